package main

// `k3s kubectl ...`: run kubectl with the admin kubeconfig, as k3s's embedded
// kubectl does when neither $KUBECONFIG nor --kubeconfig is given.

import (
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
)

func runKubectl(args []string) int {
	bin := filepath.Join(kubeBinDir(), "kubectl")
	if _, err := os.Stat(bin); err != nil {
		p, lerr := exec.LookPath("kubectl")
		if lerr != nil || isSelf(p) {
			fmt.Fprintf(os.Stderr, "kubectl not found in %s (set $%s)\n", kubeBinDir(), kubeBinEnv)
			return 1
		}
		bin = p
	}
	env := kubectlEnv(os.Environ())
	if os.Getenv("KUBECONFIG") == "" && !hasKubeconfigFlag(args) {
		kc := serverKubeconfigDefault
		if os.Geteuid() != 0 {
			if home, err := os.UserHomeDir(); err == nil {
				if _, err := os.Stat(filepath.Join(home, ".kube", "k3s.yaml")); err == nil {
					kc = filepath.Join(home, ".kube", "k3s.yaml")
				}
			}
		}
		env = append(env, "KUBECONFIG="+kc)
	}
	err := syscall.Exec(bin, append([]string{"kubectl"}, args...), env)
	fmt.Fprintf(os.Stderr, "exec %s: %v\n", bin, err)
	return 1
}

func hasKubeconfigFlag(args []string) bool {
	for _, a := range args {
		if a == "--" {
			return false
		}
		if a == "--kubeconfig" || strings.HasPrefix(a, "--kubeconfig=") {
			return true
		}
	}
	return false
}

func isSelf(path string) bool {
	self, err := os.Executable()
	if err != nil {
		return false
	}
	a, err1 := filepath.EvalSymlinks(self)
	b, err2 := filepath.EvalSymlinks(path)
	return err1 == nil && err2 == nil && a == b
}

// kubectlEnv is the environment kubectl runs with: the caller's, and (LAB ONLY: a cost, not a
// behaviour) no garbage collection below 256 MiB of heap unless the caller chose its own GOGC or
// GOMEMLIMIT. The lab's tests and the program start kubectl thousands of times per run; a short
// command never reaches that heap, and about a fifth of its CPU was the collector's work on its
// start-up garbage. A long command (a watch, a drain) is collected once the heap reaches the limit.
func kubectlEnv(environ []string) []string {
	for _, kv := range environ {
		if strings.HasPrefix(kv, "GOGC=") || strings.HasPrefix(kv, "GOMEMLIMIT=") {
			return environ
		}
	}
	return append(append([]string{}, environ...), "GOGC=off", "GOMEMLIMIT=256MiB")
}
