package main

// The SRP target port: what the Linux kernel's ib_srp names in its
// add_target line to log in to srpd (docs/srp.md).

import (
	"encoding/binary"
	"fmt"
	"net"
	"strconv"
	"strings"

	"github.com/gosrp/gosrp/internal/admin"
	"github.com/gosrp/gosrp/internal/cli"
)

// srpTargetPort is the 16-byte SRP target port identifier of the
// configuration's srp_id_ext and srp_ioc_guid (SRP r16a 5.3: the
// identifier extension, then the I/O controller GUID, each big-endian,
// which is how ib_srp's srp_send_req fills TARGET PORT IDENTIFIER from
// add_target's id_ext and ioc_guid). Both empty is the zero identifier,
// with which the target accepts any; one without the other is refused.
func (c *Config) srpTargetPort() ([16]byte, error) {
	var port [16]byte
	if (c.SRPIDExt == "") != (c.SRPIOCGUID == "") {
		return port, cli.Usagef("--srp-id-ext and --srp-ioc-guid go together (ib_srp's add_target names both): set both or neither")
	}
	if c.SRPIDExt == "" {
		return port, nil
	}
	for i, f := range []struct{ name, v string }{{"--srp-id-ext", c.SRPIDExt}, {"--srp-ioc-guid", c.SRPIOCGUID}} {
		x, err := parseGUID(f.v)
		if err != nil {
			return port, cli.Usagef("%s %q: %v", f.name, f.v, err)
		}
		binary.BigEndian.PutUint64(port[8*i:], x)
	}
	return port, nil
}

// parseGUID reads a 64-bit identifier in hex: 16 digits, optionally in
// groups of 4 separated by colons as sysfs shows a GUID
// (0002:c903:0001:2345), optionally 0x-prefixed.
func parseGUID(s string) (uint64, error) {
	h := strings.TrimPrefix(strings.ReplaceAll(s, ":", ""), "0x")
	if len(h) == 0 || len(h) > 16 {
		return 0, fmt.Errorf("want up to 16 hex digits (a GUID, as in /sys/class/infiniband/*/node_guid)")
	}
	x, err := strconv.ParseUint(h, 16, 64)
	if err != nil {
		return 0, fmt.Errorf("want up to 16 hex digits (a GUID, as in /sys/class/infiniband/*/node_guid)")
	}
	return x, nil
}

// srpStatus is what srpd status says of the SRP target port: its two
// halves and the add_target line a Linux host writes to
// /sys/class/infiniband_srp/srp-DEVICE-PORT/add_target to log in to the
// listener at listen (host:port; a wildcard host cannot be dialled, so
// it is left for the user to fill in).
func srpStatus(port [16]byte, listen string, group uint16) *admin.SRPPort {
	idExt, ioc := binary.BigEndian.Uint64(port[:8]), binary.BigEndian.Uint64(port[8:])
	dest := listen
	if host, p, err := net.SplitHostPort(listen); err == nil {
		if ip := net.ParseIP(host); host == "" || ip != nil && ip.IsUnspecified() {
			dest = "ADDRESS:" + p
		}
	}
	return &admin.SRPPort{IDExt: fmt.Sprintf("%016x", idExt), IOCGUID: fmt.Sprintf("%016x", ioc), Any: port == [16]byte{},
		AddTarget: fmt.Sprintf("id_ext=%016x,ioc_guid=%016x,dest=%s", idExt, ioc, dest), PortGroup: int(group)}
}

// srpStatusLine is the status text's line about the SRP target port.
func srpStatusLine(p *admin.SRPPort) string {
	note := ""
	if p.Any {
		note = " (no srp_id_ext/srp_ioc_guid set: any id_ext and ioc_guid are accepted)"
	}
	alua := ""
	if p.PortGroup != 0 {
		alua = fmt.Sprintf("; ALUA target port group %d", p.PortGroup)
	}
	// The add_target line ends the status line, so that it can be cut
	// out whole (test/rxe/srp-guest.sh does).
	return fmt.Sprintf("SRP target port id_ext %s ioc_guid %s%s%s; ib_srp add_target: %s", p.IDExt, p.IOCGUID, note, alua, p.AddTarget)
}

// srpPortGroup is --srp-port-group as target.Config.SRPPortGroup: a
// number that fits a target port group field (SPC-4 6.27, two bytes),
// 0 for none.
func (c *Config) srpPortGroup() (uint16, error) {
	if c.SRPPortGroup < 0 || c.SRPPortGroup > 0xFFFF {
		return 0, cli.Usagef("--srp-port-group %d: want a target port group from 1 to 65535, or 0 for none", c.SRPPortGroup)
	}
	return uint16(c.SRPPortGroup), nil
}
