package main

// The supervisor: the HTTPS listener on 6443. Like k3s's it answers /cacerts and
// /ping itself and hands everything else to the Kubernetes API server, which
// listens on 127.0.0.1 only. Callers that present a client certificate of the
// cluster's client CA are passed on with their identity in request headers,
// authenticated to the apiserver by the request-header (front-proxy) client
// certificate; bearer tokens are passed on as they are.

import (
	"context"
	"crypto/subtle"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"encoding/pem"
	"errors"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"net/http/httputil"
	"net/url"
	"slices"
	"strings"
	"time"

	authenticationv1 "k8s.io/api/authentication/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	authenticationclient "k8s.io/client-go/kubernetes/typed/authentication/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
)

const (
	supervisorKubeletCertPath = "/v1-k3s/client-kubelet.crt"
	agentConfigPath           = "/v1-k3s/config"
	nodeNameHeader            = "K3s-Node-Name"
	// The group k3s gives callers of the server token ("node:<password>").
	agentGroup = "k3s:agent"
)

type supervisor struct {
	s            *server
	clientPool   *x509.CertPool
	authed       *httputil.ReverseProxy // with the front-proxy client certificate
	plain        *httputil.ReverseProxy // no client certificate
	tokenReviews authenticationclient.TokenReviewInterface
	passwords    []string
	tunnels      *tunnelServer
	secrets      corev1client.SecretInterface // kube-system: node passwords
	nodes        corev1client.NodeInterface   // verifyNode
}

func newSupervisor(s *server, passwords []string) (*supervisor, error) {
	pool, err := certPool(s.clientCA.certPEM)
	if err != nil {
		return nil, err
	}
	serverPool, err := certPool(s.caBundle)
	if err != nil {
		return nil, err
	}
	proxyCert, err := tls.LoadX509KeyPair(s.tls("client-auth-proxy.crt"), s.tls("client-auth-proxy.key"))
	if err != nil {
		return nil, err
	}
	target := &url.URL{Scheme: "https", Host: fmt.Sprintf("127.0.0.1:%d", s.apiPort)}
	transport := func(certs []tls.Certificate) *http.Transport {
		return &http.Transport{
			TLSClientConfig:     &tls.Config{RootCAs: serverPool, Certificates: certs, MinVersion: tls.VersionTLS12},
			ForceAttemptHTTP2:   true,
			MaxIdleConnsPerHost: 50,
			IdleConnTimeout:     90 * time.Second,
			DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		}
	}
	mk := func(t *http.Transport) *httputil.ReverseProxy {
		return &httputil.ReverseProxy{
			Rewrite: func(pr *httputil.ProxyRequest) {
				pr.SetURL(target)
				pr.Out.Host = target.Host
			},
			Transport:     t,
			FlushInterval: -1, // watches stream
			ErrorLog:      log.New(io.Discard, "", 0),
			ErrorHandler: func(w http.ResponseWriter, r *http.Request, err error) {
				debugf("proxy %s %s: %v", r.Method, r.URL.Path, err)
				writeStatus(w, http.StatusServiceUnavailable, "ServiceUnavailable", "apiserver not ready")
			},
		}
	}
	tr, err := authenticationclient.NewForConfig(clientConfig(s.adminCfg, "supervisor"))
	if err != nil {
		return nil, err
	}
	core, err := corev1client.NewForConfig(clientConfig(s.adminCfg, "tunnel-server"))
	if err != nil {
		return nil, err
	}
	return &supervisor{
		s:            s,
		clientPool:   pool,
		authed:       mk(transport([]tls.Certificate{proxyCert})),
		plain:        mk(transport(nil)),
		tokenReviews: tr.TokenReviews(),
		passwords:    passwords,
		tunnels:      newTunnelServer(core.Nodes()),
		secrets:      core.Secrets(metav1.NamespaceSystem),
		nodes:        core.Nodes(),
	}, nil
}

func (sup *supervisor) listen(addr string) (func(), error) {
	kp, err := tls.LoadX509KeyPair(sup.s.tls("serving-kube-apiserver.crt"), sup.s.tls("serving-kube-apiserver.key"))
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("supervisor: %w", err)
	}
	srv := &http.Server{
		Handler: sup,
		TLSConfig: &tls.Config{
			Certificates: []tls.Certificate{kp},
			ClientAuth:   tls.RequestClientCert,
			MinVersion:   tls.VersionTLS12,
		},
		ReadHeaderTimeout: 30 * time.Second,
		ErrorLog:          log.New(io.Discard, "", 0),
	}
	go func() {
		if err := srv.ServeTLS(ln, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errorf("supervisor: %v", err)
		}
	}()
	return func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		if srv.Shutdown(ctx) != nil {
			_ = srv.Close() // hanging watches
		}
	}, nil
}

func writeStatus(w http.ResponseWriter, code int, reason, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	fmt.Fprintf(w, `{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":%q,"reason":%q,"code":%d}`+"\n", msg, reason, code)
}

func (sup *supervisor) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method == http.MethodConnect || r.URL.Path == tunnelPath || r.URL.Path == tunnelStreamPath {
		sup.serveTunnel(w, r)
		return
	}
	switch r.URL.Path {
	case "/ping":
		w.Header().Set("Content-Type", "text/plain")
		_, _ = io.WriteString(w, "pong")
		return
	case "/cacerts":
		sup.serveCACerts(w, r)
		return
	case agentConfigPath:
		sup.serveAgentConfig(w, r)
		return
	case supervisorKubeletCertPath:
		sup.serveKubeletCert(w, r)
		return
	case nodePasswordPath:
		sup.serveNodePassword(w, r)
		return
	case clientCAPath:
		sup.serveClientCA(w, r)
		return
	}
	// Never trust identity headers from outside.
	for k := range r.Header {
		if strings.HasPrefix(strings.ToLower(k), "x-remote-") {
			r.Header.Del(k)
		}
	}
	if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
		user, groups, err := sup.verifyClient(r.TLS.PeerCertificates)
		if err == nil {
			r.Header.Set("X-Remote-User", user)
			for _, g := range groups {
				r.Header.Add("X-Remote-Group", g)
			}
			sup.authed.ServeHTTP(w, r)
			return
		}
		if r.Header.Get("Authorization") == "" {
			debugf("rejected client certificate %q: %v", r.TLS.PeerCertificates[0].Subject.CommonName, err)
			writeStatus(w, http.StatusUnauthorized, "Unauthorized", "Unauthorized")
			return
		}
	}
	sup.plain.ServeHTTP(w, r)
}

// serveTunnel: the kube-apiserver's CONNECTs (its client certificate) and the agents'
// tunnels (their node certificates); nobody else.
func (sup *supervisor) serveTunnel(w http.ResponseWriter, r *http.Request) {
	user, groups := "", []string(nil)
	if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
		if u, g, err := sup.verifyClient(r.TLS.PeerCertificates); err == nil {
			user, groups = u, g
		}
	}
	node, isNode := strings.CutPrefix(user, "system:node:")
	switch {
	case r.Method == http.MethodConnect && user == "system:kube-apiserver":
		sup.tunnels.serveConnect(w, r)
	case r.Method == http.MethodGet && isNode && node != "" && slices.Contains(groups, "system:nodes"):
		if r.URL.Path == tunnelPath {
			sup.tunnels.serveAgent(w, node)
		} else {
			sup.tunnels.serveStream(w, r, node)
		}
	default:
		writeStatus(w, http.StatusUnauthorized, "Unauthorized", "Unauthorized")
	}
}

func (sup *supervisor) verifyClient(chain []*x509.Certificate) (string, []string, error) {
	inter := x509.NewCertPool()
	for _, c := range chain[1:] {
		inter.AddCert(c)
	}
	if _, err := chain[0].Verify(x509.VerifyOptions{
		Roots: sup.clientPool, Intermediates: inter, KeyUsages: []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth},
	}); err != nil {
		return "", nil, err
	}
	if chain[0].Subject.CommonName == "" {
		return "", nil, errors.New("empty common name")
	}
	return chain[0].Subject.CommonName, chain[0].Subject.Organization, nil
}

// serveCACerts returns the server CA bundle. A request that carries a bearer token
// gets 401 unless the token is valid (agents use that to check their token).
func (sup *supervisor) serveCACerts(w http.ResponseWriter, r *http.Request) {
	if auth := r.Header.Get("Authorization"); auth != "" {
		token, ok := strings.CutPrefix(auth, "Bearer ")
		if !ok {
			writeStatus(w, http.StatusUnauthorized, "Unauthorized", "Unauthorized")
			return
		}
		ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
		defer cancel()
		review, err := sup.tokenReviews.Create(ctx, &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: token}}, metav1.CreateOptions{})
		if err != nil {
			writeStatus(w, http.StatusServiceUnavailable, "ServiceUnavailable", "apiserver not ready")
			return
		}
		if !review.Status.Authenticated {
			writeStatus(w, http.StatusUnauthorized, "Unauthorized", "Unauthorized")
			return
		}
	}
	w.Header().Set("Content-Type", "text/plain")
	_, _ = w.Write(sup.s.caBundle)
}

// serveClientCA gives a node (its certificate) the client CA, which its kubelet needs to
// authenticate the API server's kubelet client certificate (k3s: /v1-k3s/client-ca.crt).
func (sup *supervisor) serveClientCA(w http.ResponseWriter, r *http.Request) {
	if r.TLS == nil || len(r.TLS.PeerCertificates) == 0 {
		writeStatus(w, http.StatusUnauthorized, "Unauthorized", "Unauthorized")
		return
	}
	if _, groups, err := sup.verifyClient(r.TLS.PeerCertificates); err != nil || !slices.Contains(groups, "system:nodes") {
		writeStatus(w, http.StatusUnauthorized, "Unauthorized", "Unauthorized")
		return
	}
	w.Header().Set("Content-Type", "text/plain")
	_, _ = w.Write(sup.s.clientCA.certPEM)
}

// authenticateAgent: the caller's identity from its client certificate, a bearer token the
// API's authenticators accept (a bootstrap token), or the server token's password, whichever
// works (k3s's authenticator is a union); ok false when none does.
func (sup *supervisor) authenticateAgent(r *http.Request) (user string, groups []string, ok bool) {
	if r.TLS != nil && len(r.TLS.PeerCertificates) > 0 {
		if u, g, err := sup.verifyClient(r.TLS.PeerCertificates); err == nil {
			return u, g, true
		}
	}
	if token, found := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); found && token != "" {
		ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
		defer cancel()
		review, err := sup.tokenReviews.Create(ctx, &authenticationv1.TokenReview{Spec: authenticationv1.TokenReviewSpec{Token: token}}, metav1.CreateOptions{})
		if err == nil && review.Status.Authenticated {
			return review.Status.User.Username, review.Status.User.Groups, true
		}
		return "", nil, false
	}
	if _, password, found := r.BasicAuth(); found {
		for _, p := range sup.passwords {
			if p != "" && subtle.ConstantTimeCompare([]byte(p), []byte(password)) == 1 {
				return "node", []string{agentGroup}, true
			}
		}
	}
	return "", nil, false
}

// agentAuthorized answers the request itself (and returns false) unless the caller is an
// agent: k3s's HasRole(k3s:agent, system:nodes, system:bootstrappers) on its agent routes,
// "not authorized" (401) for no identity, "forbidden" (403) for another role.
func (sup *supervisor) agentAuthorized(w http.ResponseWriter, r *http.Request) (string, bool) {
	user, groups, ok := sup.authenticateAgent(r)
	if !ok {
		writeStatus(w, http.StatusUnauthorized, "Unauthorized", "not authorized")
		return "", false
	}
	if !slices.Contains(groups, agentGroup) && !slices.Contains(groups, "system:nodes") && !slices.Contains(groups, "system:bootstrappers") {
		writeStatus(w, http.StatusForbidden, "Forbidden", "forbidden")
		return "", false
	}
	return user, true
}

// agentControlConfig is the part of k3s's config.Control (pkg/daemons/config) that the
// stand-in's agent reads, only here and only at its start (agentsettings.go).
type agentControlConfig struct {
	FlannelBackend string `json:"FlannelBackend"`
	// k3s serves the cluster CIDR as ClusterIPRange (a net.IPNet); the stand-in as a string.
	ClusterCIDR       string `json:"ClusterCIDR"`
	FlannelExternalIP bool   `json:"FlannelExternalIP"`
	ClusterDNS        string `json:"ClusterDNS"`
	DisableKubeProxy  bool   `json:"DisableKubeProxy"`
}

// serveAgentConfig: the agent configuration, the first request an agent authenticates (k3s's
// /v1-k3s/config serves the control-plane settings; the stand-in those its agent reads).
func (sup *supervisor) serveAgentConfig(w http.ResponseWriter, r *http.Request) {
	if _, ok := sup.agentAuthorized(w, r); !ok {
		return
	}
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(sup.s.agentSettings())
}

// serveKubeletCert signs a node's kubelet client certificate, as k3s's ClientKubeletCert
// (pkg/server/handlers/handlers.go): the caller authenticated as an agent, then its node
// name and password verified (nodepassword.go's nodeAuth: a password that does not match
// the node's record is refused, 403, and no certificate is issued), then the CSR signed
// by the client CA.
func (sup *supervisor) serveKubeletCert(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	user, ok := sup.agentAuthorized(w, r)
	if !ok {
		return
	}
	node, ok := sup.nodeAuth(w, r, user)
	if !ok {
		return
	}
	body, err := io.ReadAll(io.LimitReader(r.Body, 64<<10))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	block, _ := pem.Decode(body)
	if block == nil || block.Type != "CERTIFICATE REQUEST" {
		http.Error(w, "expected a PEM certificate request", http.StatusBadRequest)
		return
	}
	csr, err := x509.ParseCertificateRequest(block.Bytes)
	if err == nil {
		err = csr.CheckSignature()
	}
	if err != nil {
		http.Error(w, "invalid certificate request: "+err.Error(), http.StatusBadRequest)
		return
	}
	der, err := signCert(sup.s.clientCA, csr.PublicKey, nil, certSpec{
		cn: "system:node:" + node, orgs: []string{"system:nodes"}, client: true,
	})
	if err != nil {
		http.Error(w, err.Error(), http.StatusInternalServerError)
		return
	}
	infof("Issued kubelet client certificate for node %s", node)
	w.Header().Set("Content-Type", "application/x-pem-file")
	_, _ = w.Write(append(certToPEM(der), sup.s.clientCA.certPEM...))
}
