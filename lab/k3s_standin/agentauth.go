package main

// How an agent authenticates to the supervisor, and how it reads the supervisor's refusals,
// as k3s does:
//
//   - Every request after the CA check carries the token's credentials (a bootstrap token as
//     "Authorization: Bearer id.secret", a server token as basic auth "node:<password>") and,
//     when the agent holds one, its kubelet client certificate (pkg/clientaccess/token.go
//     WithUser("node"), WithClientCertificate in pkg/agent/run.go). The supervisor accepts
//     either (pkg/server/auth/auth.go: the cluster's authenticator, a union), so a deleted
//     bootstrap token still works next to a node certificate (k3s PRs #6663/#6898).
//   - The first such request fetches the agent configuration (/v1-k3s/config,
//     pkg/agent/config/config.go getConfig); a refused token is logged at info level every
//     5 s: "Waiting to retrieve agent configuration; server is not ready: failed to retrieve
//     configuration from server: <why>". The supervisor answers 401 with a Status whose
//     message is "not authorized" (util.SendError). How the agent prints it depends on its
//     version: releases whose clientaccess decodes an error body as a metav1.Status
//     (readBody) print its message, "not authorized" (seen on v1.31.3, kunobi-ninja/kobe#47);
//     older ones print the URL and the HTTP status, "https://127.0.0.1:6444/v1-k3s/config:
//     401 Unauthorized" (the get() of k3s before readBody; seen up to v1.27.5, k3s issue
//     #8381). The release between those that brought readBody was not pinned from the
//     sources at hand: the stand-in decodes from v1.31.0 (statusDecodingSince), so a stand-in
//     built as v1.30.x prints the older wording.

import (
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// defaultClientTimeout is k3s's clientaccess client timeout.
const defaultClientTimeout = 10 * time.Second

// statusDecodingSince is the first minor release whose agent prints a refusal's decoded
// Status message (see above).
const statusDecodingSince = 31

// agentAuth is what an agent presents to the supervisor.
type agentAuth struct {
	token parsedToken
	cert  *tls.Certificate // the stored kubelet client certificate, if any
}

func (a agentAuth) apply(req *http.Request) {
	switch {
	case a.token.isBootstrap():
		req.Header.Set("Authorization", "Bearer "+a.token.id+"."+a.token.secret)
	case a.token.password != "":
		req.SetBasicAuth("node", a.token.password)
	}
}

func (a agentAuth) client(caBundle []byte) *http.Client {
	cfg := &tls.Config{RootCAs: mustPool(caBundle)}
	if a.cert != nil {
		cfg.Certificates = []tls.Certificate{*a.cert}
	}
	return &http.Client{Timeout: defaultClientTimeout, Transport: &http.Transport{TLSClientConfig: cfg, DisableKeepAlives: true}}
}

// decodesStatus: whether an agent of this version prints a refusal's Status message.
func decodesStatus(v string) bool {
	parts := strings.SplitN(strings.TrimPrefix(v, "v"), ".", 3)
	if len(parts) < 2 {
		return true
	}
	major, err1 := strconv.Atoi(parts[0])
	minor, err2 := strconv.Atoi(parts[1])
	if err1 != nil || err2 != nil {
		return true
	}
	return major > 1 || minor >= statusDecodingSince
}

// responseError is how an agent of `v` reports a supervisor response outside 2xx.
func responseError(v string, resp *http.Response, body []byte) error {
	if decodesStatus(v) {
		var status struct {
			Kind    string `json:"kind"`
			Message string `json:"message"`
		}
		if json.Unmarshal(body, &status) == nil && status.Kind == "Status" {
			return fmt.Errorf("%s", status.Message)
		}
	}
	return fmt.Errorf("%s: %s", resp.Request.URL, resp.Status)
}
