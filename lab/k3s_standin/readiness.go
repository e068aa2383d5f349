package main

// When an agent tells systemd it is up. k3s's agent (pkg/agent/run.go run) sends READY=1 only
// from the goroutine that runs startNetwork once the API server is ready: configureNode (its
// labels and annotations on the Node, which waits for the Node to exist), then the CNI, whose
// flannel waits for the Node's PodCIDR (pkg/agent/flannel setup: "Waiting for node <name> CIDR
// not assigned yet", every few seconds, with no end) before the network policy controller
// starts; and only then "k3s agent is up and running" and READY=1. So an agent whose Node
// never gets a PodCIDR (the cluster CIDR exhausted, the controller-manager not allocating)
// stays `activating` for as long as systemd lets it; with --flannel-backend=none there is no
// flannel and nothing waits for the PodCIDR.

import (
	"context"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
	"k8s.io/client-go/rest"
)

// podCIDRPoll is how often the agent looks at its Node for a PodCIDR (flannel's loop).
const podCIDRPoll = 2 * time.Second

// notifyAgentReady sends READY=1 once the Node has a PodCIDR (at once when the flannel backend
// is none), as k3s's agent does; it returns without a word when ctx ends first.
func notifyAgentReady(ctx context.Context, cfg *rest.Config, spec nodeSpec) {
	if spec.flannelBackend != "none" {
		core, err := corev1client.NewForConfig(clientConfig(cfg, "kubelet"))
		if err != nil {
			errorf("watching node %s for its pod CIDR: %v", spec.name, err)
			return
		}
		for {
			node, err := core.Nodes().Get(ctx, spec.name, metav1.GetOptions{})
			if err == nil && node.Spec.PodCIDR != "" {
				break
			}
			if ctx.Err() != nil {
				return
			}
			infof("Waiting for node %s CIDR not assigned yet", spec.name)
			if !sleepCtx(ctx, podCIDRPoll) {
				return
			}
		}
	}
	infof("k3s agent is up and running")
	sdNotify("READY=1")
}
