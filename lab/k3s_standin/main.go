// Command k3s is the hk3s lab's stand-in for the k3s binary.
//
// LAB ONLY. This program is never shipped with the product. The test lab cannot
// download k3s (no GitHub releases, no container registries), so the lab builds this
// binary from the Go module proxy (lab/build/k3s_standin.sh) and the product installs
// it exactly as it installs an air-gapped k3s binary: uploaded to the host, checked
// against its SHA-256, configured through /etc/rancher/k3s/config.yaml and started by
// the systemd unit the product writes (k3s.service / k3s-agent.service, Type=notify).
// It stands in for k3s at the edges the product touches; nothing in the product
// needs to know it is not k3s.
//
// What it reproduces:
//
//   - The CLI: `k3s server`, `k3s agent`, `k3s token create|list|delete|generate`,
//     `k3s kubectl ...` (also when called through a symlink named kubectl), `k3s crictl`
//     and `k3s ctr` (the bundled binaries pointed at k3s's containerd socket, ctr in the
//     k8s.io namespace; only where the runtime is installed, see below) and
//     `k3s --version` ("k3s version v1.X.Y+k3s1 (<hash>)" and "go version ..."), and
//     `k3s certificate rotate` (certlife.go).
//     The config file (--config/-c or $K3S_CONFIG_FILE, default
//     /etc/rancher/k3s/config.yaml, plus config.yaml.d/*.yaml drop-ins; keys are flag
//     names without dashes) is merged with the command line as k3s does: the command
//     line wins, list flags collect both (split on commas, but the components' argument
//     lists: --kube-apiserver-arg "enable-admission-plugins=A,B" is one argument, as in k3s's
//     hardening guide), K3S_* variables fill what neither sets, and
//     unknown keys are skipped with a warning. Flags of real k3s that mean nothing
//     here are accepted and reported once. --token-file is waited for up to four
//     minutes when missing, as k3s does.
//   - The server: CAs under <data-dir>/server/tls (server CA, client CA,
//     request-header CA, service-account key; created once, reused), a real control
//     plane as child processes (kine on SQLite in <data-dir>/server/db,
//     kube-apiserver on 127.0.0.1:6444, kube-controller-manager, kube-scheduler when
//     the lab built one (--kube-scheduler-arg passed on); binaries from
//     /opt/lab-kube/bin or $HK3S_LAB_KUBE_BIN; their logs in <data-dir>/server/logs),
//     the components' arguments k3s's defaults merged with --kube-apiserver-arg,
//     --kube-controller-manager-arg and --kube-scheduler-arg as k3s's GetArgs merges them
//     (pkg/util/args.go: an argument of the same key replaces the default; server.go mergeArgs),
//     the supervisor on :6443 that serves /cacerts and /ping itself and proxies the
//     Kubernetes API (client certificates are passed on as front-proxy identity
//     headers), a serving certificate naming every host address, --tls-san,
//     --node-ip and --node-external-ip, the admin kubeconfig /etc/rancher/k3s/k3s.yaml
//     (--write-kubeconfig, --write-kubeconfig-mode), <data-dir>/server/token and
//     node-token, the RBAC bindings for kubelet TLS bootstrap, the server's own Node
//     (labels node-role.kubernetes.io/control-plane and master) with its Lease and
//     Ready heartbeat, READY=1 to systemd once up, and on SIGTERM a clean stop of
//     every child. The controller-manager's --node-monitor-grace-period is
//     $HK3S_LAB_NODE_MONITOR_GRACE_PERIOD (default 20s) so stopped nodes go NotReady
//     quickly in the lab.
//   - The agent: on every start, its token checked as k3s's parseToken does
//     (pkg/clientaccess/token.go): an empty token is refused even when node
//     credentials are stored ("Failed to validate connection to cluster at <url>:
//     token must not be empty", retried every 2 s forever as pkg/agent/run.go's
//     createProxyAndValidateToken does, so the node never comes back); a deleted
//     bootstrap token still passes this check. Then the secure-token CA check
//     (K10<sha256 of the /cacerts bytes>::id.secret,
//     fetched without verification; on a mismatch it logs "token CA hash does not
//     match the Cluster CA certificate hash: <token> != <server>" and retries every
//     2 s forever, sending no credentials). All of it goes through the agent's client-side
//     load balancer on 127.0.0.1:6444 (--lb-server-port), started first as k3s starts it
//     (lb.go: the dial errors to the server logged at debug level only, as
//     pkg/agent/loadbalancer does). Then the agent configuration is fetched with the
//     token's credentials (agentauth.go: a refused token logged at info level every 5 s,
//     "failed to retrieve configuration from server: not authorized" from v1.31, the URL
//     and "401 Unauthorized" before), then the node password is presented and the kubelet
//     client certificate obtained from the supervisor's /v1-k3s/client-kubelet.crt (a new one at
//     every start, as k3s's pkg/agent/config get() asks for one each time), whose
//     handler verifies the node password before it signs (as k3s's ClientKubeletCert with
//     its node auth validator; signed by the client CA, CN system:node:<name>). The
//     credentials are kept in <data-dir>/agent, so a restart needs no live token (a deleted one is enough:
//     the node's certificate authenticates it, k3s PRs #6663/#6898). The Node gets the
//     configured labels (the kubelet's restrictions on kubernetes.io labels apply),
//     taints, InternalIP (--node-ip, else the --flannel-iface address, else the
//     default route's) and ExternalIP, kubeletVersion = the k3s version, Ready
//     status; its Lease in kube-node-lease is renewed every 10 s. The kubelet port
//     (10250, or --kubelet-arg port=N) serves /healthz over TLS with a self-signed
//     serving certificate. The agent keeps a tunnel to the supervisor on 6443 (k3s's
//     egress-selector mode "agent": pkg/agent/tunnel/tunnel.go,
//     pkg/daemons/control/tunnel.go): the kube-apiserver's "cluster" egress is HTTP
//     CONNECT to the supervisor, which sends a connection to a node's address through
//     that node's tunnel (the agent dials only its kubelet port, on loopback) and dials
//     directly only where there is no tunnel. So the API's node proxy, logs and exec
//     reach a kubelet whose 10250 is blocked between the nodes, as on k3s; only a
//     direct dial of 10250 fails then. Node passwords (pkg/nodepassword): the agent's
//     /etc/rancher/node/password checked against kube-system/<node>.node-password.k3s
//     at every start, in the handlers that issue the agent's certificates and before they
//     issue anything, another host's refused ("Node password rejected, ..." every 5 s at
//     info level), the Secret deleted with its Node (nodepassword.go says how), or, when its Node
//     never came, once older than $HK3S_LAB_NODE_PASSWORD_ORPHAN_AGE (default 10m, k3s's
//     MinOrphanSecretAge; nodepassword_orphans.go). A request
//     authenticated by a node certificate whose Node was deleted is refused with 401
//     "unable to verify node identity" (pkg/nodepassword/validate.go verifyNode); the agent
//     then logs "Node authorization rejected, retrying without client certificate
//     authentication" and sends it once more with its token alone (pkg/agent/config/config.go
//     getNodeNamedCrt), so a host whose spent token is all it has besides the certificate
//     stays out ("<url>/v1-k3s/serving-kubelet.crt: 401 Unauthorized" every 5 s) until it is
//     given a live token.
//     The flannel backend is the server's --flannel-backend (default vxlan), served in the
//     agent configuration and read by the agent once, at its start (pkg/agent/config
//     get()); every node publishes it as flannel.alpha.coreos.com/backend-type (podnet.go).
//     Every node (server and agents) makes kube-proxy's, the kubelet's and flannel's
//     iptables/ip6tables chains and rules at start and leaves them at stop (netrules.go),
//     with the host's iptables or, on a host without one, k3s's bundled copy extracted into
//     <data-dir>/data/<hash>/bin/aux and put at the end of PATH as k3s does (bundle.go).
//     READY=1 goes to systemd once the Node is Ready and has its PodCIDR (readiness.go: k3s's
//     agent notifies only after flannel got the PodCIDR, so without one it stays activating); on
//     SIGTERM it stops heartbeating and exits, so the Node goes NotReady after the
//     grace period.
//   - Pod mode of the agent (runtime.go), only on a host where k3s's bundled runtime is
//     installed at /var/lib/rancher/k3s/data/current/bin (the lab's pod-capable hosts,
//     lab/pod_hosts.py): after the same certificate request, CA pinning, token and node
//     password handling, the agent registers its Node as above, then runs the real
//     containerd and kubelet (instead of the heartbeat and the /healthz port) as k3s's
//     agent does, with the client certificate it obtained. The kubelet is its own
//     release's, <data/current/bin>/kubelets/<its version>/kubelet, as a k3s binary runs the
//     kubelet compiled into it (pkg/daemons/executor/embed.go), so the Node reports the
//     binary's version and an upgrade moves it; without that file the agent exits with an
//     error naming it (never another release's kubelet). It imports the image
//     tarballs of k3s's air-gap folder <data-dir>/agent/images at start and whenever
//     one changes; stopping the agent kills containerd and the kubelet but leaves the
//     containers running (KillMode=process), as on k3s; the product's fence and wipe stop
//     them (the lab's hosts, like the hosts the product installs, have no k3s-killall.sh:
//     only k3s's install script writes one). The supervisor serves
//     /v1-k3s/client-ca.crt to nodes (their certificate), as k3s does. In pod mode the agent
//     also enforces NetworkPolicies' ingress rules with iptables as k3s's network-policy
//     controller (kube-router's) does (netpol.go says what it reproduces and what not).
//
// What it does not reproduce: on hosts without the bundled runtime, no containers (no
// containerd, no images; the Node reports no container runtime) and no real kubelet:
// pods scheduled there never run, and the kubelet port answers /healthz only. Nowhere:
// flannel's daemon (pod mode's CNI is bridge + host-local on the Node's pod CIDR), no
// kube-proxy, no egress network policy, no CoreDNS/Traefik/local-path/metrics-server/helm
// add-ons, no cloud controller (a pod-mode Node has no ExternalIP address). No embedded etcd or external datastores, no HA servers,
// no server list learned by the agent's load balancer (lb.go), no websocket (the tunnel opens one connection per stream),
// no `k3s certificate check` or CA rotation, no etcd snapshots. Secrets encryption: the server's
// --secrets-encryption, `k3s secrets-encrypt status` and `rotate-keys` (secretsencrypt.go).
//
// Certificates (certlife.go): leaf certificates last a year and are renewed only at a start
// within 90 days of their expiry, as k3s's deps.go does; $HK3S_LAB_CERT_LIFETIME and
// $HK3S_LAB_CERT_RENEW_WINDOW shorten both for the lab's tests (LAB ONLY). The server's own
// node presents no node password.
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
	case "crictl", "ctr":
		os.Exit(runBundled(cmd, rest))
	case "certificate":
		os.Exit(runCertificateCommand(rest))
	case "secrets-encrypt":
		os.Exit(runSecretsEncryptCommand(rest))
	case "etcd-snapshot", "check-config", "completion":
		fmt.Fprintf(os.Stderr, "k3s %s: not available in this build\n", cmd)
		os.Exit(1)
	default:
		fmt.Fprintf(os.Stderr, "No help topic for '%s'\n", cmd)
		os.Exit(3)
	}
}
