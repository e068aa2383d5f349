package main

// `k3s agent`: start the client-side load balancer, check the server's CA against the
// token, fetch the agent configuration, present the node password, get a kubelet client
// certificate from the supervisor (a new one at every start, as k3s), then run the node.

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
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

	corev1 "k8s.io/api/core/v1"
	"k8s.io/client-go/rest"
)

const (
	caRetryInterval = 2 * time.Second // k3s's token validation loop (pkg/agent/run.go)
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
	port, err := lbServerPort(o)
	if err != nil {
		return err
	}
	// As k3s: the load balancer first, then everything through it (lb.go).
	lb, err := startLoadBalancer(ctx, serverURL, port)
	if err != nil {
		return err
	}
	localURL := lb.URL()

	storedCA, _ := os.ReadFile(filepath.Join(spec.dataDir, "server-ca.crt"))
	caBundle, ok := waitForCA(ctx, serverURL, localURL, token, storedCA)
	if !ok {
		return nil // stopped
	}
	auth := agentAuth{token: parseToken(token)}
	if cert, err := tls.LoadX509KeyPair(filepath.Join(spec.dataDir, "client-kubelet.crt"), filepath.Join(spec.dataDir, "client-kubelet.key")); err == nil {
		auth.cert = &cert
	}
	control, ok := waitAgentConfig(ctx, localURL, caBundle, auth)
	if !ok {
		return nil
	}
	// As k3s's agent: the flannel backend and the other settings of the server's it uses are
	// read once here; a change on the server reaches this node only when the agent starts again.
	applyAgentSettings(&spec, control)
	stageBundle(o.str("data-dir"))
	installNodeRules(control.ClusterCIDR, spec.flannelBackend, spec.kubeProxy)
	pass, ok := waitNodePassword(ctx, localURL, caBundle, auth, spec.name)
	if !ok {
		return nil
	}
	cfg, ok, err := agentCredentials(ctx, localURL, auth, pass, caBundle, spec)
	if err != nil {
		return err
	}
	if !ok {
		return nil
	}
	if podRuntimeInstalled() {
		kubelet, err := ownKubelet(kubeletsDir, version)
		if err != nil {
			return err
		}
		// The real kubelet serves the kubelet port; the tunnel reaches it on loopback. As k3s's
		// (pkg/agent/tunnel), the tunnel dials the server itself, not the load balancer.
		go runTunnel(ctx, serverURL, caBundle, cfg.CertData, cfg.KeyData, spec.kubeletPort)
		err = runPodAgent(ctx, kubelet, cfg, spec, localURL, caBundle)
		infof("k3s agent stopped")
		return err
	}
	stopPort, err := startKubeletPort(ctx, spec)
	if err != nil {
		return err
	}
	defer stopPort()
	// The API server reaches this kubelet through the agent's tunnel (k3s's egress-selector mode
	// "agent"), dialled to the server itself, not through the load balancer.
	go runTunnel(ctx, serverURL, caBundle, cfg.CertData, cfg.KeyData, spec.kubeletPort)
	infof("Running kubelet stand-in for node %s (server %s)", spec.name, serverURL)
	err = runNode(ctx, cfg, spec, func(*corev1.Node) { notifyAgentReady(ctx, cfg, spec) })
	infof("k3s agent stopped")
	return err
}

// waitAgentConfig fetches the agent configuration with the token's credentials (and any
// stored node certificate) until the supervisor accepts them, every 5 s at info level, as
// k3s's agent (pkg/agent/config/config.go): a deleted or expired token is refused here,
// worded as this version's agent words it (agentauth.go).
func waitAgentConfig(ctx context.Context, serverURL string, caBundle []byte, auth agentAuth) (agentControlConfig, bool) {
	client := auth.client(caBundle)
	for {
		var control agentControlConfig
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, serverURL+agentConfigPath, nil)
		if err != nil {
			return control, false
		}
		auth.apply(req)
		resp, err := client.Do(req)
		if ctx.Err() != nil {
			return control, false
		}
		if err == nil {
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				if err = json.Unmarshal(body, &control); err == nil {
					return control, true
				}
			} else {
				err = responseError(version, resp, body)
			}
		}
		infof("Waiting to retrieve agent configuration; server is not ready: failed to retrieve configuration from server: %v", err)
		if !sleepCtx(ctx, nodePasswordRetry) {
			return control, false
		}
	}
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
//
// The requests go to requestURL (the load balancer); the log names the server, as k3s's does.
func waitForCA(ctx context.Context, serverURL, requestURL, token string, storedCA []byte) ([]byte, bool) {
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
			body, err = getCACerts(ctx, client, requestURL, "")
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

// agentCredentials returns a client config with a kubelet client certificate the supervisor
// signs now: as k3s's agent, which asks for a new client-kubelet.crt at every start
// (pkg/agent/config/config.go get: getNodeNamedHostFile, authenticated by the token and the
// certificate it holds; its handler checks the node password again before it signs), so every
// start renews it, and one that has expired can no longer get its successor (the supervisor
// refuses it, and a spent token with it).
func agentCredentials(ctx context.Context, serverURL string, auth agentAuth, pass string, caBundle []byte, spec nodeSpec) (*rest.Config, bool, error) {
	dir := spec.dataDir
	kubeconfig := filepath.Join(dir, "kubelet.kubeconfig")
	certPath, keyPath := filepath.Join(dir, "client-kubelet.crt"), filepath.Join(dir, "client-kubelet.key")
	caPath := filepath.Join(dir, "server-ca.crt")
	if auth.token.creds == "" && auth.cert == nil {
		return nil, false, errors.New("--token is required")
	}
	for {
		certPEM, keyPEM, err := certificateFromSupervisor(ctx, serverURL, caBundle, auth, pass, spec.name)
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
		infof("Waiting to retrieve agent configuration; server is not ready: %v", err)
		if !sleepCtx(ctx, nodePasswordRetry) {
			return nil, false, nil
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

// certificateFromSupervisor asks the supervisor for the node's kubelet client certificate
// (k3s's getNodeNamedCrt on /v1-k3s/client-kubelet.crt): a CSR for the node's key, the
// token's credentials, the node name and password; a refused password is "Node password
// rejected" (403), as k3s words it.
func certificateFromSupervisor(ctx context.Context, serverURL string, caBundle []byte, auth agentAuth, pass, name string) ([]byte, []byte, error) {
	csrPEM, keyPEM, err := newNodeCSR(name)
	if err != nil {
		return nil, nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, serverURL+supervisorKubeletCertPath, bytes.NewReader(csrPEM))
	if err != nil {
		return nil, nil, err
	}
	auth.apply(req)
	req.Header.Set(nodeNameHeader, name)
	req.Header.Set(nodePasswordHeader, pass)
	resp, err := doNodeNamed(auth.client(caBundle), auth, caBundle, req)
	if err != nil {
		return nil, nil, err
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	switch {
	case resp.StatusCode == http.StatusForbidden:
		return nil, nil, fmt.Errorf(nodePasswordRejected, nodePasswordFile())
	case resp.StatusCode == http.StatusUnauthorized:
		return nil, nil, fmt.Errorf("%s: %s", resp.Request.URL, resp.Status)
	case resp.StatusCode != http.StatusOK:
		return nil, nil, responseError(version, resp, body)
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
