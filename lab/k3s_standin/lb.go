package main

// The agent's client-side load balancer, as k3s's (pkg/agent/loadbalancer/loadbalancer.go,
// servers.go; started by pkg/agent/proxy in pkg/agent/run.go's createProxyAndValidateToken,
// before the token is validated): a TCP listener on 127.0.0.1:<--lb-server-port> (6444)
// through which the agent reaches the supervisor and the Kubernetes API; its kubeconfigs
// name https://127.0.0.1:6444, never the server. Each connection is passed to the server
// of --server (the load balancer's default server, in state STANDBY until the API's
// endpoints are learned). What the product meets: a server that cannot be dialled shows in
// the agent's log at the default level only as the agent's own request failing on the
// local address ("read tcp 127.0.0.1:...->127.0.0.1:6444: read: connection reset by
// peer": the load balancer closes the connection it accepted); the dial error itself,
// naming the server's address, is logged at debug level only:
//
//	level=debug msg="Dial error from server 10.0.0.2:6443@STANDBY* after 1.2ms: dial tcp 10.0.0.2:6443: connect: connection refused"
//	level=debug msg="Incoming conn 127.0.0.1:40312, error dialing load balancer servers: all servers failed"
//
// Not modelled: the server list learned from the API's endpoints (the agent keeps to the
// default server), health checks and fail-over between servers, the state file under
// <data-dir>/agent/etc, the separate API-server load balancer (only when the supervisor and
// API ports differ).

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/url"
	"strings"
	"sync"
	"time"
)

const (
	lbServiceName      = "k3s-agent-load-balancer"
	defaultLBPort      = 6444
	lbDialTimeout      = 10 * time.Second // k3s's load balancer dialer
	lbDefaultServerTag = "@STANDBY*"      // the default server's state as k3s prints it
)

type loadBalancer struct {
	local         string // 127.0.0.1:<port>
	defaultServer string // host:port of --server
	ln            net.Listener
	wg            sync.WaitGroup
}

// startLoadBalancer listens on 127.0.0.1:port and passes every connection to the server of
// serverURL, until ctx ends.
func startLoadBalancer(ctx context.Context, serverURL string, port int) (*loadBalancer, error) {
	u, err := url.Parse(serverURL)
	if err != nil {
		return nil, err
	}
	host := u.Host
	if u.Port() == "" {
		host = net.JoinHostPort(u.Hostname(), "443")
	}
	ln, err := (&net.ListenConfig{}).Listen(ctx, "tcp", fmt.Sprintf("127.0.0.1:%d", port))
	if err != nil {
		warnf("Error starting load balancer: %s", err)
		return nil, err
	}
	lb := &loadBalancer{local: ln.Addr().String(), defaultServer: host, ln: ln}
	infof("Updated load balancer %s default server: %s", lbServiceName, host)
	infof("Running load balancer %s %s -> [] [default: %s]", lbServiceName, lb.local, host)
	go func() {
		<-ctx.Done()
		_ = ln.Close()
	}()
	go lb.serve()
	return lb, nil
}

// URL is what the agent's clients and kubeconfigs use: https://127.0.0.1:<port>.
func (lb *loadBalancer) URL() string { return "https://" + lb.local }

func (lb *loadBalancer) serve() {
	for {
		src, err := lb.ln.Accept()
		if err != nil {
			return
		}
		lb.wg.Add(1)
		go func() {
			defer lb.wg.Done()
			lb.handle(src)
		}()
	}
}

func (lb *loadBalancer) handle(src net.Conn) {
	started := time.Now()
	dst, err := (&net.Dialer{Timeout: lbDialTimeout, KeepAlive: 30 * time.Second}).Dial("tcp", lb.defaultServer)
	if err != nil {
		debugf("Dial error from server %s%s after %s: %s", lb.defaultServer, lbDefaultServerTag, time.Since(started), err)
		debugf("Incoming conn %s, error dialing load balancer servers: %v", src.RemoteAddr(), errors.New("all servers failed"))
		_ = src.Close()
		return
	}
	done := make(chan struct{}, 2)
	pipe := func(to, from net.Conn) {
		_, _ = io.Copy(to, from)
		if c, ok := to.(*net.TCPConn); ok {
			_ = c.CloseWrite()
		}
		done <- struct{}{}
	}
	go pipe(dst, src)
	go pipe(src, dst)
	<-done
	<-done
	_ = src.Close()
	_ = dst.Close()
}

// lbServerPort is --lb-server-port (K3S_LB_SERVER_PORT), 6444 by default.
func lbServerPort(o *options) (int, error) {
	v := strings.TrimSpace(o.str("lb-server-port"))
	if v == "" {
		return defaultLBPort, nil
	}
	var port int
	if _, err := fmt.Sscanf(v, "%d", &port); err != nil || port <= 0 || port > 65535 {
		return 0, fmt.Errorf("invalid --lb-server-port %q", v)
	}
	return port, nil
}
