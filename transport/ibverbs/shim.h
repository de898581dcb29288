//go:build linux && cgo && ibverbs

// C side of the ibverbs provider: wrappers for the static inline verbs of
// <infiniband/verbs.h> and flat structs the Go side fills without touching
// C unions. Nothing here stores a Go pointer: every pointer in these structs
// is C memory (verbs objects or calloc'd arrays).

#ifndef GOSRP_IBVERBS_SHIM_H
#define GOSRP_IBVERBS_SHIM_H

#include <errno.h>
#include <fcntl.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <infiniband/verbs.h>
#include <rdma/rdma_cma.h>
#include <rdma/ib_user_verbs.h>
#include <unistd.h>

// gosrp_swr is one send work request as the Go side fills it. The SGEs of
// request i live in the QP's ibv_sge array at i*max_sge.
struct gosrp_swr {
	uint64_t wr_id;
	uint32_t opcode;      // enum ibv_wr_opcode
	uint32_t flags;       // enum ibv_send_flags
	uint32_t num_sge;
	uint32_t imm;         // host order; htonl here
	uint32_t inv_rkey;    // SEND_WITH_INV, LOCAL_INV
	uint32_t rkey;        // RDMA READ/WRITE
	uint64_t remote_addr;
	struct ibv_mw *mw;    // BIND_MW
	struct ibv_mr *mr;
	uint64_t bind_addr;
	uint64_t bind_len;
	uint32_t bind_rkey;
	uint32_t bind_access;
	uint32_t mw_rkey;     // the window's current key (rxe checks ibv_mw.rkey)
};

// gosrp_wc is one work completion in plain fields.
struct gosrp_wc {
	uint64_t wr_id;
	uint32_t status;
	uint32_t opcode;
	uint32_t wc_flags;
	uint32_t byte_len;
	uint32_t imm;         // host order
	uint32_t inv_rkey;
	uint32_t qp_num;
	uint32_t vendor_err;
	uint32_t raw_flags;   // wc_flags as the provider library reported them
};

// gosrp_post_send links n requests from in[] into wrs[] (preallocated, at
// least n long) and posts them. It returns 0 or the errno of
// ibv_post_send, with *bad set to the index of the first request that was
// not accepted (n on success).
static inline int gosrp_post_send(struct ibv_qp *qp, struct gosrp_swr *in, struct ibv_send_wr *wrs,
                           struct ibv_sge *sges, int max_sge, int n, int *bad) {
	int i, rc;
	struct ibv_send_wr *badwr = NULL;
	for (i = 0; i < n; i++) {
		struct ibv_send_wr *w = &wrs[i];
		struct gosrp_swr *s = &in[i];
		memset(w, 0, sizeof(*w));
		w->wr_id = s->wr_id;
		w->next = (i + 1 < n) ? &wrs[i + 1] : NULL;
		w->sg_list = s->num_sge ? &sges[(size_t)i * max_sge] : NULL;
		w->num_sge = (int)s->num_sge;
		w->opcode = (enum ibv_wr_opcode)s->opcode;
		w->send_flags = s->flags;
		switch (s->opcode) {
		case IBV_WR_SEND_WITH_IMM:
			w->imm_data = htonl(s->imm);
			break;
		case IBV_WR_RDMA_WRITE_WITH_IMM:
			w->imm_data = htonl(s->imm);
			w->wr.rdma.remote_addr = s->remote_addr;
			w->wr.rdma.rkey = s->rkey;
			break;
		case IBV_WR_RDMA_WRITE:
		case IBV_WR_RDMA_READ:
			w->wr.rdma.remote_addr = s->remote_addr;
			w->wr.rdma.rkey = s->rkey;
			break;
		case IBV_WR_SEND_WITH_INV:
		case IBV_WR_LOCAL_INV:
			w->invalidate_rkey = s->inv_rkey;
			break;
		case IBV_WR_BIND_MW:
			// libibverbs leaves a type-2 window's ibv_mw.rkey at the
			// allocation key; rxe copies it into the WQE and refuses the
			// bind unless it equals the device's current key.
			s->mw->rkey = s->mw_rkey;
			w->bind_mw.mw = s->mw;
			w->bind_mw.rkey = s->bind_rkey;
			w->bind_mw.bind_info.mr = s->mr;
			w->bind_mw.bind_info.addr = s->bind_addr;
			w->bind_mw.bind_info.length = s->bind_len;
			w->bind_mw.bind_info.mw_access_flags = s->bind_access;
			break;
		default:
			break;
		}
	}
	*bad = n;
	if (n == 0)
		return 0;
	rc = ibv_post_send(qp, wrs, &badwr);
	if (rc) {
		*bad = badwr ? (int)(badwr - wrs) : 0;
		if (*bad < 0 || *bad > n)
			*bad = 0;
	}
	return rc;
}

// gosrp_post_recv links n receive requests (ids[i], sges at i*max_sge,
// nsge[i] of them) and posts them, with the same bad contract.
static inline int gosrp_post_recv(struct ibv_qp *qp, uint64_t *ids, uint32_t *nsge, struct ibv_recv_wr *wrs,
                           struct ibv_sge *sges, int max_sge, int n, int *bad) {
	int i, rc;
	struct ibv_recv_wr *badwr = NULL;
	for (i = 0; i < n; i++) {
		wrs[i].wr_id = ids[i];
		wrs[i].next = (i + 1 < n) ? &wrs[i + 1] : NULL;
		wrs[i].sg_list = nsge[i] ? &sges[(size_t)i * max_sge] : NULL;
		wrs[i].num_sge = (int)nsge[i];
	}
	*bad = n;
	if (n == 0)
		return 0;
	rc = ibv_post_recv(qp, wrs, &badwr);
	if (rc) {
		*bad = badwr ? (int)(badwr - wrs) : 0;
		if (*bad < 0 || *bad > n)
			*bad = 0;
	}
	return rc;
}

// gosrp_poll_cq polls up to n completions into out (through the scratch
// array raw) and returns the count or a negative value on error.
// The kernel's IB_WC_WITH_INVALIDATE is bit 2, libibverbs' IBV_WC_WITH_INV
// bit 3 (bit 2 is IBV_WC_IP_CSUM_OK). rxe's user CQ is the kernel's ring
// copied as is, so its remote-invalidation flag arrives as bit 2; with
// kernel_flags set, bit 2 on a receive completion is read as WITH_INV.
#define GOSRP_KERNEL_WC_WITH_INV (1u << 2)

static inline int gosrp_poll_cq(struct ibv_cq *cq, struct ibv_wc *raw, struct gosrp_wc *out, int n,
                                int kernel_flags) {
	int i, got = ibv_poll_cq(cq, n, raw);
	for (i = 0; i < got; i++) {
		struct ibv_wc *w = &raw[i];
		struct gosrp_wc *o = &out[i];
		o->wr_id = w->wr_id;
		o->status = w->status;
		o->opcode = w->opcode;
		o->raw_flags = w->wc_flags;
		o->wc_flags = w->wc_flags;
		if (kernel_flags && w->status == IBV_WC_SUCCESS && (w->opcode & IBV_WC_RECV)) {
			o->wc_flags &= ~(unsigned)(IBV_WC_WITH_INV | GOSRP_KERNEL_WC_WITH_INV);
			if (w->wc_flags & GOSRP_KERNEL_WC_WITH_INV)
				o->wc_flags |= IBV_WC_WITH_INV;
		}
		o->byte_len = w->byte_len;
		o->imm = 0;
		o->inv_rkey = 0;
		if (w->wc_flags & IBV_WC_WITH_IMM)
			o->imm = ntohl(w->imm_data);
		else if (o->wc_flags & IBV_WC_WITH_INV)
			o->inv_rkey = w->invalidated_rkey;
		o->qp_num = w->qp_num;
		o->vendor_err = w->vendor_err;
	}
	return got;
}

static inline int gosrp_req_notify_cq(struct ibv_cq *cq) { return ibv_req_notify_cq(cq, 0); }

// gosrp_get_cq_event takes one completion event off the channel (whose fd
// is non-blocking) and acknowledges it. 0: got one, 1: none pending, <0 error.
static inline int gosrp_get_cq_event(struct ibv_comp_channel *ch) {
	struct ibv_cq *cq;
	void *ctx;
	if (ibv_get_cq_event(ch, &cq, &ctx)) {
		if (errno == EAGAIN || errno == EWOULDBLOCK)
			return 1;
		return -errno;
	}
	ibv_ack_cq_events(cq, 1);
	return 0;
}

static inline int gosrp_set_nonblock(int fd) {
	int fl = fcntl(fd, F_GETFL);
	if (fl < 0)
		return -errno;
	if (fcntl(fd, F_SETFL, fl | O_NONBLOCK) < 0)
		return -errno;
	return 0;
}

// gosrp_async is an asynchronous event in plain fields.
struct gosrp_async {
	int type;           // enum ibv_event_type
	uint32_t qp_num;    // QP events
	uintptr_t cq_handle;// CQ events: the cq_context (a handle number, not a pointer)
	uintptr_t qp_handle;// QP events: the qp_context
	int port;
};

// gosrp_get_async_event reads one async event from the context (its fd is
// non-blocking) and acknowledges it at once. 0: got one, 1: none, <0 error.
static inline int gosrp_get_async_event(struct ibv_context *ctx, struct gosrp_async *out) {
	struct ibv_async_event ev;
	memset(out, 0, sizeof(*out));
	if (ibv_get_async_event(ctx, &ev)) {
		if (errno == EAGAIN || errno == EWOULDBLOCK)
			return 1;
		return -errno;
	}
	out->type = ev.event_type;
	switch (ev.event_type) {
	case IBV_EVENT_CQ_ERR:
		out->cq_handle = (uintptr_t)ev.element.cq->cq_context;
		break;
	case IBV_EVENT_QP_FATAL:
	case IBV_EVENT_QP_REQ_ERR:
	case IBV_EVENT_QP_ACCESS_ERR:
	case IBV_EVENT_COMM_EST:
	case IBV_EVENT_SQ_DRAINED:
	case IBV_EVENT_PATH_MIG:
	case IBV_EVENT_PATH_MIG_ERR:
	case IBV_EVENT_QP_LAST_WQE_REACHED:
		out->qp_num = ev.element.qp->qp_num;
		out->qp_handle = (uintptr_t)ev.element.qp->qp_context;
		break;
	case IBV_EVENT_PORT_ACTIVE:
	case IBV_EVENT_PORT_ERR:
	case IBV_EVENT_LID_CHANGE:
	case IBV_EVENT_PKEY_CHANGE:
	case IBV_EVENT_SM_CHANGE:
	case IBV_EVENT_CLIENT_REREGISTER:
	case IBV_EVENT_GID_CHANGE:
		out->port = ev.element.port_num;
		break;
	default:
		break;
	}
	ibv_ack_async_event(&ev);
	return 0;
}

static inline struct ibv_cq *gosrp_create_cq(struct ibv_context *ctx, int cqe, uintptr_t handle,
                                      struct ibv_comp_channel *ch) {
	return ibv_create_cq(ctx, cqe, (void *)handle, ch, 0);
}

static inline struct ibv_qp *gosrp_create_qp(struct ibv_pd *pd, struct ibv_cq *scq, struct ibv_cq *rcq,
                                      uintptr_t handle, uint32_t swr, uint32_t rwr, uint32_t ssge,
                                      uint32_t rsge, uint32_t inl, int sig_all, struct ibv_qp_cap *cap) {
	struct ibv_qp_init_attr a;
	struct ibv_qp *qp;
	memset(&a, 0, sizeof(a));
	a.qp_context = (void *)handle;
	a.send_cq = scq;
	a.recv_cq = rcq;
	a.cap.max_send_wr = swr;
	a.cap.max_recv_wr = rwr;
	a.cap.max_send_sge = ssge;
	a.cap.max_recv_sge = rsge;
	a.cap.max_inline_data = inl;
	a.qp_type = IBV_QPT_RC;
	a.sq_sig_all = sig_all;
	qp = ibv_create_qp(pd, &a);
	if (qp)
		*cap = a.cap;
	return qp;
}

// gosrp_probe_inline returns the largest inline size (of a few candidates)
// an RC QP on the device accepts, or 0.
static inline int gosrp_probe_inline(struct ibv_context *ctx) {
	static const uint32_t try[] = {1024, 512, 256, 128, 64, 0};
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq;
	int i, best = 0;
	if (!pd)
		return 0;
	cq = ibv_create_cq(ctx, 2, NULL, NULL, 0);
	if (!cq) {
		ibv_dealloc_pd(pd);
		return 0;
	}
	for (i = 0; i < (int)(sizeof(try) / sizeof(try[0])); i++) {
		struct ibv_qp_cap cap;
		struct ibv_qp *qp = gosrp_create_qp(pd, cq, cq, 0, 1, 1, 1, 1, try[i], 0, &cap);
		if (qp) {
			best = (int)cap.max_inline_data;
			ibv_destroy_qp(qp);
			break;
		}
	}
	ibv_destroy_cq(cq);
	ibv_dealloc_pd(pd);
	return best;
}

// gosrp_modify_simple moves a QP to a state that needs no peer attributes
// (RESET, ERR, SQD, RTS from SQD, INIT from RESET).
static inline int gosrp_modify_simple(struct ibv_qp *qp, int state, int port) {
	struct ibv_qp_attr a;
	int mask = IBV_QP_STATE;
	memset(&a, 0, sizeof(a));
	a.qp_state = (enum ibv_qp_state)state;
	if (state == IBV_QPS_INIT) {
		a.pkey_index = 0;
		a.port_num = (uint8_t)port;
		a.qp_access_flags = IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC;
		mask |= IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS;
	}
	if (state == IBV_QPS_SQD)
		a.en_sqd_async_notify = 1;
	if (ibv_modify_qp(qp, &a, mask))
		return errno ? errno : EINVAL;
	return 0;
}

static inline int gosrp_query_state(struct ibv_qp *qp) {
	struct ibv_qp_attr a;
	struct ibv_qp_init_attr ia;
	if (ibv_query_qp(qp, &a, IBV_QP_STATE, &ia))
		return -(errno ? errno : EINVAL);
	return a.qp_state;
}

// gosrp_cm_modify moves qp to state with the attributes rdma_cm computes for
// id (manual-QP mode, as librdmacm's ucma_modify_qp_rtr/rts do for its own
// QPs). rd_atomic >= 0 overrides max_dest_rd_atomic (RTR) or max_rd_atomic
// (RTS); ack_timeout > 0 overrides the local ACK timeout (RTS).
static inline int gosrp_cm_modify(struct rdma_cm_id *id, struct ibv_qp *qp, int state, int rd_atomic, int ack_timeout) {
	struct ibv_qp_attr a;
	int mask = 0;
	memset(&a, 0, sizeof(a));
	a.qp_state = (enum ibv_qp_state)state;
	if (rdma_init_qp_attr(id, &a, &mask))
		return errno ? errno : EINVAL;
	if (rd_atomic >= 0) {
		if (state == IBV_QPS_RTR && (mask & IBV_QP_MAX_DEST_RD_ATOMIC))
			a.max_dest_rd_atomic = (uint8_t)rd_atomic;
		if (state == IBV_QPS_RTS && (mask & IBV_QP_MAX_QP_RD_ATOMIC))
			a.max_rd_atomic = (uint8_t)rd_atomic;
	}
	if (ack_timeout > 0 && state == IBV_QPS_RTS) {
		a.timeout = (uint8_t)ack_timeout;
		mask |= IBV_QP_TIMEOUT;
	}
	if (ibv_modify_qp(qp, &a, mask))
		return errno ? errno : EINVAL;
	return 0;
}

// gosrp_cm_event is a connection-manager event in plain fields; private
// data is copied into pd (at most 256 bytes) before the event is acked.
struct gosrp_cm_event {
	int type;
	int status;
	struct rdma_cm_id *id;
	struct rdma_cm_id *listen_id;
	uint8_t responder_resources;
	uint8_t initiator_depth;
	uint8_t pd_len;
	uint8_t pd[256];
};

// gosrp_get_cm_event reads one event (the channel fd is non-blocking),
// copies it out and acks it. 0: got one, 1: none, <0: -errno.
static inline int gosrp_get_cm_event(struct rdma_event_channel *ch, struct gosrp_cm_event *out) {
	struct rdma_cm_event *ev;
	memset(out, 0, sizeof(*out));
	if (rdma_get_cm_event(ch, &ev)) {
		if (errno == EAGAIN || errno == EWOULDBLOCK)
			return 1;
		return -errno;
	}
	out->type = ev->event;
	out->status = ev->status;
	out->id = ev->id;
	out->listen_id = ev->listen_id;
	if (ev->event == RDMA_CM_EVENT_CONNECT_REQUEST || ev->event == RDMA_CM_EVENT_CONNECT_RESPONSE ||
	    ev->event == RDMA_CM_EVENT_ESTABLISHED || ev->event == RDMA_CM_EVENT_REJECTED) {
		const struct rdma_conn_param *p = &ev->param.conn;
		out->responder_resources = p->responder_resources;
		out->initiator_depth = p->initiator_depth;
		if (p->private_data && p->private_data_len) {
			out->pd_len = p->private_data_len;
			memcpy(out->pd, p->private_data, p->private_data_len);
		}
	}
	rdma_ack_cm_event(ev);
	return 0;
}

static inline int gosrp_create_id(struct rdma_event_channel *ch, struct rdma_cm_id **id) {
	if (rdma_create_id(ch, id, NULL, RDMA_PS_TCP))
		return errno ? errno : EINVAL;
	return 0;
}

// gosrp_sockaddr fills ss from a 4- or 16-byte IP and a host-order port.
static inline socklen_t gosrp_sockaddr(struct sockaddr_storage *ss, const uint8_t *ip, int iplen, int port) {
	memset(ss, 0, sizeof(*ss));
	if (iplen == 4) {
		struct sockaddr_in *s = (struct sockaddr_in *)ss;
		s->sin_family = AF_INET;
		s->sin_port = htons((uint16_t)port);
		memcpy(&s->sin_addr, ip, 4);
		return sizeof(*s);
	}
	struct sockaddr_in6 *s6 = (struct sockaddr_in6 *)ss;
	s6->sin6_family = AF_INET6;
	s6->sin6_port = htons((uint16_t)port);
	memcpy(&s6->sin6_addr, ip, 16);
	return sizeof(*s6);
}

// gosrp_addr copies the IP of a sockaddr into ip (16 bytes) and returns its
// length (4 or 16, 0 if unknown).
static inline int gosrp_addr(struct sockaddr *sa, uint8_t *ip) {
	if (sa->sa_family == AF_INET) {
		memcpy(ip, &((struct sockaddr_in *)sa)->sin_addr, 4);
		return 4;
	}
	if (sa->sa_family == AF_INET6) {
		memcpy(ip, &((struct sockaddr_in6 *)sa)->sin6_addr, 16);
		return 16;
	}
	return 0;
}

static inline int gosrp_local_ip(struct rdma_cm_id *id, uint8_t *ip) { return gosrp_addr(rdma_get_local_addr(id), ip); }
static inline int gosrp_peer_ip(struct rdma_cm_id *id, uint8_t *ip) { return gosrp_addr(rdma_get_peer_addr(id), ip); }
static inline int gosrp_src_port(struct rdma_cm_id *id) { return ntohs(rdma_get_src_port(id)); }
static inline int gosrp_dst_port(struct rdma_cm_id *id) { return ntohs(rdma_get_dst_port(id)); }
static inline const char *gosrp_id_device(struct rdma_cm_id *id) {
	return (id->verbs && id->verbs->device) ? ibv_get_device_name(id->verbs->device) : NULL;
}

// gosrp_conn_param fills a conn param (private data is C memory owned by
// the caller).
static inline void gosrp_conn_param(struct rdma_conn_param *p, const void *pd, int len, int resp_res,
                             int init_depth, uint32_t qp_num, int retry, int rnr_retry) {
	memset(p, 0, sizeof(*p));
	p->private_data = len ? pd : NULL;
	p->private_data_len = (uint8_t)len;
	p->responder_resources = (uint8_t)resp_res;
	p->initiator_depth = (uint8_t)init_depth;
	p->retry_count = (uint8_t)retry;
	p->rnr_retry_count = (uint8_t)rnr_retry;
	p->flow_control = 1;
	p->qp_num = qp_num;
}

static inline int gosrp_query_port(struct ibv_context *ctx, int port, struct ibv_port_attr *pa) {
	return ibv_query_port(ctx, (uint8_t)port, pa);
}
static inline struct ibv_mr *gosrp_reg_mr(struct ibv_pd *pd, uint64_t addr, uint64_t len, int access) {
	return ibv_reg_mr(pd, (void *)(uintptr_t)addr, (size_t)len, access);
}
static inline struct ibv_mw *gosrp_alloc_mw(struct ibv_pd *pd) { return ibv_alloc_mw(pd, IBV_MW_TYPE_2); }
static inline int gosrp_dealloc_mw(struct ibv_mw *mw) { return ibv_dealloc_mw(mw); }
static inline uint32_t gosrp_inc_rkey(uint32_t k) { return ibv_inc_rkey(k); }

static inline int gosrp_errno(void) { return errno; }

// gosrp_rxe_doorbell rings rxe's send doorbell with no new work, as
// rdma-core's rxe post_send_db does after queueing WQEs in user space: a
// legacy-ABI POST_SEND command with wr_count 0, which makes the kernel run
// the QP's requester over what is queued. (ibv_post_send with an empty
// list returns EINVAL in rxe without ringing.) rxe only.
static inline int gosrp_rxe_doorbell(struct ibv_qp *qp) {
	struct {
		struct ib_uverbs_cmd_hdr hdr;
		struct ib_uverbs_post_send cmd;
	} __attribute__((packed)) c;
	struct ib_uverbs_post_send_resp resp;
	memset(&c, 0, sizeof(c));
	c.hdr.command = IB_USER_VERBS_CMD_POST_SEND;
	c.hdr.in_words = sizeof(c) / 4;
	c.hdr.out_words = sizeof(resp) / 4;
	c.cmd.response = (uintptr_t)&resp;
	c.cmd.qp_handle = qp->handle;
	c.cmd.wr_count = 0;
	c.cmd.sge_count = 0;
	c.cmd.wqe_size = sizeof(struct ibv_send_wr);
	if (write(qp->context->cmd_fd, &c, sizeof(c)) != (ssize_t)sizeof(c))
		return errno ? errno : EIO;
	return 0;
}

#endif
