package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net"
	"net/http"
	"net/url"
	"time"
)

// ErrNotRunning means no daemon answers on the socket.
var ErrNotRunning = errors.New("srpd is not running")

// ErrPermission means the socket exists, or may, but this user may not
// connect to it.
var ErrPermission = errors.New("permission denied")

// Client talks to a daemon's admin socket.
type Client struct {
	Socket string
	hc     *http.Client
}

// NewClient returns a client for the socket at path.
func NewClient(path string) *Client {
	tr := &http.Transport{
		DialContext: func(ctx context.Context, _, _ string) (net.Conn, error) {
			var d net.Dialer
			return d.DialContext(ctx, "unix", path)
		},
		DisableKeepAlives: true,
	}
	return &Client{Socket: path, hc: &http.Client{Transport: tr, Timeout: 60 * time.Second}}
}

// Ping reports whether a daemon answers on the socket.
func (c *Client) Ping(ctx context.Context) error {
	_, err := c.Status(ctx)
	return err
}

func (c *Client) do(ctx context.Context, method, path string, body, out any) error {
	var rd io.Reader
	if body != nil {
		b, err := json.Marshal(body)
		if err != nil {
			return err
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, "http://srpd"+path, rd)
	if err != nil {
		return err
	}
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		var ne *net.OpError
		if errors.As(err, &ne) && ne.Op == "dial" && errors.Is(err, fs.ErrPermission) {
			// The socket is 0600 in a 0700 directory (cmd/srpd serve.go):
			// a daemon may well be running; this user may not talk to it.
			return fmt.Errorf("%w: the admin socket %s is the daemon's user's alone; run as root or as that user", ErrPermission, c.Socket)
		}
		if errors.As(err, &ne) && ne.Op == "dial" {
			return fmt.Errorf("%w (no daemon answers on %s)", ErrNotRunning, c.Socket)
		}
		return fmt.Errorf("admin socket %s: %w", c.Socket, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64<<20))
	if err != nil {
		return fmt.Errorf("admin socket %s: %w", c.Socket, err)
	}
	if resp.StatusCode >= 300 {
		var eb errorBody
		if json.Unmarshal(b, &eb) != nil || eb.Error == "" {
			eb.Error = resp.Status
		}
		var kind error
		switch resp.StatusCode {
		case http.StatusNotFound:
			kind = ErrNotFound
		case http.StatusConflict:
			kind = ErrExists
		case http.StatusBadRequest:
			kind = ErrInvalid
		}
		if kind != nil {
			return &kindError{msg: eb.Error, kind: kind}
		}
		return errors.New(eb.Error)
	}
	if out != nil && resp.StatusCode != http.StatusNoContent {
		if err := json.Unmarshal(b, out); err != nil {
			return fmt.Errorf("admin socket %s: bad answer: %w", c.Socket, err)
		}
	}
	return nil
}

type kindError struct {
	msg  string
	kind error
}

func (e *kindError) Error() string { return e.msg }
func (e *kindError) Unwrap() error { return e.kind }

// Errorf returns an error that reads as the formatted message and matches
// kind (ErrNotFound, ErrExists, ErrBusy, ErrInvalid) with errors.Is.
func Errorf(kind error, format string, args ...any) error {
	return &kindError{msg: fmt.Sprintf(format, args...), kind: kind}
}

// Status returns the daemon's status.
func (c *Client) Status(ctx context.Context) (Status, error) {
	var s Status
	err := c.do(ctx, "GET", "/v1/status", nil, &s)
	return s, err
}

// Service returns a Service whose calls go to the daemon.
func (c *Client) Service(ctx context.Context) Service { return &remote{c: c, ctx: ctx} }

type remote struct {
	c   *Client
	ctx context.Context
}

func esc(s string) string { return url.PathEscape(s) }

func (r *remote) Status() (Status, error) { return r.c.Status(r.ctx) }

func (r *remote) Volumes() ([]Volume, error) {
	var v []Volume
	err := r.c.do(r.ctx, "GET", "/v1/volumes", nil, &v)
	return v, err
}

func (r *remote) CreateVolume(req CreateVolume) (Volume, error) {
	var v Volume
	err := r.c.do(r.ctx, "POST", "/v1/volumes", req, &v)
	return v, err
}

func (r *remote) ResizeVolume(name string, req ResizeVolume) (Volume, error) {
	var v Volume
	err := r.c.do(r.ctx, "POST", "/v1/volumes/"+esc(name)+"/resize", req, &v)
	return v, err
}

func (r *remote) DeleteVolume(name string, req DeleteVolume) error {
	path := "/v1/volumes/" + esc(name)
	if req.Snapshots {
		path += "?snapshots=1"
	}
	return r.c.do(r.ctx, "DELETE", path, nil, nil)
}

func (r *remote) Snapshots(volume string) ([]Snapshot, error) {
	var s []Snapshot
	path := "/v1/snapshots"
	if volume != "" {
		path = "/v1/volumes/" + esc(volume) + "/snapshots"
	}
	err := r.c.do(r.ctx, "GET", path, nil, &s)
	return s, err
}

func (r *remote) CreateSnapshot(volume, name string) (Snapshot, error) {
	var s Snapshot
	err := r.c.do(r.ctx, "POST", "/v1/volumes/"+esc(volume)+"/snapshots", CreateSnapshot{Name: name}, &s)
	return s, err
}

func (r *remote) DeleteSnapshot(volume, name string) error {
	return r.c.do(r.ctx, "DELETE", "/v1/volumes/"+esc(volume)+"/snapshots/"+esc(name), nil, nil)
}

func (r *remote) CloneSnapshot(volume, snap, name string) (Volume, error) {
	var v Volume
	err := r.c.do(r.ctx, "POST", "/v1/volumes/"+esc(volume)+"/snapshots/"+esc(snap)+"/clone", CloneSnapshot{Name: name}, &v)
	return v, err
}

func (r *remote) ACL() (ACL, error) {
	var a ACL
	err := r.c.do(r.ctx, "GET", "/v1/acl", nil, &a)
	return a, err
}

func (r *remote) SetACLRule(rule ACLRule) error {
	return r.c.do(r.ctx, "POST", "/v1/acl", rule, nil)
}

func (r *remote) DeleteACLRule(initiator, volume string) error {
	q := url.Values{"initiator": {initiator}, "volume": {volume}}
	return r.c.do(r.ctx, "DELETE", "/v1/acl?"+q.Encode(), nil, nil)
}

func (r *remote) SetACLDefault(deny bool) error {
	return r.c.do(r.ctx, "PUT", "/v1/acl/default", ACLDefault{DenyByDefault: deny}, nil)
}

func (r *remote) Secrets() ([]SecretInfo, error) {
	var s []SecretInfo
	err := r.c.do(r.ctx, "GET", "/v1/secrets", nil, &s)
	return s, err
}

func (r *remote) SetSecret(initiator string, s SetSecret) error {
	return r.c.do(r.ctx, "PUT", "/v1/secrets/"+esc(initiator), s, nil)
}

func (r *remote) DeleteSecret(initiator string) error {
	return r.c.do(r.ctx, "DELETE", "/v1/secrets/"+esc(initiator), nil, nil)
}
