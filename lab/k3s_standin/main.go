// Command k3s is the hk3s lab's stand-in for the k3s binary.
//
// LAB ONLY. This program is never shipped with the product. The test lab cannot
// download k3s (no GitHub releases, no container registries), so the lab builds this
// binary from the Go module proxy (lab/build/k3s_standin.sh) and the product installs
// it exactly as it installs an air-gapped k3s binary: uploaded to the host, checked
// against its SHA-256, configured through /etc/rancher/k3s/config.yaml and started by
// a systemd unit the product writes (k3s.service / k3s-agent.service). It behaves
// like k3s at the edges the product touches.
//
// What it reproduces:
//
//   - The CLI: `k3s server`, `k3s agent`, `k3s token create|list|delete|generate`,
//     `k3s kubectl ...` (also when called through a symlink named kubectl) and
//     `k3s --version` ("k3s version v1.X.Y+k3s1 (<hash>)" and "go version ...").
//     The config file (--config/-c, default /etc/rancher/k3s/config.yaml, plus
//     config.yaml.d/*.yaml drop-ins; keys are flag names without dashes) is merged
//     with command-line flags and K3S_* environment variables the way k3s does.
//     Flags of real k3s that have no meaning here are accepted and reported once.
//   - The server: a CA set under <data-dir>/server/tls (server CA, client CA,
//     request-header CA, service-account key; kept across restarts), a real control
//     plane (kine on SQLite, kube-apiserver on 127.0.0.1:6444 and
//     kube-controller-manager, started from /opt/lab-kube/bin or $HK3S_LAB_KUBE_BIN),
//     the supervisor on :6443 that serves /cacerts and /ping itself and proxies the
//     Kubernetes API, the admin kubeconfig /etc/rancher/k3s/k3s.yaml, the server
//     token files, the RBAC bindings for kubelet TLS bootstrap, and the server's own
//     Node (control-plane and master role labels) with Lease and Ready heartbeat.
//     SIGTERM stops every child process.
//   - The agent: the secure-token CA check (K10<sha256 of /cacerts>::id.secret;
//     fetched without verification, retried forever on mismatch without sending
//     credentials), the real kubelet TLS bootstrap with a bootstrap token (key, CSR
//     for signer kubernetes.io/kube-apiserver-client-kubelet, approved and signed by
//     the real controllers), credentials kept under <data-dir>/agent so a restart
//     needs no token, the Node with the configured labels, taints, addresses and
//     kubelet version, a Lease renewed every 10 s, Ready status, and a TLS /healthz
//     on the kubelet port (10250) with a self-signed serving certificate.
//     A stopped agent stops heartbeating, so its Node goes NotReady after the
//     controller-manager's --node-monitor-grace-period ($HK3S_LAB_NODE_MONITOR_GRACE_PERIOD,
//     default 20s in the lab).
//
// What it does not reproduce: no containers (no containerd, no images), no CNI or
// flannel, no kube-proxy, no CoreDNS/Traefik/local-path/metrics-server add-ons, no
// scheduler, no real kubelet. Pods scheduled on its nodes never run. No embedded
// etcd, no HA servers, no agent load balancer, no node-password secrets, no
// certificate rotation, no secrets encryption, no etcd snapshots.
package main

import (
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"
)

// Set at build time with -ldflags "-X main.version=... -X main.gitCommit=...".
var (
	version   = "v0.0.0+k3s1"
	gitCommit = "00000000"
)

func versionLines() string {
	return fmt.Sprintf("k3s version %s (%s)\ngo version %s\n", version, gitCommit, runtime.Version())
}

// debugLogging is switched on by --debug.
var debugLogging bool

// logf writes one logrus-style line (as k3s prints to a non-terminal stderr).
func logf(level, format string, args ...any) {
	if level == "debug" && !debugLogging {
		return
	}
	msg := fmt.Sprintf(format, args...)
	fmt.Fprintf(os.Stderr, "time=%q level=%s msg=%s\n",
		time.Now().Format(time.RFC3339), level, strconv.Quote(msg))
}

func infof(format string, args ...any)  { logf("info", format, args...) }
func warnf(format string, args ...any)  { logf("warning", format, args...) }
func errorf(format string, args ...any) { logf("error", format, args...) }
func debugf(format string, args ...any) { logf("debug", format, args...) }

func fatalf(format string, args ...any) {
	logf("fatal", format, args...)
	os.Exit(1)
}

const usage = `NAME:
   k3s - Kubernetes, but small and simple (hk3s lab stand-in)

USAGE:
   k3s [global options] command [command options] [arguments...]

COMMANDS:
   server   Run management server
   agent    Run node agent
   kubectl  Run kubectl
   token    Manage bootstrap tokens

GLOBAL OPTIONS:
   --debug           (logging) Turn on debug logs
   --help, -h        show help
   --version, -v     print the version
`

func main() {
	args := os.Args[1:]
	switch filepath.Base(os.Args[0]) {
	case "kubectl":
		os.Exit(runKubectl(args))
	}

	// Global options before the command.
	for len(args) > 0 && strings.HasPrefix(args[0], "-") {
		switch args[0] {
		case "--version", "-v":
			fmt.Print(versionLines())
			return
		case "--help", "-h":
			fmt.Print(usage)
			return
		case "--debug":
			debugLogging = true
			args = args[1:]
		default:
			fmt.Fprintf(os.Stderr, "Incorrect Usage: flag provided but not defined: %s\n\n%s", args[0], usage)
			os.Exit(1)
		}
	}
	if len(args) == 0 {
		fmt.Print(usage)
		return
	}
	cmd, rest := args[0], args[1:]
	switch cmd {
	case "server":
		os.Exit(runServerCommand(rest))
	case "agent":
		os.Exit(runAgentCommand(rest))
	case "token":
		os.Exit(runTokenCommand(rest))
	case "kubectl":
		os.Exit(runKubectl(rest))
	case "version":
		fmt.Print(versionLines())
	case "help":
		fmt.Print(usage)
	case "crictl", "ctr", "etcd-snapshot", "secrets-encrypt", "certificate", "check-config", "completion":
		fmt.Fprintf(os.Stderr, "k3s %s: not available in this build\n", cmd)
		os.Exit(1)
	default:
		fmt.Fprintf(os.Stderr, "No help topic for '%s'\n", cmd)
		os.Exit(3)
	}
}
