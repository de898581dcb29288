// Package testcerts makes throwaway X.509 certificates for TLS tests: a
// CA, a server certificate for localhost, 127.0.0.1 and ::1, and a client
// certificate, both signed by the CA, written as PEM files in the layout
// nbdkit, qemu-nbd and libnbd's tls-certificates directory use:
//
//	dir := t.TempDir()
//	testcerts.Write(t, dir)     // ca-cert.pem, server-*.pem, client-*.pem
//	srv, cli := testcerts.Configs(t, dir)
//
// The keys are ECDSA P-256, valid for a day; nothing here is fit for
// anything but a test.
package testcerts

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// The files Write creates in its directory.
const (
	CACert     = "ca-cert.pem"
	ServerCert = "server-cert.pem"
	ServerKey  = "server-key.pem"
	ClientCert = "client-cert.pem"
	ClientKey  = "client-key.pem"
)

// Write creates the CA, server and client certificates and keys in dir.
func Write(t testing.TB, dir string) {
	t.Helper()
	now := time.Now()
	caKey := newKey(t)
	ca := &x509.Certificate{
		SerialNumber: big.NewInt(1), Subject: pkix.Name{CommonName: "gosrp test CA"},
		NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
		IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, ca, ca, &caKey.PublicKey, caKey)
	if err != nil {
		t.Fatal(err)
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		t.Fatal(err)
	}
	writePEM(t, filepath.Join(dir, CACert), "CERTIFICATE", caDER)
	leaf := func(serial int64, name string, usage x509.ExtKeyUsage, certFile, keyFile string, server bool) {
		key := newKey(t)
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(serial), Subject: pkix.Name{CommonName: name},
			NotBefore: now.Add(-time.Hour), NotAfter: now.Add(24 * time.Hour),
			KeyUsage: x509.KeyUsageDigitalSignature, ExtKeyUsage: []x509.ExtKeyUsage{usage},
		}
		if server {
			tmpl.DNSNames = []string{"localhost"}
			tmpl.IPAddresses = []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback}
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
		if err != nil {
			t.Fatal(err)
		}
		kder, err := x509.MarshalPKCS8PrivateKey(key)
		if err != nil {
			t.Fatal(err)
		}
		writePEM(t, filepath.Join(dir, certFile), "CERTIFICATE", der)
		writePEM(t, filepath.Join(dir, keyFile), "PRIVATE KEY", kder)
	}
	leaf(2, "localhost", x509.ExtKeyUsageServerAuth, ServerCert, ServerKey, true)
	leaf(3, "client", x509.ExtKeyUsageClientAuth, ClientCert, ClientKey, false)
}

// Configs loads what Write made: a server configuration that requires a
// client certificate signed by the CA, and a client configuration that
// presents one and trusts the CA for "localhost".
func Configs(t testing.TB, dir string) (server, client *tls.Config) {
	t.Helper()
	pool := x509.NewCertPool()
	ca, err := os.ReadFile(filepath.Join(dir, CACert))
	if err != nil {
		t.Fatal(err)
	}
	if !pool.AppendCertsFromPEM(ca) {
		t.Fatal("testcerts: no certificate in " + CACert)
	}
	srv, err := tls.LoadX509KeyPair(filepath.Join(dir, ServerCert), filepath.Join(dir, ServerKey))
	if err != nil {
		t.Fatal(err)
	}
	cli, err := tls.LoadX509KeyPair(filepath.Join(dir, ClientCert), filepath.Join(dir, ClientKey))
	if err != nil {
		t.Fatal(err)
	}
	server = &tls.Config{Certificates: []tls.Certificate{srv}, ClientAuth: tls.RequireAndVerifyClientCert, ClientCAs: pool, MinVersion: tls.VersionTLS12}
	client = &tls.Config{Certificates: []tls.Certificate{cli}, RootCAs: pool, ServerName: "localhost", MinVersion: tls.VersionTLS12}
	return server, client
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

func writePEM(t testing.TB, path, typ string, der []byte) {
	t.Helper()
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600); err != nil {
		t.Fatal(err)
	}
}
