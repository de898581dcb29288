//go:build !(linux && cgo && ibverbs)

package ibverbs

import "github.com/gosrp/gosrp/transport"

func init() {
	transport.RegisterHint("ibverbs", "rebuild with: go build -tags ibverbs (needs libibverbs-dev and librdmacm-dev)")
}
