package main

// k3s's bundled tools: the real k3s binary carries an archive (k3s-root) that it extracts at its
// first start into <data-dir>/data/<hash>/ (cmd/k3s/main.go extract: the folder is named after
// the archive's hash, and data/current links to it), and before it runs `k3s server` or `k3s
// agent` it sets PATH to "<dir>/bin:$PATH:<dir>/bin/aux" (stageAndRun; --prefer-bundled-bin puts
// aux before the host's). bin/aux holds k3s-root's iptables, iptables-save, iptables-restore and
// their ip6tables twins (k3s-root scripts/package: links to iptables-detect.sh, which runs its
// xtables-nft-multi or xtables-legacy-multi). So on a host without iptables tools k3s's node
// components make their packet filter rules all the same, with the bundled copy, and
// k3s-killall.sh adds every data/*/bin and data/*/bin/aux to its PATH to remove them.
//
// The stand-in does the same with what the lab gives it: it cannot carry an iptables in its own
// binary (k3s-root's are static builds), so the lab binds the base tree's xtables-nft-multi and
// its extensions read-only at labBundleDir/aux on every host (lab/k3s_bundle.py): that is this
// stand-in's "archive". At its first start it extracts a copy into <data-dir>/data/<hash>/bin/aux
// (the binary, its extensions, and iptables-detect.sh with k3s-root's six links to it; the
// script runs the copy in nft mode, the mode iptables-detect.sh picks on a host with no legacy
// rules) and sets PATH as k3s does. A host whose iptables package is removed then gets its rules
// from the bundled copy, as on k3s, and the copy goes with the data dir. Where labBundleDir is
// missing (the stand-in's own tests on the build machine) nothing is extracted and PATH stays.

import (
	"crypto/sha256"
	"encoding/hex"
	"io"
	"os"
	"path/filepath"
	"strings"
)

// labBundleDir holds what the lab gives the stand-in to bundle (LAB ONLY; see above).
const labBundleDir = "/opt/lab-k3s-bundle"

// bundledXtables are the names k3s-root links in bin/aux (scripts/package).
var bundledXtables = []string{"iptables", "iptables-save", "iptables-restore", "ip6tables", "ip6tables-save", "ip6tables-restore"}

// bundleDir is <data-dir>/data/<hash>: one folder per build, as k3s names its by its archive's hash.
func bundleDir(dataDir string) string {
	sum := sha256.Sum256([]byte(version + " " + gitCommit))
	return filepath.Join(dataDir, "data", hex.EncodeToString(sum[:]))
}

// stageBundle extracts the bundled tools (once per build) and puts them on PATH as k3s does:
// bin before the host's PATH, bin/aux after it, so the host's own iptables wins where it has one.
func stageBundle(dataDir string) {
	source := filepath.Join(labBundleDir, "aux", "xtables-nft-multi")
	if _, err := os.Stat(source); err != nil {
		debugf("no bundled tools to extract (%s: %v)", source, err)
		return
	}
	dir := bundleDir(dataDir)
	aux := filepath.Join(dir, "bin", "aux")
	if _, err := os.Stat(filepath.Join(aux, "xtables-nft-multi")); err != nil {
		infof("Preparing data dir %s", dir)
		if err := extractBundle(source, aux); err != nil {
			warnf("extracting the bundled tools into %s: %v", aux, err)
			return
		}
	}
	path := strings.Join([]string{filepath.Join(dir, "bin"), os.Getenv("PATH"), aux}, ":")
	if err := os.Setenv("PATH", path); err != nil {
		warnf("setting PATH: %v", err)
	}
}

// detectScript stands in for k3s-root's iptables-detect.sh: it runs the multi-call binary under
// the name it was called by, with the bundled extensions.
const detectScript = `#!/bin/sh
# k3s's bundled iptables (LAB ONLY stand-in for k3s-root's iptables-detect.sh): nft mode.
dir=$(dirname "$0")
XTABLES_LIBDIR="$dir/xtables" exec "$dir/xtables-nft-multi" "$(basename "$0")" "$@"
`

// extractBundle writes aux: the extensions, the script and its links, then the multi-call
// binary, written aside and renamed last (its presence marks a finished extraction).
func extractBundle(source, aux string) error {
	if err := os.MkdirAll(filepath.Join(aux, "xtables"), 0o755); err != nil {
		return err
	}
	extensions, err := filepath.Glob(filepath.Join(filepath.Dir(source), "xtables", "*.so"))
	if err != nil {
		return err
	}
	for _, ext := range extensions {
		if err := copyFile(ext, filepath.Join(aux, "xtables", filepath.Base(ext)), 0o644); err != nil {
			return err
		}
	}
	if err := writeFileAtomic(filepath.Join(aux, "iptables-detect.sh"), []byte(detectScript), 0o755); err != nil {
		return err
	}
	for _, name := range bundledXtables {
		link := filepath.Join(aux, name)
		_ = os.Remove(link)
		if err := os.Symlink("iptables-detect.sh", link); err != nil {
			return err
		}
	}
	return copyFile(source, filepath.Join(aux, "xtables-nft-multi"), 0o755)
}

// copyFile copies source to target through a file aside, renamed when complete.
func copyFile(source, target string, mode os.FileMode) error {
	in, err := os.Open(source)
	if err != nil {
		return err
	}
	defer in.Close()
	part := target + ".part"
	out, err := os.OpenFile(part, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, mode)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	if err := out.Close(); err != nil {
		return err
	}
	return os.Rename(part, target)
}
