package main

// `k3s agent`: check the server's CA against the token, bootstrap a kubelet client
// certificate with the token (or reuse the stored one), then run the node.

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/base64"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	certificatesv1 "k8s.io/api/certificates/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	certificatesclient "k8s.io/client-go/kubernetes/typed/certificates/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
)

const (
	caRetryInterval  = 2 * time.Second // k3s's token validation loop (pkg/agent/run.go)
	csrWaitTimeout   = 5 * time.Minute
	kubeletClientCSR = "kubernetes.io/kube-apiserver-client-kubelet"
)

func runAgentCommand(args []string) int {
	if wantsHelp(args) {
		newOptions(agentFlags()).printHelp("agent")
		return 0
	}
	o, err := parseCommand(agentFlags(), args)
	if err != nil {
		fmt.Fprintf(os.Stderr, "Incorrect Usage: %v\n", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	if err := runAgent(ctx, o); err != nil {
		fatalf("%v", err)
	}
	return 0
}

// tokenFileWait is how long a missing --token-file is waited for, as k3s does
// (it logs "Waiting for <file> to be available" every 2 s, then gives up).
const tokenFileWait = 4 * time.Minute

// readToken returns --token, or the contents of --token-file (waited for while it
// does not exist, up to tokenFileWait, like k3s's util.ReadFile).
func readToken(ctx context.Context, o *options, flag, fileFlag string) (string, error) {
	if t := o.str(flag); t != "" {
		return strings.TrimSpace(t), nil
	}
	f := o.str(fileFlag)
	if f == "" {
		return "", nil
	}
	for start := time.Now(); time.Since(start) < tokenFileWait; {
		b, err := os.ReadFile(f)
		if err == nil {
			return strings.TrimSpace(string(b)), nil
		}
		if !errors.Is(err, os.ErrNotExist) {
			return "", err
		}
		infof("Waiting for %s to be available\n", f)
		if !sleepCtx(ctx, 2*time.Second) {
			return "", ctx.Err()
		}
	}
	return "", errors.New("Timeout while trying to read the file")
}

func runAgent(ctx context.Context, o *options) error {
	token, err := readToken(ctx, o, "token", "token-file")
	if err != nil {
		if ctx.Err() != nil {
			return nil
		}
		return err
	}
	spec, err := nodeOptions(o, "agent")
	if err != nil {
		return err
	}
	// As k3s: no token is needed when a kubelet client certificate is stored.
	if _, err := tls.LoadX509KeyPair(filepath.Join(spec.dataDir, "client-kubelet.crt"), filepath.Join(spec.dataDir, "client-kubelet.key")); err != nil && token == "" {
		return errors.New("--token is required")
	}
	serverURL := strings.TrimRight(o.str("server"), "/")
	if serverURL == "" {
		return errors.New("--server is required")
	}
	if u, err := url.Parse(serverURL); err != nil || u.Scheme != "https" || u.Host == "" {
		return fmt.Errorf("invalid --server %q: must be an https URL", serverURL)
	}
	if err := os.MkdirAll(spec.dataDir, 0o700); err != nil {
		return err
	}
	infof("Starting k3s agent %s (%s)", version, gitCommit)
	o.reportIgnored()

	storedCA, _ := os.ReadFile(filepath.Join(spec.dataDir, "server-ca.crt"))
	caBundle, ok := waitForCA(ctx, serverURL, token, storedCA)
	if !ok {
		return nil // stopped
	}
	cfg, ok, err := agentCredentials(ctx, serverURL, token, caBundle, spec)
	if err != nil {
		return err
	}
	if !ok {
		return nil
	}
	if !waitNodePassword(ctx, serverURL, caBundle, cfg.CertData, cfg.KeyData, spec.name) {
		return nil
	}
	if podRuntimeInstalled() {
		// The real kubelet serves the kubelet port; the tunnel reaches it on loopback.
		go runTunnel(ctx, serverURL, caBundle, cfg.CertData, cfg.KeyData, spec.kubeletPort)
		err := runPodAgent(ctx, cfg, spec, serverURL, caBundle)
		infof("k3s agent stopped")
		return err
	}
	stopPort, err := startKubeletPort(ctx, spec)
	if err != nil {
		return err
	}
	defer stopPort()
	// The API server reaches this kubelet through the agent's tunnel (k3s's egress-selector mode "agent").
	go runTunnel(ctx, serverURL, caBundle, cfg.CertData, cfg.KeyData, spec.kubeletPort)
	infof("Running kubelet stand-in for node %s (server %s)", spec.name, serverURL)
	err = runNode(ctx, cfg, spec, func(*corev1.Node) { sdNotify("READY=1") })
	infof("k3s agent stopped")
	return err
}

// insecureClient fetches /cacerts without verifying the server, as k3s does before
// it knows the CA; the hash in the token is what authenticates the answer.
func insecureClient() *http.Client {
	return &http.Client{
		Timeout: 10 * time.Second,
		Transport: &http.Transport{
			TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // checked against the token's hash
			Proxy:           http.ProxyFromEnvironment,
		},
	}
}

func getCACerts(ctx context.Context, client *http.Client, serverURL, bearer string) ([]byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, serverURL+"/cacerts", nil)
	if err != nil {
		return nil, err
	}
	if bearer != "" {
		req.Header.Set("Authorization", "Bearer "+bearer)
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if err != nil {
		return nil, err
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("%s: %s", serverURL+"/cacerts", resp.Status)
	}
	return body, nil
}

// waitForCA fetches the cluster CA from /cacerts until its hash matches the token's
// (no credentials are sent before that). Retries forever, every few seconds.
// Without a hash in the token, the CA stored by an earlier join (if any) must
// verify the server instead.
//
// As k3s's createProxyAndValidateToken (pkg/agent/run.go), the token is parsed first on
// every start, also when node credentials are stored: a token k3s refuses (an empty
// one: "token must not be empty") is logged as "Failed to validate connection to
// cluster at <url>: <why>" and retried every 2 s forever, so the kubelet never starts.
func waitForCA(ctx context.Context, serverURL, token string, storedCA []byte) ([]byte, bool) {
	client := insecureClient()
	parsed, tokenErr := validateAgentToken(token)
	want := parsed.caHash
	if want == "" && len(storedCA) > 0 {
		client = &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: mustPool(storedCA)}}}
	}
	warned := false
	for {
		var body []byte
		var err error
		if tokenErr == nil {
			body, err = getCACerts(ctx, client, serverURL, "")
		}
		switch {
		case ctx.Err() != nil:
			return nil, false
		case tokenErr != nil:
			errorf("Failed to validate connection to cluster at %s: %v", serverURL, tokenErr)
		case err != nil:
			errorf("Failed to validate connection to cluster at %s: failed to get CA certs: %v", serverURL, err)
		case want != "" && caHash(body) != want:
			errorf("Failed to validate connection to cluster at %s: token CA hash does not match the Cluster CA certificate hash: %s != %s", serverURL, want, caHash(body))
		default:
			if _, perr := parseCertsPEM(body); perr != nil {
				errorf("Failed to validate connection to cluster at %s: failed to parse CA certs: %v", serverURL, perr)
				break
			}
			if want == "" && len(storedCA) == 0 && !warned {
				warnf("Cluster CA certificate is not trusted by the host CA bundle, but the token does not include a CA hash. Use the full token from the server's node-token file to enable Cluster CA validation.")
				warned = true
			}
			return body, true
		}
		if !sleepCtx(ctx, caRetryInterval) {
			return nil, false
		}
	}
}

// agentCredentials returns a client config with the node's kubelet client
// certificate: the stored one when it is still valid for this CA and node,
// otherwise a new one obtained with the token.
func agentCredentials(ctx context.Context, serverURL, token string, caBundle []byte, spec nodeSpec) (*rest.Config, bool, error) {
	dir := spec.dataDir
	kubeconfig := filepath.Join(dir, "kubelet.kubeconfig")
	certPath, keyPath := filepath.Join(dir, "client-kubelet.crt"), filepath.Join(dir, "client-kubelet.key")
	caPath := filepath.Join(dir, "server-ca.crt")

	if cfg, reason := storedCredentials(ctx, kubeconfig, certPath, keyPath, caPath, serverURL, caBundle, spec.name); cfg != nil {
		infof("Using the kubelet client certificate stored in %s", certPath)
		return cfg, true, nil
	} else if reason != "" {
		infof("Stored kubelet credentials not used: %s", reason)
	}
	if token == "" {
		return nil, false, errors.New("--token is required")
	}
	t := parseToken(token)
	for {
		var certPEM, keyPEM []byte
		var err error
		if t.isBootstrap() {
			certPEM, keyPEM, err = bootstrapWithToken(ctx, serverURL, caBundle, t, spec.name)
		} else {
			certPEM, keyPEM, err = certificateFromSupervisor(ctx, serverURL, caBundle, t, spec.name)
		}
		if ctx.Err() != nil {
			return nil, false, nil
		}
		if err == nil {
			if err := writeFileAtomic(caPath, caBundle, 0o644); err != nil {
				return nil, false, err
			}
			if err := writeFileAtomic(keyPath, keyPEM, 0o600); err != nil {
				return nil, false, err
			}
			if err := writeFileAtomic(certPath, certPEM, 0o644); err != nil {
				return nil, false, err
			}
			if err := writeKubeconfig(kubeconfig, serverURL, caBundle, certPEM, keyPEM, 0o600); err != nil {
				return nil, false, err
			}
			infof("Kubelet client certificate for system:node:%s stored in %s", spec.name, certPath)
			return &rest.Config{Host: serverURL, TLSClientConfig: rest.TLSClientConfig{CAData: caBundle, CertData: certPEM, KeyData: keyPEM}}, true, nil
		}
		errorf("Failed to validate connection to cluster at %s: %v", serverURL, err)
		if !sleepCtx(ctx, caRetryInterval) {
			return nil, false, nil
		}
	}
}

// storedCredentials checks the stored kubeconfig: same server, same CA, a client
// certificate for this node that has not expired and that the API still accepts.
func storedCredentials(ctx context.Context, kubeconfig, certPath, keyPath, caPath, serverURL string, caBundle []byte, node string) (*rest.Config, string) {
	cfg, err := restConfigFromKubeconfig(kubeconfig)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, ""
		}
		return nil, err.Error()
	}
	if strings.TrimRight(cfg.Host, "/") != serverURL {
		return nil, fmt.Sprintf("they are for server %s", cfg.Host)
	}
	if !pemEqual(cfg.CAData, caBundle) {
		return nil, "the cluster CA changed"
	}
	certs, err := parseCertsPEM(cfg.CertData)
	if err != nil {
		return nil, err.Error()
	}
	if certs[0].Subject.CommonName != "system:node:"+node {
		return nil, fmt.Sprintf("the certificate is for %s", certs[0].Subject.CommonName)
	}
	if time.Now().After(certs[0].NotAfter) {
		return nil, "the certificate has expired"
	}
	// Ask the API whether it still accepts the certificate.
	core, err := corev1client.NewForConfig(clientConfig(cfg, "kubelet"))
	if err != nil {
		return nil, err.Error()
	}
	for {
		_, err = core.Nodes().Get(ctx, node, metav1.GetOptions{})
		if err == nil || apierrors.IsNotFound(err) {
			return cfg, ""
		}
		if apierrors.IsUnauthorized(err) {
			return nil, "the API server rejects the certificate (Unauthorized)"
		}
		errorf("Failed to validate connection to cluster at %s: %v", serverURL, err)
		if !sleepCtx(ctx, caRetryInterval) {
			return nil, "stopped"
		}
	}
}

// newNodeCSR makes a key and a CSR for CN system:node:<name>, O system:nodes.
func newNodeCSR(name string) (csrPEM, keyPEM []byte, err error) {
	k, err := newECKey()
	if err != nil {
		return nil, nil, err
	}
	der, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{
		Subject: pkix.Name{CommonName: "system:node:" + name, Organization: []string{"system:nodes"}},
	}, k)
	if err != nil {
		return nil, nil, err
	}
	if keyPEM, err = keyToPEM(k); err != nil {
		return nil, nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE REQUEST", Bytes: der}), keyPEM, nil
}

// bootstrapWithToken does kubelet TLS bootstrap: authenticated with the bootstrap
// token it creates a CertificateSigningRequest for the kubelet client signer and
// waits until the controller-manager has approved and signed it.
func bootstrapWithToken(ctx context.Context, serverURL string, caBundle []byte, t parsedToken, name string) ([]byte, []byte, error) {
	// Validate the token first, as k3s does with an authenticated /cacerts request.
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: mustPool(caBundle)}}}
	body, err := getCACerts(ctx, client, serverURL, t.creds)
	if err != nil {
		if strings.Contains(err.Error(), "401") {
			return nil, nil, fmt.Errorf("failed to get CA certs: %s/cacerts: 401 Unauthorized", serverURL)
		}
		return nil, nil, fmt.Errorf("failed to get CA certs: %w", err)
	}
	if !bytes.Equal(body, caBundle) {
		return nil, nil, errors.New("the cluster CA changed while joining")
	}

	cfg := clientConfig(&rest.Config{Host: serverURL, BearerToken: t.creds, TLSClientConfig: rest.TLSClientConfig{CAData: caBundle}}, "kubelet-bootstrap")
	cs, err := certificatesclient.NewForConfig(cfg)
	if err != nil {
		return nil, nil, err
	}
	csrPEM, keyPEM, err := newNodeCSR(name)
	if err != nil {
		return nil, nil, err
	}
	sum := sha256.Sum256(csrPEM)
	csrName := "node-csr-" + strings.TrimRight(base64.RawURLEncoding.EncodeToString(sum[:]), "=")[:32]
	// An ECDSA key: digital signature and client auth (key encipherment is for RSA).
	usages := []certificatesv1.KeyUsage{certificatesv1.UsageDigitalSignature, certificatesv1.UsageClientAuth}
	csr, err := cs.CertificateSigningRequests().Create(ctx, &certificatesv1.CertificateSigningRequest{
		ObjectMeta: metav1.ObjectMeta{Name: csrName},
		Spec: certificatesv1.CertificateSigningRequestSpec{
			Request:    csrPEM,
			SignerName: kubeletClientCSR,
			Usages:     usages,
		},
	}, metav1.CreateOptions{})
	if err != nil {
		if apierrors.IsUnauthorized(err) {
			return nil, nil, fmt.Errorf("failed to create certificate signing request: Unauthorized")
		}
		return nil, nil, fmt.Errorf("failed to create certificate signing request: %w", err)
	}
	infof("Waiting for certificate signing request %s (signer %s) to be approved and issued", csr.Name, kubeletClientCSR)
	wctx, cancel := context.WithTimeout(ctx, csrWaitTimeout)
	defer cancel()
	for {
		got, err := cs.CertificateSigningRequests().Get(wctx, csr.Name, metav1.GetOptions{})
		if err != nil && wctx.Err() == nil {
			warnf("Failed to get certificate signing request %s: %v", csr.Name, err)
		}
		if got != nil {
			if got.UID != csr.UID {
				return nil, nil, fmt.Errorf("certificate signing request %s was replaced", csr.Name)
			}
			for _, c := range got.Status.Conditions {
				switch c.Type {
				case certificatesv1.CertificateDenied:
					return nil, nil, fmt.Errorf("certificate signing request %s was denied: %s %s", csr.Name, c.Reason, c.Message)
				case certificatesv1.CertificateFailed:
					return nil, nil, fmt.Errorf("certificate signing request %s failed: %s %s", csr.Name, c.Reason, c.Message)
				}
			}
			if len(got.Status.Certificate) > 0 {
				certs, err := parseCertsPEM(got.Status.Certificate)
				if err != nil {
					return nil, nil, fmt.Errorf("certificate signing request %s: %w", csr.Name, err)
				}
				if certs[0].Subject.CommonName != "system:node:"+name {
					return nil, nil, fmt.Errorf("issued certificate is for %s", certs[0].Subject.CommonName)
				}
				infof("Certificate signing request %s approved and issued", csr.Name)
				return got.Status.Certificate, keyPEM, nil
			}
		}
		if !sleepCtx(wctx, time.Second) {
			if ctx.Err() != nil {
				return nil, nil, ctx.Err()
			}
			return nil, nil, fmt.Errorf("timed out waiting for certificate signing request %s to be approved and issued", csr.Name)
		}
	}
}

// certificateFromSupervisor: with a server token (not a bootstrap token) the
// supervisor itself signs the node's CSR after checking the token's password.
func certificateFromSupervisor(ctx context.Context, serverURL string, caBundle []byte, t parsedToken, name string) ([]byte, []byte, error) {
	csrPEM, keyPEM, err := newNodeCSR(name)
	if err != nil {
		return nil, nil, err
	}
	client := &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: mustPool(caBundle)}}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, serverURL+supervisorKubeletCertPath, bytes.NewReader(csrPEM))
	if err != nil {
		return nil, nil, err
	}
	req.SetBasicAuth("node", t.password)
	req.Header.Set(nodeNameHeader, name)
	resp, err := client.Do(req)
	if err != nil {
		return nil, nil, fmt.Errorf("failed to get CA certs: %w", err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	if resp.StatusCode != http.StatusOK {
		return nil, nil, fmt.Errorf("failed to get CA certs: %s%s: %s", serverURL, supervisorKubeletCertPath, resp.Status)
	}
	if _, err := parseCertsPEM(body); err != nil {
		return nil, nil, err
	}
	return body, keyPEM, nil
}

func mustPool(caBundle []byte) *x509.CertPool {
	p, err := certPool(caBundle)
	if err != nil {
		return x509.NewCertPool()
	}
	return p
}
