package main

// Pod mode of the agent (LAB ONLY): when the container runtime k3s bundles is installed
// where k3s extracts it (<k3s data>/data/current/bin: containerd, containerd-shim-runc-v2,
// runc, ctr, crictl, the CNI plugins), the agent runs the real thing as k3s's agent does
// (pkg/agent/run.go, pkg/agent/containerd, pkg/daemons/agent):
//
//   - containerd as a child process (config version 3 written to
//     <data-dir>/agent/etc/containerd/config.toml, socket /run/k3s/containerd/containerd.sock,
//     logs in <data-dir>/agent/containerd/containerd.log), killed with the agent
//     (Pdeathsig, as k3s's), while its shims and so the containers keep running: the
//     unit's KillMode=process leaves them, as on k3s; the agent exits when containerd dies;
//   - the images in k3s's air-gap folder <data-dir>/agent/images (*.tar) imported into
//     containerd's k8s.io namespace at start, and again whenever a file there changes;
//   - a bridge + host-local CNI configuration for the Node's pod CIDR (allocated by the
//     controller-manager) in <data-dir>/agent/etc/cni/net.d;
//   - the real kubelet of this binary's own k3s release: k3s compiles the kubelet into its
//     binary and runs it in its own process (pkg/daemons/agent/agent.go starts it through
//     pkg/daemons/executor/embed.go's Kubelet, kubelet.NewKubeletCommand), so a Node always
//     reports the version of the k3s binary that runs it, and a k3s upgrade moves the kubelet
//     with it. The stand-in cannot embed one, so the lab installs one kubelet per release it
//     ships, at <data/current/bin>/kubelets/<k3s version>/kubelet (lab/build/pod_runtime.sh,
//     lab/pod_hosts.py), and the agent runs the one stamped with its own version. When that
//     one is missing it logs so and exits non-zero (never another release's kubelet: a k3s
//     binary has no other kubelet to run);
//   - that kubelet with the client certificate the agent obtained (its
//     kubelet.kubeconfig), the serving certificate the agent makes, webhook
//     authentication/authorization with the cluster's client CA (fetched from the
//     supervisor's /v1-k3s/client-ca.crt with the node certificate, as k3s does), and
//     the Node the agent registered (labels, annotations, taints) adopted by it.
//
// Lab deviations, forced by the machine: containerd's root is /var/lib/containerd (a plain
// directory the lab binds; k3s keeps it under <data-dir>/agent/containerd, but overlayfs
// snapshots fail on the host's overlay root), cgroup v1 with the cgroupfs driver
// (failCgroupV1: false), and no flannel daemon: the pod network across nodes is the VXLAN
// flannel would make, set up by the agent itself (podnet.go).

import (
	"cmp"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
)

const (
	runtimeBinDir    = "/var/lib/rancher/k3s/data/current/bin"
	containerdRoot   = "/var/lib/containerd"
	containerdState  = "/run/k3s/containerd"
	containerdSocket = "/run/k3s/containerd/containerd.sock"
	clientCAPath     = "/v1-k3s/client-ca.crt"
	// The sandbox image k3s pins, and the cluster DNS address of k3s's default service CIDR
	// (the server's, from the agent configuration, wins: agentsettings.go).
	pauseImage  = "docker.io/rancher/mirrored-pause:3.6"
	clusterDNS  = "10.43.0.10"
	imagePoll   = 5 * time.Second
	readyWait   = 3 * time.Minute
	podCIDRWait = time.Minute
)

// podRuntimeInstalled: the bundled runtime is where k3s would have extracted it.
func podRuntimeInstalled() bool {
	for _, b := range []string{"containerd", "containerd-shim-runc-v2", "runc"} {
		if !executable(filepath.Join(runtimeBinDir, b)) {
			return false
		}
	}
	return true
}

func executable(path string) bool {
	fi, err := os.Stat(path)
	return err == nil && fi.Mode().IsRegular() && fi.Mode()&0o111 != 0
}

// kubeletsDir holds one directory per k3s release, named by its version, with that release's kubelet.
const kubeletsDir = runtimeBinDir + "/kubelets"

// ownKubelet is the kubelet of the k3s release `release` under `dir` (kubeletsDir and this
// binary's version; see the file comment): an error naming the release, the path and the
// releases installed when it is not there.
func ownKubelet(dir, release string) (string, error) {
	path := filepath.Join(dir, release, "kubelet")
	if executable(path) {
		return path, nil
	}
	installed := []string{}
	if entries, err := os.ReadDir(dir); err == nil {
		for _, e := range entries {
			if executable(filepath.Join(dir, e.Name(), "kubelet")) {
				installed = append(installed, e.Name())
			}
		}
	}
	return "", fmt.Errorf("no kubelet for k3s %s at %s (kubelets installed for: %s); "+
		"the kubelet a k3s binary runs is its own release's, never another's: rebuild the lab's pod runtime "+
		"(lab/build/pod_runtime.sh) so it holds this release's kubelet", release, path, cmp.Or(strings.Join(installed, ", "), "none"))
}

// runtimeEnv is the environment k3s gives containerd and its own crictl/ctr commands.
func runtimeEnv() []string {
	env := []string{}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "PATH=") {
			env = append(env, kv)
		}
	}
	return append(env,
		"PATH="+runtimeBinDir+":/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
		"CONTAINERD_ADDRESS="+containerdSocket,
		"CONTAINERD_NAMESPACE=k8s.io",
		"CONTAINER_RUNTIME_ENDPOINT=unix://"+containerdSocket,
		"IMAGE_SERVICE_ENDPOINT=unix://"+containerdSocket,
	)
}

// runBundled runs `k3s crictl|ctr ARGS` as k3s does: the bundled binary, pointed at
// k3s's containerd socket (and ctr at the k8s.io namespace).
func runBundled(name string, args []string) int {
	path := filepath.Join(runtimeBinDir, name)
	if _, err := os.Stat(path); err != nil {
		fmt.Fprintf(os.Stderr, "k3s %s: not available: no container runtime installed in %s\n", name, runtimeBinDir)
		return 1
	}
	if err := syscall.Exec(path, append([]string{name}, args...), runtimeEnv()); err != nil {
		fmt.Fprintf(os.Stderr, "k3s %s: %v\n", name, err)
	}
	return 1
}

// podAgent runs containerd and the kubelet for one node.
type podAgent struct {
	kubelet   string // the path of this release's kubelet
	spec      nodeSpec
	cfg       *rest.Config
	serverURL string
	caBundle  []byte
	etcDir    string
	nodes     corev1client.NodeInterface
}

func runPodAgent(ctx context.Context, kubeletPath string, cfg *rest.Config, spec nodeSpec, serverURL string, caBundle []byte) error {
	core, err := corev1client.NewForConfig(clientConfig(cfg, "kubelet"))
	if err != nil {
		return err
	}
	pa := &podAgent{kubelet: kubeletPath, spec: spec, cfg: cfg, serverURL: serverURL, caBundle: caBundle, etcDir: filepath.Join(spec.dataDir, "etc"), nodes: core.Nodes()}
	infof("Container runtime found in %s: running containerd and the kubelet", runtimeBinDir)
	if err := pa.fetchClientCA(ctx); err != nil {
		return err
	}
	if err := pa.servingCert(); err != nil {
		return err
	}
	// Register the Node with the configured labels, annotations and taints; the kubelet adopts it.
	nr := &nodeRunner{spec: spec, nodes: pa.nodes}
	for {
		if err := nr.register(ctx); err == nil {
			break
		} else {
			errorf("Unable to register node %q with API server: %v", spec.name, err)
		}
		if !sleepCtx(ctx, 5*time.Second) {
			return nil
		}
	}
	podCIDR, err := pa.waitPodCIDR(ctx)
	if err != nil || ctx.Err() != nil {
		return err
	}
	if err := pa.writeConfigs(podCIDR); err != nil {
		return err
	}
	containerd, err := pa.startChild(ctx, "containerd", filepath.Join(spec.dataDir, "containerd", "containerd.log"),
		filepath.Join(runtimeBinDir, "containerd"), "--config", filepath.Join(pa.etcDir, "containerd", "config.toml"))
	if err != nil {
		return err
	}
	if !waitSocket(ctx, containerdSocket, time.Minute) {
		if ctx.Err() != nil {
			return nil
		}
		return fmt.Errorf("containerd did not open %s within a minute; see %s", containerdSocket, filepath.Join(spec.dataDir, "containerd", "containerd.log"))
	}
	infof("containerd is now running")
	// As k3s: the air-gap images are imported before the kubelet starts, then watched.
	seen := map[string]string{}
	pa.importImages(ctx, seen)
	go func() {
		for sleepCtx(ctx, imagePoll) {
			pa.importImages(ctx, seen)
		}
	}()
	kubelet, err := pa.startChild(ctx, "kubelet", filepath.Join(spec.dataDir, "kubelet.log"),
		pa.kubelet, pa.kubeletArgs()...)
	if err != nil {
		return err
	}
	go pa.announceReady(ctx)
	if err := startPodNetwork(ctx, pa, podCIDR); err != nil {
		warnf("pod network across nodes: %v", err)
	}
	go runNetworkPolicies(ctx, pa)
	// As k3s: the agent ends when containerd or the kubelet does (systemd restarts it).
	containerdDone, kubeletDone := exited(containerd), exited(kubelet)
	select {
	case <-ctx.Done():
		infof("Stopping the kubelet and containerd; containers keep running")
		_ = kubelet.Process.Signal(syscall.SIGTERM)
		_ = containerd.Process.Signal(syscall.SIGTERM)
		waitExit(kubelet, kubeletDone, 10*time.Second)
		waitExit(containerd, containerdDone, 10*time.Second)
		return nil
	case err := <-containerdDone:
		_ = kubelet.Process.Kill()
		return fmt.Errorf("containerd exited: %v", err)
	case err := <-kubeletDone:
		_ = containerd.Process.Kill()
		return fmt.Errorf("kubelet exited: %v", err)
	}
}

// fetchClientCA gets the cluster's client CA (which signed the API server's kubelet
// client certificate) from the supervisor, with the node's certificate, as k3s does.
func (pa *podAgent) fetchClientCA(ctx context.Context) error {
	cert, err := tls.X509KeyPair(pa.cfg.CertData, pa.cfg.KeyData)
	if err != nil {
		return err
	}
	client := &http.Client{Timeout: 10 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: mustPool(pa.caBundle), Certificates: []tls.Certificate{cert}}}}
	for {
		body, err := func() ([]byte, error) {
			req, err := http.NewRequestWithContext(ctx, http.MethodGet, pa.serverURL+clientCAPath, nil)
			if err != nil {
				return nil, err
			}
			resp, err := client.Do(req)
			if err != nil {
				return nil, err
			}
			defer resp.Body.Close()
			b, err := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
			if err == nil && resp.StatusCode != http.StatusOK {
				err = fmt.Errorf("%s%s: %s", pa.serverURL, clientCAPath, resp.Status)
			}
			return b, err
		}()
		if err == nil {
			if _, perr := parseCertsPEM(body); perr != nil {
				return fmt.Errorf("client CA: %w", perr)
			}
			return writeFileAtomic(filepath.Join(pa.spec.dataDir, "client-ca.crt"), body, 0o644)
		}
		if ctx.Err() != nil {
			return nil
		}
		errorf("Failed to retrieve the client CA: %v", err)
		if !sleepCtx(ctx, caRetryInterval) {
			return nil
		}
	}
}

func (pa *podAgent) servingCert() error {
	var ips []net.IP
	for _, s := range append(append([]string{"127.0.0.1"}, pa.spec.internalIPs...), pa.spec.externalIPs...) {
		ips = append(ips, net.ParseIP(s))
	}
	_, err := ensureCert(nil, filepath.Join(pa.spec.dataDir, "serving-kubelet.crt"), filepath.Join(pa.spec.dataDir, "serving-kubelet.key"), certSpec{
		cn: pa.spec.name, dns: []string{pa.spec.name, "localhost"}, ips: ips, server: true,
	})
	return err
}

func (pa *podAgent) waitPodCIDR(ctx context.Context) (string, error) {
	deadline := time.Now().Add(podCIDRWait)
	for {
		node, err := pa.nodes.Get(ctx, pa.spec.name, metav1.GetOptions{})
		if err == nil && node.Spec.PodCIDR != "" {
			infof("Node %s has pod CIDR %s", pa.spec.name, node.Spec.PodCIDR)
			return node.Spec.PodCIDR, nil
		}
		if ctx.Err() != nil {
			return "", nil
		}
		if time.Now().After(deadline) {
			return "", fmt.Errorf("node %s got no pod CIDR within %s (is the controller-manager allocating node CIDRs?)", pa.spec.name, podCIDRWait)
		}
		if !sleepCtx(ctx, time.Second) {
			return "", nil
		}
	}
}

func (pa *podAgent) writeConfigs(podCIDR string) error {
	containerdConfig := fmt.Sprintf(`# Written by the k3s stand-in (LAB ONLY) at every agent start, as k3s writes its own.
version = 3
root = %q
state = %q

[grpc]
  address = %q

[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = %q

[plugins.'io.containerd.cri.v1.runtime']
  # No process here may lower its oom_score_adj (no CAP_SYS_RESOURCE in the lab).
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = %q
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = [%q]
    conf_dir = %q
`, containerdRoot, containerdState, containerdSocket, pauseImage, filepath.Join(runtimeBinDir, "runc"), runtimeBinDir, filepath.Join(pa.etcDir, "cni", "net.d"))
	cni := fmt.Sprintf(`{
  "cniVersion": "1.0.0",
  "name": "cbr0",
  "plugins": [
    {"type": "bridge", "bridge": "cni0", "isGateway": true, "hairpinMode": true, "forceAddress": true, "mtu": %d,
     "ipam": {"type": "host-local", "ranges": [[{"subnet": %q}]], "routes": [{"dst": "0.0.0.0/0"}]}},
    {"type": "portmap", "capabilities": {"portMappings": true}}
  ]
}
`, podMTU(pa.spec), podCIDR)
	port := pa.spec.kubeletPort
	kubelet := fmt.Sprintf(`# Written by the k3s stand-in (LAB ONLY) at every agent start.
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: 0.0.0.0
port: %d
readOnlyPort: 0
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: %q}
authorization: {mode: Webhook}
tlsCertFile: %q
tlsPrivateKeyFile: %q
containerRuntimeEndpoint: unix://%s
cgroupDriver: cgroupfs
failCgroupV1: false
cgroupRoot: /
cgroupsPerQOS: true
enforceNodeAllocatable: [pods]
failSwapOn: false
protectKernelDefaults: false
clusterDNS: [%s]
clusterDomain: cluster.local
serializeImagePulls: false
evictionHard: {"memory.available": "50Mi", "nodefs.available": "1%%", "imagefs.available": "1%%"}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
`, port, filepath.Join(pa.spec.dataDir, "client-ca.crt"), filepath.Join(pa.spec.dataDir, "serving-kubelet.crt"), filepath.Join(pa.spec.dataDir, "serving-kubelet.key"), containerdSocket, cmp.Or(pa.spec.clusterDNS, clusterDNS))
	for path, text := range map[string]string{
		filepath.Join(pa.etcDir, "containerd", "config.toml"):          containerdConfig,
		filepath.Join(pa.etcDir, "cni", "net.d", "10-bridge.conflist"): cni,
		filepath.Join(pa.etcDir, "kubelet.yaml"):                       kubelet,
	} {
		if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
			return err
		}
		if err := writeFileAtomic(path, []byte(text), 0o644); err != nil {
			return err
		}
	}
	return os.MkdirAll(filepath.Join(pa.spec.dataDir, "images"), 0o755)
}

func (pa *podAgent) kubeletArgs() []string {
	args := []string{
		"--config=" + filepath.Join(pa.etcDir, "kubelet.yaml"),
		"--kubeconfig=" + filepath.Join(pa.spec.dataDir, "kubelet.kubeconfig"),
		"--hostname-override=" + pa.spec.name,
	}
	if len(pa.spec.internalIPs) > 0 {
		args = append(args, "--node-ip="+strings.Join(pa.spec.internalIPs, ","))
	}
	return args
}

// startChild starts a supervised child that dies with the agent (as k3s's containerd).
func (pa *podAgent) startChild(ctx context.Context, name, logPath, path string, args ...string) (*exec.Cmd, error) {
	if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err != nil {
		return nil, err
	}
	logFile, err := os.OpenFile(logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(path, args...)
	cmd.Env = runtimeEnv()
	cmd.Stdout, cmd.Stderr = logFile, logFile
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		logFile.Close()
		return nil, fmt.Errorf("starting %s: %w", name, err)
	}
	go func() { <-ctx.Done(); logFile.Close() }()
	infof("Running %s (pid %d), logging to %s", name, cmd.Process.Pid, logPath)
	return cmd, nil
}

// importImages imports each *.tar in the air-gap folder that is new or changed since seen.
func (pa *podAgent) importImages(ctx context.Context, seen map[string]string) {
	dir := filepath.Join(pa.spec.dataDir, "images")
	entries, _ := os.ReadDir(dir)
	names := []string{}
	for _, e := range entries {
		if !e.IsDir() && (strings.HasSuffix(e.Name(), ".tar") || strings.HasSuffix(e.Name(), ".tar.gz") || strings.HasSuffix(e.Name(), ".tar.zst")) {
			names = append(names, e.Name())
		}
	}
	sort.Strings(names)
	for _, n := range names {
		path := filepath.Join(dir, n)
		fi, err := os.Stat(path)
		if err != nil {
			continue
		}
		stamp := strconv.FormatInt(fi.Size(), 10) + "@" + fi.ModTime().String()
		if seen[n] == stamp {
			continue
		}
		started := time.Now()
		out, err := exec.CommandContext(ctx, filepath.Join(runtimeBinDir, "ctr"), "--address", containerdSocket,
			"-n", "k8s.io", "images", "import", "--local", path).CombinedOutput()
		if ctx.Err() != nil {
			return
		}
		if err != nil {
			errorf("Unable to import images from %s: %v: %s", path, err, strings.TrimSpace(string(out)))
			continue
		}
		seen[n] = stamp
		infof("Imported images from %s in %s", path, time.Since(started).Round(time.Millisecond))
	}
}

// announceReady tells systemd READY=1 once the kubelet reports the Node Ready.
func (pa *podAgent) announceReady(ctx context.Context) {
	deadline := time.Now().Add(readyWait)
	for time.Now().Before(deadline) {
		node, err := pa.nodes.Get(ctx, pa.spec.name, metav1.GetOptions{})
		if err == nil {
			for _, c := range node.Status.Conditions {
				if c.Type == corev1.NodeReady && c.Status == corev1.ConditionTrue {
					infof("Node %s is Ready (kubelet %s, runtime %s)", pa.spec.name, node.Status.NodeInfo.KubeletVersion, node.Status.NodeInfo.ContainerRuntimeVersion)
					sdNotify("READY=1")
					return
				}
			}
		}
		if !sleepCtx(ctx, time.Second) {
			return
		}
	}
	warnf("Node %s not Ready after %s; see %s", pa.spec.name, readyWait, filepath.Join(pa.spec.dataDir, "kubelet.log"))
}

func waitSocket(ctx context.Context, path string, timeout time.Duration) bool {
	deadline := time.Now().Add(timeout)
	for time.Now().Before(deadline) {
		if c, err := net.DialTimeout("unix", path, time.Second); err == nil {
			c.Close()
			return true
		}
		if !sleepCtx(ctx, 200*time.Millisecond) {
			return false
		}
	}
	return false
}

func exited(cmd *exec.Cmd) <-chan error {
	ch := make(chan error, 1)
	go func() { ch <- cmd.Wait() }()
	return ch
}

func waitExit(cmd *exec.Cmd, done <-chan error, timeout time.Duration) {
	select {
	case <-done:
	case <-time.After(timeout):
		_ = cmd.Process.Kill()
		<-done
	}
}
