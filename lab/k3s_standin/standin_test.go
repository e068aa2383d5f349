package main

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/sha256"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/hex"
	"encoding/pem"
	"fmt"
	"io"
	"math/big"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
)

func writeFile(t *testing.T, path, content string) {
	t.Helper()
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
}

func TestConfigFileMergesWithFlags(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.yaml")
	writeFile(t, cfg, `
server: https://10.0.0.2:6443
token: K10abc::abcdef.0123456789abcdef
node-ip: 10.0.1.5
flannel-iface: enp7s0
node-label:
  - a=b
  - c=d
node-taint: [hk3s.dev/validating=true:NoSchedule]
kubelet-arg: "port=10260"
selinux: true
not-a-flag: 1
`)
	writeFile(t, cfg+".d/10-extra.yaml", "node-label+: [e=f]\nnode-name: from-dropin\n")
	t.Setenv("K3S_NODE_NAME", "from-env")
	t.Setenv("K3S_URL", "https://ignored:6443")
	o, err := parseCommand(agentFlags(), []string{"--config", cfg, "--node-label", "x=y", "--node-ip=10.0.1.6", "-d", "/tmp/dd"})
	if err != nil {
		t.Fatal(err)
	}
	if got := o.str("server"); got != "https://10.0.0.2:6443" {
		t.Errorf("server = %q (config beats env)", got)
	}
	if got := o.list("node-label"); !slices.Equal(got, []string{"a=b", "c=d", "e=f", "x=y"}) {
		t.Errorf("node-label = %v", got)
	}
	if got := o.list("node-ip"); !slices.Equal(got, []string{"10.0.1.5", "10.0.1.6"}) {
		t.Errorf("node-ip = %v", got)
	}
	if got := o.str("node-name"); got != "from-dropin" {
		t.Errorf("node-name = %q", got)
	}
	if got := o.str("data-dir"); got != "/tmp/dd" {
		t.Errorf("data-dir = %q", got)
	}
	if got := o.list("node-taint"); !slices.Equal(got, []string{"hk3s.dev/validating=true:NoSchedule"}) {
		t.Errorf("node-taint = %v", got)
	}
	if !o.isSet("selinux") || !o.defs["selinux"].ignored {
		t.Errorf("selinux should be accepted and marked ignored")
	}
}

func TestFlagOnCommandLineBeatsConfig(t *testing.T) {
	dir := t.TempDir()
	cfg := filepath.Join(dir, "config.yaml")
	writeFile(t, cfg, "node-name: from-config\ndata-dir: /var/lib/x\n")
	o, err := parseCommand(serverFlags(), []string{"-c", cfg, "--node-name", "cli"})
	if err != nil {
		t.Fatal(err)
	}
	if o.str("node-name") != "cli" || o.str("data-dir") != "/var/lib/x" {
		t.Errorf("node-name=%q data-dir=%q", o.str("node-name"), o.str("data-dir"))
	}
	if o.str("https-listen-port") != "6443" || o.str("write-kubeconfig") != "/etc/rancher/k3s/k3s.yaml" {
		t.Errorf("defaults: %q %q", o.str("https-listen-port"), o.str("write-kubeconfig"))
	}
}

func TestUnknownFlagAndMissingExplicitConfigFail(t *testing.T) {
	if _, err := parseCommand(agentFlags(), []string{"--config", "/dev/null", "--no-such-flag"}); err == nil {
		t.Error("unknown flag accepted")
	}
	if _, err := parseCommand(agentFlags(), []string{"--config", filepath.Join(t.TempDir(), "absent.yaml")}); err == nil {
		t.Error("missing explicit config file accepted")
	}
}

func TestParseToken(t *testing.T) {
	ca := []byte("-----BEGIN CERTIFICATE-----\nabc\n-----END CERTIFICATE-----\n")
	sum := sha256.Sum256(ca)
	tok := formatToken(ca, "abcdef.0123456789abcdef")
	if tok != "K10"+hex.EncodeToString(sum[:])+"::abcdef.0123456789abcdef" {
		t.Fatalf("formatToken = %q", tok)
	}
	p := parseToken(tok)
	if p.caHash != hex.EncodeToString(sum[:]) || !p.isBootstrap() || p.id != "abcdef" || p.secret != "0123456789abcdef" {
		t.Errorf("parseToken = %+v", p)
	}
	s := parseToken("K10" + hex.EncodeToString(sum[:]) + "::server:s3cret")
	if s.isBootstrap() || s.user != "server" || s.password != "s3cret" {
		t.Errorf("server token = %+v", s)
	}
	plain := parseToken("abcdef.0123456789abcdef")
	if plain.caHash != "" || !plain.isBootstrap() {
		t.Errorf("plain bootstrap token = %+v", plain)
	}
}

func TestAgentTokenRulesAreK3ss(t *testing.T) {
	hash := hex.EncodeToString(make([]byte, 32))
	for token, want := range map[string]string{
		"":                                "token must not be empty",
		"   \n":                           "token must not be empty",
		"K10abc::abcdef.0123456789abcdef": "invalid token CA hash length",
		"K10" + hash + "::server:":        "invalid token format",
		"K10" + hash + "::abcdef.0123456789abcdef": "",
		"abcdef.0123456789abcdef":                  "",
		"plain-server-password":                    "",
	} {
		_, err := validateAgentToken(token)
		if got := ""; err != nil {
			got = err.Error()
			if got != want {
				t.Errorf("validateAgentToken(%q) = %q, want %q", token, got, want)
			}
		} else if want != "" {
			t.Errorf("validateAgentToken(%q) accepted, want %q", token, want)
		}
	}
}

func TestNodePasswordHash(t *testing.T) {
	stored := hashNodePassword("secret-one", []byte("0123456789abcdef"))
	if !nodePasswordMatches(stored, "secret-one") {
		t.Error("the password does not match its own hash")
	}
	if nodePasswordMatches(stored, "secret-two") || nodePasswordMatches("garbage", "secret-one") {
		t.Error("another password or a malformed hash matched")
	}
	path := filepath.Join(t.TempDir(), "node", "password")
	first, err := ensureNodePassword(path)
	if err != nil || len(first) != 32 {
		t.Fatalf("ensureNodePassword = %q, %v", first, err)
	}
	if again, _ := ensureNodePassword(path); again != first {
		t.Errorf("the password changed across starts: %q != %q", again, first)
	}
}

func TestParseTaint(t *testing.T) {
	got, err := parseTaint("hk3s.dev/validating=true:NoSchedule")
	if err != nil || got != (corev1.Taint{Key: "hk3s.dev/validating", Value: "true", Effect: corev1.TaintEffectNoSchedule}) {
		t.Errorf("parseTaint = %+v, %v", got, err)
	}
	for _, bad := range []string{"k=v", "k=v:Sometimes", ":NoSchedule"} {
		if _, err := parseTaint(bad); err == nil {
			t.Errorf("parseTaint(%q) accepted", bad)
		}
	}
}

func TestKubeletRestrictedLabels(t *testing.T) {
	for key, want := range map[string]bool{
		"a":                                  false,
		"hk3s.dev/role":                      false,
		"node-role.kubernetes.io/worker":     true,
		"kubernetes.io/foo":                  true,
		"example.k8s.io/x":                   true,
		"node.kubernetes.io/exclude-from-lb": false,
		"kubelet.kubernetes.io/x":            false,
		"topology.kubernetes.io/zone":        false,
		"kubernetes.io/hostname":             false,
		"notkubernetes.io/x":                 false,
	} {
		if got := kubeletRestrictedLabel(key); got != want {
			t.Errorf("kubeletRestrictedLabel(%q) = %v, want %v", key, got, want)
		}
	}
}

// A refused token as the agent words it, by version (agentauth.go): older agents print the
// URL and the HTTP status, newer ones the decoded Status message.
func TestRefusedTokenWordingFollowsTheVersion(t *testing.T) {
	body := []byte(`{"kind":"Status","apiVersion":"v1","metadata":{},"status":"Failure","message":"not authorized","reason":"Unauthorized","code":401}`)
	req, err := http.NewRequest(http.MethodGet, "https://127.0.0.1:6444/v1-k3s/config", nil)
	if err != nil {
		t.Fatal(err)
	}
	resp := &http.Response{StatusCode: http.StatusUnauthorized, Status: "401 Unauthorized", Request: req}
	for v, want := range map[string]string{
		"v1.30.14+k3s1": "https://127.0.0.1:6444/v1-k3s/config: 401 Unauthorized",
		"v1.31.0+k3s1":  "not authorized",
		"v1.36.1+k3s1":  "not authorized",
	} {
		if got := responseError(v, resp, body).Error(); got != want {
			t.Errorf("%s: %q, want %q", v, got, want)
		}
	}
	// A body that is no Status: the URL and the HTTP status in every version.
	if got := responseError("v1.36.1+k3s1", resp, []byte("Unauthorized\n")).Error(); got != "https://127.0.0.1:6444/v1-k3s/config: 401 Unauthorized" {
		t.Errorf("plain body: %q", got)
	}
}

// The load balancer passes a connection to the server, and closes the one it accepted when
// the server cannot be dialled (what the agent's own request then meets).
func TestLoadBalancerPassesToTheServerAndClosesWhenItCannotDial(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	server, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go func() {
		for {
			c, err := server.Accept()
			if err != nil {
				return
			}
			go func() { _, _ = io.Copy(c, c); c.Close() }()
		}
	}()
	lb, err := startLoadBalancer(ctx, "https://"+server.Addr().String(), 0)
	if err != nil {
		t.Fatal(err)
	}
	c, err := net.Dial("tcp", lb.local)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := c.Write([]byte("ping")); err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(c, buf); err != nil || string(buf) != "ping" {
		t.Fatalf("echo through the load balancer: %q %v", buf, err)
	}
	c.Close()

	addr := server.Addr().String()
	server.Close() // nothing listens there now
	lb2, err := startLoadBalancer(ctx, "https://"+addr, 0)
	if err != nil {
		t.Fatal(err)
	}
	c2, err := net.Dial("tcp", lb2.local)
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Close()
	_, _ = c2.Write([]byte("hello"))
	_ = c2.SetReadDeadline(time.Now().Add(5 * time.Second))
	if n, err := c2.Read(buf); err == nil {
		t.Fatalf("read %d bytes from a load balancer with no server", n)
	} else if ne, ok := err.(net.Error); ok && ne.Timeout() {
		t.Fatalf("the load balancer kept the connection open: %v", err)
	}
}

// The CA hash in a token, as k3s's hashCA (pkg/clientaccess/token.go): the bundle's bytes for
// one certificate; for a chain (a custom CA with an intermediate), the root's DER, so the hash
// survives a renewed intermediate.
func TestCAHashIsTheBytesOfOneCertificateAndTheRootOfAChain(t *testing.T) {
	mk := func(cn string, parent *x509.Certificate, parentKey *ecdsa.PrivateKey) (*x509.Certificate, *ecdsa.PrivateKey, []byte) {
		key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			t.Fatal(err)
		}
		tmpl := &x509.Certificate{
			SerialNumber: big.NewInt(time.Now().UnixNano()), Subject: pkix.Name{CommonName: cn},
			NotBefore: time.Now().Add(-time.Hour), NotAfter: time.Now().Add(time.Hour),
			IsCA: true, BasicConstraintsValid: true, KeyUsage: x509.KeyUsageCertSign,
		}
		if parent == nil {
			parent, parentKey = tmpl, key
		}
		der, err := x509.CreateCertificate(rand.Reader, tmpl, parent, &key.PublicKey, parentKey)
		if err != nil {
			t.Fatal(err)
		}
		cert, err := x509.ParseCertificate(der)
		if err != nil {
			t.Fatal(err)
		}
		return cert, key, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der})
	}
	root, rootKey, rootPEM := mk("root", nil, nil)
	_, _, interPEM := mk("intermediate", root, rootKey)
	one := sha256.Sum256(rootPEM)
	if got := caHash(rootPEM); got != hex.EncodeToString(one[:]) {
		t.Errorf("one certificate: %s, want the hash of its bytes", got)
	}
	chain := append(append([]byte{}, interPEM...), rootPEM...)
	want := sha256.Sum256(root.Raw)
	if got := caHash(chain); got != hex.EncodeToString(want[:]) {
		t.Errorf("a chain: %s, want the hash of the root's DER %s", got, hex.EncodeToString(want[:]))
	}
	if raw := sha256.Sum256(chain); caHash(chain) == hex.EncodeToString(raw[:]) {
		t.Errorf("a chain hashed as raw bytes")
	}
}

// k3s's GetArgs (pkg/util/args.go): an extra argument replaces k3s's default of the same key,
// "key+=" appends to it, "key-=" prepends, repeated keys keep every value; sorted by key.
func TestMergeArgsIsK3ssGetArgs(t *testing.T) {
	defaults := []string{"--secure-port=6444", "--enable-admission-plugins=NodeRestriction", "--feature-gates=A=true"}
	got := mergeArgs(defaults, []string{
		"enable-admission-plugins=NodeRestriction,DenyServiceExternalIPs",
		"--feature-gates+=B=false",
		"v=2",
		"v=4",
		"profiling",
	})
	want := []string{
		"--enable-admission-plugins=NodeRestriction,DenyServiceExternalIPs",
		"--feature-gates=A=true",
		"--feature-gates=B=false",
		"--profiling=true",
		"--secure-port=6444",
		"--v=2",
		"--v=4",
	}
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Fatalf("mergeArgs:\n got %q\nwant %q", got, want)
	}
	if got := mergeArgs(defaults, []string{"enable-admission-plugins-=X"}); got[0] != "--enable-admission-plugins=X" || got[1] != "--enable-admission-plugins=NodeRestriction" {
		t.Fatalf("prepend: %q", got)
	}
}

// kube-router's ingress rules (netpol.go): a selected pod of this node gets its chain, reached
// first from FORWARD/OUTPUT's jumps; permitted sources are marked, the rest rejected; pods no
// policy selects, pods of other nodes and egress-only policies get nothing.
func TestNetpolRulesetFollowsKubeRouter(t *testing.T) {
	pod := func(ns, name, node, ip string, podLabels map[string]string) corev1.Pod {
		return corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: podLabels},
			Spec:       corev1.PodSpec{NodeName: node},
			Status:     corev1.PodStatus{PodIP: ip, Phase: corev1.PodRunning},
		}
	}
	pods := []corev1.Pod{
		pod("longhorn-system", "manager", "w1", "10.42.1.5", map[string]string{"app": "longhorn-manager"}),
		pod("longhorn-system", "ui", "w2", "10.42.2.6", map[string]string{"app": "longhorn-ui"}),
		pod("longhorn-system", "share", "w1", "10.42.1.7", map[string]string{"app": "share"}),
		pod("default", "plain", "w1", "10.42.1.8", nil),
		pod("monitoring", "prom", "w2", "10.42.2.9", nil),
	}
	namespaces := []corev1.Namespace{
		{ObjectMeta: metav1.ObjectMeta{Name: "monitoring", Labels: map[string]string{"kubernetes.io/metadata.name": "monitoring"}}},
		{ObjectMeta: metav1.ObjectMeta{Name: "default", Labels: map[string]string{"kubernetes.io/metadata.name": "default"}}},
	}
	tcp := corev1.ProtocolTCP
	port := intstr.FromInt32(9501)
	policies := []networkingv1.NetworkPolicy{{
		ObjectMeta: metav1.ObjectMeta{Namespace: "longhorn-system", Name: "manager"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "longhorn-manager"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{
				{From: []networkingv1.NetworkPolicyPeer{
					{PodSelector: &metav1.LabelSelector{}},
					{NamespaceSelector: &metav1.LabelSelector{MatchLabels: map[string]string{"kubernetes.io/metadata.name": "monitoring"}}},
					{IPBlock: &networkingv1.IPBlock{CIDR: "192.0.2.0/24", Except: []string{"192.0.2.8/29"}}},
				}},
				{Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &port}}},
			},
		},
	}, {
		ObjectMeta: metav1.ObjectMeta{Namespace: "default", Name: "egress-only"},
		Spec:       networkingv1.NetworkPolicySpec{PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeEgress}},
	}}
	text, chains := netpolRuleset("w1", pods, namespaces, policies)
	podChain := netpolChainName(podFirewallPrefix, "longhorn-system", "manager")
	for _, want := range []string{
		"-A KUBE-ROUTER-FORWARD -m comment --comment \"rule to jump traffic destined to POD name:manager namespace: longhorn-system to chain " + podChain + "\" -d 10.42.1.5/32 -j " + podChain,
		"-A " + podChain + " -m comment --comment \"rule to permit the traffic traffic to pods when source is the pod's local node\" -m addrtype --src-type LOCAL -d 10.42.1.5/32 -j ACCEPT",
		"-s 10.42.1.7/32 -j MARK --set-xmark 0x10000/0x10000",            // a Longhorn pod
		"-s 10.42.2.6/32 -j MARK --set-xmark 0x10000/0x10000",            // on another node too
		"-s 10.42.2.9/32 -j MARK --set-xmark 0x10000/0x10000",            // the named namespace's pod
		"-s 192.0.2.8/29 -j RETURN",                                      // the ipBlock's exception
		"-p tcp -m tcp --dport 9501 -j MARK --set-xmark 0x10000/0x10000", // the webhook's port from anywhere
		"-A " + podChain + " -m comment --comment \"rule to REJECT traffic destined for POD name:manager namespace: longhorn-system\" -m mark ! --mark 0x10000/0x10000 -j REJECT",
	} {
		if !strings.Contains(text, want) {
			t.Errorf("missing %q in\n%s", want, text)
		}
	}
	if strings.Contains(text, "10.42.1.8/32 -j MARK") || strings.Contains(text, "-d 10.42.2.6/32 -j") || strings.Contains(text, "-d 10.42.1.7/32 -j") {
		t.Errorf("the plain pod is permitted, or a pod of another node or one no policy selects has a chain:\n%s", text)
	}
	if len(chains) != 5 { // the two KUBE-ROUTER chains, the pod's, the policy's, the ipBlock's
		t.Errorf("chains %v", chains)
	}
	// Nothing selected: the two chains, empty.
	if text, _ := netpolRuleset("w1", pods, namespaces, nil); text != "*filter\n:KUBE-ROUTER-FORWARD - [0:0]\n:KUBE-ROUTER-OUTPUT - [0:0]\nCOMMIT\n" {
		t.Errorf("no policy: %q", text)
	}
}

// Real packets through the rules applyNetpol loads, in network namespaces of this machine: a
// "node" with a bridge and three "pods" on it. A Longhorn pod gets the manager's answer, a plain
// pod is refused (bridged traffic meets iptables through br_netfilter, which k3s's agent and the
// program's host preparation load), the webhook port answers everyone, the node itself is
// admitted; once the policy is gone its chains go and the plain pod gets the answer. Needs root,
// ip, iptables and python3; skipped where namespaces or br_netfilter are not available.
func TestNetpolRulesHoldRealPackets(t *testing.T) {
	if os.Geteuid() != 0 {
		t.Skip("needs root")
	}
	for _, tool := range []string{"ip", "iptables", "iptables-restore", "python3"} {
		if _, err := exec.LookPath(tool); err != nil {
			t.Skipf("needs %s", tool)
		}
	}
	if _, err := os.Stat("/proc/sys/net/bridge"); err != nil {
		t.Skip("br_netfilter is not loaded")
	}
	suffix := fmt.Sprint(os.Getpid())
	node, mgr, share, plain := "np-node-"+suffix, "np-mgr-"+suffix, "np-share-"+suffix, "np-plain-"+suffix
	run := func(args ...string) error {
		out, err := exec.Command(args[0], args[1:]...).CombinedOutput()
		if err != nil {
			return fmt.Errorf("%s: %v: %s", strings.Join(args, " "), err, out)
		}
		return nil
	}
	for _, ns := range []string{node, mgr, share, plain} {
		if err := run("ip", "netns", "add", ns); err != nil {
			t.Skipf("no network namespaces here: %v", err)
		}
		t.Cleanup(func() { _ = exec.Command("ip", "netns", "del", ns).Run() })
	}
	setup := [][]string{
		{"ip", "-n", node, "link", "add", "br0", "type", "bridge"},
		{"ip", "-n", node, "addr", "add", "10.42.1.1/24", "dev", "br0"},
		{"ip", "-n", node, "link", "set", "br0", "up"},
		{"ip", "-n", node, "link", "set", "lo", "up"},
	}
	addresses := map[string]string{mgr: "10.42.1.5", share: "10.42.1.7", plain: "10.42.1.8"}
	for i, ns := range []string{mgr, share, plain} {
		veth := fmt.Sprintf("v%d", i)
		setup = append(setup,
			[]string{"ip", "-n", node, "link", "add", veth, "type", "veth", "peer", "name", "eth0", "netns", ns},
			[]string{"ip", "-n", node, "link", "set", veth, "master", "br0"},
			[]string{"ip", "-n", node, "link", "set", veth, "up"},
			[]string{"ip", "-n", ns, "addr", "add", addresses[ns] + "/24", "dev", "eth0"},
			[]string{"ip", "-n", ns, "link", "set", "eth0", "up"},
			[]string{"ip", "-n", ns, "route", "add", "default", "via", "10.42.1.1"},
		)
	}
	for _, args := range setup {
		if err := run(args...); err != nil {
			t.Skipf("cannot wire namespaces here: %v", err)
		}
	}
	if out, _ := exec.Command("ip", "netns", "exec", node, "cat", "/proc/sys/net/bridge/bridge-nf-call-iptables").Output(); strings.TrimSpace(string(out)) != "1" {
		t.Skip("bridged traffic does not meet iptables in a new namespace here")
	}
	server := exec.Command("ip", "netns", "exec", mgr, "python3", "-c", `
import socket, threading
def serve(port):
    s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("0.0.0.0", port)); s.listen(8)
    while True:
        c, _ = s.accept(); c.sendall(b"volumes"); c.close()
for port in (9500, 9501):
    threading.Thread(target=serve, args=(port,)).start()
print("ready", flush=True)
`)
	stdout, _ := server.StdoutPipe()
	if err := server.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = server.Process.Kill(); _ = server.Wait() })
	if line, _ := io.ReadAll(io.LimitReader(stdout, 6)); strings.TrimSpace(string(line)) != "ready" {
		t.Fatalf("listener: %q", line)
	}
	answer := func(from string, port int) string {
		out, _ := exec.Command("ip", "netns", "exec", from, "python3", "-c", fmt.Sprintf(`
import socket
try:
    s = socket.create_connection(("10.42.1.5", %d), timeout=2); print(s.recv(16).decode()); s.close()
except OSError:
    print("")
`, port)).Output()
		return strings.TrimSpace(string(out))
	}
	netpolCommand = func(name string, args ...string) *exec.Cmd {
		return exec.Command("ip", append([]string{"netns", "exec", node, name}, args...)...)
	}
	t.Cleanup(func() { netpolCommand = exec.Command })

	pod := func(ns, name, ip string, podLabels map[string]string) corev1.Pod {
		return corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Namespace: ns, Name: name, Labels: podLabels},
			Spec:       corev1.PodSpec{NodeName: "w1"},
			Status:     corev1.PodStatus{PodIP: ip, Phase: corev1.PodRunning},
		}
	}
	pods := []corev1.Pod{
		pod("longhorn-system", "manager", "10.42.1.5", map[string]string{"app": "longhorn-manager"}),
		pod("longhorn-system", "share", "10.42.1.7", map[string]string{"app": "share"}),
		pod("default", "plain", "10.42.1.8", nil),
	}
	tcp := corev1.ProtocolTCP
	webhook := intstr.FromInt32(9501)
	policies := []networkingv1.NetworkPolicy{{
		ObjectMeta: metav1.ObjectMeta{Namespace: "longhorn-system", Name: "hk3s-longhorn-manager"},
		Spec: networkingv1.NetworkPolicySpec{
			PodSelector: metav1.LabelSelector{MatchLabels: map[string]string{"app": "longhorn-manager"}},
			PolicyTypes: []networkingv1.PolicyType{networkingv1.PolicyTypeIngress},
			Ingress: []networkingv1.NetworkPolicyIngressRule{
				{From: []networkingv1.NetworkPolicyPeer{{PodSelector: &metav1.LabelSelector{}}}},
				{Ports: []networkingv1.NetworkPolicyPort{{Protocol: &tcp, Port: &webhook}}},
			},
		},
	}}
	if got := answer(plain, 9500); got != "volumes" {
		t.Fatalf("before any policy the plain pod gets %q: the namespaces do not work", got)
	}
	if err := applyNetpol(netpolRuleset("w1", pods, nil, policies)); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		from string
		port int
		want string
	}{{share, 9500, "volumes"}, {plain, 9500, ""}, {plain, 9501, "volumes"}, {node, 9500, "volumes"}} {
		if got := answer(c.from, c.port); got != c.want {
			t.Errorf("%s -> manager:%d: got %q, want %q", c.from, c.port, got, c.want)
		}
	}
	if err := applyNetpol(netpolRuleset("w1", pods, nil, nil)); err != nil {
		t.Fatal(err)
	}
	if got := answer(plain, 9500); got != "volumes" {
		t.Errorf("with the policy gone the plain pod gets %q", got)
	}
	out, _ := netpolCommand("iptables", "-S").Output()
	if strings.Contains(string(out), podFirewallPrefix) || strings.Contains(string(out), policyChainPrefix) {
		t.Errorf("chains left behind:\n%s", out)
	}
}

// A component's argument keeps its commas (docs.k3s.io hardening guide: kube-apiserver-arg
// "enable-admission-plugins=NodeRestriction,EventRateLimit"); other lists are split as before.
func TestComponentArgsKeepTheirCommas(t *testing.T) {
	cfg := filepath.Join(t.TempDir(), "config.yaml")
	writeFile(t, cfg, "kube-apiserver-arg:\n  - enable-admission-plugins=NodeRestriction,DenyServiceExternalIPs\ntls-san: a.example,b.example\n")
	o, err := parseCommand(serverFlags(), []string{"--config", cfg, "--kube-scheduler-arg", "feature-gates=A=true,B=false"})
	if err != nil {
		t.Fatal(err)
	}
	if got := o.list("kube-apiserver-arg"); !slices.Equal(got, []string{"enable-admission-plugins=NodeRestriction,DenyServiceExternalIPs"}) {
		t.Errorf("kube-apiserver-arg = %q", got)
	}
	if got := o.list("kube-scheduler-arg"); !slices.Equal(got, []string{"feature-gates=A=true,B=false"}) {
		t.Errorf("kube-scheduler-arg = %q", got)
	}
	if got := o.list("tls-san"); !slices.Equal(got, []string{"a.example", "b.example"}) {
		t.Errorf("tls-san = %q", got)
	}
}

// A start renews a server certificate only within the renewal window (deps.go expired()):
// outside it the stored one is kept, inside it a new one is signed for the lifetime.
func TestServerCertificatesRenewOnlyWithinTheWindow(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(certLifetimeEnv, "2h")
	t.Setenv(certRenewWindowEnv, "10m")
	ca, err := loadOrCreateCA(filepath.Join(dir, "ca.crt"), filepath.Join(dir, "ca.key"), "k3s-client-ca")
	if err != nil {
		t.Fatal(err)
	}
	spec := certSpec{cn: "system:admin", orgs: []string{"system:masters"}, client: true}
	crt, key := filepath.Join(dir, "client-admin.crt"), filepath.Join(dir, "client-admin.key")
	first, err := ensureCert(ca, crt, key, spec)
	if err != nil {
		t.Fatal(err)
	}
	if left := time.Until(first.cert.NotAfter); left < 119*time.Minute || left > 2*time.Hour {
		t.Fatalf("lifetime %s, want 2h", left)
	}
	again, err := ensureCert(ca, crt, key, spec)
	if err != nil {
		t.Fatal(err)
	}
	if again.cert.SerialNumber.Cmp(first.cert.SerialNumber) != 0 {
		t.Fatal("a certificate outside its renewal window was renewed")
	}
	t.Setenv(certRenewWindowEnv, "3h") // now it expires within the window
	renewed, err := ensureCert(ca, crt, key, spec)
	if err != nil {
		t.Fatal(err)
	}
	if renewed.cert.SerialNumber.Cmp(first.cert.SerialNumber) == 0 {
		t.Fatal("a certificate inside its renewal window was kept")
	}
}

// `k3s certificate rotate` backs server/tls up, removes the leaf certificates (never a CA) and
// signs nothing.
func TestCertificateRotateRemovesLeavesKeepsCAs(t *testing.T) {
	dir := t.TempDir()
	for _, f := range []string{"server/tls/client-ca.crt", "server/tls/client-ca.key", "server/tls/client-admin.crt",
		"server/tls/client-admin.key", "server/tls/serving-kube-apiserver.crt", "agent/client-kubelet.crt"} {
		writeFile(t, filepath.Join(dir, f), "x")
	}
	now := time.Unix(1700000000, 0)
	if err := rotateCertificates(dir, now); err != nil {
		t.Fatal(err)
	}
	for _, gone := range []string{"server/tls/client-admin.crt", "server/tls/client-admin.key", "server/tls/serving-kube-apiserver.crt", "agent/client-kubelet.crt"} {
		if _, err := os.Stat(filepath.Join(dir, gone)); !os.IsNotExist(err) {
			t.Errorf("%s not removed", gone)
		}
	}
	for _, kept := range []string{"server/tls/client-ca.crt", "server/tls/client-ca.key", "server/tls/dynamic-cert-regenerate",
		"server/tls-1700000000/client-admin.crt", "server/tls-1700000000/client-kubelet.crt"} {
		if _, err := os.Stat(filepath.Join(dir, kept)); err != nil {
			t.Errorf("%s: %v", kept, err)
		}
	}
}

// A k3s binary runs the kubelet compiled into it: the stand-in runs its own release's
// kubelet and never another release's, and a missing one is an error naming it.
func TestOwnKubeletIsTheReleasesOrAnError(t *testing.T) {
	dir := t.TempDir()
	put := func(release string) string {
		path := filepath.Join(dir, release, "kubelet")
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			t.Fatal(err)
		}
		if err := os.WriteFile(path, []byte("#!/bin/sh\n"), 0o755); err != nil {
			t.Fatal(err)
		}
		return path
	}
	put("v1.37.2+k3s1")
	_, err := ownKubelet(dir, "v1.37.3+k3s1")
	want := "no kubelet for k3s v1.37.3+k3s1 at " + filepath.Join(dir, "v1.37.3+k3s1", "kubelet") + " (kubelets installed for: v1.37.2+k3s1)"
	if err == nil || !strings.Contains(err.Error(), want) {
		t.Fatalf("another release's kubelet only: got %v, want an error with %q", err, want)
	}
	own := put("v1.37.3+k3s1")
	if got, err := ownKubelet(dir, "v1.37.3+k3s1"); err != nil || got != own {
		t.Fatalf("got %q, %v; want %q", got, err, own)
	}
	if _, err := ownKubelet(filepath.Join(dir, "none"), "v1.37.3+k3s1"); err == nil || !strings.Contains(err.Error(), "(kubelets installed for: none)") {
		t.Fatalf("no kubelets: got %v", err)
	}
}

func TestKubectlRunsWithoutCollectionUnlessTheCallerChose(t *testing.T) {
	got := kubectlEnv([]string{"PATH=/bin"})
	if strings.Join(got, " ") != "PATH=/bin GOGC=off GOMEMLIMIT=256MiB" {
		t.Fatalf("got %q", got)
	}
	for _, chosen := range []string{"GOGC=100", "GOMEMLIMIT=1GiB"} {
		if got := kubectlEnv([]string{"PATH=/bin", chosen}); strings.Join(got, " ") != "PATH=/bin "+chosen {
			t.Fatalf("%s: got %q", chosen, got)
		}
	}
}
