package main

// The iptables chains and rules k3s's node components leave on every node (server and agents,
// either flannel backend), made at start as they make them, left in place at stop (they do not
// remove them: k3s-killall.sh's last lines do, install.sh create_killall:
// "iptables-save | grep -v KUBE- | grep -v CNI- | grep -iv flannel | iptables-restore", the
// same for ip6tables):
//
//   - kube-proxy, iptables mode (kubernetes pkg/proxy/iptables/proxier.go, iptablesJumpChains
//     and syncProxyRules): nat KUBE-SERVICES (from PREROUTING and OUTPUT, "kubernetes service
//     portals"), KUBE-POSTROUTING (from POSTROUTING, "kubernetes postrouting rules": RETURN
//     unless marked 0x4000, then MASQUERADE), KUBE-MARK-MASQ (MARK --or-mark 0x4000),
//     KUBE-NODEPORTS; filter KUBE-FORWARD (from FORWARD, "kubernetes forwarding rules": ACCEPT
//     what is marked 0x4000), KUBE-SERVICES (from FORWARD and OUTPUT, conntrack NEW);
//   - the kubelet's canaries (pkg/kubelet/kubelet_network_linux.go): KUBE-KUBELET-CANARY in
//     mangle, nat and filter, and KUBE-IPTABLES-HINT in mangle, for IPv4 and IPv6;
//   - flannel (pkg/trafficmngr/iptables): nat FLANNEL-POSTRTG (from POSTROUTING, "flanneld
//     masq"), filter FLANNEL-FWD (from FORWARD, "flanneld forward": ACCEPT to and from the
//     cluster CIDR).
//
// Nothing here drops or rejects: no packet the lab sends is marked 0x4000, the FORWARD
// accepts cover only the pod network. Not reproduced: kube-proxy's and the kubelet's jumps
// from INPUT (KUBE-PROXY-FIREWALL, KUBE-NODEPORTS, KUBE-EXTERNAL-SERVICES, KUBE-FIREWALL) and
// kube-proxy's nftables mode (tables ip/ip6 kube-proxy). The stand-in's own tests, which run
// nodes on the build machine itself, get none: they set $HK3S_LAB_NO_HOST_RULES, or
// $HK3S_LAB_KUBE_BIN (set only there: lab hosts have the binaries at /opt/lab-kube/bin).

import (
	"fmt"
	"os"
	"os/exec"
	"slices"
	"strings"
)

type ruleSpec struct {
	table, chain string
	args         []string
}

func kubeRules(clusterCIDR string) (v4, v6 []ruleSpec, chains4, chains6 [][2]string) {
	chains4 = [][2]string{
		{"nat", "KUBE-SERVICES"}, {"nat", "KUBE-POSTROUTING"}, {"nat", "KUBE-MARK-MASQ"}, {"nat", "KUBE-NODEPORTS"},
		{"filter", "KUBE-FORWARD"}, {"filter", "KUBE-SERVICES"},
		{"mangle", "KUBE-KUBELET-CANARY"}, {"nat", "KUBE-KUBELET-CANARY"}, {"filter", "KUBE-KUBELET-CANARY"},
		{"mangle", "KUBE-IPTABLES-HINT"},
		{"nat", "FLANNEL-POSTRTG"}, {"filter", "FLANNEL-FWD"},
	}
	chains6 = [][2]string{
		{"mangle", "KUBE-KUBELET-CANARY"}, {"nat", "KUBE-KUBELET-CANARY"}, {"filter", "KUBE-KUBELET-CANARY"},
		{"mangle", "KUBE-IPTABLES-HINT"},
	}
	c := func(s string) []string { return []string{"-m", "comment", "--comment", s} }
	j := func(args ...string) []string { return args }
	v4 = []ruleSpec{
		{"nat", "PREROUTING", append(c("kubernetes service portals"), "-j", "KUBE-SERVICES")},
		{"nat", "OUTPUT", append(c("kubernetes service portals"), "-j", "KUBE-SERVICES")},
		{"nat", "POSTROUTING", append(c("kubernetes postrouting rules"), "-j", "KUBE-POSTROUTING")},
		{"nat", "KUBE-MARK-MASQ", j("-j", "MARK", "--or-mark", "0x4000")},
		{"nat", "KUBE-POSTROUTING", j("-m", "mark", "!", "--mark", "0x4000/0x4000", "-j", "RETURN")},
		{"nat", "KUBE-POSTROUTING", j("-j", "MARK", "--xor-mark", "0x4000")},
		{"nat", "KUBE-POSTROUTING", append(c("kubernetes service traffic requiring SNAT"), "-j", "MASQUERADE")},
		{"filter", "FORWARD", append(c("kubernetes forwarding rules"), "-j", "KUBE-FORWARD")},
		{"filter", "FORWARD", append(append([]string{"-m", "conntrack", "--ctstate", "NEW"}, c("kubernetes service portals")...), "-j", "KUBE-SERVICES")},
		{"filter", "OUTPUT", append(append([]string{"-m", "conntrack", "--ctstate", "NEW"}, c("kubernetes service portals")...), "-j", "KUBE-SERVICES")},
		{"filter", "KUBE-FORWARD", append(append(c("kubernetes forwarding rules"), "-m", "mark", "--mark", "0x4000/0x4000"), "-j", "ACCEPT")},
		{"nat", "POSTROUTING", append(c("flanneld masq"), "-j", "FLANNEL-POSTRTG")},
		{"nat", "FLANNEL-POSTRTG", append(append([]string{"-m", "mark", "--mark", "0x4000/0x4000"}, c("flanneld masq")...), "-j", "RETURN")},
		{"filter", "FORWARD", append(c("flanneld forward"), "-j", "FLANNEL-FWD")},
		{"filter", "FLANNEL-FWD", append(append([]string{"-s", clusterCIDR}, c("flanneld forward")...), "-j", "ACCEPT")},
		{"filter", "FLANNEL-FWD", append(append([]string{"-d", clusterCIDR}, c("flanneld forward")...), "-j", "ACCEPT")},
	}
	return v4, v6, chains4, chains6
}

// installNodeRules makes the chains and rules above (idempotent: a chain or rule already
// there is left as it is, as the components' own syncs do).
func installNodeRules(clusterCIDR, backend string, kubeProxy bool) {
	if os.Getenv("HK3S_LAB_NO_HOST_RULES") != "" || os.Getenv(kubeBinEnv) != "" {
		return // a node on the build machine itself (below)
	}
	if clusterCIDR == "" {
		clusterCIDR = "10.42.0.0/16"
	}
	v4, v6, chains4, chains6 := kubeRules(clusterCIDR)
	if backend == "none" {
		// No flannel: only kube-proxy's and the kubelet's.
		v4 = slices.DeleteFunc(v4, func(r ruleSpec) bool {
			return strings.Contains(strings.Join(r.args, " "), "FLANNEL-") || strings.HasPrefix(r.chain, "FLANNEL-")
		})
		chains4 = slices.DeleteFunc(chains4, func(tc [2]string) bool { return strings.HasPrefix(tc[1], "FLANNEL-") })
	}
	if !kubeProxy {
		// --disable-kube-proxy: no kube-proxy, so none of its chains (the kubelet's stay).
		isProxy := func(chain string) bool {
			return chain == "KUBE-SERVICES" || chain == "KUBE-POSTROUTING" || chain == "KUBE-MARK-MASQ" || chain == "KUBE-NODEPORTS" || chain == "KUBE-FORWARD"
		}
		v4 = slices.DeleteFunc(v4, func(r ruleSpec) bool {
			return isProxy(r.chain) || (len(r.args) > 1 && isProxy(r.args[len(r.args)-1]))
		})
		chains4 = slices.DeleteFunc(chains4, func(tc [2]string) bool { return isProxy(tc[1]) })
	}
	apply := func(bin string, chains [][2]string, rules []ruleSpec) {
		if _, err := exec.LookPath(bin); err != nil {
			warnf("%s not found: no %s rules", bin, bin)
			return
		}
		for _, tc := range chains {
			if exec.Command(bin, "-w", "5", "-t", tc[0], "-S", tc[1]).Run() != nil {
				if out, err := exec.Command(bin, "-w", "5", "-t", tc[0], "-N", tc[1]).CombinedOutput(); err != nil {
					warnf("%s -t %s -N %s: %v: %s", bin, tc[0], tc[1], err, strings.TrimSpace(string(out)))
				}
			}
		}
		for _, r := range rules {
			spec := append([]string{"-w", "5", "-t", r.table}, append([]string{"-C", r.chain}, r.args...)...)
			if exec.Command(bin, spec...).Run() == nil {
				continue
			}
			spec[4] = "-A"
			if out, err := exec.Command(bin, spec...).CombinedOutput(); err != nil {
				warnf("%s %s: %v: %s", bin, strings.Join(spec, " "), err, strings.TrimSpace(string(out)))
			}
		}
	}
	apply("iptables", chains4, v4)
	apply("ip6tables", chains6, v6)
	infof("%s", fmt.Sprintf("Node iptables rules in place (kube-proxy, kubelet, flannel; cluster CIDR %s)", clusterCIDR))
}
