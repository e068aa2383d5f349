package main

// The pod network across nodes in pod mode (LAB ONLY): the kernel VXLAN devices k3s's
// flannel (vxlan backend, github.com/flannel-io/flannel pkg/backend/vxlan) makes,
// driven by the agent itself instead of flannel's daemon:
//
//   - flannel.1: a VXLAN device, VNI 1, UDP port 8472, local address the node's
//     InternalIP on the interface that holds it, no learning, MTU 50 below that
//     interface's, holding <pod CIDR network address>/32;
//   - the Node's annotations flannel.alpha.coreos.com/backend-type=vxlan,
//     backend-data={"VNIs":[1],"VtepMAC":"<flannel.1 MAC>"}, public-ip=<InternalIP>,
//     kube-subnet-manager=true, as flannel's kube subnet manager publishes them;
//   - for every other Node so annotated, with a pod CIDR: a route to its pod CIDR via its
//     VTEP address on flannel.1 (onlink), a permanent neighbour entry for that address
//     with its VtepMAC and a forwarding entry sending that MAC to its public-ip; entries
//     of Nodes gone or changed are removed. Re-read every few seconds. A Node whose
//     backend-type is not vxlan is no peer: flannel's vxlan backend programs only VTEPs
//     (flannel's pkg/backend/vxlan/vxlan_network.go handleSubnetEvents: "ignoring non-vxlan
//     subnet", logged here at the same level), so pods
//     on nodes with different backends cannot reach each other;
//   - the backend is the server's --flannel-backend, which the agent reads once, at its
//     start, from /v1-k3s/config (k3s's pkg/agent/config/config.go get(): FlannelBackend
//     of the served config.Control), and publishes as backend-type even when it is not
//     vxlan (then no device is made: the lab's kernel has no WireGuard).

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"os/exec"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
)

const (
	vxlanDevice   = "flannel.1"
	vxlanVNI      = 1
	vxlanPort     = 8472
	vxlanOverhead = 50
	annPrefix     = "flannel.alpha.coreos.com/"
	podNetPoll    = 3 * time.Second
)

type vxlanPeer struct{ subnet, vtep, mac, publicIP string }

func ipCmd(args ...string) error {
	out, err := exec.Command("ip", args...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("ip %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// nodeInterface is the interface holding ip, and its MTU.
func nodeInterface(ip string) (string, int, error) {
	ifaces, err := net.Interfaces()
	if err != nil {
		return "", 0, err
	}
	for _, ifc := range ifaces {
		addrs, _ := ifc.Addrs()
		for _, a := range addrs {
			if n, ok := a.(*net.IPNet); ok && n.IP.String() == ip {
				return ifc.Name, ifc.MTU, nil
			}
		}
	}
	return "", 0, fmt.Errorf("no interface holds %s", ip)
}

// podMTU is the MTU pods get: the VXLAN device's when the node has an InternalIP.
func podMTU(spec nodeSpec) int {
	if len(spec.internalIPs) == 0 {
		return 1500
	}
	if _, mtu, err := nodeInterface(spec.internalIPs[0]); err == nil {
		return mtu - vxlanOverhead
	}
	return 1500
}

// setFlannelBackend records the backend the node runs, published as flannel's kube subnet
// manager does (its Node's flannel.alpha.coreos.com/backend-type); "none" runs no flannel.
func setFlannelBackend(spec *nodeSpec, backend string) {
	if backend == "" {
		backend = "vxlan"
	}
	spec.flannelBackend = backend
	if backend != "none" {
		spec.annotations[annPrefix+"backend-type"] = backend
	}
}

func startPodNetwork(ctx context.Context, pa *podAgent, podCIDR string) error {
	if b := pa.spec.flannelBackend; b != "vxlan" {
		// Only vxlan is made here (the lab's kernel has no WireGuard); a node on another
		// backend keeps its annotation and reaches no other node's pods, nor they its.
		return fmt.Errorf("flannel backend %s is not available in the lab: no pod traffic to or from other nodes", b)
	}
	if len(pa.spec.internalIPs) == 0 {
		return fmt.Errorf("the node has no InternalIP for the VXLAN device")
	}
	local := pa.spec.internalIPs[0]
	iface, mtu, err := nodeInterface(local)
	if err != nil {
		return err
	}
	_, subnet, err := net.ParseCIDR(podCIDR)
	if err != nil {
		return err
	}
	_ = ipCmd("link", "delete", vxlanDevice) // a leftover with other settings
	if err := ipCmd("link", "add", vxlanDevice, "type", "vxlan", "id", fmt.Sprint(vxlanVNI), "local", local,
		"dev", iface, "dstport", fmt.Sprint(vxlanPort), "nolearning"); err != nil {
		return err
	}
	if err := ipCmd("link", "set", vxlanDevice, "mtu", fmt.Sprint(mtu-vxlanOverhead), "up"); err != nil {
		return err
	}
	if err := ipCmd("addr", "replace", subnet.IP.String()+"/32", "dev", vxlanDevice); err != nil {
		return err
	}
	dev, err := net.InterfaceByName(vxlanDevice)
	if err != nil {
		return err
	}
	backend, _ := json.Marshal(map[string]any{"VNIs": []int{vxlanVNI}, "VtepMAC": dev.HardwareAddr.String()})
	patch, _ := json.Marshal(map[string]any{"metadata": map[string]any{"annotations": map[string]string{
		annPrefix + "backend-type":        pa.spec.flannelBackend,
		annPrefix + "backend-data":        string(backend),
		annPrefix + "public-ip":           flannelPublicIP(pa.spec),
		annPrefix + "kube-subnet-manager": "true",
	}}})
	if _, err := pa.nodes.Patch(ctx, pa.spec.name, types.StrategicMergePatchType, patch, metav1.PatchOptions{}); err != nil {
		return fmt.Errorf("publishing the VTEP on node %s: %w", pa.spec.name, err)
	}
	infof("Pod network: %s (VNI %d, port %d) on %s, %s, VTEP %s", vxlanDevice, vxlanVNI, vxlanPort, iface, podCIDR, dev.HardwareAddr)
	go syncPeers(ctx, pa)
	return nil
}

func peerOf(n *corev1.Node) (vxlanPeer, bool) {
	a := n.Annotations
	if a[annPrefix+"backend-type"] != "vxlan" || n.Spec.PodCIDR == "" || a[annPrefix+"public-ip"] == "" {
		return vxlanPeer{}, false
	}
	var data struct{ VtepMAC string }
	if json.Unmarshal([]byte(a[annPrefix+"backend-data"]), &data) != nil || data.VtepMAC == "" {
		return vxlanPeer{}, false
	}
	_, subnet, err := net.ParseCIDR(n.Spec.PodCIDR)
	if err != nil {
		return vxlanPeer{}, false
	}
	return vxlanPeer{subnet: subnet.String(), vtep: subnet.IP.String(), mac: data.VtepMAC, publicIP: a[annPrefix+"public-ip"]}, true
}

func addPeer(p vxlanPeer) error {
	if err := ipCmd("neigh", "replace", p.vtep, "lladdr", p.mac, "dev", vxlanDevice, "nud", "permanent"); err != nil {
		return err
	}
	if out, err := exec.Command("bridge", "fdb", "replace", p.mac, "dev", vxlanDevice, "dst", p.publicIP, "self", "permanent").CombinedOutput(); err != nil {
		return fmt.Errorf("bridge fdb: %v: %s", err, strings.TrimSpace(string(out)))
	}
	return ipCmd("route", "replace", p.subnet, "via", p.vtep, "dev", vxlanDevice, "onlink")
}

func removePeer(p vxlanPeer) {
	_ = ipCmd("route", "delete", p.subnet, "dev", vxlanDevice)
	_ = ipCmd("neigh", "delete", p.vtep, "dev", vxlanDevice)
	_ = exec.Command("bridge", "fdb", "delete", p.mac, "dev", vxlanDevice, "dst", p.publicIP, "self").Run()
}

func syncPeers(ctx context.Context, pa *podAgent) {
	installed := map[string]vxlanPeer{}
	ignored := map[string]bool{}
	for {
		nodes, err := pa.nodes.List(ctx, metav1.ListOptions{})
		if err == nil {
			seen := map[string]bool{}
			for i := range nodes.Items {
				n := &nodes.Items[i]
				if n.Name == pa.spec.name {
					continue
				}
				p, ok := peerOf(n)
				if !ok {
					if bt := n.Annotations[annPrefix+"backend-type"]; bt != "" && bt != "vxlan" && !ignored[n.Name] {
						ignored[n.Name] = true
						warnf("ignoring non-vxlan subnet(%s): type=%v", n.Spec.PodCIDR, bt)
					}
					continue
				}
				delete(ignored, n.Name)
				seen[n.Name] = true
				if old, had := installed[n.Name]; had && old == p {
					continue
				} else if had {
					removePeer(old)
				}
				if err := addPeer(p); err != nil {
					warnf("Pod network: route to node %s: %v", n.Name, err)
					continue
				}
				installed[n.Name] = p
				infof("Pod network: %s reaches node %s's pods %s through %s", vxlanDevice, n.Name, p.subnet, p.publicIP)
			}
			for name, p := range installed {
				if !seen[name] {
					removePeer(p)
					delete(installed, name)
				}
			}
		} else if ctx.Err() == nil {
			warnf("Pod network: listing nodes: %v", err)
		}
		if !sleepCtx(ctx, podNetPoll) {
			return
		}
	}
}
