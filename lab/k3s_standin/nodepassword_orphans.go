package main

// Orphaned node-password Secrets, as recent k3s's node-password controller
// (pkg/nodepassword/controller.go sync, run every minute by wait.UntilWithContext): a
// kube-system/<node>.node-password.k3s Secret whose Node does not exist and that is older than
// MinOrphanSecretAge (10 minutes: the Secret is written when the agent asks for its
// certificates, the Node only after containerd and the kubelet start) is deleted, with its UID
// as a precondition, and logged as a warning "Deleted orphaned node-password secret <name>
// created <time>". So a host refused or killed between its certificate request and its Node's
// registration does not hold the name for ever. The age is $HK3S_LAB_NODE_PASSWORD_ORPHAN_AGE
// (a Go duration, default 10m) so that tests need not wait ten minutes; the sweep runs every
// minute, or every <age> when that is shorter.

import (
	"context"
	"os"
	"strings"
	"time"

	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
)

const (
	orphanAgeEnv          = "HK3S_LAB_NODE_PASSWORD_ORPHAN_AGE"
	defaultMinOrphanAge   = 10 * time.Minute
	orphanSweepInterval   = time.Minute
	orphanSecretLogFormat = "Deleted orphaned node-password secret %s created %s"
)

// minOrphanSecretAge is k3s's MinOrphanSecretAge, or the lab's setting.
func minOrphanSecretAge() time.Duration {
	if v := os.Getenv(orphanAgeEnv); v != "" {
		if d, err := time.ParseDuration(v); err == nil && d > 0 {
			return d
		}
		warnf("ignoring $%s=%q: not a positive duration", orphanAgeEnv, v)
	}
	return defaultMinOrphanAge
}

// sweepOrphanedNodePasswords deletes the orphaned Secrets (see above) until ctx ends.
func sweepOrphanedNodePasswords(ctx context.Context, nodes corev1client.NodeInterface, secrets corev1client.SecretInterface) {
	age := minOrphanSecretAge()
	interval := min(orphanSweepInterval, age)
	for sleepCtx(ctx, interval) {
		nodeList, err := nodes.List(ctx, metav1.ListOptions{})
		if err != nil {
			continue
		}
		owned := map[string]bool{}
		for _, n := range nodeList.Items {
			owned[strings.ToLower(n.Name+nodePasswordSuffix)] = true
		}
		secretList, err := secrets.List(ctx, metav1.ListOptions{})
		if err != nil {
			continue
		}
		oldest := time.Now().Add(-age)
		for _, s := range secretList.Items {
			if !strings.HasSuffix(s.Name, nodePasswordSuffix) || owned[s.Name] || s.CreationTimestamp.After(oldest) {
				continue
			}
			uid := s.UID
			err := secrets.Delete(ctx, s.Name, metav1.DeleteOptions{Preconditions: &metav1.Preconditions{UID: &uid}})
			if err != nil {
				errorf("Failed to delete orphaned node-password secret %s: %v", s.Name, err)
				continue
			}
			warnf(orphanSecretLogFormat, s.Name, s.CreationTimestamp)
		}
	}
}
