package main

// k3s's network-policy controller in pod mode (LAB ONLY): k3s runs kube-router's netpol
// controller in every agent (k3s pkg/agent/netpol/netpol.go Run, unless
// --disable-network-policy; github.com/cloudnativelabs/kube-router pkg/controllers/netpol),
// which enforces NetworkPolicies with iptables on the node where the selected pod runs. This
// file reproduces its ingress half with kube-router's chain layout and rules:
//
//   - a pod no ingress policy selects is left alone (default allow);
//   - a pod of this node (spec.nodeName; not hostNetwork, with an IP) that some policy of its
//     namespace selects for Ingress (policyTypes holds Ingress, or is empty) gets a chain
//     KUBE-POD-FW-<hash>, reached from KUBE-ROUTER-FORWARD and KUBE-ROUTER-OUTPUT ("-d <pod IP>"),
//     which the filter table's FORWARD and OUTPUT chains jump to first (pod.go
//     syncPodFirewallChains): return traffic is accepted ("rule for stateful firewall for
//     pod"), so is traffic from the pod's own node ("rule to permit the traffic traffic to pods
//     when source is the pod's local node", -m addrtype --src-type LOCAL), then each selecting
//     policy's chain KUBE-NWPLCY-<hash> marks what it permits (0x10000), and what is not marked
//     is REJECTed ("rule to REJECT traffic destined for POD name:... namespace: ..."), the mark
//     then cleared;
//   - a policy's chain permits, per ingress rule, the sources of its `from` (none: every
//     source) on its `ports` (none: every port): a podSelector's pods in the policy's
//     namespace, a namespaceSelector's namespaces' pods (both: those pods of those
//     namespaces), an ipBlock's CIDR but its `except` networks (kube-router: ipsets with
//     nomatch entries; here a chain per block that returns for each exception); ports by
//     protocol (TCP when unset), number or range (endPort) or a name the target pod's
//     containers declare (policy.go);
//   - re-read every two seconds (kube-router watches and resyncs); chains of pods and policies
//     gone are removed.
//
// Not reproduced: egress policies (kube-router's egress chains: a pod's outgoing traffic is
// never limited here), IPv6, NFLOG logging of refusals, kube-router's ipsets (rules name each
// address), and its marking of permitted packets for an ACCEPT at the end of FORWARD (permitted
// packets go on through FORWARD, where flannel's FLANNEL-FWD accepts pod traffic). Traffic
// between two pods on one bridge is filtered only where the kernel hands bridged packets to
// iptables (br_netfilter, which k3s's agent loads: pkg/agent/syssetup), as on k3s.
//
// It reads pods, namespaces and NetworkPolicies with the node's certificate, through the
// system:k3s-controller role the server binds to system:nodes (server.go bootstrapRBAC).

import (
	"context"
	"crypto/sha256"
	"encoding/base32"
	"fmt"
	"os/exec"
	"sort"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	networkingv1 "k8s.io/api/networking/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/labels"
	"k8s.io/client-go/kubernetes"
)

const (
	netpolPoll          = 2 * time.Second
	netpolForwardChain  = "KUBE-ROUTER-FORWARD"
	netpolOutputChain   = "KUBE-ROUTER-OUTPUT"
	podFirewallPrefix   = "KUBE-POD-FW-"
	policyChainPrefix   = "KUBE-NWPLCY-"
	netpolPermittedMark = "0x10000/0x10000"
)

// netpolChainName is kube-router's: the prefix and 16 base32 characters of a SHA-256.
func netpolChainName(prefix string, parts ...string) string {
	hash := sha256.Sum256([]byte(strings.Join(parts, "")))
	return prefix + base32.StdEncoding.EncodeToString(hash[:])[:16]
}

func comment(text string) string { return fmt.Sprintf("-m comment --comment %q", text) }

func isIngressPolicy(p *networkingv1.NetworkPolicy) bool {
	if len(p.Spec.PolicyTypes) == 0 {
		return true // Ingress always, Egress only when egress rules are given
	}
	for _, t := range p.Spec.PolicyTypes {
		if t == networkingv1.PolicyTypeIngress {
			return true
		}
	}
	return false
}

func selects(selector *metav1.LabelSelector, set map[string]string) bool {
	s, err := metav1.LabelSelectorAsSelector(selector)
	return err == nil && s.Matches(labels.Set(set))
}

func podRunning(p *corev1.Pod) bool {
	return p.Status.PodIP != "" && !p.Spec.HostNetwork &&
		p.Status.Phase != corev1.PodSucceeded && p.Status.Phase != corev1.PodFailed
}

// peerSources are the source addresses a peer names ("-s" arguments), or for an ipBlock its
// CIDR and exceptions.
func peerSources(peer networkingv1.NetworkPolicyPeer, policyNS string, pods []corev1.Pod, namespaces []corev1.Namespace) []string {
	nsLabels := map[string]map[string]string{}
	for i := range namespaces {
		nsLabels[namespaces[i].Name] = namespaces[i].Labels
	}
	var out []string
	for i := range pods {
		p := &pods[i]
		if !podRunning(p) {
			continue
		}
		switch {
		case peer.NamespaceSelector != nil:
			if !selects(peer.NamespaceSelector, nsLabels[p.Namespace]) {
				continue
			}
		case p.Namespace != policyNS:
			continue
		}
		if peer.PodSelector != nil && !selects(peer.PodSelector, p.Labels) {
			continue
		}
		out = append(out, p.Status.PodIP+"/32")
	}
	sort.Strings(out)
	return out
}

// portArgs are the "-p ... --dport ..." alternatives of a rule's ports for the target pod
// (one empty alternative: every port). A named port the pod does not declare matches nothing.
func portArgs(ports []networkingv1.NetworkPolicyPort, target *corev1.Pod) []string {
	if len(ports) == 0 {
		return []string{""}
	}
	var out []string
	for _, port := range ports {
		protocol := corev1.ProtocolTCP
		if port.Protocol != nil {
			protocol = *port.Protocol
		}
		proto := strings.ToLower(string(protocol))
		if port.Port == nil {
			out = append(out, "-p "+proto)
			continue
		}
		number := port.Port.IntValue()
		if port.Port.Type != 0 { // a named port: the target's container port of that name
			number = 0
			for _, c := range target.Spec.Containers {
				for _, cp := range c.Ports {
					if cp.Name == port.Port.StrVal && cp.Protocol == protocol {
						number = int(cp.ContainerPort)
					}
				}
			}
			if number == 0 {
				continue
			}
		}
		dport := fmt.Sprint(number)
		if port.EndPort != nil && port.Port.Type == 0 {
			dport = fmt.Sprintf("%d:%d", number, *port.EndPort)
		}
		out = append(out, fmt.Sprintf("-p %s -m %s --dport %s", proto, proto, dport))
	}
	return out
}

// netpolRuleset is the filter table's part (iptables-restore --noflush input) for the
// ingress-selected pods of node, and every chain name it declares.
func netpolRuleset(node string, pods []corev1.Pod, namespaces []corev1.Namespace, policies []networkingv1.NetworkPolicy) (string, map[string]bool) {
	chains := map[string]bool{}
	var decl, rules []string
	add := func(chain, args string) { rules = append(rules, "-A "+chain+" "+args) }
	// iptables-restore --noflush empties a declared chain (and makes it when missing).
	declare := func(chain string) {
		if !chains[chain] {
			decl = append(decl, ":"+chain+" - [0:0]")
		}
		chains[chain] = true
	}
	declare(netpolForwardChain)
	declare(netpolOutputChain)
	sort.Slice(pods, func(i, j int) bool { return pods[i].Namespace+"/"+pods[i].Name < pods[j].Namespace+"/"+pods[j].Name })
	sort.Slice(policies, func(i, j int) bool {
		return policies[i].Namespace+"/"+policies[i].Name < policies[j].Namespace+"/"+policies[j].Name
	})
	for i := range pods {
		target := &pods[i]
		if target.Spec.NodeName != node || !podRunning(target) {
			continue
		}
		var selecting []*networkingv1.NetworkPolicy
		for j := range policies {
			p := &policies[j]
			if p.Namespace == target.Namespace && isIngressPolicy(p) && selects(&p.Spec.PodSelector, target.Labels) {
				selecting = append(selecting, p)
			}
		}
		if len(selecting) == 0 {
			continue // default allow
		}
		ip := target.Status.PodIP
		podChain := netpolChainName(podFirewallPrefix, target.Namespace, target.Name)
		declare(podChain)
		jump := fmt.Sprintf("%s -d %s/32 -j %s", comment("rule to jump traffic destined to POD name:"+target.Name+
			" namespace: "+target.Namespace+" to chain "+podChain), ip, podChain)
		add(netpolForwardChain, jump)
		add(netpolOutputChain, jump)
		add(podChain, comment("rule for stateful firewall for pod")+" -m conntrack --ctstate RELATED,ESTABLISHED -j ACCEPT")
		add(podChain, comment("rule to permit the traffic traffic to pods when source is the pod's local node")+
			fmt.Sprintf(" -m addrtype --src-type LOCAL -d %s/32 -j ACCEPT", ip))
		for _, p := range selecting {
			// One chain per policy and target: named ports are the target's.
			policyChain := netpolChainName(policyChainPrefix, p.Namespace, p.Name, target.Namespace, target.Name)
			declare(policyChain)
			add(podChain, comment("run through nw policy "+p.Name)+" -j "+policyChain)
			mark := "-j MARK --set-xmark " + netpolPermittedMark
			for r, rule := range p.Spec.Ingress {
				for _, ports := range portArgs(rule.Ports, target) {
					ruleComment := comment(fmt.Sprintf("rule to ACCEPT traffic from sources of rule %d of policy %s/%s", r, p.Namespace, p.Name))
					if len(rule.From) == 0 {
						add(policyChain, strings.Join(strings.Fields(ruleComment+" "+ports+" "+mark), " "))
						continue
					}
					for k, peer := range rule.From {
						if peer.IPBlock != nil {
							block := netpolChainName(policyChainPrefix, p.Namespace, p.Name, target.Namespace, target.Name, fmt.Sprint(r, "/", k, "/", ports))
							declare(block)
							for _, except := range peer.IPBlock.Except {
								add(block, "-s "+except+" -j RETURN")
							}
							add(block, mark)
							add(policyChain, strings.Join(strings.Fields(ruleComment+" -s "+peer.IPBlock.CIDR+" "+ports+" -j "+block), " "))
							continue
						}
						for _, source := range peerSources(peer, p.Namespace, pods, namespaces) {
							add(policyChain, strings.Join(strings.Fields(ruleComment+" -s "+source+" "+ports+" "+mark), " "))
						}
					}
				}
			}
		}
		add(podChain, comment("rule to REJECT traffic destined for POD name:"+target.Name+" namespace: "+target.Namespace)+
			" -m mark ! --mark "+netpolPermittedMark+" -j REJECT")
		add(podChain, "-j MARK --set-xmark 0x0/0x10000")
	}
	text := "*filter\n" + strings.Join(decl, "\n") + "\n"
	if len(rules) > 0 {
		text += strings.Join(rules, "\n") + "\n"
	}
	return text + "COMMIT\n", chains
}

// netpolCommand makes the iptables commands (a test runs them in a network namespace of its own).
var netpolCommand = exec.Command

func iptables(args ...string) error {
	out, err := netpolCommand("iptables", append([]string{"-w", "5"}, args...)...).CombinedOutput()
	if err != nil {
		return fmt.Errorf("iptables %s: %v: %s", strings.Join(args, " "), err, strings.TrimSpace(string(out)))
	}
	return nil
}

// applyNetpol loads the ruleset, puts the jumps first in FORWARD and OUTPUT, and removes the
// pod and policy chains no longer declared.
func applyNetpol(text string, chains map[string]bool) error {
	restore := netpolCommand("iptables-restore", "-w", "5", "--noflush")
	restore.Stdin = strings.NewReader(text)
	if out, err := restore.CombinedOutput(); err != nil {
		return fmt.Errorf("iptables-restore: %v: %s", err, strings.TrimSpace(string(out)))
	}
	for _, jump := range [][2]string{{"FORWARD", netpolForwardChain}, {"OUTPUT", netpolOutputChain}} {
		spec := []string{jump[0], "-m", "comment", "--comment", "kube-router netpol", "-j", jump[1]}
		if iptables(append([]string{"-C"}, spec...)...) != nil {
			if err := iptables(append([]string{"-I", jump[0], "1"}, spec[1:]...)...); err != nil {
				return err
			}
		}
	}
	out, err := netpolCommand("iptables", "-w", "5", "-S").Output()
	if err != nil {
		return err
	}
	var stale []string
	for _, line := range strings.Split(string(out), "\n") {
		name, ok := strings.CutPrefix(line, "-N ")
		if ok && !chains[name] && (strings.HasPrefix(name, podFirewallPrefix) || strings.HasPrefix(name, policyChainPrefix)) {
			stale = append(stale, name)
		}
	}
	// Emptied first, so no stale chain still jumps to another when it is deleted.
	for _, name := range stale {
		_ = iptables("-F", name)
	}
	for _, name := range stale {
		_ = iptables("-X", name)
	}
	return nil
}

// runNetworkPolicies keeps this node's rules in step with the cluster's pods, namespaces and
// policies until ctx ends.
func runNetworkPolicies(ctx context.Context, pa *podAgent) {
	client, err := kubernetes.NewForConfig(clientConfig(pa.cfg, "network-policy-controller"))
	if err != nil {
		warnf("network policy controller: %v", err)
		return
	}
	infof("Starting network policy controller (ingress, kube-router's rules)")
	applied := ""
	for {
		pods, perr := client.CoreV1().Pods("").List(ctx, metav1.ListOptions{})
		namespaces, nerr := client.CoreV1().Namespaces().List(ctx, metav1.ListOptions{})
		policies, err := client.NetworkingV1().NetworkPolicies("").List(ctx, metav1.ListOptions{})
		switch {
		case ctx.Err() != nil:
			return
		case perr != nil || nerr != nil || err != nil:
			warnf("network policy controller: listing: %v %v %v", perr, nerr, err)
		default:
			text, chains := netpolRuleset(pa.spec.name, pods.Items, namespaces.Items, policies.Items)
			if text != applied {
				if err := applyNetpol(text, chains); err != nil {
					warnf("network policy controller: %v", err)
				} else {
					applied = text
				}
			}
		}
		if !sleepCtx(ctx, netpolPoll) {
			return
		}
	}
}
