package main

// The node side shared by agent and server: register the Node like a kubelet does
// (labels, taints, addresses, capacity, node info), keep its Lease in kube-node-lease
// and its Ready condition fresh, and serve /healthz over TLS on the kubelet port.
// Nothing runs pods.

import (
	"bufio"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	coordinationv1 "k8s.io/api/coordination/v1"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	coordinationclient "k8s.io/client-go/kubernetes/typed/coordination/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
	"k8s.io/client-go/util/retry"
)

const (
	defaultKubeletPort   = 10250
	leaseDurationSeconds = 40
	leaseRenewInterval   = 10 * time.Second
	statusCheckInterval  = 10 * time.Second
	statusReportInterval = time.Minute
)

// nodeSpec is what the node side registers and reports.
type nodeSpec struct {
	name           string
	labels         map[string]string
	annotations    map[string]string
	flannelBackend string // the server's, read by an agent at its start (podnet.go)
	// The server's, read by an agent at its start (agentsettings.go).
	flannelExternalIP bool
	clusterDNS        string
	kubeProxy         bool
	taints            []corev1.Taint
	internalIPs       []string
	externalIPs       []string
	kubeletPort       int
	dataDir           string // the node's own directory (<data-dir>/agent)
}

// nodeOptions turns the common node flags into a nodeSpec (name, labels, taints,
// addresses, kubelet port).
func nodeOptions(o *options, role string) (nodeSpec, error) {
	ns := nodeSpec{
		labels:      map[string]string{},
		annotations: map[string]string{},
		kubeletPort: defaultKubeletPort,
		dataDir:     filepath.Join(o.str("data-dir"), "agent"),
	}
	name := o.str("node-name")
	if name == "" {
		h, err := os.Hostname()
		if err != nil {
			return ns, err
		}
		name = h
	}
	ns.name = strings.ToLower(name)
	if errs := validateDNS1123Subdomain(ns.name); errs != "" {
		return ns, fmt.Errorf("invalid node name %q: %s", ns.name, errs)
	}
	var restricted []string
	for _, l := range o.list("node-label") {
		k, v, ok := strings.Cut(l, "=")
		if !ok || k == "" {
			return ns, fmt.Errorf("invalid --node-label %q (want key=value)", l)
		}
		if kubeletRestrictedLabel(k) {
			restricted = append(restricted, k)
		}
		ns.labels[k] = v
	}
	if len(restricted) > 0 {
		// The kubelet refuses to start with these (NodeRestriction would reject them).
		return ns, fmt.Errorf("unknown 'kubernetes.io' or 'k8s.io' labels specified with --node-labels: %v\n"+
			"--node-labels in the 'kubernetes.io' namespace must begin with an allowed prefix (kubelet.kubernetes.io, node.kubernetes.io) "+
			"or be in the specifically allowed set (%s)", restricted, strings.Join(kubeletAllowedLabels, ", "))
	}
	for _, t := range o.list("node-taint") {
		taint, err := parseTaint(t)
		if err != nil {
			return ns, err
		}
		ns.taints = append(ns.taints, taint)
	}
	for _, a := range o.list("kubelet-arg") {
		k, v, _ := strings.Cut(strings.TrimLeft(a, "-"), "=")
		switch k {
		case "port":
			p, err := strconv.Atoi(v)
			if err != nil || p < 1 || p > 65535 {
				return ns, fmt.Errorf("invalid --kubelet-arg %q", a)
			}
			ns.kubeletPort = p
		default:
			debugf("kubelet argument %q has no effect here", a)
		}
	}
	var err error
	if ns.internalIPs, err = ipList(o.list("node-ip"), "--node-ip"); err != nil {
		return ns, err
	}
	if ns.externalIPs, err = ipList(o.list("node-external-ip"), "--node-external-ip"); err != nil {
		return ns, err
	}
	if len(ns.internalIPs) == 0 {
		ip, err := defaultNodeIP(o.str("flannel-iface"))
		if err != nil {
			return ns, err
		}
		ns.internalIPs = []string{ip}
	}
	ns.annotations["k3s.io/hostname"] = hostnameOrEmpty()
	ns.annotations["k3s.io/internal-ip"] = strings.Join(ns.internalIPs, ",")
	if len(ns.externalIPs) > 0 {
		ns.annotations["k3s.io/external-ip"] = strings.Join(ns.externalIPs, ",")
	}
	ns.annotations["k3s.io/node-args"] = nodeArgsAnnotation(role, o)
	return ns, nil
}

// The labels a kubelet may set on its own Node in the kubernetes.io and k8s.io
// namespaces (besides the kubelet.kubernetes.io and node.kubernetes.io prefixes).
var kubeletAllowedLabels = []string{
	"beta.kubernetes.io/arch", "beta.kubernetes.io/instance-type", "beta.kubernetes.io/os",
	"failure-domain.beta.kubernetes.io/region", "failure-domain.beta.kubernetes.io/zone",
	"kubernetes.io/arch", "kubernetes.io/hostname", "kubernetes.io/os",
	"node.kubernetes.io/instance-type", "topology.kubernetes.io/region", "topology.kubernetes.io/zone",
}

func kubeletRestrictedLabel(key string) bool {
	prefix, _, ok := strings.Cut(key, "/")
	if !ok {
		return false
	}
	inK8sNamespace := func(p, ns string) bool { return p == ns || strings.HasSuffix(p, "."+ns) }
	if !inK8sNamespace(prefix, "kubernetes.io") && !inK8sNamespace(prefix, "k8s.io") {
		return false
	}
	for _, allowed := range []string{"kubelet.kubernetes.io", "node.kubernetes.io"} {
		if inK8sNamespace(prefix, allowed) {
			return false
		}
	}
	return !slices.Contains(kubeletAllowedLabels, key)
}

func hostnameOrEmpty() string {
	h, _ := os.Hostname()
	return h
}

// nodeArgsAnnotation records the node's arguments as k3s does, secrets redacted.
func nodeArgsAnnotation(role string, o *options) string {
	args := []string{role}
	for _, d := range o.order {
		src, ok := o.set[d.name]
		if !ok || d.name == "config" {
			continue
		}
		_ = src
		redact := strings.Contains(d.name, "token") || d.name == "vpn-auth" || d.name == "datastore-endpoint"
		if d.kind == kindList {
			for _, v := range o.lists[d.name] {
				if redact {
					v = "********"
				}
				args = append(args, "--"+d.name, v)
			}
			continue
		}
		v := o.scalars[d.name]
		if redact {
			v = "********"
		}
		args = append(args, "--"+d.name, v)
	}
	b, _ := json.Marshal(args)
	return string(b)
}

func validateDNS1123Subdomain(s string) string {
	if len(s) == 0 || len(s) > 253 {
		return "must be 1 to 253 characters"
	}
	for _, part := range strings.Split(s, ".") {
		if part == "" || part[0] == '-' || part[len(part)-1] == '-' {
			return "must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"
		}
		for _, r := range part {
			if !(r >= 'a' && r <= 'z' || r >= '0' && r <= '9' || r == '-') {
				return "must consist of lower case alphanumeric characters, '-' or '.', and must start and end with an alphanumeric character"
			}
		}
	}
	return ""
}

func parseTaint(s string) (corev1.Taint, error) {
	var t corev1.Taint
	kv, effect, ok := strings.Cut(s, ":")
	if !ok {
		return t, fmt.Errorf("invalid --node-taint %q (want key[=value]:Effect)", s)
	}
	switch corev1.TaintEffect(effect) {
	case corev1.TaintEffectNoSchedule, corev1.TaintEffectPreferNoSchedule, corev1.TaintEffectNoExecute:
	default:
		return t, fmt.Errorf("invalid --node-taint %q: effect must be NoSchedule, PreferNoSchedule or NoExecute", s)
	}
	k, v, _ := strings.Cut(kv, "=")
	if k == "" {
		return t, fmt.Errorf("invalid --node-taint %q: empty key", s)
	}
	return corev1.Taint{Key: k, Value: v, Effect: corev1.TaintEffect(effect)}, nil
}

func ipList(values []string, flag string) ([]string, error) {
	var out []string
	for _, v := range values {
		ip := net.ParseIP(v)
		if ip == nil {
			return nil, fmt.Errorf("invalid %s %q: not an IP address", flag, v)
		}
		out = append(out, ip.String())
	}
	return out, nil
}

// defaultNodeIP: the first IPv4 of --flannel-iface when given (as k3s does), else
// the first global IPv4 of the interface holding the default route, else the
// first global IPv4 of any interface that is up.
func defaultNodeIP(iface string) (string, error) {
	if iface != "" {
		ifc, err := net.InterfaceByName(iface)
		if err != nil {
			return "", fmt.Errorf("unable to find interface %s: %w", iface, err)
		}
		if ip := firstGlobalIPv4(ifc); ip != "" {
			return ip, nil
		}
		return "", fmt.Errorf("interface %s has no IPv4 address", iface)
	}
	if name := defaultRouteInterface(); name != "" {
		if ifc, err := net.InterfaceByName(name); err == nil {
			if ip := firstGlobalIPv4(ifc); ip != "" {
				return ip, nil
			}
		}
	}
	ifcs, _ := net.Interfaces()
	for i := range ifcs {
		if ifcs[i].Flags&net.FlagUp == 0 || ifcs[i].Flags&net.FlagLoopback != 0 {
			continue
		}
		if ip := firstGlobalIPv4(&ifcs[i]); ip != "" {
			return ip, nil
		}
	}
	return "127.0.0.1", nil
}

func firstGlobalIPv4(ifc *net.Interface) string {
	addrs, _ := ifc.Addrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok {
			if ip := n.IP.To4(); ip != nil && ip.IsGlobalUnicast() {
				return ip.String()
			}
		}
	}
	return ""
}

func defaultRouteInterface() string {
	f, err := os.Open("/proc/net/route")
	if err != nil {
		return ""
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		fields := strings.Fields(s.Text())
		if len(fields) > 2 && fields[1] == "00000000" && fields[0] != "Iface" {
			return fields[0]
		}
	}
	return ""
}

// allHostIPs lists the addresses of every interface (for certificate SANs).
func allHostIPs() []net.IP {
	var out []net.IP
	addrs, _ := net.InterfaceAddrs()
	for _, a := range addrs {
		if n, ok := a.(*net.IPNet); ok && !n.IP.IsLinkLocalUnicast() {
			out = append(out, n.IP)
		}
	}
	return out
}

// ---- the running node

type nodeRunner struct {
	spec    nodeSpec
	nodes   corev1client.NodeInterface
	leases  coordinationclient.LeaseInterface
	nodeUID string
	onceUp  func(*corev1.Node) // called once after the first Ready status was posted
}

// startKubeletPort binds the kubelet port and serves /healthz over TLS with a
// self-signed serving certificate kept in the node's directory.
func startKubeletPort(ctx context.Context, spec nodeSpec) (func(), error) {
	var ips []net.IP
	for _, s := range append(append([]string{"127.0.0.1"}, spec.internalIPs...), spec.externalIPs...) {
		ips = append(ips, net.ParseIP(s))
	}
	kp, err := ensureCert(nil, filepath.Join(spec.dataDir, "serving-kubelet.crt"), filepath.Join(spec.dataDir, "serving-kubelet.key"), certSpec{
		cn: spec.name, dns: []string{spec.name, "localhost"}, ips: ips, server: true,
	})
	if err != nil {
		return nil, fmt.Errorf("kubelet serving certificate: %w", err)
	}
	cert := tls.Certificate{Certificate: [][]byte{kp.cert.Raw}, PrivateKey: kp.key, Leaf: kp.cert}
	ln, err := net.Listen("tcp", net.JoinHostPort("", strconv.Itoa(spec.kubeletPort)))
	if err != nil {
		return nil, fmt.Errorf("kubelet port: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		_, _ = w.Write([]byte("ok"))
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		http.Error(w, "404 page not found", http.StatusNotFound)
	})
	srv := &http.Server{
		Handler:           mux,
		TLSConfig:         &tls.Config{Certificates: []tls.Certificate{cert}, MinVersion: tls.VersionTLS12},
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          nil,
	}
	go func() {
		if err := srv.ServeTLS(ln, "", ""); err != nil && !errors.Is(err, http.ErrServerClosed) {
			errorf("kubelet port: %v", err)
		}
	}()
	infof("Kubelet stand-in serving /healthz on :%d (self-signed serving certificate %s)", spec.kubeletPort, filepath.Join(spec.dataDir, "serving-kubelet.crt"))
	stop := func() {
		sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		_ = srv.Shutdown(sctx)
	}
	return stop, nil
}

// runNode registers the Node and keeps it alive until ctx ends. The kubelet port
// must already be served. onceUp runs once after the first Ready status.
func runNode(ctx context.Context, cfg *rest.Config, spec nodeSpec, onceUp func(*corev1.Node)) error {
	cfg = clientConfig(cfg, "kubelet")
	core, err := corev1client.NewForConfig(cfg)
	if err != nil {
		return err
	}
	coord, err := coordinationclient.NewForConfig(cfg)
	if err != nil {
		return err
	}
	nr := &nodeRunner{spec: spec, nodes: core.Nodes(), leases: coord.Leases(corev1.NamespaceNodeLease), onceUp: onceUp}

	// Register, retrying like the kubelet does.
	for {
		err := nr.register(ctx)
		if err == nil {
			break
		}
		errorf("Unable to register node %q with API server: %v", spec.name, err)
		if !sleepCtx(ctx, 5*time.Second) {
			return nil
		}
	}

	leaseTick := time.NewTicker(leaseRenewInterval)
	defer leaseTick.Stop()
	statusTick := time.NewTicker(statusCheckInterval)
	defer statusTick.Stop()
	lastReport := time.Time{}
	announced := false
	failing := false
	syncStatus := func() {
		posted, err := nr.syncStatus(ctx, &lastReport)
		if err != nil {
			if ctx.Err() == nil {
				errorf("Error updating node status, will retry: %v", err)
				failing = true
			}
			return
		}
		if failing {
			infof("Node %s status updates resumed", spec.name)
			failing = false
		}
		if posted != nil && !announced {
			announced = true
			infof("Node %s is Ready (kubelet version %s)", spec.name, version)
			if nr.onceUp != nil {
				go nr.onceUp(posted)
			}
		}
	}
	nr.renewLease(ctx)
	syncStatus()
	for {
		select {
		case <-ctx.Done():
			infof("Stopped heartbeating node %s", spec.name)
			return nil
		case <-leaseTick.C:
			nr.renewLease(ctx)
		case <-statusTick.C:
			syncStatus()
		}
	}
}

func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

func (nr *nodeRunner) baseLabels() map[string]string {
	l := map[string]string{
		"kubernetes.io/hostname":           nr.spec.name,
		"kubernetes.io/os":                 runtime.GOOS,
		"kubernetes.io/arch":               runtime.GOARCH,
		"beta.kubernetes.io/os":            runtime.GOOS,
		"beta.kubernetes.io/arch":          runtime.GOARCH,
		"node.kubernetes.io/instance-type": "k3s",
		"beta.kubernetes.io/instance-type": "k3s",
	}
	for k, v := range nr.spec.labels {
		l[k] = v
	}
	return l
}

// register creates the Node, or adopts the existing one (then the configured
// labels are added or updated; taints are only set at registration, as a kubelet).
func (nr *nodeRunner) register(ctx context.Context) error {
	node := &corev1.Node{
		ObjectMeta: metav1.ObjectMeta{
			Name:        nr.spec.name,
			Labels:      nr.baseLabels(),
			Annotations: map[string]string{"volumes.kubernetes.io/controller-managed-attach-detach": "true"},
		},
		Spec: corev1.NodeSpec{Taints: nr.spec.taints},
	}
	for k, v := range nr.spec.annotations {
		node.Annotations[k] = v
	}
	created, err := nr.nodes.Create(ctx, node, metav1.CreateOptions{})
	if err == nil {
		nr.nodeUID = string(created.UID)
		infof("Successfully registered node %s", nr.spec.name)
		return nil
	}
	if !apierrors.IsAlreadyExists(err) {
		return err
	}
	return retry.RetryOnConflict(retry.DefaultRetry, func() error {
		existing, err := nr.nodes.Get(ctx, nr.spec.name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		nr.nodeUID = string(existing.UID)
		changed := false
		if existing.Labels == nil {
			existing.Labels = map[string]string{}
		}
		if existing.Annotations == nil {
			existing.Annotations = map[string]string{}
		}
		for k, v := range nr.baseLabels() {
			if existing.Labels[k] != v {
				existing.Labels[k] = v
				changed = true
			}
		}
		for k, v := range nr.spec.annotations {
			if existing.Annotations[k] != v {
				existing.Annotations[k] = v
				changed = true
			}
		}
		if changed {
			if _, err := nr.nodes.Update(ctx, existing, metav1.UpdateOptions{}); err != nil {
				return err
			}
		}
		infof("Node %s was already registered; reusing it", nr.spec.name)
		return nil
	})
}

func (nr *nodeRunner) renewLease(ctx context.Context) {
	now := metav1.NewMicroTime(time.Now())
	name := nr.spec.name
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		lease, err := nr.leases.Get(ctx, name, metav1.GetOptions{})
		if apierrors.IsNotFound(err) {
			holder, dur := name, int32(leaseDurationSeconds)
			l := &coordinationv1.Lease{
				ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: corev1.NamespaceNodeLease},
				Spec: coordinationv1.LeaseSpec{
					HolderIdentity: &holder, LeaseDurationSeconds: &dur, RenewTime: &now,
				},
			}
			if nr.nodeUID != "" {
				l.OwnerReferences = []metav1.OwnerReference{{
					APIVersion: "v1", Kind: "Node", Name: name, UID: types.UID(nr.nodeUID),
				}}
			}
			_, err = nr.leases.Create(ctx, l, metav1.CreateOptions{})
			return err
		}
		if err != nil {
			return err
		}
		holder, dur := name, int32(leaseDurationSeconds)
		lease.Spec.HolderIdentity, lease.Spec.LeaseDurationSeconds, lease.Spec.RenewTime = &holder, &dur, &now
		_, err = nr.leases.Update(ctx, lease, metav1.UpdateOptions{})
		return err
	})
	if err != nil && ctx.Err() == nil {
		errorf("Failed to update lease for node %s: %v", name, err)
	}
}

// syncStatus posts the node status when something changed or the last report is
// older than statusReportInterval. Returns the node when posted.
func (nr *nodeRunner) syncStatus(ctx context.Context, lastReport *time.Time) (*corev1.Node, error) {
	var posted *corev1.Node
	err := retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node, err := nr.nodes.Get(ctx, nr.spec.name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		want := nr.desiredStatus(node)
		if !statusChanged(node, want) && time.Since(*lastReport) < statusReportInterval {
			return nil
		}
		now := metav1.Now()
		conds := make([]corev1.NodeCondition, 0, len(want.Conditions))
		for _, c := range want.Conditions {
			c.LastHeartbeatTime = now
			c.LastTransitionTime = now
			for _, old := range node.Status.Conditions {
				if old.Type == c.Type && old.Status == c.Status {
					c.LastTransitionTime = old.LastTransitionTime
				}
			}
			conds = append(conds, c)
		}
		// Keep conditions owned by others (e.g. NetworkUnavailable).
		for _, old := range node.Status.Conditions {
			if !slices.ContainsFunc(conds, func(c corev1.NodeCondition) bool { return c.Type == old.Type }) {
				conds = append(conds, old)
			}
		}
		node.Status.Conditions = conds
		node.Status.Addresses = want.Addresses
		node.Status.Capacity = want.Capacity
		node.Status.Allocatable = want.Allocatable
		node.Status.NodeInfo = want.NodeInfo
		node.Status.DaemonEndpoints = want.DaemonEndpoints
		updated, err := nr.nodes.UpdateStatus(ctx, node, metav1.UpdateOptions{})
		if err != nil {
			return err
		}
		posted = updated
		*lastReport = time.Now()
		return nil
	})
	return posted, err
}

func statusChanged(node *corev1.Node, want corev1.NodeStatus) bool {
	for _, c := range want.Conditions {
		found := false
		for _, old := range node.Status.Conditions {
			if old.Type == c.Type {
				found = true
				if old.Status != c.Status || old.Reason != c.Reason {
					return true
				}
			}
		}
		if !found {
			return true
		}
	}
	if !slices.Equal(node.Status.Addresses, want.Addresses) {
		return true
	}
	if node.Status.NodeInfo.KubeletVersion != want.NodeInfo.KubeletVersion ||
		node.Status.DaemonEndpoints.KubeletEndpoint.Port != want.DaemonEndpoints.KubeletEndpoint.Port {
		return true
	}
	return false
}

func (nr *nodeRunner) desiredStatus(_ *corev1.Node) corev1.NodeStatus {
	var addrs []corev1.NodeAddress
	for _, ip := range nr.spec.internalIPs {
		addrs = append(addrs, corev1.NodeAddress{Type: corev1.NodeInternalIP, Address: ip})
	}
	for _, ip := range nr.spec.externalIPs {
		addrs = append(addrs, corev1.NodeAddress{Type: corev1.NodeExternalIP, Address: ip})
	}
	addrs = append(addrs, corev1.NodeAddress{Type: corev1.NodeHostName, Address: nr.spec.name})

	capacity := corev1.ResourceList{
		corev1.ResourceCPU:              *resource.NewQuantity(int64(runtime.NumCPU()), resource.DecimalSI),
		corev1.ResourceMemory:           *resource.NewQuantity(memTotalBytes(), resource.BinarySI),
		corev1.ResourcePods:             *resource.NewQuantity(110, resource.DecimalSI),
		corev1.ResourceEphemeralStorage: *resource.NewQuantity(diskBytes(nr.spec.dataDir), resource.BinarySI),
	}
	cond := func(t corev1.NodeConditionType, s corev1.ConditionStatus, reason, msg string) corev1.NodeCondition {
		return corev1.NodeCondition{Type: t, Status: s, Reason: reason, Message: msg}
	}
	return corev1.NodeStatus{
		Capacity:    capacity,
		Allocatable: capacity.DeepCopy(),
		Conditions: []corev1.NodeCondition{
			cond(corev1.NodeMemoryPressure, corev1.ConditionFalse, "KubeletHasSufficientMemory", "kubelet has sufficient memory available"),
			cond(corev1.NodeDiskPressure, corev1.ConditionFalse, "KubeletHasNoDiskPressure", "kubelet has no disk pressure"),
			cond(corev1.NodePIDPressure, corev1.ConditionFalse, "KubeletHasSufficientPID", "kubelet has sufficient PID available"),
			cond(corev1.NodeReady, corev1.ConditionTrue, "KubeletReady", "kubelet is posting ready status"),
		},
		Addresses:       addrs,
		DaemonEndpoints: corev1.NodeDaemonEndpoints{KubeletEndpoint: corev1.DaemonEndpoint{Port: int32(nr.spec.kubeletPort)}},
		NodeInfo: corev1.NodeSystemInfo{
			MachineID:               readTrimmed("/etc/machine-id"),
			SystemUUID:              readTrimmed("/sys/class/dmi/id/product_uuid"),
			BootID:                  readTrimmed("/proc/sys/kernel/random/boot_id"),
			KernelVersion:           kernelVersion(),
			OSImage:                 osImage(),
			ContainerRuntimeVersion: "", // no container runtime: nothing to report
			KubeletVersion:          version,
			OperatingSystem:         runtime.GOOS,
			Architecture:            runtime.GOARCH,
		},
	}
}

func readTrimmed(path string) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return ""
	}
	return strings.TrimSpace(string(b))
}

func kernelVersion() string {
	var u syscall.Utsname
	if syscall.Uname(&u) != nil {
		return ""
	}
	var b strings.Builder
	for _, c := range u.Release {
		if c == 0 {
			break
		}
		b.WriteByte(byte(c))
	}
	return b.String()
}

func osImage() string {
	b, err := os.ReadFile("/etc/os-release")
	if err != nil {
		return "Linux"
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "PRETTY_NAME="); ok {
			if u, err := strconv.Unquote(v); err == nil {
				return u
			}
			return strings.Trim(v, `"'`)
		}
	}
	return "Linux"
}

func memTotalBytes() int64 {
	b, err := os.ReadFile("/proc/meminfo")
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "MemTotal:"); ok {
			f := strings.Fields(v)
			if len(f) > 0 {
				kb, _ := strconv.ParseInt(f[0], 10, 64)
				return kb * 1024
			}
		}
	}
	return 0
}

func diskBytes(path string) int64 {
	var st syscall.Statfs_t
	for p := path; ; p = filepath.Dir(p) {
		if syscall.Statfs(p, &st) == nil {
			return int64(st.Blocks) * st.Bsize
		}
		if p == "/" || p == "." {
			return 0
		}
	}
}
