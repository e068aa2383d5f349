package main

// The agent tunnel (k3s's default egress-selector mode "agent"): every agent keeps a
// connection open to the supervisor on 6443, and the API server's own traffic to a
// kubelet (node proxy, logs, exec, port-forward) goes through it instead of dialling
// the node's 10250. As k3s (pkg/daemons/control/tunnel.go, pkg/agent/tunnel/tunnel.go,
// pkg/daemons/control/server.go's egress-selector configuration):
//
//   - the kube-apiserver gets an EgressSelectorConfiguration whose "cluster" egress is
//     HTTP CONNECT to the supervisor, authenticated by its kubelet client certificate;
//   - the supervisor finds the Node whose address the CONNECT names; when that node's
//     agent holds a tunnel, the connection goes through it, and the agent dials its own
//     kubelet port on the loopback address; without a tunnel (the server's own node,
//     an agent not connected) it dials the address directly;
//   - the agent authenticates its tunnel with its node certificate and lets through
//     only its kubelet port.
//
// k3s multiplexes the tunnel over one websocket (rancher/remotedialer); here each
// connection through it is a connection of its own from the agent to 6443, which is
// the same at the edges a firewall sees: nothing from the server to the node's 10250.

import (
	"bufio"
	"context"
	"crypto/rand"
	"crypto/tls"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
)

const (
	tunnelPath          = "/v1-k3s/connect"
	tunnelStreamPath    = "/v1-k3s/connect/stream"
	tunnelStreamHeader  = "K3s-Tunnel-Stream"
	tunnelDialTimeout   = 10 * time.Second
	tunnelRetryInterval = 5 * time.Second
)

// writeEgressSelectorConfig writes the kube-apiserver's egress configuration: the
// "cluster" egress (kubelets, pods, services) is HTTP CONNECT to the supervisor.
func (s *server) writeEgressSelectorConfig() (string, error) {
	host := s.bindAddress
	if ip := net.ParseIP(host); ip == nil || ip.IsUnspecified() {
		host = "127.0.0.1"
	}
	path := filepath.Join(s.serverDir, "etc", "egress-selector-config.yaml")
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return "", err
	}
	text := fmt.Sprintf(`apiVersion: apiserver.k8s.io/v1beta1
kind: EgressSelectorConfiguration
egressSelections:
- name: cluster
  connection:
    proxyProtocol: HTTPConnect
    transport:
      tcp:
        url: https://%s
        tlsConfig:
          caBundle: %s
          clientCert: %s
          clientKey: %s
`, net.JoinHostPort(host, strconv.Itoa(s.httpsPort)), s.tls("server-ca.crt"), s.tls("client-kube-apiserver.crt"), s.tls("client-kube-apiserver.key"))
	return path, writeFileAtomic(path, []byte(text), 0o600)
}

// tunnelServer is the supervisor's side: agents' tunnels by node name, and the
// connections waiting for an agent to answer a dial.
type tunnelServer struct {
	nodes   corev1client.NodeInterface
	mu      sync.Mutex
	agents  map[string]*tunnelAgent
	waiting map[string]chan net.Conn
}

type tunnelAgent struct {
	conn net.Conn
	wmu  sync.Mutex
}

func newTunnelServer(nodes corev1client.NodeInterface) *tunnelServer {
	return &tunnelServer{nodes: nodes, agents: map[string]*tunnelAgent{}, waiting: map[string]chan net.Conn{}}
}

// hijack answers 200 and takes the connection over (HTTP/1.1 only, as a CONNECT or an
// agent's tunnel request always is).
func hijack(w http.ResponseWriter, status string) (net.Conn, *bufio.Reader, error) {
	hj, ok := w.(http.Hijacker)
	if !ok {
		return nil, nil, errors.New("connection cannot be taken over")
	}
	conn, brw, err := hj.Hijack()
	if err != nil {
		return nil, nil, err
	}
	if _, err := io.WriteString(conn, "HTTP/1.1 "+status+"\r\n\r\n"); err != nil {
		conn.Close()
		return nil, nil, err
	}
	return conn, brw.Reader, nil
}

func splice(a, b net.Conn, aBuffered io.Reader) {
	done := make(chan struct{}, 2)
	go func() { _, _ = io.Copy(b, aBuffered); done <- struct{}{} }()
	go func() { _, _ = io.Copy(a, b); done <- struct{}{} }()
	<-done
	a.Close()
	b.Close()
	<-done
}

// serveAgent keeps an agent's tunnel (GET /v1-k3s/connect with its node certificate).
func (ts *tunnelServer) serveAgent(w http.ResponseWriter, node string) {
	conn, br, err := hijack(w, "200 OK")
	if err != nil {
		return
	}
	agent := &tunnelAgent{conn: conn}
	ts.mu.Lock()
	if old := ts.agents[node]; old != nil {
		old.conn.Close()
	}
	ts.agents[node] = agent
	ts.mu.Unlock()
	infof("Tunnel server: agent %s connected", node)
	_, _ = io.Copy(io.Discard, br) // until the agent goes away
	ts.mu.Lock()
	if ts.agents[node] == agent {
		delete(ts.agents, node)
	}
	ts.mu.Unlock()
	conn.Close()
	infof("Tunnel server: agent %s disconnected", node)
}

// serveStream pairs an agent's answer to a dial with the connection waiting for it.
func (ts *tunnelServer) serveStream(w http.ResponseWriter, r *http.Request, node string) {
	id := r.Header.Get(tunnelStreamHeader)
	ts.mu.Lock()
	ch, ok := ts.waiting[node+"/"+id]
	delete(ts.waiting, node+"/"+id)
	ts.mu.Unlock()
	if !ok {
		http.Error(w, "no such stream", http.StatusNotFound)
		return
	}
	conn, br, err := hijack(w, "200 OK")
	if err != nil {
		close(ch)
		return
	}
	ch <- &bufferedConn{Conn: conn, r: br}
}

type bufferedConn struct {
	net.Conn
	r io.Reader
}

func (c *bufferedConn) Read(p []byte) (int, error) { return c.r.Read(p) }

// dialThroughAgent asks node's agent to connect to its port and waits for the stream.
func (ts *tunnelServer) dialThroughAgent(ctx context.Context, node string, port string) (net.Conn, error) {
	ts.mu.Lock()
	agent := ts.agents[node]
	ts.mu.Unlock()
	if agent == nil {
		return nil, fmt.Errorf("failed to find Session for client %s", node)
	}
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	id := hex.EncodeToString(b)
	ch := make(chan net.Conn, 1)
	ts.mu.Lock()
	ts.waiting[node+"/"+id] = ch
	ts.mu.Unlock()
	defer func() {
		ts.mu.Lock()
		delete(ts.waiting, node+"/"+id)
		ts.mu.Unlock()
	}()
	agent.wmu.Lock()
	_, err := fmt.Fprintf(agent.conn, "dial %s %s\n", id, port)
	agent.wmu.Unlock()
	if err != nil {
		return nil, err
	}
	select {
	case conn, ok := <-ch:
		if !ok || conn == nil {
			return nil, fmt.Errorf("agent %s could not open the stream", node)
		}
		return conn, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	case <-time.After(tunnelDialTimeout):
		return nil, fmt.Errorf("agent %s did not answer the dial to port %s", node, port)
	}
}

// nodeAt is the Node that holds the address, if any.
func (ts *tunnelServer) nodeAt(ctx context.Context, host string) string {
	list, err := ts.nodes.List(ctx, metav1.ListOptions{})
	if err != nil {
		return ""
	}
	for _, n := range list.Items {
		for _, a := range n.Status.Addresses {
			if a.Address == host {
				return n.Name
			}
		}
	}
	return ""
}

// serveConnect handles the kube-apiserver's HTTP CONNECT (its "cluster" egress).
func (ts *tunnelServer) serveConnect(w http.ResponseWriter, r *http.Request) {
	host, port, err := net.SplitHostPort(r.Host)
	if err != nil {
		http.Error(w, "bad CONNECT target", http.StatusBadRequest)
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), tunnelDialTimeout)
	defer cancel()
	var backend net.Conn
	if node := ts.nodeAt(ctx, host); node != "" {
		backend, err = ts.dialThroughAgent(ctx, node, port)
		if err != nil {
			debugf("Tunnel server egress proxy dial error: %v", err)
			if strings.HasPrefix(err.Error(), "failed to find Session for client") {
				debugf("Tunnel server egress proxy falling back to direct connection to node %s", node)
				backend = nil
			} else {
				http.Error(w, err.Error(), http.StatusBadGateway)
				return
			}
		}
	}
	if backend == nil {
		backend, err = (&net.Dialer{}).DialContext(ctx, "tcp", r.Host)
		if err != nil {
			debugf("Tunnel server egress proxy dial error: %v", err)
			http.Error(w, err.Error(), http.StatusBadGateway)
			return
		}
	}
	conn, br, err := hijack(w, "200 Connection established")
	if err != nil {
		backend.Close()
		return
	}
	splice(conn, backend, br)
}

// runTunnel keeps the agent's tunnel to the supervisor open (reconnecting every few
// seconds when it drops) and answers its dials: only to the kubelet port, on loopback.
func runTunnel(ctx context.Context, serverURL string, caBundle, certPEM, keyPEM []byte, kubeletPort int) {
	u, err := url.Parse(serverURL)
	if err != nil {
		errorf("Tunnel: %v", err)
		return
	}
	cert, err := tls.X509KeyPair(certPEM, keyPEM)
	if err != nil {
		errorf("Tunnel: %v", err)
		return
	}
	tlsConfig := &tls.Config{RootCAs: mustPool(caBundle), Certificates: []tls.Certificate{cert}, ServerName: u.Hostname(), MinVersion: tls.VersionTLS12}
	open := func(path string, header string) (net.Conn, *bufio.Reader, error) {
		d := &tls.Dialer{NetDialer: &net.Dialer{Timeout: tunnelDialTimeout}, Config: tlsConfig}
		conn, err := d.DialContext(ctx, "tcp", u.Host)
		if err != nil {
			return nil, nil, err
		}
		if _, err := fmt.Fprintf(conn, "GET %s HTTP/1.1\r\nHost: %s\r\n%s\r\n", path, u.Host, header); err != nil {
			conn.Close()
			return nil, nil, err
		}
		br := bufio.NewReader(conn)
		resp, err := http.ReadResponse(br, nil)
		if err != nil {
			conn.Close()
			return nil, nil, err
		}
		if resp.StatusCode != http.StatusOK {
			conn.Close()
			return nil, nil, fmt.Errorf("%s%s: %s", serverURL, path, resp.Status)
		}
		return conn, br, nil
	}
	allowed := strconv.Itoa(kubeletPort)
	for ctx.Err() == nil {
		infof("Connecting to proxy url=%q", "wss://"+u.Host+tunnelPath)
		conn, br, err := open(tunnelPath, "")
		if err != nil {
			errorf("Failed to connect to proxy. Empty dialer response: %v", err)
			sleepCtx(ctx, tunnelRetryInterval)
			continue
		}
		stop := context.AfterFunc(ctx, func() { conn.Close() })
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				break
			}
			var id, port string
			if _, err := fmt.Sscanf(line, "dial %s %s", &id, &port); err != nil {
				continue
			}
			go func() {
				if port != allowed {
					debugf("Tunnel: refused a dial to port %s (only the kubelet port %s)", port, allowed)
					return
				}
				local, err := net.DialTimeout("tcp", net.JoinHostPort("127.0.0.1", port), tunnelDialTimeout)
				if err != nil {
					debugf("Tunnel: dial to 127.0.0.1:%s failed: %v", port, err)
					return
				}
				stream, sbr, err := open(tunnelStreamPath, tunnelStreamHeader+": "+id+"\r\n")
				if err != nil {
					local.Close()
					return
				}
				splice(stream, local, sbr)
			}()
		}
		stop()
		conn.Close()
		if ctx.Err() == nil {
			errorf("Remotedialer proxy error; reconnecting...")
			sleepCtx(ctx, tunnelRetryInterval)
		}
	}
}
