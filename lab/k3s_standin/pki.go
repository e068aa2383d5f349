package main

// Certificates and keys: CAs that are created once and kept, leaf certificates that
// are reused while they still match what is wanted.

import (
	"bytes"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"errors"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"time"
)

type keyPair struct {
	cert    *x509.Certificate
	key     crypto.Signer
	certPEM []byte
}

type certSpec struct {
	cn     string
	orgs   []string
	dns    []string
	ips    []net.IP
	client bool
	server bool
	days   int
}

// writeFileAtomic writes data to path through a temporary file.
func writeFileAtomic(path string, data []byte, mode os.FileMode) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), "."+filepath.Base(path)+".tmp")
	if err != nil {
		return err
	}
	defer os.Remove(tmp.Name())
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Chmod(mode); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return os.Rename(tmp.Name(), path)
}

func newECKey() (*ecdsa.PrivateKey, error) {
	return ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
}

func keyToPEM(key crypto.Signer) ([]byte, error) {
	der, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), nil
}

func certToPEM(der []byte) []byte {
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
}

func parseKeyPEM(data []byte) (crypto.Signer, error) {
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			return nil, errors.New("no private key in PEM data")
		}
		switch block.Type {
		case "PRIVATE KEY":
			k, err := x509.ParsePKCS8PrivateKey(block.Bytes)
			if err != nil {
				return nil, err
			}
			s, ok := k.(crypto.Signer)
			if !ok {
				return nil, errors.New("unsupported private key type")
			}
			return s, nil
		case "EC PRIVATE KEY":
			return x509.ParseECPrivateKey(block.Bytes)
		case "RSA PRIVATE KEY":
			return x509.ParsePKCS1PrivateKey(block.Bytes)
		}
	}
}

func parseCertsPEM(data []byte) ([]*x509.Certificate, error) {
	var certs []*x509.Certificate
	for {
		var block *pem.Block
		block, data = pem.Decode(data)
		if block == nil {
			break
		}
		if block.Type != "CERTIFICATE" {
			continue
		}
		c, err := x509.ParseCertificate(block.Bytes)
		if err != nil {
			return nil, err
		}
		certs = append(certs, c)
	}
	if len(certs) == 0 {
		return nil, errors.New("no certificate in PEM data")
	}
	return certs, nil
}

func loadKeyPair(certPath, keyPath string) (*keyPair, error) {
	certPEM, err := os.ReadFile(certPath)
	if err != nil {
		return nil, err
	}
	keyPEM, err := os.ReadFile(keyPath)
	if err != nil {
		return nil, err
	}
	certs, err := parseCertsPEM(certPEM)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", certPath, err)
	}
	key, err := parseKeyPEM(keyPEM)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", keyPath, err)
	}
	return &keyPair{cert: certs[0], key: key, certPEM: certPEM}, nil
}

func randomSerial() (*big.Int, error) {
	return rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 127))
}

// loadOrCreateCA returns the CA in certPath/keyPath, creating it when absent.
// The CN gets an @<unix time> suffix as k3s's CAs have.
func loadOrCreateCA(certPath, keyPath, cnPrefix string) (*keyPair, error) {
	if kp, err := loadKeyPair(certPath, keyPath); err == nil {
		return kp, nil
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	key, err := newECKey()
	if err != nil {
		return nil, err
	}
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: fmt.Sprintf("%s@%d", cnPrefix, now.Unix())},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.AddDate(10, 0, 0),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign | x509.KeyUsageDigitalSignature,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, key.Public(), key)
	if err != nil {
		return nil, err
	}
	keyPEM, err := keyToPEM(key)
	if err != nil {
		return nil, err
	}
	if err := writeFileAtomic(keyPath, keyPEM, 0o600); err != nil {
		return nil, err
	}
	certPEM := certToPEM(der)
	if err := writeFileAtomic(certPath, certPEM, 0o644); err != nil {
		return nil, err
	}
	cert, _ := x509.ParseCertificate(der)
	return &keyPair{cert: cert, key: key, certPEM: certPEM}, nil
}

// signCert signs a certificate for pub with the CA (ca == nil: self-signed with key).
func signCert(ca *keyPair, pub crypto.PublicKey, self crypto.Signer, spec certSpec) ([]byte, error) {
	serial, err := randomSerial()
	if err != nil {
		return nil, err
	}
	lifetime := certLifetime()
	if spec.days != 0 {
		lifetime = time.Duration(spec.days) * 24 * time.Hour
	}
	now := time.Now()
	tmpl := &x509.Certificate{
		SerialNumber: serial,
		Subject:      pkix.Name{CommonName: spec.cn, Organization: spec.orgs},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(lifetime),
		KeyUsage:     x509.KeyUsageDigitalSignature | x509.KeyUsageKeyEncipherment,
		DNSNames:     spec.dns,
		IPAddresses:  spec.ips,
	}
	if spec.client {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageClientAuth)
	}
	if spec.server {
		tmpl.ExtKeyUsage = append(tmpl.ExtKeyUsage, x509.ExtKeyUsageServerAuth)
	}
	if ca == nil {
		return x509.CreateCertificate(rand.Reader, tmpl, tmpl, pub, self)
	}
	return x509.CreateCertificate(rand.Reader, tmpl, ca.cert, pub, ca.key)
}

// certMatches: the certificate was issued by ca (nil: any), does not expire within the
// renewal window (certlife.go: deps.go's expired()), and has the spec's subject and at least
// its names (deps.go's fieldsChanged()).
func certMatches(c *x509.Certificate, ca *keyPair, spec certSpec) bool {
	if certExpiring(c.NotAfter) {
		return false
	}
	if ca != nil && c.CheckSignatureFrom(ca.cert) != nil {
		return false
	}
	if c.Subject.CommonName != spec.cn || !slices.Equal(c.Subject.Organization, spec.orgs) {
		return false
	}
	for _, d := range spec.dns {
		if !slices.Contains(c.DNSNames, d) {
			return false
		}
	}
	for _, ip := range spec.ips {
		if !slices.ContainsFunc(c.IPAddresses, ip.Equal) {
			return false
		}
	}
	return true
}

// ensureCert returns the certificate at certPath/keyPath when it still matches spec,
// and otherwise issues a new one (a new key too). ca == nil: self-signed.
func ensureCert(ca *keyPair, certPath, keyPath string, spec certSpec) (*keyPair, error) {
	if kp, err := loadKeyPair(certPath, keyPath); err == nil && certMatches(kp.cert, ca, spec) {
		return kp, nil
	}
	key, err := newECKey()
	if err != nil {
		return nil, err
	}
	der, err := signCert(ca, key.Public(), key, spec)
	if err != nil {
		return nil, err
	}
	keyPEM, err := keyToPEM(key)
	if err != nil {
		return nil, err
	}
	if err := writeFileAtomic(keyPath, keyPEM, 0o600); err != nil {
		return nil, err
	}
	certPEM := certToPEM(der)
	if ca != nil {
		// Chain: leaf then CA, as k3s writes its certificates.
		certPEM = append(certPEM, ca.certPEM...)
	}
	if err := writeFileAtomic(certPath, certPEM, 0o644); err != nil {
		return nil, err
	}
	cert, _ := x509.ParseCertificate(der)
	return &keyPair{cert: cert, key: key, certPEM: certPEM}, nil
}

// ensureRSAKey creates an RSA private key file once (the service-account key).
func ensureRSAKey(path string) error {
	if _, err := os.Stat(path); err == nil {
		return nil
	}
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		return err
	}
	der := x509.MarshalPKCS1PrivateKey(key)
	return writeFileAtomic(path, pem.EncodeToMemory(&pem.Block{Type: "RSA PRIVATE KEY", Bytes: der}), 0o600)
}

// caHash is the hash a secure token carries, as k3s's hashCA (pkg/clientaccess/token.go):
// SHA-256 of the CA bundle bytes as /cacerts serves them; for a bundle of several
// certificates, of the DER of the root the first one verifies to (roots: the others
// without an authority key id or self-signed), the raw bytes when none verifies.
func caHash(caBundle []byte) string {
	b := caBundle
	if certs, err := parseCertsPEM(caBundle); err == nil && len(certs) > 1 {
		roots, inter := x509.NewCertPool(), x509.NewCertPool()
		for _, c := range certs[1:] {
			if len(c.AuthorityKeyId) == 0 || bytes.Equal(c.AuthorityKeyId, c.SubjectKeyId) {
				roots.AddCert(c)
			} else {
				inter.AddCert(c)
			}
		}
		if chains, err := certs[0].Verify(x509.VerifyOptions{Roots: roots, Intermediates: inter}); err == nil {
			chain := chains[0]
			b = chain[len(chain)-1].Raw
		}
	}
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

func certPool(pemData []byte) (*x509.CertPool, error) {
	pool := x509.NewCertPool()
	if !pool.AppendCertsFromPEM(pemData) {
		return nil, errors.New("no certificates in CA bundle")
	}
	return pool, nil
}

func pemEqual(a, b []byte) bool { return bytes.Equal(bytes.TrimSpace(a), bytes.TrimSpace(b)) }
