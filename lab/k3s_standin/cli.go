package main

// Command-line and config-file handling, after k3s: the config file's keys are flag
// names without the leading dashes; its values come first and the command line's
// after them, so a flag given on the command line wins and list flags collect the
// entries of both. Environment variables (K3S_TOKEN, K3S_URL, ...) fill flags that
// neither sets.

import (
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"

	"sigs.k8s.io/yaml"
)

type flagKind int

const (
	kindString flagKind = iota
	kindBool
	kindList
)

type flagDef struct {
	name    string
	aliases []string
	kind    flagKind
	def     string
	env     []string
	usage   string
	// ignored: accepted for compatibility with real k3s; has no effect here.
	ignored bool
	// wholeValues: a list whose values are never split on commas. The components' argument
	// lists (--kube-apiserver-arg and the like) take "key=value" items whose values hold commas
	// (docs.k3s.io's hardening guide: kube-apiserver-arg
	// "enable-admission-plugins=NodeRestriction,EventRateLimit", kubelet-arg
	// "tls-cipher-suites=...,..."), each passed on whole.
	wholeValues bool
}

// options holds the parsed values of one command.
type options struct {
	defs    map[string]*flagDef // by name and alias
	order   []*flagDef
	scalars map[string]string
	lists   map[string][]string
	set     map[string]string // flag name -> where it was set ("flag", "config", "env")
	args    []string          // positional arguments
}

func newOptions(defs []*flagDef) *options {
	o := &options{
		defs:    map[string]*flagDef{},
		scalars: map[string]string{},
		lists:   map[string][]string{},
		set:     map[string]string{},
	}
	for _, d := range defs {
		o.order = append(o.order, d)
		o.defs[d.name] = d
		for _, a := range d.aliases {
			o.defs[a] = d
		}
	}
	return o
}

func (o *options) str(name string) string {
	d := o.mustDef(name)
	if v, ok := o.scalars[d.name]; ok {
		return v
	}
	return d.def
}

func (o *options) boolean(name string) bool {
	v := o.str(name)
	b, _ := strconv.ParseBool(v)
	return b
}

func (o *options) list(name string) []string {
	d := o.mustDef(name)
	return o.lists[d.name]
}

func (o *options) isSet(name string) bool {
	_, ok := o.set[o.mustDef(name).name]
	return ok
}

func (o *options) mustDef(name string) *flagDef {
	d, ok := o.defs[name]
	if !ok {
		panic("undefined flag " + name)
	}
	return d
}

// values are the entries one value of a list flag adds: split on commas, but for wholeValues.
func (d *flagDef) values(v string) []string {
	if d.wholeValues {
		if v = strings.TrimSpace(v); v != "" {
			return []string{v}
		}
		return nil
	}
	return splitList(v)
}

// splitList splits a list flag's value on commas, as urfave/cli's StringSlice does.
func splitList(v string) []string {
	var out []string
	for _, p := range strings.Split(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			out = append(out, p)
		}
	}
	return out
}

// setValue records one value. appendList decides whether a list value adds to or
// replaces the entries collected so far from the same source.
func (o *options) setValue(d *flagDef, value, source string) error {
	switch d.kind {
	case kindBool:
		if value == "" {
			value = "true"
		}
		if _, err := strconv.ParseBool(value); err != nil {
			return fmt.Errorf("invalid boolean value %q for flag --%s", value, d.name)
		}
		o.scalars[d.name] = value
	case kindList:
		o.lists[d.name] = append(o.lists[d.name], d.values(value)...)
	default:
		o.scalars[d.name] = value
	}
	o.set[d.name] = source
	return nil
}

// parseArgs parses command-line flags. Parsing stops at the first positional
// argument when stopAtPositional is set (as for `k3s token delete ID`), otherwise
// positional arguments are collected and flags may follow them.
func (o *options) parseArgs(args []string, stopAtPositional bool) error {
	for i := 0; i < len(args); i++ {
		a := args[i]
		if a == "--" {
			o.args = append(o.args, args[i+1:]...)
			return nil
		}
		if !strings.HasPrefix(a, "-") || a == "-" {
			if stopAtPositional {
				o.args = append(o.args, args[i:]...)
				return nil
			}
			o.args = append(o.args, a)
			continue
		}
		name := strings.TrimLeft(a, "-")
		value, hasValue := "", false
		if eq := strings.IndexByte(name, '='); eq >= 0 {
			name, value, hasValue = name[:eq], name[eq+1:], true
		}
		d, ok := o.defs[name]
		if !ok {
			return fmt.Errorf("flag provided but not defined: -%s", name)
		}
		if d.kind != kindBool && !hasValue {
			if i+1 >= len(args) {
				return fmt.Errorf("flag needs an argument: -%s", name)
			}
			i++
			value = args[i]
		}
		if err := o.setValue(d, value, "flag"); err != nil {
			return err
		}
	}
	return nil
}

// configFiles returns the config file and its drop-ins (<file>.d/*.yaml), in order.
func configFiles(path string) []string {
	files := []string{}
	if _, err := os.Stat(path); err == nil {
		files = append(files, path)
	}
	drop, _ := filepath.Glob(path + ".d/*.yaml")
	sort.Strings(drop)
	return append(files, drop...)
}

// applyConfigFile merges the config file (and drop-ins) under the command-line
// values already parsed into o. explicit: the path was named by --config or
// K3S_CONFIG_FILE, so a missing file is an error.
func (o *options) applyConfigFile(path string, explicit bool) error {
	if explicit {
		if _, err := os.Stat(path); err != nil {
			return fmt.Errorf("unable to read config file %s: %w", path, err)
		}
	}
	fromFiles := map[string][]string{} // flag name -> values in file order
	scalarsFromFiles := map[string]string{}
	var unknown []string
	for _, f := range configFiles(path) {
		data, err := os.ReadFile(f)
		if err != nil {
			return fmt.Errorf("unable to read config file %s: %w", f, err)
		}
		var doc map[string]any
		if err := yaml.Unmarshal(data, &doc); err != nil {
			return fmt.Errorf("unable to parse config file %s: %w", f, err)
		}
		keys := make([]string, 0, len(doc))
		for k := range doc {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, key := range keys {
			raw := doc[key]
			appendMode := strings.HasSuffix(key, "+")
			name := strings.TrimSuffix(key, "+")
			d, ok := o.defs[name]
			if !ok || name == "config" || name == "c" {
				unknown = append(unknown, key)
				continue
			}
			values, err := yamlValues(raw)
			if err != nil {
				return fmt.Errorf("config file %s: key %q: %w", f, key, err)
			}
			switch d.kind {
			case kindList:
				var entries []string
				for _, v := range values {
					entries = append(entries, d.values(v)...)
				}
				if appendMode {
					fromFiles[d.name] = append(fromFiles[d.name], entries...)
				} else {
					fromFiles[d.name] = entries
				}
			default:
				if len(values) > 0 {
					scalarsFromFiles[d.name] = values[len(values)-1]
				}
			}
		}
	}
	for _, key := range unknown {
		warnf("Unknown flag --%s found in config.yaml, skipping", key)
	}
	for name, v := range scalarsFromFiles {
		d := o.defs[name]
		if _, onCLI := o.set[name]; onCLI {
			continue
		}
		if err := o.setValue(d, v, "config"); err != nil {
			return fmt.Errorf("config file %s: %w", path, err)
		}
	}
	for name, v := range fromFiles {
		// Config entries come before the command line's.
		o.lists[name] = append(append([]string{}, v...), o.lists[name]...)
		if _, onCLI := o.set[name]; !onCLI {
			o.set[name] = "config"
		}
	}
	return nil
}

func yamlValues(raw any) ([]string, error) {
	switch v := raw.(type) {
	case nil:
		return nil, nil
	case []any:
		out := make([]string, 0, len(v))
		for _, e := range v {
			s, err := yamlScalar(e)
			if err != nil {
				return nil, err
			}
			out = append(out, s)
		}
		return out, nil
	default:
		s, err := yamlScalar(v)
		if err != nil {
			return nil, err
		}
		return []string{s}, nil
	}
}

func yamlScalar(v any) (string, error) {
	switch x := v.(type) {
	case string:
		return x, nil
	case bool:
		return strconv.FormatBool(x), nil
	case float64:
		return strconv.FormatFloat(x, 'f', -1, 64), nil
	case int64:
		return strconv.FormatInt(x, 10), nil
	case int:
		return strconv.Itoa(x), nil
	default:
		return "", fmt.Errorf("unsupported value %v (%T)", v, v)
	}
}

// applyEnv fills flags that neither the command line nor the config file set.
// parseSubcommandArgs reads a subcommand's flags, then the K3S_* environment, as k3s's
// urfave/cli does; on an error it prints it as k3s does and says false (exit status 1).
func (o *options) parseSubcommandArgs(args []string) bool {
	if err := o.parseArgs(args, false); err != nil {
		fmt.Fprintf(os.Stderr, "Incorrect Usage: %v\n", err)
		return false
	}
	if err := o.applyEnv(); err != nil {
		fmt.Fprintln(os.Stderr, err)
		return false
	}
	return true
}

func (o *options) applyEnv() error {
	for _, d := range o.order {
		if _, ok := o.set[d.name]; ok {
			continue
		}
		for _, e := range d.env {
			if v, ok := os.LookupEnv(e); ok && v != "" {
				if err := o.setValue(d, v, "env"); err != nil {
					return fmt.Errorf("$%s: %w", e, err)
				}
				break
			}
		}
	}
	return nil
}

// parseCommand parses a server or agent command line: flags, then the config file
// named by --config/-c or $K3S_CONFIG_FILE (default /etc/rancher/k3s/config.yaml),
// then the environment.
func parseCommand(defs []*flagDef, args []string) (*options, error) {
	o := newOptions(defs)
	if err := o.parseArgs(args, false); err != nil {
		return nil, err
	}
	if len(o.args) > 0 {
		return nil, fmt.Errorf("unexpected arguments: %s", strings.Join(o.args, " "))
	}
	cfg, explicit := o.str("config"), o.isSet("config")
	if !explicit {
		if env := os.Getenv("K3S_CONFIG_FILE"); env != "" {
			cfg, explicit = env, true
		}
	}
	if err := o.applyConfigFile(cfg, explicit); err != nil {
		return nil, err
	}
	if err := o.applyEnv(); err != nil {
		return nil, err
	}
	debugLogging = debugLogging || o.boolean("debug")
	return o, nil
}

// reportIgnored logs, once, the flags that were set but have no effect here.
func (o *options) reportIgnored() {
	var names []string
	for _, d := range o.order {
		if _, ok := o.set[d.name]; ok && d.ignored {
			names = append(names, "--"+d.name)
		}
	}
	if len(names) > 0 {
		infof("Accepted without effect (no containers, CNI or add-ons on this node): %s", strings.Join(names, " "))
	}
}

func (o *options) printHelp(command string) {
	fmt.Printf("NAME:\n   k3s %s\n\nOPTIONS:\n", command)
	for _, d := range o.order {
		names := "--" + d.name
		for _, a := range d.aliases {
			if len(a) == 1 {
				names += ", -" + a
			} else {
				names += ", --" + a
			}
		}
		line := "   " + names
		if d.kind != kindBool {
			line += " value"
		}
		if d.usage != "" {
			line += "\t" + d.usage
		}
		if d.def != "" {
			line += fmt.Sprintf(" (default: %q)", d.def)
		}
		if len(d.env) > 0 {
			line += " [$" + strings.Join(d.env, ", $") + "]"
		}
		fmt.Println(line)
	}
}

func wantsHelp(args []string) bool {
	for _, a := range args {
		if a == "--" {
			return false
		}
		if a == "--help" || a == "-h" {
			return true
		}
	}
	return false
}

// ---- flag sets -------------------------------------------------------------------

const defaultDataDir = "/var/lib/rancher/k3s"
const defaultConfigFile = "/etc/rancher/k3s/config.yaml"

func str(name string, aliases []string, def string, env []string, usage string) *flagDef {
	return &flagDef{name: name, aliases: aliases, kind: kindString, def: def, env: env, usage: usage}
}
func boolean(name string, env []string, usage string) *flagDef {
	return &flagDef{name: name, kind: kindBool, env: env, usage: usage}
}
func list(name string, env []string, usage string) *flagDef {
	return &flagDef{name: name, kind: kindList, env: env, usage: usage}
}

// argList is a component's argument list (--kube-apiserver-arg ...): whole values.
func argList(name, usage string) *flagDef {
	return &flagDef{name: name, kind: kindList, usage: usage, wholeValues: true}
}
func ignoredStr(name string) *flagDef {
	return &flagDef{name: name, kind: kindString, ignored: true, usage: "(no effect here)"}
}
func ignoredBool(name string) *flagDef {
	return &flagDef{name: name, kind: kindBool, ignored: true, usage: "(no effect here)"}
}
func ignoredList(name string) *flagDef {
	return &flagDef{name: name, kind: kindList, ignored: true, usage: "(no effect here)"}
}

// Flags shared by server and agent (the node side).
func commonFlags() []*flagDef {
	return []*flagDef{
		str("config", []string{"c"}, defaultConfigFile, nil, "(config) Load configuration from FILE"),
		boolean("debug", []string{"K3S_DEBUG"}, "(logging) Turn on debug logs"),
		str("data-dir", []string{"d"}, defaultDataDir, []string{"K3S_DATA_DIR"}, "(data) Folder to hold state"),
		str("token", []string{"t"}, "", []string{"K3S_TOKEN"}, "(cluster) Shared secret used to join a server or agent to a cluster"),
		str("token-file", nil, "", []string{"K3S_TOKEN_FILE"}, "(cluster) File containing the token"),
		str("node-name", nil, "", []string{"K3S_NODE_NAME"}, "(agent/node) Node name"),
		list("node-label", nil, "(agent/node) Registering and starting kubelet with set of labels"),
		list("node-taint", nil, "(agent/node) Registering kubelet with set of taints"),
		list("node-ip", nil, "(agent/networking) IPv4/IPv6 addresses to advertise for node"),
		list("node-external-ip", nil, "(agent/networking) IPv4/IPv6 external IP addresses to advertise for node"),
		str("flannel-iface", nil, "", nil, "(agent/networking) Override default flannel interface (its address is the node IP when --node-ip is not set)"),
		argList("kubelet-arg", "(agent/flags) Customized flag for kubelet process (port=N sets the kubelet port)"),
		ignoredBool("with-node-id"),
		ignoredList("node-internal-dns"),
		ignoredList("node-external-dns"),
		ignoredStr("image-credential-provider-bin-dir"),
		ignoredStr("image-credential-provider-config"),
		ignoredStr("container-runtime-endpoint"),
		ignoredStr("default-runtime"),
		ignoredStr("image-service-endpoint"),
		ignoredBool("disable-default-registry-endpoint"),
		ignoredStr("snapshotter"),
		ignoredStr("private-registry"),
		ignoredStr("system-default-registry"),
		ignoredList("airgap-extra-registry"),
		ignoredStr("pause-image"),
		ignoredBool("docker"),
		ignoredStr("resolv-conf"),
		ignoredStr("flannel-conf"),
		ignoredStr("flannel-cni-conf"),
		ignoredList("kube-proxy-arg"),
		ignoredBool("protect-kernel-defaults"),
		ignoredBool("selinux"),
		str("lb-server-port", nil, "6444", []string{"K3S_LB_SERVER_PORT"}, "(agent/node) Local port for supervisor client load-balancer"),
		ignoredStr("vpn-auth"),
		ignoredStr("vpn-auth-file"),
		ignoredBool("prefer-bundled-bin"),
		ignoredBool("rootless"),
		ignoredBool("enable-pprof"),
		ignoredStr("log"),
		ignoredBool("alsologtostderr"),
		ignoredStr("v"),
		ignoredStr("vmodule"),
	}
}

func serverFlags() []*flagDef {
	return append(commonFlags(),
		str("bind-address", nil, "0.0.0.0", nil, "(listener) k3s bind address"),
		str("advertise-address", nil, "", nil, "(listener) IPv4/IPv6 address that apiserver uses to advertise to members of the cluster (default: node-external-ip/node-ip)"),
		ignoredStr("advertise-port"),
		str("https-listen-port", nil, "6443", nil, "(listener) HTTPS listen port"),
		str("apiserver-port", nil, "", nil, "(listener) Port the kube-apiserver listens on at 127.0.0.1 (default: https-listen-port + 1)"),
		list("tls-san", nil, "(listener) Add additional hostnames or IPv4/IPv6 addresses as Subject Alternative Names on the server TLS cert"),
		str("write-kubeconfig", []string{"o"}, "/etc/rancher/k3s/k3s.yaml", []string{"K3S_KUBECONFIG_OUTPUT"}, "(client) Write kubeconfig for admin client to this file"),
		str("write-kubeconfig-mode", nil, "", []string{"K3S_KUBECONFIG_MODE"}, "(client) Write kubeconfig with this mode"),
		ignoredStr("write-kubeconfig-group"),
		str("cluster-cidr", nil, "10.42.0.0/16", nil, "(networking) IPv4/IPv6 network CIDRs to use for pod IPs"),
		str("service-cidr", nil, "10.43.0.0/16", nil, "(networking) IPv4/IPv6 network CIDRs to use for service IPs"),
		str("service-node-port-range", nil, "30000-32767", nil, "(networking) Port range to reserve for services with NodePort visibility"),
		ignoredStr("cluster-dns"),
		str("cluster-domain", nil, "cluster.local", nil, "(networking) Cluster Domain"),
		str("flannel-backend", nil, "vxlan", nil, "(networking) Backend (valid values: 'none', 'vxlan', 'host-gw', 'wireguard-native'); served to every agent in its configuration, published as each Node's flannel.alpha.coreos.com/backend-type"),
		ignoredBool("flannel-ipv6-masq"),
		boolean("flannel-external-ip", nil, "(networking) Use node external IP addresses for Flannel traffic (here: the API server reaches kubelets at their external addresses)"),
		ignoredStr("egress-selector-mode"),
		ignoredStr("servicelb-namespace"),
		str("agent-token", nil, "", []string{"K3S_AGENT_TOKEN"}, "(cluster) Shared secret used to join agents to the cluster, but not servers"),
		str("agent-token-file", nil, "", []string{"K3S_AGENT_TOKEN_FILE"}, "(cluster) File containing the agent secret"),
		str("server", []string{"s"}, "", []string{"K3S_URL"}, "(cluster) Server to connect to, used to join a cluster (not supported here)"),
		ignoredBool("cluster-init"),
		ignoredBool("cluster-reset"),
		ignoredStr("cluster-reset-restore-path"),
		argList("kube-apiserver-arg", "(flags) Customized flag for kube-apiserver process"),
		argList("kube-controller-manager-arg", "(flags) Customized flag for kube-controller-manager process"),
		ignoredList("etcd-arg"),
		argList("kube-scheduler-arg", "(flags) Customized flag for kube-scheduler process"),
		ignoredList("kube-cloud-controller-manager-arg"),
		str("datastore-endpoint", nil, "", []string{"K3S_DATASTORE_ENDPOINT"}, "(db) sqlite:// only here"),
		ignoredStr("datastore-cafile"),
		ignoredStr("datastore-certfile"),
		ignoredStr("datastore-keyfile"),
		ignoredBool("etcd-expose-metrics"),
		ignoredBool("etcd-disable-snapshots"),
		ignoredStr("etcd-snapshot-name"),
		ignoredStr("etcd-snapshot-schedule-cron"),
		ignoredStr("etcd-snapshot-retention"),
		ignoredStr("etcd-snapshot-dir"),
		ignoredBool("etcd-snapshot-compress"),
		ignoredBool("etcd-s3"),
		ignoredStr("default-local-storage-path"),
		ignoredList("disable"),
		ignoredBool("disable-scheduler"),
		ignoredBool("disable-cloud-controller"),
		boolean("disable-kube-proxy", nil, "(components) Disable running kube-proxy (here: its packet filter rules are not made)"),
		ignoredBool("disable-network-policy"),
		ignoredBool("disable-helm-controller"),
		ignoredBool("embedded-registry"),
		ignoredBool("supervisor-metrics"),
		boolean("secrets-encryption", nil, "Enable secret encryption at rest (secretsencrypt.go)"),
		ignoredStr("secrets-encryption-provider"),
		ignoredBool("disable-apiserver"),
		ignoredBool("disable-controller-manager"),
		ignoredBool("disable-etcd"),
		ignoredBool("kine-tls"),
		ignoredStr("helm-job-image"),
		ignoredStr("kubelet-path"),
		boolean("disable-agent", nil, "Do not run a local agent and register a local kubelet"),
	)
}

func agentFlags() []*flagDef {
	return append(commonFlags(),
		str("server", []string{"s"}, "", []string{"K3S_URL"}, "(cluster) Server to connect to"),
	)
}
