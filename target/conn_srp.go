package target

// The shell's part of an SRP login: the catalog calls the core's login
// decision needs and the volumes it opens, made on the connection's own
// goroutine before its loop starts.

import "github.com/gosrp/gosrp/internal/srp"

// srpLogin lists the catalog and lets the core decide the login.
func (c *conn) srpLogin(req *srp.LoginRequest) srpLoginResult {
	list, err := c.t.cfg.Catalog.List()
	return c.core.srpLogin(req, list, err)
}

// srpOpen opens the volumes of the session's LUNs (names by LUN, ""
// for none) and hands them to the core. A volume that fails to open
// leaves its LUN empty: the initiator sees LOGICAL UNIT NOT SUPPORTED
// there, and the failure is logged.
func (c *conn) srpOpen(names []string) {
	vols := make([]srpVolume, len(names))
	for i, name := range names {
		if name == "" {
			continue
		}
		v, info, err := openVolume(c.t.cfg.Catalog, name)
		if err != nil {
			c.log.Warn("SRP LUN left empty: open volume", "volume", name, "lun", i, "conn", c.id, "err", err)
			continue
		}
		vols[i] = srpVolume{vol: v, info: info}
	}
	c.core.srpAttach(vols)
}
