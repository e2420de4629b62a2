package testserver

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"
)

// Certs are the files of a cluster set up as kubeadm sets etcd up: one CA, a member certificate
// for both serving and peer connections (127.0.0.1 and localhost, server and client usage),
// and kube-apiserver's client certificate.
type Certs struct {
	CA, MemberCert, MemberKey, ClientCert, ClientKey string
	// client and member are the loaded pairs; pool trusts the CA.
	client, member tls.Certificate
	pool           *x509.CertPool
}

var (
	certsOnce sync.Once
	certs     *Certs
	certsErr  error
)

// TLSWanted says whether the environment asks for TLS (STORAGE_SUITE_TLS set).
func TLSWanted() bool { return os.Getenv("STORAGE_SUITE_TLS") != "" }

// sharedCerts makes the certificates once per test process, in a directory of their own.
func sharedCerts() (*Certs, error) {
	certsOnce.Do(func() {
		dir, err := os.MkdirTemp("", "storage-suite-certs-")
		if err != nil {
			certsErr = err
			return
		}
		certs, certsErr = makeCerts(dir)
	})
	return certs, certsErr
}

// makeCerts writes a CA, a member pair and a client pair under dir (ECDSA P-256, PKCS#8 keys).
func makeCerts(dir string) (*Certs, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	now := time.Now().Add(-time.Hour)
	caTemplate := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "etcd-ca"},
		NotBefore:             now,
		NotAfter:              now.Add(48 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTemplate, caTemplate, &caKey.PublicKey, caKey)
	if err != nil {
		return nil, err
	}
	ca, err := x509.ParseCertificate(caDER)
	if err != nil {
		return nil, err
	}
	c := &Certs{CA: filepath.Join(dir, "ca.crt"), pool: x509.NewCertPool()}
	c.pool.AddCert(ca)
	if err := writePEM(c.CA, "CERTIFICATE", caDER); err != nil {
		return nil, err
	}
	member := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "member"},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth},
	}
	c.MemberCert, c.MemberKey = filepath.Join(dir, "member.crt"), filepath.Join(dir, "member.key")
	if c.member, err = issue(member, ca, caKey, c.MemberCert, c.MemberKey, now); err != nil {
		return nil, err
	}
	client := &x509.Certificate{
		SerialNumber: big.NewInt(3),
		Subject:      pkix.Name{CommonName: "kube-apiserver-etcd-client"},
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}
	c.ClientCert, c.ClientKey = filepath.Join(dir, "client.crt"), filepath.Join(dir, "client.key")
	if c.client, err = issue(client, ca, caKey, c.ClientCert, c.ClientKey, now); err != nil {
		return nil, err
	}
	return c, nil
}

// issue signs template with the CA, writes the certificate and a new key, and loads the pair.
func issue(template, ca *x509.Certificate, caKey *ecdsa.PrivateKey, certPath, keyPath string, now time.Time) (tls.Certificate, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, err
	}
	template.NotBefore, template.NotAfter = now, now.Add(48*time.Hour)
	template.KeyUsage = x509.KeyUsageDigitalSignature
	der, err := x509.CreateCertificate(rand.Reader, template, ca, &key.PublicKey, caKey)
	if err != nil {
		return tls.Certificate{}, err
	}
	keyDER, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return tls.Certificate{}, err
	}
	if err := writePEM(certPath, "CERTIFICATE", der); err != nil {
		return tls.Certificate{}, err
	}
	if err := writePEM(keyPath, "PRIVATE KEY", keyDER); err != nil {
		return tls.Certificate{}, err
	}
	return tls.LoadX509KeyPair(certPath, keyPath)
}

func writePEM(path, kind string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600)
}

// memberFlags are a member's TLS flags, as kubeadm writes them into etcd's manifest.
func (c *Certs) memberFlags() []string {
	return []string{
		"--cert-file", c.MemberCert, "--key-file", c.MemberKey,
		"--client-cert-auth", "--trusted-ca-file", c.CA,
		"--peer-cert-file", c.MemberCert, "--peer-key-file", c.MemberKey,
		"--peer-client-cert-auth", "--peer-trusted-ca-file", c.CA,
	}
}

// ClientTLS is what kube-apiserver's etcd client presents (--etcd-cafile, --etcd-certfile,
// --etcd-keyfile).
func (c *Certs) ClientTLS() *tls.Config {
	return &tls.Config{RootCAs: c.pool, Certificates: []tls.Certificate{c.client}, MinVersion: tls.VersionTLS12}
}

// ProxyFront is what a wirecheck proxy shows its clients: the member's certificate, and a
// demand for a client certificate from the CA, as the member makes.
func (c *Certs) ProxyFront() *tls.Config {
	return &tls.Config{
		Certificates: []tls.Certificate{c.member},
		ClientAuth:   tls.RequireAndVerifyClientCert,
		ClientCAs:    c.pool,
		NextProtos:   []string{"h2"},
		MinVersion:   tls.VersionTLS12,
	}
}

// ProxyBack is what a wirecheck proxy presents to the member it forwards to.
func (c *Certs) ProxyBack() *tls.Config {
	back := c.ClientTLS()
	back.NextProtos = []string{"h2"}
	return back
}

// scheme is the client URLs' scheme: https with TLS.
func scheme(withTLS bool) string {
	if withTLS {
		return "https"
	}
	return "http"
}

// mustCerts returns the shared certificates, failing the test if they cannot be made.
func mustCerts(t testing.TB) *Certs {
	c, err := sharedCerts()
	if err != nil {
		t.Fatal(fmt.Errorf("making TLS certificates: %w", err))
	}
	return c
}
