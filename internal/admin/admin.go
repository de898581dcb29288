// Package admin is srpd's administration API: JSON over HTTP on a unix
// socket in the daemon's data directory (srpd.sock), like SPDK's JSON-RPC
// socket. This package holds the request and response types, the HTTP
// handler that serves a Service, and the client srpd's own subcommands
// use. Anything that speaks HTTP over a unix socket can drive it:
//
//	curl --unix-socket ./srpd-data/srpd.sock http://srpd/v1/volumes
//
// Routes (every body is JSON; errors are {"error": "..."} with a 4xx/5xx
// status):
//
//	GET    /v1/status                              Status
//	GET    /v1/volumes                             []Volume
//	POST   /v1/volumes                             CreateVolume → Volume
//	POST   /v1/volumes/{name}/resize               ResizeVolume → Volume
//	DELETE /v1/volumes/{name}[?snapshots=1]       (one with snapshots only with ?snapshots=1)
//	GET    /v1/snapshots                           []Snapshot (of every volume)
//	GET    /v1/volumes/{name}/snapshots            []Snapshot
//	POST   /v1/volumes/{name}/snapshots            CreateSnapshot → Snapshot
//	DELETE /v1/volumes/{name}/snapshots/{snap}
//	POST   /v1/volumes/{name}/snapshots/{snap}/clone  CloneSnapshot → Volume
//	GET    /v1/acl                                 ACL
//	POST   /v1/acl                                 ACLRule (add or replace)
//	DELETE /v1/acl?initiator=I&volume=V
//	PUT    /v1/acl/default                         ACLDefault
//	GET    /v1/secrets                             []SecretInfo (never the secret)
//	PUT    /v1/secrets/{initiator}                 SetSecret
//	DELETE /v1/secrets/{initiator}
package admin

import (
	"errors"
	"time"
)

// SocketName is the admin socket's file name inside the data directory.
const SocketName = "srpd.sock"

// Volume describes one volume.
type Volume struct {
	Name      string    `json:"name"`
	Size      int64     `json:"size"`
	BlockSize int       `json:"block_size"`
	Created   time.Time `json:"created,omitzero"`
	Snapshots int       `json:"snapshots"`
	// PathState is the volume's state at this gateway when the store is
	// shared by several (rbd): active, standby, fenced, or closed when
	// no session has it open here (docs/gateways.md). Empty for other
	// stores, whose volumes are always served.
	PathState string `json:"path_state,omitempty"`
}

// Snapshot describes one snapshot; it is served read-only as VOLUME@NAME.
type Snapshot struct {
	Volume    string    `json:"volume"`
	Name      string    `json:"name"`
	Size      int64     `json:"size"`
	BlockSize int       `json:"block_size"`
	Created   time.Time `json:"created,omitzero"`
}

// CreateVolume is the body of POST /v1/volumes.
type CreateVolume struct {
	Name      string `json:"name"`
	Size      int64  `json:"size"`
	BlockSize int    `json:"block_size,omitempty"`
}

// ResizeVolume is the body of POST /v1/volumes/{name}/resize.
type ResizeVolume struct {
	Size int64 `json:"size"`
	// Force shrinks the volume even while sessions have it open (their
	// I/O past the new end then fails); without it such a shrink is
	// refused with ErrBusy. A grow never needs it.
	Force bool `json:"force,omitempty"`
}

// DeleteVolume says how DELETE /v1/volumes/{name} deletes (its query:
// ?snapshots=1).
type DeleteVolume struct {
	// Snapshots deletes the volume's snapshots with it. Without it a
	// volume that has snapshots is refused with ErrBusy: a snapshot is
	// what a user keeps to go back to, and `rbd rm` and `zfs destroy`
	// refuse the same way.
	Snapshots bool
}

// CreateSnapshot is the body of POST /v1/volumes/{name}/snapshots.
type CreateSnapshot struct {
	Name string `json:"name"`
}

// CloneSnapshot is the body of POST .../snapshots/{snap}/clone.
type CloneSnapshot struct {
	Name string `json:"name"`
}

// ACLRule grants Access ("none", "ro" or "rw") on Volume to Initiator; "*"
// matches any name. The most specific rule wins.
type ACLRule struct {
	Initiator string `json:"initiator"`
	Volume    string `json:"volume"`
	Access    string `json:"access"`
}

// ACL is the daemon's access control list.
type ACL struct {
	// DenyByDefault: without a matching rule an initiator gets nothing
	// (false: read-write).
	DenyByDefault bool      `json:"deny_by_default"`
	Rules         []ACLRule `json:"rules"`
}

// ACLDefault is the body of PUT /v1/acl/default.
type ACLDefault struct {
	DenyByDefault bool `json:"deny_by_default"`
}

// SetSecret is the body of PUT /v1/secrets/{initiator}.
type SetSecret struct {
	Secret string `json:"secret"`
	// Required: the initiator must authenticate; false lets it log in
	// without a secret (but one that answers must answer right).
	Required bool `json:"required"`
}

// SecretInfo describes a configured secret without revealing it.
type SecretInfo struct {
	Initiator string `json:"initiator"`
	Required  bool   `json:"required"`
}

// OpStats count one kind of operation.
type OpStats struct {
	Ops    uint64 `json:"ops"`
	Bytes  uint64 `json:"bytes"`
	Errors uint64 `json:"errors"`
}

// IOStats are the counters of a volume or connection.
type IOStats struct {
	Read        OpStats `json:"read"`
	Write       OpStats `json:"write"`
	Flush       OpStats `json:"flush"`
	Discard     OpStats `json:"discard"`
	WriteZeroes OpStats `json:"write_zeroes"`
	// P50 and P99 latency upper bounds in microseconds.
	P50us uint64 `json:"p50_us"`
	P99us uint64 `json:"p99_us"`
}

// VolumeStats are one served volume's counters.
type VolumeStats struct {
	Name string `json:"name"`
	IOStats
}

// Conn describes one live connection.
type Conn struct {
	ID           uint64 `json:"id"`
	Remote       string `json:"remote"`
	Initiator    string `json:"initiator"`
	State        string `json:"state"`
	Credits      int    `json:"credits"`
	CreditsInUse int    `json:"credits_in_use"`
	OpenVolumes  int    `json:"open_volumes"`
	IOStats
}

// Status is the answer to GET /v1/status.
type Status struct {
	PID      int    `json:"pid"`
	Target   string `json:"target"`
	Listen   string `json:"listen"`
	Provider string `json:"provider"`
	Metrics  string `json:"metrics,omitempty"`
	Data     string `json:"data"`
	// ACLLive: ACL changes reach the running target at once (otherwise
	// they apply when srpd restarts).
	ACLLive      bool          `json:"acl_live"`
	Started      time.Time     `json:"started"`
	Volumes      []Volume      `json:"volumes"`
	Connections  int           `json:"connections"`
	Accepted     uint64        `json:"accepted"`
	Rejected     uint64        `json:"rejected"`
	Violations   uint64        `json:"violations"`
	CreditsInUse int           `json:"credits_in_use"`
	VolumeStats  []VolumeStats `json:"volume_stats"`
	Conns        []Conn        `json:"conns"`
	// Space is the store's file system (nil for a store that does not
	// measure it, such as the memory backend).
	Space *Space `json:"space,omitempty"`
	// SRP is the target port the kernel's SRP initiator logs in to (nil
	// when srpd serves no target).
	SRP *SRPPort `json:"srp,omitempty"`
	// Reservations are the volumes' persistent reservations and
	// exclusive opens, those that have any, by volume name.
	Reservations []Reservation `json:"reservations,omitempty"`
}

// SRPPort is the T10 SRP target port identifier srpd answers to, and
// how a Linux host names it.
type SRPPort struct {
	// IDExt and IOCGUID are its two halves, 16 hex digits each.
	IDExt   string `json:"id_ext"`
	IOCGUID string `json:"ioc_guid"`
	// Any: none is configured, so every identifier is accepted.
	Any bool `json:"any"`
	// AddTarget is the line to write to ib_srp's add_target file
	// (/sys/class/infiniband_srp/srp-DEVICE-PORT/add_target).
	AddTarget string `json:"add_target"`
	// PortGroup is the ALUA target port group SRP hosts see for shared
	// volumes (--srp-port-group; 0: ALUA off).
	PortGroup int `json:"port_group,omitempty"`
}

// Reservation is a volume's reservation state in Status.
type Reservation struct {
	Volume     string `json:"volume"`
	Generation uint32 `json:"generation"`
	// Holder holds a reservation of Type ("" for none).
	Holder string `json:"holder,omitempty"`
	Type   string `json:"type,omitempty"`
	// Registrants are the registered initiators.
	Registrants []string `json:"registrants,omitempty"`
	// Exclusive is the initiator of a session holding the volume open
	// exclusively.
	Exclusive string `json:"exclusive,omitempty"`
}

// Space is a store's free space and thin-provisioning totals.
type Space struct {
	Total   int64 `json:"total"`
	Free    int64 `json:"free"`
	Reserve int64 `json:"reserve"`
	// Full: free space is below the reserve and writes fail with ENOSPC.
	Full          bool   `json:"full"`
	RefusedWrites uint64 `json:"refused_writes"`
	// Provisioned is the sum of the volume sizes; MaxOvercommit bounds it
	// to that multiple of Total (0: unbounded).
	Provisioned   int64   `json:"provisioned"`
	MaxOvercommit float64 `json:"max_overcommit"`
}

// Error kinds a Service returns (wrapped); the handler maps them to HTTP
// statuses and the client back to these errors.
var (
	ErrNotFound = errors.New("not found")
	ErrExists   = errors.New("already exists")
	ErrBusy     = errors.New("in use")
	ErrInvalid  = errors.New("invalid argument")
)

// Service is what the daemon implements and the handler serves.
type Service interface {
	Status() (Status, error)
	Volumes() ([]Volume, error)
	CreateVolume(CreateVolume) (Volume, error)
	ResizeVolume(name string, req ResizeVolume) (Volume, error)
	DeleteVolume(name string, req DeleteVolume) error
	Snapshots(volume string) ([]Snapshot, error)
	CreateSnapshot(volume, name string) (Snapshot, error)
	DeleteSnapshot(volume, name string) error
	CloneSnapshot(volume, snap, name string) (Volume, error)
	ACL() (ACL, error)
	SetACLRule(ACLRule) error
	DeleteACLRule(initiator, volume string) error
	SetACLDefault(deny bool) error
	Secrets() ([]SecretInfo, error)
	SetSecret(initiator string, s SetSecret) error
	DeleteSecret(initiator string) error
}
