package main

// Node passwords, as k3s (pkg/nodepassword/nodepassword.go, the agent's
// pkg/agent/config/config.go, the server's node controller pkg/node/controller.go):
//
//   - every agent keeps a random password in /etc/rancher/node/password (made on its
//     first start, kept across restarts and reinstalls of k3s);
//   - at every start the agent sends its node name and password to the supervisor; the
//     server keeps a hash in the immutable Secret kube-system/<node>.node-password.k3s,
//     created by the first agent of that name, and refuses (403) an agent whose password
//     does not match; the agent then logs, every 5 s and at info level, "Waiting to
//     retrieve agent configuration; server is not ready: Node password rejected,
//     duplicate hostname or contents of '/etc/rancher/node/password' may not match
//     server node-passwd entry, try enabling a unique node name with the --with-node-id
//     flag", and never starts its kubelet;
//   - the Secret is deleted when its Node is deleted: a host rebuilt under the name of a
//     live Node meets the refusal; a Secret whose Node never came (a node whose
//     registration was refused or interrupted after the Secret was written) is deleted
//     once it is older than k3s's MinOrphanSecretAge (nodepassword_orphans.go), and until
//     then another host under that name meets the refusal too.
//
// As in k3s, the password is checked in the handlers that issue the agent's certificates
// (the serving certificate first, then the client certificate), before anything is issued:
// a refused host gets no certificate, runs no kubelet and registers no Node. The password file is $HK3S_LAB_NODE_PASSWORD_FILE when set (the stand-in's
// own tests run agents on one machine), else /etc/rancher/node/password.

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/watch"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
)

const (
	nodePasswordPath     = "/v1-k3s/serving-kubelet.crt"
	nodePasswordHeader   = "K3s-Node-Password"
	nodePasswordRetry    = 5 * time.Second
	nodePasswordSuffix   = ".node-password.k3s"
	defaultPasswordFile  = "/etc/rancher/node/password"
	nodePasswordRejected = "Node password rejected, duplicate hostname or contents of '%s' may not match server node-passwd entry, try enabling a unique node name with the --with-node-id flag"
)

func nodePasswordFile() string {
	if f := os.Getenv("HK3S_LAB_NODE_PASSWORD_FILE"); f != "" {
		return f
	}
	return defaultPasswordFile
}

// ensureNodePassword reads the node's password, making one on first use.
func ensureNodePassword(path string) (string, error) {
	if b, err := os.ReadFile(path); err == nil && strings.TrimSpace(string(b)) != "" {
		return strings.TrimSpace(string(b)), nil
	} else if err != nil && !errors.Is(err, os.ErrNotExist) {
		return "", err
	}
	b := make([]byte, 16)
	if _, err := rand.Read(b); err != nil {
		return "", err
	}
	pass := hex.EncodeToString(b)
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return "", err
	}
	return pass, writeFileAtomic(path, []byte(pass+"\n"), 0o600)
}

// waitNodePassword presents the node's name and password (with the token's credentials and
// any stored node certificate) until the server accepts them: forever, every 5 s, as the k3s
// agent retries its configuration. It comes before any certificate is issued, as in k3s,
// whose agent asks for its serving certificate first (getServingCert, password checked in
// the handler) and its client certificate next (checked again).
func waitNodePassword(ctx context.Context, serverURL string, caBundle []byte, auth agentAuth, node string) (string, bool) {
	file := nodePasswordFile()
	pass, err := ensureNodePassword(file)
	if err != nil {
		errorf("Failed to read or create the node password in %s: %v", file, err)
		return "", false
	}
	client := auth.client(caBundle)
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, serverURL+nodePasswordPath, nil)
		if err != nil {
			return "", false
		}
		auth.apply(req)
		req.Header.Set(nodeNameHeader, node)
		req.Header.Set(nodePasswordHeader, pass)
		resp, err := doNodeNamed(client, auth, caBundle, req)
		switch {
		case ctx.Err() != nil:
			return "", false
		case err != nil:
			infof("Waiting to retrieve agent configuration; server is not ready: %v", err)
		default:
			body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<16))
			resp.Body.Close()
			switch resp.StatusCode {
			case http.StatusOK:
				return pass, true
			case http.StatusForbidden:
				infof("Waiting to retrieve agent configuration; server is not ready: "+nodePasswordRejected, file)
			case http.StatusUnauthorized:
				// getNodeNamedCrt words every other refusal as the URL and the HTTP status.
				infof("Waiting to retrieve agent configuration; server is not ready: %s: %s", resp.Request.URL, resp.Status)
			default:
				infof("Waiting to retrieve agent configuration; server is not ready: %v", responseError(version, resp, body))
			}
		}
		if !sleepCtx(ctx, nodePasswordRetry) {
			return "", false
		}
	}
}

// doNodeNamed sends a node-named certificate request as k3s's getNodeNamedCrt
// (pkg/agent/config/config.go): a 401 to a request that carried the stored client
// certificate (its Node was deleted: the supervisor's verifyNode) is logged "Node
// authorization rejected, retrying without client certificate authentication" and sent
// once more with the token's credentials alone; what that answers is the answer.
func doNodeNamed(client *http.Client, auth agentAuth, caBundle []byte, req *http.Request) (*http.Response, error) {
	var body []byte
	if req.Body != nil && req.GetBody != nil {
		if rc, err := req.GetBody(); err == nil {
			body, _ = io.ReadAll(rc)
			rc.Close()
		}
	}
	resp, err := client.Do(req)
	if err != nil || resp.StatusCode != http.StatusUnauthorized || auth.cert == nil {
		return resp, err
	}
	_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 1<<16))
	resp.Body.Close()
	infof("Node authorization rejected, retrying without client certificate authentication")
	retry := req.Clone(req.Context())
	if body != nil {
		retry.Body = io.NopCloser(bytes.NewReader(body))
	}
	return agentAuth{token: auth.token}.client(caBundle).Do(retry)
}

func hashNodePassword(pass string, salt []byte) string {
	sum := sha256.Sum256(append(append([]byte{}, salt...), pass...))
	return "sha256:" + hex.EncodeToString(salt) + ":" + hex.EncodeToString(sum[:])
}

func nodePasswordMatches(stored, pass string) bool {
	parts := strings.Split(stored, ":")
	if len(parts) != 3 || parts[0] != "sha256" {
		return false
	}
	salt, err := hex.DecodeString(parts[1])
	if err != nil {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(hashNodePassword(pass, salt)), []byte(stored)) == 1
}

// ensureNodePasswordSecret verifies the node's password against its Secret, creating
// the Secret when there is none (k3s's nodepassword.Ensure).
func ensureNodePasswordSecret(ctx context.Context, secrets corev1client.SecretInterface, node, pass string) error {
	name := strings.ToLower(node + nodePasswordSuffix)
	verify := func() error {
		s, err := secrets.Get(ctx, name, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if !nodePasswordMatches(string(s.Data["hash"]), pass) {
			return fmt.Errorf("unable to verify password for node '%s'", node)
		}
		return nil
	}
	if err := verify(); !apierrors.IsNotFound(err) {
		return err
	}
	salt := make([]byte, 16)
	if _, err := rand.Read(salt); err != nil {
		return err
	}
	immutable := true
	_, err := secrets.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: metav1.NamespaceSystem},
		Immutable:  &immutable,
		Data:       map[string][]byte{"hash": []byte(hashNodePassword(pass, salt))},
	}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return verify()
	}
	return err
}

// nodeAuth verifies the node name and password a request carries, as k3s's
// nodepassword.GetNodeAuthValidator (pkg/nodepassword/validate.go): both headers required
// (400), a caller authenticated by a node certificate only for its own name (400) and only
// while that Node exists (verifyNode: 401 "unable to verify node identity: nodes \"x\" not
// found", so a certificate outlives no deleted Node), the
// password checked against the node's record or the record created (Ensure); a password
// that does not match is refused with 403 and the handler issues nothing. It answers the
// request itself when it returns false.
func (sup *supervisor) nodeAuth(w http.ResponseWriter, r *http.Request, user string) (string, bool) {
	node := strings.ToLower(r.Header.Get(nodeNameHeader))
	pass := r.Header.Get(nodePasswordHeader)
	switch {
	case node == "":
		writeStatus(w, http.StatusBadRequest, "BadRequest", "node name not set")
		return "", false
	case pass == "":
		writeStatus(w, http.StatusBadRequest, "BadRequest", "node password not set")
		return "", false
	}
	if name, isNode := strings.CutPrefix(user, "system:node:"); isNode && name != node {
		writeStatus(w, http.StatusBadRequest, "BadRequest", "header node name does not match auth node name")
		return "", false
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	if name, isNode := strings.CutPrefix(user, "system:node:"); isNode {
		// verifyNode: a node certificate authenticates only while its Node exists.
		if _, err := sup.nodes.Get(ctx, name, metav1.GetOptions{}); err != nil {
			if !apierrors.IsNotFound(err) {
				writeStatus(w, http.StatusServiceUnavailable, "ServiceUnavailable", err.Error())
				return "", false
			}
			msg := "unable to verify node identity: " + err.Error()
			warnf("Node identity auth failed for '%s': %s", node, msg)
			writeStatus(w, http.StatusUnauthorized, "Unauthorized", msg)
			return "", false
		}
	}
	if err := ensureNodePasswordSecret(ctx, sup.secrets, node, pass); err != nil {
		if strings.HasPrefix(err.Error(), "unable to verify password") {
			warnf("Node password validation failed for '%s': %v", node, err)
			writeStatus(w, http.StatusForbidden, "Forbidden", err.Error())
			return "", false
		}
		writeStatus(w, http.StatusServiceUnavailable, "ServiceUnavailable", err.Error())
		return "", false
	}
	return node, true
}

// serveNodePassword answers the agent's serving-certificate request (k3s's
// ServingKubeletCert, the agent's first certificate request): an agent, then nodeAuth. The
// stand-in issues no serving certificate (its kubelet port makes its own), so an accepted
// request gets "ok".
func (sup *supervisor) serveNodePassword(w http.ResponseWriter, r *http.Request) {
	user, ok := sup.agentAuthorized(w, r)
	if !ok {
		return
	}
	if _, ok := sup.nodeAuth(w, r, user); !ok {
		return
	}
	w.Header().Set("Content-Type", "text/plain")
	_, _ = io.WriteString(w, "ok\n")
}

// removeNodePasswords deletes a Node's password Secret when the Node is deleted
// (k3s's node controller), until ctx ends.
func removeNodePasswords(ctx context.Context, nodes corev1client.NodeInterface, secrets corev1client.SecretInterface) {
	for ctx.Err() == nil {
		w, err := nodes.Watch(ctx, metav1.ListOptions{})
		if err != nil {
			sleepCtx(ctx, 2*time.Second)
			continue
		}
		for ev := range w.ResultChan() {
			if n, ok := ev.Object.(*corev1.Node); ok && ev.Type == watch.Deleted {
				name := strings.ToLower(n.Name + nodePasswordSuffix)
				if err := secrets.Delete(ctx, name, metav1.DeleteOptions{}); err == nil {
					infof("Removed node password secret %s with its node", name)
				}
			}
		}
		w.Stop()
	}
}
