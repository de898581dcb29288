package admin

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
)

// Handler serves svc on the routes listed in the package comment.
func Handler(svc Service) http.Handler {
	mux := http.NewServeMux()
	h := func(pattern string, fn func(r *http.Request) (any, error)) {
		mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
			v, err := fn(r)
			if err != nil {
				writeJSON(w, statusOf(err), errorBody{Error: err.Error()})
				return
			}
			if v == nil {
				w.WriteHeader(http.StatusNoContent)
				return
			}
			writeJSON(w, http.StatusOK, v)
		})
	}
	h("GET /v1/status", func(*http.Request) (any, error) { return svc.Status() })
	h("GET /v1/volumes", func(*http.Request) (any, error) { return svc.Volumes() })
	h("POST /v1/volumes", func(r *http.Request) (any, error) {
		var req CreateVolume
		if err := decode(r, &req); err != nil {
			return nil, err
		}
		return svc.CreateVolume(req)
	})
	h("POST /v1/volumes/{name}/resize", func(r *http.Request) (any, error) {
		var req ResizeVolume
		if err := decode(r, &req); err != nil {
			return nil, err
		}
		return svc.ResizeVolume(r.PathValue("name"), req)
	})
	h("DELETE /v1/volumes/{name}", func(r *http.Request) (any, error) {
		return nil, svc.DeleteVolume(r.PathValue("name"), DeleteVolume{Snapshots: r.URL.Query().Get("snapshots") == "1"})
	})
	h("GET /v1/volumes/{name}/snapshots", func(r *http.Request) (any, error) {
		return svc.Snapshots(r.PathValue("name"))
	})
	h("GET /v1/snapshots", func(*http.Request) (any, error) { return svc.Snapshots("") })
	h("POST /v1/volumes/{name}/snapshots", func(r *http.Request) (any, error) {
		var req CreateSnapshot
		if err := decode(r, &req); err != nil {
			return nil, err
		}
		return svc.CreateSnapshot(r.PathValue("name"), req.Name)
	})
	h("DELETE /v1/volumes/{name}/snapshots/{snap}", func(r *http.Request) (any, error) {
		return nil, svc.DeleteSnapshot(r.PathValue("name"), r.PathValue("snap"))
	})
	h("POST /v1/volumes/{name}/snapshots/{snap}/clone", func(r *http.Request) (any, error) {
		var req CloneSnapshot
		if err := decode(r, &req); err != nil {
			return nil, err
		}
		return svc.CloneSnapshot(r.PathValue("name"), r.PathValue("snap"), req.Name)
	})
	h("GET /v1/acl", func(*http.Request) (any, error) { return svc.ACL() })
	h("POST /v1/acl", func(r *http.Request) (any, error) {
		var req ACLRule
		if err := decode(r, &req); err != nil {
			return nil, err
		}
		return nil, svc.SetACLRule(req)
	})
	h("DELETE /v1/acl", func(r *http.Request) (any, error) {
		q := r.URL.Query()
		return nil, svc.DeleteACLRule(q.Get("initiator"), q.Get("volume"))
	})
	h("PUT /v1/acl/default", func(r *http.Request) (any, error) {
		var req ACLDefault
		if err := decode(r, &req); err != nil {
			return nil, err
		}
		return nil, svc.SetACLDefault(req.DenyByDefault)
	})
	h("GET /v1/secrets", func(*http.Request) (any, error) { return svc.Secrets() })
	h("PUT /v1/secrets/{initiator}", func(r *http.Request) (any, error) {
		var req SetSecret
		if err := decode(r, &req); err != nil {
			return nil, err
		}
		return nil, svc.SetSecret(r.PathValue("initiator"), req)
	})
	h("DELETE /v1/secrets/{initiator}", func(r *http.Request) (any, error) {
		return nil, svc.DeleteSecret(r.PathValue("initiator"))
	})
	return mux
}

type errorBody struct {
	Error string `json:"error"`
	Kind  string `json:"kind,omitempty"`
}

func decode(r *http.Request, v any) error {
	dec := json.NewDecoder(io.LimitReader(r.Body, 1<<20))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return Errorf(ErrInvalid, "bad request body: %v", err)
	}
	return nil
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func statusOf(err error) int {
	switch {
	case errors.Is(err, ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, ErrExists), errors.Is(err, ErrBusy):
		return http.StatusConflict
	case errors.Is(err, ErrInvalid):
		return http.StatusBadRequest
	}
	return http.StatusInternalServerError
}
