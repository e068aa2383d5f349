package main

// Secrets encryption at rest, as k3s does it.
//
// At every server start with --secrets-encryption, k3s's genEncryptionConfigAndState
// (pkg/daemons/control/deps/deps.go) writes <data-dir>/server/cred/encryption-config.json (one
// AES-CBC key "aescbckey", then the identity provider) and encryption-state.json
// ("start-<sha256 of the config>") when the config is missing, whether or not the server ran
// before without it, and the kube-apiserver gets --encryption-provider-config (with automatic
// reload). From then on the API server writes every Secret encrypted (k8s:enc:aescbc:v1:...);
// Secrets stored before stay as they were until something rewrites them. The server's Node
// carries the stage in its k3s.io/encryption-config-hash annotation, set from
// encryption-state.json when the server labels its Node (pkg/server/server.go
// setNodeLabelsAndAnnotations, secretsencrypt.BootstrapEncryptionHashAnnotation).
//
// `k3s secrets-encrypt status [-o json]` prints what pkg/cli/secretsencrypt Status prints from
// pkg/server/secrets-encrypt.go encryptionStatus: "Encryption Status: Disabled, no configuration
// file found" without the file, else Enabled/Disabled (the first provider AES-CBC: enabled), the
// "Current Rotation Stage:" from the Node's annotation, "Server Encryption Hashes: All hashes
// match", and the keys. `k3s secrets-encrypt rotate-keys` is encryptionRotateKeys +
// reencryptAndRemoveKey: only from stage start or reencrypt_finished; the annotation set to
// reencrypt_active; a new key "aescbckey-<RFC 3339 time>" appended and rotated to the front;
// then, once the kube-apiserver reports it reloaded its encryption config (its
// apiserver_encryption_config_controller_automatic_reload* metrics; it polls the file every
// minute), every Secret is updated through the API (so rewritten with the new key), the last
// key removed, and the stage reencrypt_finished written to the annotation and
// encryption-state.json.
//
// The difference: real k3s's CLI asks the server (its supervisor's /v1-k3s/encrypt/status and
// /v1-k3s/encrypt/config, with the server token) and the server does the work; here the CLI
// does the same work itself on the server host, with the supervisor's kubeconfig. prepare,
// rotate, reencrypt, enable and disable are not reproduced.

import (
	"bufio"
	"bytes"
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"text/tabwriter"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/client-go/kubernetes"
	"k8s.io/client-go/util/retry"
)

const (
	encryptionHashAnnotation    = "k3s.io/encryption-config-hash"
	encryptionStart             = "start"
	encryptionReencryptActive   = "reencrypt_active"
	encryptionReencryptFinished = "reencrypt_finished"
	encryptionReloadTimeout     = 70 * time.Second
)

type encryptionConfiguration struct {
	Kind       string               `json:"kind"`
	APIVersion string               `json:"apiVersion"`
	Resources  []encryptionResource `json:"resources"`
}

type encryptionResource struct {
	Resources []string             `json:"resources"`
	Providers []encryptionProvider `json:"providers"`
}

type encryptionProvider struct {
	AESCBC   *aesConfiguration `json:"aescbc,omitempty"`
	Identity *struct{}         `json:"identity,omitempty"`
}

type aesConfiguration struct {
	Keys []encryptionKey `json:"keys"`
}

type encryptionKey struct {
	Name   string `json:"name"`
	Secret string `json:"secret"`
}

func encryptionConfigPath(serverDir string) string {
	return filepath.Join(serverDir, "cred", "encryption-config.json")
}
func encryptionStatePath(serverDir string) string {
	return filepath.Join(serverDir, "cred", "encryption-state.json")
}

func newEncryptionKey(name string) (encryptionKey, error) {
	key := make([]byte, 32)
	if _, err := rand.Read(key); err != nil {
		return encryptionKey{}, err
	}
	return encryptionKey{Name: name, Secret: base64.StdEncoding.EncodeToString(key)}, nil
}

// writeEncryptionConfig is secretsencrypt.WriteEncryptionConfig with encryption enabled.
func writeEncryptionConfig(serverDir string, keys []encryptionKey) ([]byte, error) {
	cfg := encryptionConfiguration{
		Kind:       "EncryptionConfiguration",
		APIVersion: "apiserver.config.k8s.io/v1",
		Resources: []encryptionResource{{
			Resources: []string{"secrets"},
			Providers: []encryptionProvider{{AESCBC: &aesConfiguration{Keys: keys}}, {Identity: &struct{}{}}},
		}},
	}
	b, err := json.Marshal(cfg)
	if err != nil {
		return nil, err
	}
	return b, writeFileAtomic(encryptionConfigPath(serverDir), b, 0o600)
}

func hashHex(b []byte) string {
	sum := sha256.Sum256(b)
	return hex.EncodeToString(sum[:])
}

// genEncryptionConfigAndState is deps.go's: the config and the start state when there is no
// config yet; the path of the config for the kube-apiserver.
func genEncryptionConfigAndState(serverDir string) (string, error) {
	path := encryptionConfigPath(serverDir)
	if fi, err := os.Stat(path); err == nil && fi.Size() > 0 {
		if _, err := os.Stat(encryptionStatePath(serverDir)); errors.Is(err, os.ErrNotExist) {
			b, err := os.ReadFile(path)
			if err != nil {
				return "", err
			}
			return path, os.WriteFile(encryptionStatePath(serverDir), []byte(encryptionStart+"-"+hashHex(b)), 0o600)
		}
		return path, nil
	}
	key, err := newEncryptionKey("aescbckey")
	if err != nil {
		return "", err
	}
	b, err := writeEncryptionConfig(serverDir, []encryptionKey{key})
	if err != nil {
		return "", err
	}
	infof("Secrets encryption: wrote %s", path)
	return path, os.WriteFile(encryptionStatePath(serverDir), []byte(encryptionStart+"-"+hashHex(b)), 0o600)
}

func readEncryptionConfig(serverDir string) (*encryptionConfiguration, []byte, error) {
	b, err := os.ReadFile(encryptionConfigPath(serverDir))
	if err != nil {
		return nil, nil, err
	}
	var cfg encryptionConfiguration
	if err := json.Unmarshal(b, &cfg); err != nil {
		return nil, nil, err
	}
	if len(cfg.Resources) == 0 || len(cfg.Resources[0].Providers) < 2 {
		return nil, nil, fmt.Errorf("%s: unexpected encryption configuration", encryptionConfigPath(serverDir))
	}
	return &cfg, b, nil
}

func encryptionKeys(cfg *encryptionConfiguration) []encryptionKey {
	var keys []encryptionKey
	for _, p := range cfg.Resources[0].Providers {
		if p.AESCBC != nil {
			keys = append(keys, p.AESCBC.Keys...)
		}
	}
	return keys
}

// ---- k3s secrets-encrypt

func secretsEncryptFlags() []*flagDef {
	return []*flagDef{
		str("data-dir", []string{"d"}, defaultDataDir, []string{"K3S_DATA_DIR"}, "(data) Folder to hold state"),
		str("output", []string{"o"}, "text", nil, "Status format: text or json"),
		boolean("debug", nil, "(logging) Turn on debug logs"),
	}
}

type encryptCLI struct {
	serverDir string
	client    kubernetes.Interface
	node      string
}

func runSecretsEncryptCommand(args []string) int {
	if len(args) == 0 || args[0] == "--help" || args[0] == "-h" {
		fmt.Print("NAME:\n   k3s secrets-encrypt - Control secrets encryption and keys rotation\n\nCOMMANDS:\n" +
			"   status       Print current status of secrets encryption\n   rotate-keys  Dynamically rotates secrets " +
			"encryption keys and re-encrypt secrets\n")
		return 0
	}
	sub := args[0]
	o := newOptions(secretsEncryptFlags())
	if !o.parseSubcommandArgs(args[1:]) {
		return 1
	}
	dataDir, err := filepath.Abs(o.str("data-dir"))
	if err != nil {
		fatalf("%v", err)
	}
	c := &encryptCLI{serverDir: filepath.Join(dataDir, "server")}
	ctx := context.Background()
	switch sub {
	case "status":
		err = c.status(ctx, strings.ToLower(o.str("output")) == "json")
	case "rotate-keys":
		if err = c.rotateKeys(ctx); err == nil {
			fmt.Println("keys rotated, reencryption started")
		}
	default:
		fmt.Fprintf(os.Stderr, "k3s secrets-encrypt %s: not available in this build\n", sub)
		return 1
	}
	if err != nil {
		fatalf("%v: see server log for details", err)
	}
	return 0
}

// connect: the supervisor's client, and the server's own (control-plane) Node.
func (c *encryptCLI) connect(ctx context.Context) error {
	cfg, err := restConfigFromKubeconfig(filepath.Join(c.serverDir, "cred", "supervisor.kubeconfig"))
	if err != nil {
		return err
	}
	if c.client, err = kubernetes.NewForConfig(clientConfig(cfg, "secrets-encrypt")); err != nil {
		return err
	}
	nodes, err := c.client.CoreV1().Nodes().List(ctx, metav1.ListOptions{LabelSelector: controlPlaneLabel + "=true"})
	if err != nil {
		return err
	}
	if len(nodes.Items) == 0 {
		return errors.New("cannot manage secrets encryption: no control-plane node")
	}
	c.node = nodes.Items[0].Name
	return nil
}

// stage is getEncryptionHashAnnotation: the stage and hash on the server's Node.
func (c *encryptCLI) stage(ctx context.Context) (string, string, error) {
	node, err := c.client.CoreV1().Nodes().Get(ctx, c.node, metav1.GetOptions{})
	if err != nil {
		return "", "", err
	}
	ann, ok := node.Annotations[encryptionHashAnnotation]
	if !ok {
		return "", "", fmt.Errorf("missing annotation on node %s", c.node)
	}
	stage, hash, ok := strings.Cut(ann, "-")
	if !ok || strings.Contains(hash, "-") {
		return "", "", fmt.Errorf("invalid annotation %s found on node %s", ann, c.node)
	}
	return stage, hash, nil
}

// serverEncrypts: the server runs with --secrets-encryption (its config file and flags).
func serverEncrypts() bool {
	o, err := parseCommand(serverFlags(), nil)
	return err == nil && o.boolean("secrets-encryption")
}

func (c *encryptCLI) status(ctx context.Context, asJSON bool) error {
	type state struct {
		Stage        string   `json:"stage"`
		ActiveKey    string   `json:"activekey"`
		Enable       *bool    `json:"enable,omitempty"`
		HashMatch    bool     `json:"hashmatch,omitempty"`
		HashError    string   `json:"hasherror,omitempty"`
		InactiveKeys []string `json:"inactivekeys,omitempty"`
	}
	st := state{}
	cfg, _, err := readEncryptionConfig(c.serverDir)
	switch {
	case errors.Is(err, os.ErrNotExist):
	case err != nil:
		return err
	default:
		providers := cfg.Resources[0].Providers
		if providers[1].Identity != nil && providers[0].AESCBC != nil {
			enabled := true
			st.Enable = &enabled
		} else if providers[0].Identity != nil && providers[1].AESCBC != nil || !serverEncrypts() {
			enabled := false
			st.Enable = &enabled
		}
		if err := c.connect(ctx); err != nil {
			return err
		}
		st.HashMatch = true
		if st.Stage, _, err = c.stage(ctx); err != nil {
			return err
		}
		active := true
		for _, p := range providers {
			if p.AESCBC != nil {
				for _, k := range p.AESCBC.Keys {
					if active {
						active = false
						st.ActiveKey = k.Name
					} else {
						st.InactiveKeys = append(st.InactiveKeys, k.Name)
					}
				}
			}
			if p.Identity != nil {
				active = false
			}
		}
	}
	if asJSON {
		b, err := json.MarshalIndent(st, "", "\t")
		if err != nil {
			return err
		}
		fmt.Println(string(b))
		return nil
	}
	if st.Enable == nil {
		fmt.Println("Encryption Status: Disabled, no configuration file found")
		return nil
	}
	out := "Encryption Status: Disabled\n"
	if *st.Enable {
		out = "Encryption Status: Enabled\n"
	}
	out += fmt.Sprintln("Current Rotation Stage:", st.Stage)
	out += fmt.Sprintln("Server Encryption Hashes: All hashes match")
	var tab bytes.Buffer
	w := tabwriter.NewWriter(&tab, 0, 0, 2, ' ', 0)
	fmt.Fprintf(w, "\n")
	fmt.Fprintf(w, "Active\tKey Type\tName\n")
	fmt.Fprintf(w, "------\t--------\t----\n")
	if st.ActiveKey != "" {
		fmt.Fprintf(w, " *\t%s\t%s\n", "AES-CBC", st.ActiveKey)
	}
	for _, k := range st.InactiveKeys {
		fmt.Fprintf(w, "\t%s\t%s\n", "AES-CBC", k)
	}
	w.Flush()
	fmt.Println(out + tab.String())
	return nil
}

// annotate writes stage-<hash of the config> on the Node (and to encryption-state.json unless
// the stage is not persisted), as WriteEncryptionHashAnnotation.
func (c *encryptCLI) annotate(ctx context.Context, stage string, persist bool) error {
	_, b, err := readEncryptionConfig(c.serverDir)
	if err != nil {
		return err
	}
	ann := stage + "-" + hashHex(b)
	err = retry.RetryOnConflict(retry.DefaultRetry, func() error {
		node, err := c.client.CoreV1().Nodes().Get(ctx, c.node, metav1.GetOptions{})
		if err != nil {
			return err
		}
		if node.Annotations == nil {
			node.Annotations = map[string]string{}
		}
		node.Annotations[encryptionHashAnnotation] = ann
		_, err = c.client.CoreV1().Nodes().Update(ctx, node, metav1.UpdateOptions{})
		return err
	})
	if err != nil || !persist {
		return err
	}
	return os.WriteFile(encryptionStatePath(c.serverDir), []byte(ann), 0o600)
}

// reloads: the kube-apiserver's count of successful automatic reloads of its encryption config.
func (c *encryptCLI) reloads(ctx context.Context) (float64, error) {
	raw, err := c.client.CoreV1().RESTClient().Get().AbsPath("/metrics").DoRaw(ctx)
	if err != nil {
		return 0, err
	}
	var total float64
	scanner := bufio.NewScanner(bytes.NewReader(raw))
	scanner.Buffer(make([]byte, 1024*1024), 1024*1024)
	for scanner.Scan() {
		line := scanner.Text()
		success := strings.HasPrefix(line, "apiserver_encryption_config_controller_automatic_reload_success_total") ||
			strings.HasPrefix(line, "apiserver_encryption_config_controller_automatic_reloads_total") &&
				strings.Contains(line, `status="success"`)
		if !success {
			continue
		}
		fields := strings.Fields(line)
		if v, err := strconv.ParseFloat(fields[len(fields)-1], 64); err == nil {
			total += v
		}
	}
	return total, scanner.Err()
}

func (c *encryptCLI) rotateKeys(ctx context.Context) error {
	if err := c.connect(ctx); err != nil {
		return err
	}
	cfg, b, err := readEncryptionConfig(c.serverDir)
	if err != nil {
		return err
	}
	stage, hash, err := c.stage(ctx)
	if err != nil {
		return err
	}
	if stage != encryptionStart && stage != encryptionReencryptFinished {
		return fmt.Errorf("incorrect stage: %s found on node %s", stage, c.node)
	} else if hash != hashHex(b) {
		return fmt.Errorf("invalid hash: %s found on node %s", hash, c.node)
	}
	before, err := c.reloads(ctx)
	if err != nil {
		return err
	}
	if err := c.annotate(ctx, encryptionReencryptActive, false); err != nil {
		return err
	}
	keys := encryptionKeys(cfg)
	key, err := newEncryptionKey("aescbckey-" + time.Now().Format(time.RFC3339))
	if err != nil {
		return err
	}
	keys = append(keys, key)
	infof("Adding secrets-encryption key: %s", key.Name)
	if _, err := writeEncryptionConfig(c.serverDir, keys); err != nil {
		return err
	}
	keys = append(keys[len(keys)-1:], keys[:len(keys)-1]...)
	infof("Rotating secrets-encryption keys")
	if _, err := writeEncryptionConfig(c.serverDir, keys); err != nil {
		return err
	}
	deadline := time.Now().Add(encryptionReloadTimeout)
	for {
		now, err := c.reloads(ctx)
		if err == nil && now > before {
			break
		}
		if time.Now().After(deadline) {
			return errors.New("timed out waiting for the kube-apiserver to reload its encryption configuration")
		}
		time.Sleep(time.Second)
	}
	secrets, err := c.client.CoreV1().Secrets(metav1.NamespaceAll).List(ctx, metav1.ListOptions{})
	if err != nil {
		return err
	}
	for i := range secrets.Items {
		s := &secrets.Items[i]
		if _, err := c.client.CoreV1().Secrets(s.Namespace).Update(ctx, s, metav1.UpdateOptions{}); err != nil && !apierrors.IsConflict(err) {
			return fmt.Errorf("failed to update secret: %v", err)
		}
	}
	infof("reencrypted %d secrets", len(secrets.Items))
	infof("Removing key: %s", keys[len(keys)-1].Name)
	if _, err := writeEncryptionConfig(c.serverDir, keys[:len(keys)-1]); err != nil {
		return err
	}
	return c.annotate(ctx, encryptionReencryptFinished, true)
}
