package main

// How long the certificates k3s signs last, when k3s renews them, and `k3s certificate rotate`.
//
// k3s signs every leaf certificate (the server's serving and client certificates under
// <data-dir>/server/tls, the nodes' client and serving certificates) for a year
// (rancher/dynamiclistener cert.NewSignedCert), and renews one only at a start: a server
// certificate is signed afresh when it is missing, when its subject or names changed, or when it
// expires within the renewal window, config.CertificateRenewDays = 90 days
// (pkg/daemons/control/deps/deps.go createClientCertKey: `regen = regen || expired(certFile) ||
// fieldsChanged(...)`, expired() = certutil.IsCertExpired(cert, CertificateRenewDays)). A running
// server renews nothing, and a start more than 90 days before the expiry renews nothing either.
// The CAs last ten years and are never renewed here.
//
// Lab setting (LAB ONLY, k3s has no such variables): the year and the 90 days are
// $HK3S_LAB_CERT_LIFETIME and $HK3S_LAB_CERT_RENEW_WINDOW (Go durations, e.g. "3h" and "10m"),
// read from the environment of the process that signs (the k3s unit: a lab test gives it a
// systemd drop-in with Environment= lines), so a lab test sees a server's certificates come
// into their renewal window and run out within minutes rather than a year.
//
// `k3s certificate rotate` (pkg/cli/cert/cert.go rotate, pkg/util/services FilesForServices):
// on a host with a server data directory, copies <data-dir>/server/tls to
// <data-dir>/server/tls-<unix time>, writes <data-dir>/server/tls/dynamic-cert-regenerate, and
// removes the leaf certificates and keys of every service (admin, api-server, auth-proxy,
// controller-manager, scheduler, supervisor, cloud-controller, kube-proxy, k3s-controller,
// kubelet; never a CA), on the server and in <data-dir>/agent. Nothing is signed: the next start
// signs what is missing ("please restart k3s server or agent to rotate certificates"). k3s's
// documentation has k3s stopped around it (docs.k3s.io/cli/certificate).

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"time"
)

const (
	certLifetimeEnv       = "HK3S_LAB_CERT_LIFETIME"
	certRenewWindowEnv    = "HK3S_LAB_CERT_RENEW_WINDOW"
	defaultCertLifetime   = 365 * 24 * time.Hour
	defaultCertRenewDays  = 90
	defaultCertRenewRange = defaultCertRenewDays * 24 * time.Hour
)

func durationFromEnv(name string, fallback time.Duration) time.Duration {
	value := os.Getenv(name)
	if value == "" {
		return fallback
	}
	d, err := time.ParseDuration(value)
	if err != nil || d <= 0 {
		warnf("ignoring $%s=%q: not a positive Go duration", name, value)
		return fallback
	}
	return d
}

// certLifetime: how long a leaf certificate signed now lasts (k3s: a year).
func certLifetime() time.Duration { return durationFromEnv(certLifetimeEnv, defaultCertLifetime) }

// certRenewWindow: a start renews a certificate that expires within this (k3s: 90 days).
func certRenewWindow() time.Duration {
	return durationFromEnv(certRenewWindowEnv, defaultCertRenewRange)
}

// certExpiring is deps.go's expired(): the certificate ends within the renewal window.
func certExpiring(notAfter time.Time) bool { return time.Until(notAfter) < certRenewWindow() }

// rotatedServerFiles: the leaf certificates and keys `k3s certificate rotate` removes under
// <data-dir>/server/tls (FilesForServices for services.All), the CAs left alone.
var rotatedServerFiles = []string{
	"client-admin", "client-kube-apiserver", "serving-kube-apiserver", "client-controller",
	"client-scheduler", "client-supervisor", "client-auth-proxy", "client-k3s-cloud-controller",
	"client-kube-proxy", "client-k3s-controller",
}

// rotatedAgentFiles: the same under <data-dir>/agent.
var rotatedAgentFiles = []string{"client-k3s-controller", "client-kubelet", "serving-kubelet", "client-kube-proxy"}

func certificateFlags() []*flagDef {
	return []*flagDef{
		str("data-dir", []string{"d"}, defaultDataDir, []string{"K3S_DATA_DIR"}, "(data) Folder to hold state"),
		list("service", []string{"s"}, "List of services to manage certificates for (all here)"),
		boolean("debug", nil, "(logging) Turn on debug logs"),
		ignoredStr("config"),
	}
}

func runCertificateCommand(args []string) int {
	if len(args) == 0 || args[0] == "--help" || args[0] == "-h" {
		fmt.Print("NAME:\n   k3s certificate - Manage K3s certificates\n\nCOMMANDS:\n   rotate  Rotate " +
			"certificates (the next start signs new ones)\n")
		return 0
	}
	sub := args[0]
	o := newOptions(certificateFlags())
	if !o.parseSubcommandArgs(args[1:]) {
		return 1
	}
	switch sub {
	case "rotate":
		if err := rotateCertificates(o.str("data-dir"), time.Now()); err != nil {
			fatalf("%v", err)
		}
		return 0
	default:
		fmt.Fprintf(os.Stderr, "k3s certificate %s: not available in this build\n", sub)
		return 1
	}
}

// rotateCertificates is pkg/cli/cert rotate for services.All.
func rotateCertificates(dataDir string, now time.Time) error {
	serverDir := filepath.Join(dataDir, "server")
	agentDir := filepath.Join(dataDir, "agent")
	tlsDir := filepath.Join(serverDir, "tls")
	var files []string
	backup := filepath.Join(agentDir, fmt.Sprintf("tls-%d", now.Unix()))
	if _, err := os.Stat(serverDir); err == nil {
		infof("Server detected, rotating agent and server certificates")
		backup = filepath.Join(serverDir, fmt.Sprintf("tls-%d", now.Unix()))
		if err := copyTree(tlsDir, backup); err != nil {
			return err
		}
		for _, name := range rotatedServerFiles {
			files = append(files, filepath.Join(tlsDir, name+".crt"), filepath.Join(tlsDir, name+".key"))
		}
		if err := os.WriteFile(filepath.Join(tlsDir, "dynamic-cert-regenerate"), nil, 0o600); err != nil {
			return err
		}
		infof("Rotating dynamic listener certificate")
	} else if !os.IsNotExist(err) {
		return err
	} else {
		infof("Agent detected, rotating agent certificates")
		if err := os.MkdirAll(backup, 0o700); err != nil {
			return err
		}
	}
	for _, name := range rotatedAgentFiles {
		for _, ext := range []string{".crt", ".key"} {
			path := filepath.Join(agentDir, name+ext)
			if _, err := os.Stat(path); err == nil {
				if err := copyFile(path, filepath.Join(backup, name+ext), keepMode(path)); err != nil {
					return err
				}
			}
			files = append(files, path)
		}
	}
	infof("Rotating certificates")
	for _, f := range files {
		if err := os.Remove(f); err == nil {
			debugf("file %s is deleted", f)
		}
	}
	infof("Successfully backed up certificates to %s, please restart k3s server or agent to rotate certificates", backup)
	return nil
}

// copyTree copies the regular files under src into dst (k3s copies server/tls whole).
func copyTree(src, dst string) error {
	return filepath.Walk(src, func(path string, fi os.FileInfo, err error) error {
		if err != nil {
			return err
		}
		rel, err := filepath.Rel(src, path)
		if err != nil || strings.HasPrefix(rel, "..") {
			return err
		}
		target := filepath.Join(dst, rel)
		if fi.IsDir() {
			return os.MkdirAll(target, 0o700)
		}
		if !fi.Mode().IsRegular() {
			return nil
		}
		return copyFile(path, target, fi.Mode().Perm())
	})
}

// keepMode is the permission bits of the file at path (0600 when it cannot be read): a backup
// keeps the mode of what it copies, keys staying private.
func keepMode(path string) os.FileMode {
	if fi, err := os.Stat(path); err == nil {
		return fi.Mode().Perm()
	}
	return 0o600
}
