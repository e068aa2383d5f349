package main

import (
	"crypto/sha256"
	"encoding/hex"
	"os"
	"path/filepath"
	"slices"
	"testing"

	corev1 "k8s.io/api/core/v1"
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
