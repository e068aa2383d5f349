package main

// `k3s server`: certificates, kine + kube-apiserver + kube-controller-manager +
// kube-scheduler as child processes, the supervisor on the HTTPS listen port, the admin kubeconfig,
// bootstrap RBAC, and the server's own node.

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	rbacv1 "k8s.io/api/rbac/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	rbacclient "k8s.io/client-go/kubernetes/typed/rbac/v1"
	"k8s.io/client-go/rest"
)

const (
	defaultKubeBin          = "/opt/lab-kube/bin"
	kubeBinEnv              = "HK3S_LAB_KUBE_BIN"
	gracePeriodEnv          = "HK3S_LAB_NODE_MONITOR_GRACE_PERIOD"
	defaultGracePeriod      = "20s"
	controlPlaneLabel       = "node-role.kubernetes.io/control-plane"
	masterLabel             = "node-role.kubernetes.io/master"
	childStopTimeout        = 20 * time.Second
	defaultControllerPort   = 10257
	serverKubeconfigDefault = "/etc/rancher/k3s/k3s.yaml"
)

func kubeBinDir() string {
	if d := os.Getenv(kubeBinEnv); d != "" {
		return d
	}
	return defaultKubeBin
}

func runServerCommand(args []string) int {
	if wantsHelp(args) {
		newOptions(serverFlags()).printHelp("server")
		return 0
	}
	o, err := parseCommand(serverFlags(), args)
	if err != nil {
		fmt.Fprintf(os.Stderr, "Incorrect Usage: %v\n", err)
		return 1
	}
	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGTERM, syscall.SIGINT)
	defer stop()
	s := &server{o: o}
	err = s.run(ctx)
	s.shutdown()
	if err != nil {
		fatalf("%v", err)
	}
	infof("k3s server stopped")
	return 0
}

type server struct {
	o                            *options
	dataDir, serverDir, tlsDir   string
	credDir, dbDir, logDir       string
	kubeBin                      string
	httpsPort, apiPort, kcmPort  int
	bindAddress, advertise       string
	serverCA, clientCA, reqHdrCA *keyPair
	caBundle                     []byte
	node                         *nodeSpec
	adminCfg                     *rest.Config // direct to the apiserver (127.0.0.1:apiPort)
	encryptionConfig             string       // --secrets-encryption: the kube-apiserver's encryption config

	mu       sync.Mutex
	children []*child
	stopSup  func()
	stopPort func()
	nodeDone chan struct{}
	cancel   context.CancelFunc
}

func (s *server) run(parent context.Context) error {
	o := s.o
	ctx, cancel := context.WithCancel(parent)
	s.cancel = cancel
	defer cancel()

	if o.str("server") != "" {
		return errors.New("joining a server to an existing cluster (--server) is not supported by this build; run a single server")
	}
	dsn := o.str("datastore-endpoint")
	if dsn != "" && !strings.HasPrefix(dsn, "sqlite://") {
		return fmt.Errorf("unsupported --datastore-endpoint %q: only sqlite:// is available", dsn)
	}
	var err error
	s.dataDir, err = filepath.Abs(o.str("data-dir"))
	if err != nil {
		return err
	}
	s.serverDir = filepath.Join(s.dataDir, "server")
	s.tlsDir = filepath.Join(s.serverDir, "tls")
	s.credDir = filepath.Join(s.serverDir, "cred")
	s.dbDir = filepath.Join(s.serverDir, "db")
	s.logDir = filepath.Join(s.serverDir, "logs")
	for _, d := range []string{s.tlsDir, s.credDir, s.dbDir, s.logDir, filepath.Join(s.tlsDir, "temporary-certs"), filepath.Join(s.dataDir, "agent")} {
		if err := os.MkdirAll(d, 0o700); err != nil {
			return err
		}
	}
	if s.httpsPort, err = strconv.Atoi(o.str("https-listen-port")); err != nil {
		return fmt.Errorf("invalid --https-listen-port: %w", err)
	}
	s.apiPort = s.httpsPort + 1
	if p := o.str("apiserver-port"); p != "" {
		if s.apiPort, err = strconv.Atoi(p); err != nil {
			return fmt.Errorf("invalid --apiserver-port: %w", err)
		}
	}
	s.kcmPort = defaultControllerPort
	for _, a := range o.list("kube-controller-manager-arg") {
		if k, v, _ := strings.Cut(strings.TrimLeft(a, "-"), "="); k == "secure-port" {
			s.kcmPort, _ = strconv.Atoi(v)
		}
	}
	s.bindAddress = o.str("bind-address")
	s.kubeBin = kubeBinDir()
	for _, b := range []string{"kine", "kube-apiserver", "kube-controller-manager"} {
		if fi, err := os.Stat(filepath.Join(s.kubeBin, b)); err != nil || fi.Mode()&0o111 == 0 {
			return fmt.Errorf("missing %s in %s (set $%s)", b, s.kubeBin, kubeBinEnv)
		}
	}
	infof("Starting k3s %s (%s)", version, gitCommit)
	o.reportIgnored()

	switch b := o.str("flannel-backend"); b {
	case "none", "vxlan", "host-gw", "wireguard-native":
	default:
		// As k3s's pkg/agent/flannel setup: a backend it does not know is fatal.
		return fmt.Errorf("invalid flannel backend: %s", b)
	}
	if !o.boolean("disable-agent") {
		ns, err := nodeOptions(o, "server")
		if err != nil {
			return err
		}
		s.node = &ns
		applyAgentSettings(&ns, s.agentSettings())
		stageBundle(s.dataDir)
		installNodeRules(o.str("cluster-cidr"), ns.flannelBackend, ns.kubeProxy)
	}
	s.advertise = o.str("advertise-address")
	if s.advertise == "" {
		switch {
		case s.node != nil && len(s.node.externalIPs) > 0:
			s.advertise = s.node.externalIPs[0]
		case s.node != nil:
			s.advertise = s.node.internalIPs[0]
		default:
			ip, err := defaultNodeIP(o.str("flannel-iface"))
			if err != nil {
				return err
			}
			s.advertise = ip
		}
	}

	if err := s.certificates(); err != nil {
		return fmt.Errorf("certificates: %w", err)
	}
	if o.boolean("secrets-encryption") {
		if s.encryptionConfig, err = genEncryptionConfigAndState(s.serverDir); err != nil {
			return fmt.Errorf("secrets encryption: %w", err)
		}
	}
	serverToken, err := readToken(ctx, o, "token", "token-file")
	if err != nil {
		return err
	}
	password, err := ensureServerToken(s.serverDir, s.caBundle, serverToken)
	if err != nil {
		return err
	}
	passwords := []string{password}
	if at, err := readToken(ctx, o, "agent-token", "agent-token-file"); err != nil {
		return err
	} else if at != "" {
		p := parseToken(at)
		passwords = append(passwords, p.password)
		if err := writeFileAtomic(filepath.Join(s.serverDir, "agent-token"), []byte(formatToken(s.caBundle, "node:"+p.password)+"\n"), 0o600); err != nil {
			return err
		}
	}

	// The supervisor listens first: /cacerts and /ping answer while the apiserver starts.
	sup, err := newSupervisor(s, passwords)
	if err != nil {
		return err
	}
	if s.stopSup, err = sup.listen(net.JoinHostPort(s.bindAddress, strconv.Itoa(s.httpsPort))); err != nil {
		return err
	}
	infof("Supervisor listening on %s:%d (Kubernetes API proxied to 127.0.0.1:%d)", s.bindAddress, s.httpsPort, s.apiPort)

	failed := make(chan error, 4)
	watch := func(c *child) {
		go func() {
			<-c.done
			// Under systemd's default KillMode the children get SIGTERM together with
			// us: a child that exits at the same moment as our own stop is no failure.
			select {
			case <-ctx.Done():
				return
			case <-time.After(2 * time.Second):
			}
			failed <- fmt.Errorf("%s exited unexpectedly (%v); see %s", c.name, c.err, c.logPath)
		}()
	}

	kine, err := s.startKine()
	if err != nil {
		return err
	}
	watch(kine)
	if err := waitFor(ctx, failed, "kine", time.Minute, func() bool {
		c, err := net.DialTimeout("unix", filepath.Join(s.serverDir, "kine.sock"), time.Second)
		if err == nil {
			c.Close()
		}
		return err == nil
	}); err != nil {
		return err
	}

	api, err := s.startAPIServer()
	if err != nil {
		return err
	}
	watch(api)
	infof("Waiting for API server to become available")
	if err := waitFor(ctx, failed, "kube-apiserver", 5*time.Minute, s.apiReady); err != nil {
		return err
	}
	infof("kube-apiserver is ready")

	if err := s.bootstrapRBAC(ctx); err != nil {
		return fmt.Errorf("bootstrap RBAC: %w", err)
	}
	if core, err := corev1client.NewForConfig(clientConfig(s.adminCfg, "node-controller")); err == nil {
		go removeNodePasswords(ctx, core.Nodes(), core.Secrets(metav1.NamespaceSystem))
		go sweepOrphanedNodePasswords(ctx, core.Nodes(), core.Secrets(metav1.NamespaceSystem))
	}

	kcm, err := s.startControllerManager()
	if err != nil {
		return err
	}
	watch(kcm)
	// k3s runs a scheduler too; an older lab build without one leaves pods unscheduled.
	if _, err := os.Stat(filepath.Join(s.kubeBin, "kube-scheduler")); err == nil {
		sched, err := s.startScheduler()
		if err != nil {
			return err
		}
		watch(sched)
	} else {
		warnf("no kube-scheduler in %s: pods will not be scheduled", s.kubeBin)
	}

	if err := s.writeAdminKubeconfig(); err != nil {
		return err
	}

	if s.node != nil {
		if err := s.startNode(ctx); err != nil {
			return err
		}
	}
	if err := waitFor(ctx, failed, "kube-controller-manager", 5*time.Minute, s.controllerManagerHealthy); err != nil {
		return err
	}
	sdNotify("READY=1")
	infof("k3s is up and running")

	select {
	case <-ctx.Done():
		infof("Received shutdown signal; stopping k3s")
		return nil
	case err := <-failed:
		return err
	}
}

// waitFor polls ok every 500 ms until it is true, a child fails, ctx ends or the
// timeout passes.
func waitFor(ctx context.Context, failed chan error, what string, timeout time.Duration, ok func() bool) error {
	deadline := time.Now().Add(timeout)
	for !ok() {
		select {
		case <-ctx.Done():
			return nil
		case err := <-failed:
			return err
		case <-time.After(500 * time.Millisecond):
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("timed out after %s waiting for %s", timeout, what)
		}
	}
	return nil
}

func (s *server) tls(name string) string { return filepath.Join(s.tlsDir, name) }

func (s *server) certificates() error {
	var err error
	if s.serverCA, err = loadOrCreateCA(s.tls("server-ca.crt"), s.tls("server-ca.key"), "k3s-server-ca"); err != nil {
		return err
	}
	if s.clientCA, err = loadOrCreateCA(s.tls("client-ca.crt"), s.tls("client-ca.key"), "k3s-client-ca"); err != nil {
		return err
	}
	if s.reqHdrCA, err = loadOrCreateCA(s.tls("request-header-ca.crt"), s.tls("request-header-ca.key"), "k3s-request-header-ca"); err != nil {
		return err
	}
	// /cacerts serves this file's bytes; token hashes are of the same bytes.
	if s.caBundle, err = os.ReadFile(s.tls("server-ca.crt")); err != nil {
		return err
	}
	if err := ensureRSAKey(s.tls("service.key")); err != nil {
		return err
	}

	domain := s.o.str("cluster-domain")
	dns := []string{"kubernetes", "kubernetes.default", "kubernetes.default.svc", "kubernetes.default.svc." + domain, "localhost"}
	if h, err := os.Hostname(); err == nil && h != "" {
		dns = append(dns, strings.ToLower(h))
	}
	ips := []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1")}
	if svcIP, err := firstServiceIP(s.o.str("service-cidr")); err == nil {
		ips = append(ips, svcIP)
	} else {
		return err
	}
	ips = append(ips, allHostIPs()...)
	extra := append([]string{s.advertise}, s.o.list("tls-san")...)
	if s.node != nil {
		dns = append(dns, s.node.name)
		extra = append(extra, s.node.internalIPs...)
		extra = append(extra, s.node.externalIPs...)
	}
	if s.bindAddress != "0.0.0.0" && s.bindAddress != "::" {
		extra = append(extra, s.bindAddress)
	}
	for _, e := range extra {
		if ip := net.ParseIP(e); ip != nil {
			ips = append(ips, ip)
		} else if e != "" {
			dns = append(dns, e)
		}
	}
	if _, err := ensureCert(s.serverCA, s.tls("serving-kube-apiserver.crt"), s.tls("serving-kube-apiserver.key"), certSpec{
		cn: "kube-apiserver", dns: dedupe(dns), ips: dedupeIPs(ips), server: true,
	}); err != nil {
		return err
	}
	clients := []struct {
		file string
		ca   *keyPair
		cn   string
		orgs []string
	}{
		{"client-admin", s.clientCA, "system:admin", []string{"system:masters"}},
		{"client-controller", s.clientCA, "system:kube-controller-manager", nil},
		{"client-scheduler", s.clientCA, "system:kube-scheduler", nil},
		{"client-kube-apiserver", s.clientCA, "system:kube-apiserver", []string{"system:masters"}},
		{"client-supervisor", s.clientCA, "system:k3s-supervisor", []string{"system:masters"}},
		{"client-auth-proxy", s.reqHdrCA, "system:auth-proxy", nil},
	}
	for _, c := range clients {
		if _, err := ensureCert(c.ca, s.tls(c.file+".crt"), s.tls(c.file+".key"), certSpec{cn: c.cn, orgs: c.orgs, client: true}); err != nil {
			return err
		}
	}
	// Kubeconfigs for the control plane and the token command (direct to the apiserver).
	apiURL := fmt.Sprintf("https://127.0.0.1:%d", s.apiPort)
	for _, kc := range []struct{ file, cert string }{
		{"admin.kubeconfig", "client-admin"},
		{"controller.kubeconfig", "client-controller"},
		{"scheduler.kubeconfig", "client-scheduler"},
		{"supervisor.kubeconfig", "client-supervisor"},
	} {
		kp, err := loadKeyPair(s.tls(kc.cert+".crt"), s.tls(kc.cert+".key"))
		if err != nil {
			return err
		}
		keyPEM, err := keyToPEM(kp.key)
		if err != nil {
			return err
		}
		if err := writeKubeconfig(filepath.Join(s.credDir, kc.file), apiURL, s.caBundle, kp.certPEM, keyPEM, 0o600); err != nil {
			return err
		}
	}
	var err2 error
	s.adminCfg, err2 = restConfigFromKubeconfig(filepath.Join(s.credDir, "supervisor.kubeconfig"))
	return err2
}

func firstServiceIP(cidr string) (net.IP, error) {
	first := strings.Split(cidr, ",")[0]
	_, n, err := net.ParseCIDR(strings.TrimSpace(first))
	if err != nil {
		return nil, fmt.Errorf("invalid --service-cidr %q: %w", cidr, err)
	}
	ip := make(net.IP, len(n.IP))
	copy(ip, n.IP)
	ip[len(ip)-1]++
	return ip, nil
}

func dedupe(in []string) []string {
	seen := map[string]bool{}
	var out []string
	for _, s := range in {
		if !seen[s] {
			seen[s] = true
			out = append(out, s)
		}
	}
	return out
}

func dedupeIPs(in []net.IP) []net.IP {
	seen := map[string]bool{}
	var out []net.IP
	for _, ip := range in {
		if ip == nil || seen[ip.String()] {
			continue
		}
		seen[ip.String()] = true
		out = append(out, ip)
	}
	return out
}

// mergeArgs gives a control-plane component its arguments as k3s's GetArgs does
// (pkg/util/args.go): k3s's own --key=value defaults, where a --<component>-arg of the same key
// replaces the default (a key ending in "+" appends to it, one ending in "-" prepends; repeated
// keys keep every value in order), sorted by key. So
// kube-apiserver-arg "enable-admission-plugins=NodeRestriction,DenyServiceExternalIPs" is the API
// server's only --enable-admission-plugins, as on k3s.
func mergeArgs(defaults []string, extra []string) []string {
	initial := map[string]string{}
	for _, arg := range defaults {
		key, value, _ := strings.Cut(strings.TrimPrefix(arg, "--"), "=")
		initial[key] = value
	}
	multi := map[string][]string{}
	for _, unsplit := range extra {
		key, value, found := strings.Cut(strings.TrimPrefix(unsplit, "--"), "=")
		if !found {
			value = "true"
		}
		cleaned := strings.TrimRight(key, "-+")
		initialValue, hasInitial := initial[cleaned]
		existing := multi[cleaned]
		var values []string
		switch {
		case strings.HasSuffix(key, "+"):
			if hasInitial {
				values = append(values, initialValue)
			}
			values = append(append(values, existing...), value)
		case strings.HasSuffix(key, "-"):
			values = append(values, value)
			if hasInitial {
				values = append(values, initialValue)
			}
			values = append(values, existing...)
		default:
			values = append(append(values, existing...), value)
		}
		delete(initial, cleaned)
		multi[cleaned] = values
	}
	for key, value := range initial {
		multi[key] = []string{value}
	}
	keys := make([]string, 0, len(multi))
	for key := range multi {
		keys = append(keys, key)
	}
	sort.Strings(keys)
	var out []string
	for _, key := range keys {
		for _, value := range multi[key] {
			out = append(out, "--"+key+"="+value)
		}
	}
	return out
}

// ---- child processes

type child struct {
	name, logPath string
	cmd           *exec.Cmd
	done          chan struct{}
	err           error
}

func (s *server) startChild(name string, args []string) (*child, error) {
	logPath := filepath.Join(s.logDir, name+".log")
	f, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	bin := filepath.Join(s.kubeBin, name)
	fmt.Fprintf(f, "==== %s %s %s\n", time.Now().Format(time.RFC3339), bin, strings.Join(args, " "))
	cmd := exec.Command(bin, args...)
	cmd.Dir = s.serverDir
	// Only k3s itself talks to systemd: the apiserver would report READY=1 early.
	for _, e := range os.Environ() {
		if !strings.HasPrefix(e, "NOTIFY_SOCKET=") {
			cmd.Env = append(cmd.Env, e)
		}
	}
	cmd.Stdout, cmd.Stderr = f, f
	// Own process group (stopped as a group); killed if this process dies.
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	c := &child{name: name, logPath: logPath, cmd: cmd, done: make(chan struct{})}
	go func() {
		c.err = cmd.Wait()
		close(c.done)
	}()
	s.mu.Lock()
	s.children = append(s.children, c)
	s.mu.Unlock()
	infof("Running %s (pid %d), log %s", name, cmd.Process.Pid, logPath)
	return c, nil
}

func (c *child) stop() {
	select {
	case <-c.done:
		return
	default:
	}
	pid := c.cmd.Process.Pid
	_ = syscall.Kill(-pid, syscall.SIGTERM)
	select {
	case <-c.done:
	case <-time.After(childStopTimeout):
		warnf("%s did not stop within %s; killing it", c.name, childStopTimeout)
		_ = syscall.Kill(-pid, syscall.SIGKILL)
		<-c.done
	}
	// Anything left in its process group.
	_ = syscall.Kill(-pid, syscall.SIGKILL)
}

// shutdown stops the node, the supervisor and the children (newest first).
func (s *server) shutdown() {
	if s.cancel != nil {
		s.cancel()
	}
	if s.nodeDone != nil {
		select {
		case <-s.nodeDone:
		case <-time.After(5 * time.Second):
		}
	}
	if s.stopPort != nil {
		s.stopPort()
	}
	if s.stopSup != nil {
		s.stopSup()
	}
	s.mu.Lock()
	children := append([]*child(nil), s.children...)
	s.mu.Unlock()
	for i := len(children) - 1; i >= 0; i-- {
		c := children[i]
		infof("Stopping %s", c.name)
		c.stop()
	}
	_ = os.Remove(filepath.Join(s.serverDir, "kine.sock"))
}

func (s *server) startKine() (*child, error) {
	_ = os.Remove(filepath.Join(s.serverDir, "kine.sock"))
	endpoint := s.o.str("datastore-endpoint")
	if endpoint == "" {
		endpoint = "sqlite://" + filepath.Join(s.dbDir, "state.db") + "?_journal=WAL&_busy_timeout=30000"
	}
	return s.startChild("kine", []string{
		"--listen-address=unix://kine.sock",
		"--endpoint=" + endpoint,
		"--metrics-bind-address=0",
	})
}

func (s *server) startAPIServer() (*child, error) {
	t := s.tls
	egress, err := s.writeEgressSelectorConfig()
	if err != nil {
		return nil, err
	}
	args := []string{
		"--egress-selector-config-file=" + egress,
		"--advertise-address=" + s.advertise,
		"--allow-privileged=true",
		"--anonymous-auth=false",
		"--api-audiences=https://kubernetes.default.svc." + s.o.str("cluster-domain") + ",k3s",
		"--authorization-mode=Node,RBAC",
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(s.apiPort),
		"--cert-dir=" + t("temporary-certs"),
		"--client-ca-file=" + t("client-ca.crt"),
		"--enable-admission-plugins=NodeRestriction",
		"--enable-bootstrap-token-auth=true",
		"--etcd-servers=unix://kine.sock",
		"--storage-backend=etcd3",
		"--kubelet-client-certificate=" + t("client-kube-apiserver.crt"),
		"--kubelet-client-key=" + t("client-kube-apiserver.key"),
		"--kubelet-preferred-address-types=" + kubeletAddressTypes(s.o.boolean("flannel-external-ip")),
		"--profiling=false",
		"--proxy-client-cert-file=" + t("client-auth-proxy.crt"),
		"--proxy-client-key-file=" + t("client-auth-proxy.key"),
		"--requestheader-allowed-names=system:auth-proxy",
		"--requestheader-client-ca-file=" + t("request-header-ca.crt"),
		"--requestheader-extra-headers-prefix=X-Remote-Extra-",
		"--requestheader-group-headers=X-Remote-Group",
		"--requestheader-username-headers=X-Remote-User",
		"--service-account-issuer=https://kubernetes.default.svc." + s.o.str("cluster-domain"),
		"--service-account-key-file=" + t("service.key"),
		"--service-account-signing-key-file=" + t("service.key"),
		"--service-cluster-ip-range=" + s.o.str("service-cidr"),
		"--service-node-port-range=" + s.o.str("service-node-port-range"),
		"--tls-cert-file=" + t("serving-kube-apiserver.crt"),
		"--tls-private-key-file=" + t("serving-kube-apiserver.key"),
	}
	if s.encryptionConfig != "" {
		args = append(args, "--encryption-provider-config="+s.encryptionConfig, "--encryption-provider-config-automatic-reload=true")
	}
	return s.startChild("kube-apiserver", mergeArgs(args, s.o.list("kube-apiserver-arg")))
}

func (s *server) startControllerManager() (*child, error) {
	t := s.tls
	grace := os.Getenv(gracePeriodEnv)
	if grace == "" {
		grace = defaultGracePeriod
	}
	kc := filepath.Join(s.credDir, "controller.kubeconfig")
	args := []string{
		"--kubeconfig=" + kc,
		"--authentication-kubeconfig=" + kc,
		"--authorization-kubeconfig=" + kc,
		"--bind-address=127.0.0.1",
		"--secure-port=" + strconv.Itoa(defaultControllerPort),
		"--cert-dir=" + t("temporary-certs"),
		"--leader-elect=false",
		"--controllers=*,bootstrapsigner,tokencleaner",
		"--allocate-node-cidrs=true",
		"--cluster-cidr=" + s.o.str("cluster-cidr"),
		"--service-cluster-ip-range=" + s.o.str("service-cidr"),
		"--cluster-signing-kube-apiserver-client-cert-file=" + t("client-ca.crt"),
		"--cluster-signing-kube-apiserver-client-key-file=" + t("client-ca.key"),
		"--cluster-signing-kubelet-client-cert-file=" + t("client-ca.crt"),
		"--cluster-signing-kubelet-client-key-file=" + t("client-ca.key"),
		"--cluster-signing-kubelet-serving-cert-file=" + t("server-ca.crt"),
		"--cluster-signing-kubelet-serving-key-file=" + t("server-ca.key"),
		"--cluster-signing-legacy-unknown-cert-file=" + t("server-ca.crt"),
		"--cluster-signing-legacy-unknown-key-file=" + t("server-ca.key"),
		"--root-ca-file=" + t("server-ca.crt"),
		"--service-account-private-key-file=" + t("service.key"),
		"--use-service-account-credentials=true",
		"--configure-cloud-routes=false",
		"--node-monitor-grace-period=" + grace,
		"--profiling=false",
	}
	return s.startChild("kube-controller-manager", mergeArgs(args, s.o.list("kube-controller-manager-arg")))
}

func (s *server) startScheduler() (*child, error) {
	kc := filepath.Join(s.credDir, "scheduler.kubeconfig")
	return s.startChild("kube-scheduler", mergeArgs([]string{
		"--kubeconfig=" + kc,
		"--authentication-kubeconfig=" + kc,
		"--authorization-kubeconfig=" + kc,
		"--bind-address=127.0.0.1",
		"--secure-port=10259",
		"--leader-elect=false",
		"--profiling=false",
	}, s.o.list("kube-scheduler-arg")))
}

func (s *server) apiReady() bool {
	cfg := rest.CopyConfig(s.adminCfg)
	cfg.Timeout = 5 * time.Second
	client, err := rest.HTTPClientFor(cfg)
	if err != nil {
		return false
	}
	resp, err := client.Get(cfg.Host + "/readyz")
	if err != nil {
		return false
	}
	defer resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

func (s *server) controllerManagerHealthy() bool {
	if s.kcmPort <= 0 { // its secure port is switched off: nothing to ask
		return true
	}
	client := &http.Client{Timeout: 3 * time.Second, Transport: &http.Transport{
		TLSClientConfig: &tls.Config{InsecureSkipVerify: true}, //nolint:gosec // local health probe of a self-signed endpoint
	}}
	resp, err := client.Get(fmt.Sprintf("https://127.0.0.1:%d/healthz", s.kcmPort))
	if err != nil {
		return false
	}
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

func (s *server) bootstrapRBAC(ctx context.Context) error {
	rc, err := rbacclient.NewForConfig(clientConfig(s.adminCfg, "supervisor"))
	if err != nil {
		return err
	}
	// k3s's flannel reads every Node (their pod CIDRs and VTEPs) and its network-policy
	// controller every pod, namespace and NetworkPolicy (pkg/agent/netpol/netpol.go: its
	// informers) as system:k3s-controller; the stand-in's agents do it with their node
	// certificate, so the role is bound to the system:nodes group (the Node authorizer lets a
	// node read only its own Node and pods).
	controllerRole := &rbacv1.ClusterRole{
		ObjectMeta: metav1.ObjectMeta{Name: "system:k3s-controller", Labels: map[string]string{"objectset.rio.cattle.io/owner-name": "k3s"}},
		Rules: []rbacv1.PolicyRule{
			{APIGroups: []string{""}, Resources: []string{"nodes"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{""}, Resources: []string{"pods", "namespaces"}, Verbs: []string{"get", "list", "watch"}},
			{APIGroups: []string{"networking.k8s.io"}, Resources: []string{"networkpolicies"}, Verbs: []string{"get", "list", "watch"}},
		},
	}
	if _, err := rc.ClusterRoles().Create(ctx, controllerRole, metav1.CreateOptions{}); apierrors.IsAlreadyExists(err) {
		existing, gerr := rc.ClusterRoles().Get(ctx, controllerRole.Name, metav1.GetOptions{})
		if gerr != nil {
			return gerr
		}
		existing.Rules = controllerRole.Rules
		if _, err := rc.ClusterRoles().Update(ctx, existing, metav1.UpdateOptions{}); err != nil {
			return fmt.Errorf("clusterrole %s: %w", controllerRole.Name, err)
		}
	} else if err != nil {
		return fmt.Errorf("clusterrole %s: %w", controllerRole.Name, err)
	}
	bindings := []struct{ name, role, kind, subject string }{
		{"system:k3s-controller", "system:k3s-controller", rbacv1.GroupKind, "system:nodes"},
		{"k3s:kubelet-bootstrap", "system:node-bootstrapper", rbacv1.GroupKind, "system:bootstrappers"},
		{"k3s:node-autoapprove-bootstrap", "system:certificates.k8s.io:certificatesigningrequests:nodeclient", rbacv1.GroupKind, "system:bootstrappers"},
		{"k3s:node-autoapprove-certificate-rotation", "system:certificates.k8s.io:certificatesigningrequests:selfnodeclient", rbacv1.GroupKind, "system:nodes"},
		{"kube-apiserver-kubelet-admin", "system:kubelet-api-admin", rbacv1.UserKind, "system:kube-apiserver"},
	}
	for _, b := range bindings {
		crb := &rbacv1.ClusterRoleBinding{
			ObjectMeta: metav1.ObjectMeta{Name: b.name, Labels: map[string]string{"objectset.rio.cattle.io/owner-name": "k3s"}},
			RoleRef:    rbacv1.RoleRef{APIGroup: rbacv1.GroupName, Kind: "ClusterRole", Name: b.role},
			Subjects:   []rbacv1.Subject{{APIGroup: rbacv1.GroupName, Kind: b.kind, Name: b.subject}},
		}
		_, err := rc.ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{})
		if apierrors.IsAlreadyExists(err) {
			existing, gerr := rc.ClusterRoleBindings().Get(ctx, b.name, metav1.GetOptions{})
			if gerr != nil {
				return gerr
			}
			if existing.RoleRef != crb.RoleRef {
				if err := rc.ClusterRoleBindings().Delete(ctx, b.name, metav1.DeleteOptions{}); err != nil {
					return err
				}
				_, err = rc.ClusterRoleBindings().Create(ctx, crb, metav1.CreateOptions{})
			} else {
				existing.Subjects = crb.Subjects
				_, err = rc.ClusterRoleBindings().Update(ctx, existing, metav1.UpdateOptions{})
			}
		}
		if err != nil {
			return fmt.Errorf("clusterrolebinding %s: %w", b.name, err)
		}
	}
	return nil
}

func (s *server) kubeconfigServerURL() string {
	host := "127.0.0.1"
	if b := s.bindAddress; b != "" && b != "0.0.0.0" && b != "::" {
		host = b
	}
	return "https://" + net.JoinHostPort(host, strconv.Itoa(s.httpsPort))
}

func (s *server) writeAdminKubeconfig() error {
	path := s.o.str("write-kubeconfig")
	if path == "" {
		path = serverKubeconfigDefault
	}
	mode := os.FileMode(0o600)
	if m := s.o.str("write-kubeconfig-mode"); m != "" {
		v, err := strconv.ParseUint(m, 8, 32)
		if err != nil {
			return fmt.Errorf("invalid --write-kubeconfig-mode %q", m)
		}
		mode = os.FileMode(v)
	}
	kp, err := loadKeyPair(s.tls("client-admin.crt"), s.tls("client-admin.key"))
	if err != nil {
		return err
	}
	keyPEM, err := keyToPEM(kp.key)
	if err != nil {
		return err
	}
	if err := writeKubeconfig(path, s.kubeconfigServerURL(), s.caBundle, kp.certPEM, keyPEM, mode); err != nil {
		return err
	}
	if err := os.Chmod(path, mode); err != nil {
		return err
	}
	infof("Wrote kubeconfig %s", path)
	return nil
}

// startNode runs the server's own node through the supervisor, with a kubelet
// client certificate the server signs itself, and labels it with the server roles.
func (s *server) startNode(ctx context.Context) error {
	ns := *s.node
	dir := ns.dataDir
	kp, err := ensureCert(s.clientCA, filepath.Join(dir, "client-kubelet.crt"), filepath.Join(dir, "client-kubelet.key"), certSpec{
		cn: "system:node:" + ns.name, orgs: []string{"system:nodes"}, client: true,
	})
	if err != nil {
		return err
	}
	keyPEM, err := keyToPEM(kp.key)
	if err != nil {
		return err
	}
	url := s.kubeconfigServerURL()
	if err := writeFileAtomic(filepath.Join(dir, "server-ca.crt"), s.caBundle, 0o644); err != nil {
		return err
	}
	if err := writeKubeconfig(filepath.Join(dir, "kubelet.kubeconfig"), url, s.caBundle, kp.certPEM, keyPEM, 0o600); err != nil {
		return err
	}
	if s.stopPort, err = startKubeletPort(ctx, ns); err != nil {
		return err
	}
	cfg := &rest.Config{Host: url, TLSClientConfig: rest.TLSClientConfig{CAData: s.caBundle, CertData: kp.certPEM, KeyData: keyPEM}}
	s.nodeDone = make(chan struct{})
	go func() {
		defer close(s.nodeDone)
		_ = runNode(ctx, cfg, ns, func(*corev1.Node) { s.labelServerNode(ctx, ns.name) })
	}()
	return nil
}

// labelServerNode adds the role labels with the supervisor's credentials (a node
// may not set node-role labels on itself).
func (s *server) labelServerNode(ctx context.Context, name string) {
	core, err := corev1client.NewForConfig(clientConfig(s.adminCfg, "supervisor"))
	if err != nil {
		errorf("labelling node %s: %v", name, err)
		return
	}
	patch := fmt.Sprintf(`{"metadata":{"labels":{%q:"true",%q:"true"}}}`, controlPlaneLabel, masterLabel)
	if s.encryptionConfig != "" {
		// The encryption stage, from encryption-state.json (BootstrapEncryptionHashAnnotation).
		if state, err := os.ReadFile(encryptionStatePath(s.serverDir)); err == nil {
			patch = fmt.Sprintf(`{"metadata":{"labels":{%q:"true",%q:"true"},"annotations":{%q:%q}}}`,
				controlPlaneLabel, masterLabel, encryptionHashAnnotation, string(state))
		}
	}
	for {
		_, err := core.Nodes().Patch(ctx, name, types.MergePatchType, []byte(patch), metav1.PatchOptions{})
		if err == nil {
			infof("Labelled node %s with %s=true and %s=true", name, controlPlaneLabel, masterLabel)
			return
		}
		if ctx.Err() != nil {
			return
		}
		errorf("Failed to set role labels on node %s: %v", name, err)
		if !sleepCtx(ctx, 5*time.Second) {
			return
		}
	}
}

// sdNotify tells systemd (Type=notify units, as k3s's are) about our state.
func sdNotify(state string) {
	addr := os.Getenv("NOTIFY_SOCKET")
	if addr == "" {
		return
	}
	conn, err := net.DialUnix("unixgram", nil, &net.UnixAddr{Name: addr, Net: "unixgram"})
	if err != nil {
		warnf("sd_notify: %v", err)
		return
	}
	defer conn.Close()
	if _, err := conn.Write([]byte(state)); err != nil {
		warnf("sd_notify: %v", err)
	}
}

// kubeletAddressTypes: real k3s reaches kubelets through each agent's tunnel, whatever
// the node's addresses. The stand-in has no tunnel and dials the node directly, so when
// nodes are reachable only at their external addresses (--flannel-external-ip: some sit
// behind a 1:1 NAT) it prefers those.
func kubeletAddressTypes(externalFirst bool) string {
	if externalFirst {
		return "ExternalIP,InternalIP,Hostname"
	}
	return "InternalIP,ExternalIP,Hostname"
}
