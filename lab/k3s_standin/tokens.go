package main

// Tokens: the secure token form K10<CA hash>::<credentials>, bootstrap-token Secrets
// (`k3s token create|list|delete|generate`), and the server token files.

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"math/big"
	"os"
	"path/filepath"
	"regexp"
	"sort"
	"strings"
	"text/tabwriter"
	"time"

	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	corev1client "k8s.io/client-go/kubernetes/typed/core/v1"
)

const (
	tokenPrefix             = "K10"
	bootstrapSecretType     = corev1.SecretType("bootstrap.kubernetes.io/token")
	bootstrapSecretPrefix   = "bootstrap-token-"
	defaultBootstrapGroups  = "system:bootstrappers:k3s:default-node-token"
	bootstrapTokenAlphabet  = "abcdefghijklmnopqrstuvwxyz0123456789"
	defaultBootstrapUsages  = "signing,authentication"
	defaultBootstrapTTLText = "24h"
)

var bootstrapTokenRE = regexp.MustCompile(`^([a-z0-9]{6})\.([a-z0-9]{16})$`)
var bootstrapTokenIDRE = regexp.MustCompile(`^[a-z0-9]{6}$`)

// parsedToken is a token as given to an agent or server.
type parsedToken struct {
	caHash string // hex SHA-256 of the CA bundle; empty for a token without one
	creds  string // what follows "::" (or the whole token)
	// For a bootstrap token id.secret:
	id, secret string
	// For a server token user:password:
	user, password string
}

func (t parsedToken) isBootstrap() bool { return t.id != "" }

func parseToken(token string) parsedToken {
	token = strings.TrimSpace(token)
	var t parsedToken
	t.creds = token
	if strings.HasPrefix(token, tokenPrefix) {
		if i := strings.Index(token, "::"); i >= 0 {
			t.caHash, t.creds = token[len(tokenPrefix):i], token[i+2:]
		}
	}
	if m := bootstrapTokenRE.FindStringSubmatch(t.creds); m != nil {
		t.id, t.secret = m[1], m[2]
		return t
	}
	if i := strings.IndexByte(t.creds, ':'); i >= 0 {
		t.user, t.password = t.creds[:i], t.creds[i+1:]
	} else {
		t.user, t.password = "server", t.creds
	}
	return t
}

// validateAgentToken applies k3s's own token rules (pkg/clientaccess/token.go,
// parseToken), which every k3s agent runs at each start before anything else, stored
// credentials or not: an empty token is refused ("token must not be empty"), a CA
// hash must be 64 hex digits, and a token that is not a bootstrap token needs
// user:password (a bare password means the server token).
func validateAgentToken(token string) (parsedToken, error) {
	token = strings.TrimSpace(token)
	if token == "" {
		return parsedToken{}, errors.New("token must not be empty")
	}
	if strings.HasPrefix(token, tokenPrefix) {
		if i := strings.Index(token, "::"); i >= 0 {
			if n := len(token[len(tokenPrefix):i]); n > 0 && n != 64 {
				return parsedToken{}, errors.New("invalid token CA hash length")
			}
		}
	}
	t := parseToken(token)
	if !t.isBootstrap() && strings.Contains(t.creds, ":") && t.password == "" {
		return parsedToken{}, errors.New("invalid token format")
	}
	return t, nil
}

func formatToken(caBundle []byte, creds string) string {
	return tokenPrefix + caHash(caBundle) + "::" + creds
}

func randomString(n int, alphabet string) (string, error) {
	b := make([]byte, n)
	for i := range b {
		x, err := rand.Int(rand.Reader, big.NewInt(int64(len(alphabet))))
		if err != nil {
			return "", err
		}
		b[i] = alphabet[x.Int64()]
	}
	return string(b), nil
}

func generateBootstrapToken() (string, error) {
	id, err := randomString(6, bootstrapTokenAlphabet)
	if err != nil {
		return "", err
	}
	secret, err := randomString(16, bootstrapTokenAlphabet)
	if err != nil {
		return "", err
	}
	return id + "." + secret, nil
}

// ensureServerToken writes <data-dir>/server/token (and node-token) as k3s does:
// K10<CA hash>::server:<password>. The password is --token's, or the one already
// stored, or a new random one. Returns the password.
func ensureServerToken(serverDir string, caBundle []byte, given string) (string, error) {
	tokenPath := filepath.Join(serverDir, "token")
	password := ""
	if given != "" {
		p := parseToken(given)
		if p.caHash != "" && p.caHash != caHash(caBundle) {
			return "", fmt.Errorf("token CA hash does not match the Cluster CA certificate hash: %s != %s", p.caHash, caHash(caBundle))
		}
		password = p.password
		if p.isBootstrap() {
			password = p.creds
		}
	} else if data, err := os.ReadFile(tokenPath); err == nil {
		password = parseToken(string(data)).password
	}
	if password == "" {
		var err error
		if password, err = randomString(32, "0123456789abcdef"); err != nil {
			return "", err
		}
	}
	full := formatToken(caBundle, "server:"+password) + "\n"
	for _, name := range []string{"token", "node-token"} {
		if err := writeFileAtomic(filepath.Join(serverDir, name), []byte(full), 0o600); err != nil {
			return "", err
		}
	}
	return password, nil
}

// ---- k3s token ...

func tokenFlags() []*flagDef {
	return []*flagDef{
		str("data-dir", []string{"d"}, defaultDataDir, []string{"K3S_DATA_DIR"}, "(data) Folder to hold state"),
		str("kubeconfig", nil, "", []string{"KUBECONFIG"}, "(cluster) Server to connect to (default: <data-dir>/server/cred/admin.kubeconfig)"),
		str("description", nil, "", nil, "A human friendly description of how this token is used"),
		list("groups", nil, "Extra groups that this token will authenticate as when used for authentication"),
		str("ttl", nil, defaultBootstrapTTLText, nil, "The duration before the token is automatically deleted (e.g. 1s, 2m, 3h). If set to '0', the token will never expire"),
		list("usages", nil, "Describes the ways in which this token can be used (signing,authentication)"),
		str("output", []string{"o"}, "text", nil, "Output format: text, json or yaml (list only)"),
		boolean("debug", nil, "(logging) Turn on debug logs"),
	}
}

func runTokenCommand(args []string) int {
	if len(args) == 0 || args[0] == "--help" || args[0] == "-h" {
		fmt.Print("NAME:\n   k3s token - Manage tokens\n\nCOMMANDS:\n   create    Create bootstrap tokens on the server\n   delete    Delete bootstrap tokens on the server\n   generate  Generate and print a bootstrap token, but do not create it on the server\n   list      List bootstrap tokens on the server\n")
		return 0
	}
	sub := args[0]
	o := newOptions(tokenFlags())
	if wantsHelp(args[1:]) {
		o.printHelp("token " + sub)
		return 0
	}
	if !o.parseSubcommandArgs(args[1:]) {
		return 1
	}
	var err error
	switch sub {
	case "generate":
		var tok string
		if tok, err = generateBootstrapToken(); err == nil {
			fmt.Println(tok)
		}
	case "create":
		err = tokenCreate(o)
	case "list":
		err = tokenList(o)
	case "delete":
		err = tokenDelete(o)
	case "rotate":
		err = fmt.Errorf("token rotate is not supported")
	default:
		fmt.Fprintf(os.Stderr, "No help topic for '%s'\n", sub)
		return 3
	}
	if err != nil {
		fatalf("%v", err)
	}
	return 0
}

func tokenKubeconfig(o *options) string {
	if kc := o.str("kubeconfig"); kc != "" {
		return kc
	}
	return filepath.Join(o.str("data-dir"), "server", "cred", "admin.kubeconfig")
}

func secretsClient(o *options) (corev1client.SecretInterface, error) {
	cfg, err := restConfigFromKubeconfig(tokenKubeconfig(o))
	if err != nil {
		return nil, err
	}
	cs, err := corev1client.NewForConfig(clientConfig(cfg, "token"))
	if err != nil {
		return nil, err
	}
	return cs.Secrets(metav1.NamespaceSystem), nil
}

func tokenCreate(o *options) error {
	caBundle, err := os.ReadFile(filepath.Join(o.str("data-dir"), "server", "tls", "server-ca.crt"))
	if err != nil {
		return fmt.Errorf("failed to read server CA (is this a server?): %w", err)
	}
	tok := ""
	switch len(o.args) {
	case 0:
		if tok, err = generateBootstrapToken(); err != nil {
			return err
		}
	case 1:
		tok = parseToken(o.args[0]).creds
		if !bootstrapTokenRE.MatchString(tok) {
			return fmt.Errorf("the bootstrap token %q was not of the form %q", o.args[0], `\A([a-z0-9]{6})\.([a-z0-9]{16})\z`)
		}
	default:
		return fmt.Errorf("too many arguments")
	}
	m := bootstrapTokenRE.FindStringSubmatch(tok)
	id, secret := m[1], m[2]

	ttl, err := time.ParseDuration(o.str("ttl"))
	if err != nil {
		return fmt.Errorf("invalid --ttl %q: %w", o.str("ttl"), err)
	}
	usages := o.list("usages")
	if !o.isSet("usages") {
		usages = splitList(defaultBootstrapUsages)
	}
	groups := o.list("groups")
	if !o.isSet("groups") {
		groups = []string{defaultBootstrapGroups}
	}
	for _, g := range groups {
		if !strings.HasPrefix(g, "system:bootstrappers:") {
			return fmt.Errorf("group %q must start with system:bootstrappers:", g)
		}
	}
	data := map[string]string{
		"token-id":     id,
		"token-secret": secret,
	}
	if d := o.str("description"); d != "" {
		data["description"] = d
	}
	if ttl > 0 {
		data["expiration"] = time.Now().Add(ttl).UTC().Format(time.RFC3339)
	}
	for _, u := range usages {
		switch u {
		case "signing", "authentication":
			data["usage-bootstrap-"+u] = "true"
		default:
			return fmt.Errorf("invalid bootstrap token usage %q (valid: signing, authentication)", u)
		}
	}
	if len(groups) > 0 {
		data["auth-extra-groups"] = strings.Join(groups, ",")
	}
	secrets, err := secretsClient(o)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	_, err = secrets.Create(ctx, &corev1.Secret{
		ObjectMeta: metav1.ObjectMeta{Name: bootstrapSecretPrefix + id, Namespace: metav1.NamespaceSystem},
		Type:       bootstrapSecretType,
		StringData: data,
	}, metav1.CreateOptions{})
	if apierrors.IsAlreadyExists(err) {
		return fmt.Errorf("a token with id %q already exists", id)
	}
	if err != nil {
		return fmt.Errorf("failed to create bootstrap token: %w", err)
	}
	fmt.Println(formatToken(caBundle, tok))
	return nil
}

type tokenInfo struct {
	Token       string   `json:"token"`
	TTL         string   `json:"ttl"`
	Expires     string   `json:"expires,omitempty"`
	Usages      []string `json:"usages"`
	Description string   `json:"description,omitempty"`
	ExtraGroups []string `json:"groups,omitempty"`
}

func tokenList(o *options) error {
	secrets, err := secretsClient(o)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	l, err := secrets.List(ctx, metav1.ListOptions{FieldSelector: fields.OneTermEqualSelector("type", string(bootstrapSecretType)).String()})
	if err != nil {
		return fmt.Errorf("failed to list bootstrap tokens: %w", err)
	}
	var infos []tokenInfo
	for _, s := range l.Items {
		get := func(k string) string { return string(s.Data[k]) }
		id := get("token-id")
		if !bootstrapTokenIDRE.MatchString(id) || s.Name != bootstrapSecretPrefix+id {
			continue
		}
		ti := tokenInfo{Token: id + "." + get("token-secret"), TTL: "<forever>", Expires: "<never>", Description: get("description")}
		if exp := get("expiration"); exp != "" {
			ti.Expires = exp
			if t, err := time.Parse(time.RFC3339, exp); err == nil {
				if left := time.Until(t); left > 0 {
					ti.TTL = left.Round(time.Second).String()
				} else {
					ti.TTL = "<invalid>"
				}
			}
		}
		for k := range s.Data {
			if u, ok := strings.CutPrefix(k, "usage-bootstrap-"); ok && get(k) == "true" {
				ti.Usages = append(ti.Usages, u)
			}
		}
		sort.Strings(ti.Usages)
		if g := get("auth-extra-groups"); g != "" {
			ti.ExtraGroups = strings.Split(g, ",")
		}
		infos = append(infos, ti)
	}
	switch o.str("output") {
	case "json", "yaml":
		// JSON is valid YAML.
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(infos)
	}
	w := tabwriter.NewWriter(os.Stdout, 10, 4, 3, ' ', 0)
	fmt.Fprintln(w, "TOKEN\tTTL\tEXPIRES\tUSAGES\tDESCRIPTION\tEXTRA GROUPS")
	for _, ti := range infos {
		desc := ti.Description
		if desc == "" {
			desc = "<none>"
		}
		groups := strings.Join(ti.ExtraGroups, ",")
		if groups == "" {
			groups = "<none>"
		}
		fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\n", ti.Token, ti.TTL, ti.Expires, strings.Join(ti.Usages, ","), desc, groups)
	}
	return w.Flush()
}

func tokenDelete(o *options) error {
	if len(o.args) == 0 {
		return fmt.Errorf("missing argument; 'token delete' is missing token")
	}
	secrets, err := secretsClient(o)
	if err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	for _, arg := range o.args {
		p := parseToken(arg)
		id := p.id
		if id == "" && bootstrapTokenIDRE.MatchString(p.creds) {
			id = p.creds
		}
		if id == "" {
			return fmt.Errorf("given token didn't match pattern %q or %q", `\A([a-z0-9]{6})\z`, `\A([a-z0-9]{6})\.([a-z0-9]{16})\z`)
		}
		if err := secrets.Delete(ctx, bootstrapSecretPrefix+id, metav1.DeleteOptions{}); err != nil {
			return fmt.Errorf("failed to delete bootstrap token %q: %w", id, err)
		}
		fmt.Printf("bootstrap token %q deleted\n", id)
	}
	return nil
}
