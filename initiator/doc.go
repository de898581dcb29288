// Package initiator is the client side of gosrp: it dials a target over a
// transport provider, logs in, opens volumes and reads and writes them,
// exposing the application's memory to the target only through the FRMR
// pool (package frmr) and only for the life of each I/O.
//
// A ten-line program:
//
//	p, _ := transport.Open("emu", transport.Options{"wire": "tcp"})
//	s, err := initiator.Dial(ctx, initiator.Config{Provider: p, Addr: "127.0.0.1:4420", Name: "host-a"})
//	if err != nil {
//		return err
//	}
//	defer s.Close()
//	v, _ := s.Open(ctx, "vol0", initiator.OpenOptions{})
//	buf := make([]byte, 4096)
//	_, err = v.ReadAt(buf, 0)
//
// How an I/O travels: the channel's poller takes a credit, registers the
// buffer (a per-credit bounce buffer, or the application's own memory if
// it came from Session.AllocBuffer) with a freshly bumped key, and chains
// REG_MR (or BIND_MW) → SEND(command) on one send queue. The target moves
// the data with RDMA READ or WRITE and answers, normally with
// SEND_WITH_INV naming the key. The I/O completes only when the response
// has arrived, the command's SEND has completed, and the key is proven
// invalid: by the remote invalidation if it names exactly the key
// registered, otherwise by a signaled LOCAL_INV that completed SUCCESS.
// A write of up to Config.ImmediateData bytes (8 KiB by default, as the
// target grants) skips all of that: its SEND gathers the command and the
// data through local keys (SRP-2 immediate data), no key is exposed, and
// it completes when the response arrives (on RC the target answers only a
// command it received; the NIC may still resend the SEND until it sees the
// ACK, but the responder drops a duplicate without delivering it again).
//
// Failures: any error completion, a bogus remote invalidation, a missing
// completion past Config.IOTimeout or a lost link tears the connection
// down: the QP is moved to ERR and drained, every registration not proven
// invalid is deregistered and replaced, and the channel reconnects with
// backoff, logs in again, re-opens its volumes and re-issues the I/O that
// had not completed. I/O fails with ErrConnectionLost only after
// Config.LossTimeout. Each channel is one QP with its own poller
// goroutine, pool and credits; a session spreads I/O over its channels.
package initiator
