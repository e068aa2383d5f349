package main

// The server's settings an agent reads from /v1-k3s/config, once, at its start (k3s's
// pkg/agent/config/config.go get() copies them from config.Control into the node's config;
// nothing re-reads them while the agent runs, so a change on the server reaches an agent only
// when it starts again):
//
//   - FlannelBackend (podnet.go) and the cluster CIDR (netrules.go);
//   - FlannelExternalIP (--flannel-external-ip): flannel publishes the node's external address
//     as its public-ip, the address other nodes send pod traffic to; pkg/agent/run.go warns
//     when the node has no external address ("Server has flannel-external-ip flag set but
//     this node does not set node-external-ip. Flannel will use internal address when
//     connecting to this node.") and when the backend does not encrypt ("Flannel is using
//     external addresses with an insecure backend: <backend>. Please consider using an
//     encrypting flannel backend.");
//   - ClusterDNS: the kubelet's clusterDNS, the tenth address of the server's service CIDR
//     (pkg/cli/server: the default cluster DNS), so an agent follows the server's --service-cidr;
//   - DisableKubeProxy (--disable-kube-proxy, read by getKubeProxyDisabled): the agent runs no
//     kube-proxy, so none of kube-proxy's packet filter rules are made (netrules.go).

import (
	"fmt"
	"net"
)

// clusterDNSOf is k3s's default cluster DNS address for a service CIDR: its tenth address.
func clusterDNSOf(serviceCIDR string) string {
	ip, err := firstServiceIP(serviceCIDR)
	if err != nil {
		return ""
	}
	ip = ip.To16()
	ip[len(ip)-1] += 9
	return net.IP(ip).String()
}

// agentSettings is what the supervisor serves from the server's own flags.
func (s *server) agentSettings() agentControlConfig {
	return agentControlConfig{
		FlannelBackend:    s.o.str("flannel-backend"),
		ClusterCIDR:       s.o.str("cluster-cidr"),
		FlannelExternalIP: s.o.boolean("flannel-external-ip"),
		ClusterDNS:        clusterDNSOf(s.o.str("service-cidr")),
		DisableKubeProxy:  s.o.boolean("disable-kube-proxy"),
	}
}

// applyAgentSettings takes the server's settings into the node's, as k3s's agent does at start.
func applyAgentSettings(spec *nodeSpec, control agentControlConfig) {
	setFlannelBackend(spec, control.FlannelBackend)
	spec.flannelExternalIP = control.FlannelExternalIP
	spec.clusterDNS = control.ClusterDNS
	spec.kubeProxy = !control.DisableKubeProxy
	if spec.flannelBackend == "none" || !spec.flannelExternalIP {
		return
	}
	if len(spec.externalIPs) == 0 {
		warnf("Server has flannel-external-ip flag set but this node does not set node-external-ip. Flannel will use internal address when connecting to this node.")
	} else if spec.flannelBackend != "wireguard-native" {
		warnf("%s", fmt.Sprintf("Flannel is using external addresses with an insecure backend: %v. Please consider using an encrypting flannel backend.", spec.flannelBackend))
	}
}

// flannelPublicIP is the address flannel publishes for the node: its external one when the
// server says so and it has one, else its internal one.
func flannelPublicIP(spec nodeSpec) string {
	if spec.flannelExternalIP && len(spec.externalIPs) > 0 {
		return spec.externalIPs[0]
	}
	return spec.internalIPs[0]
}
