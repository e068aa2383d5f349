package main

// Kubeconfig files (written and read without clientcmd) and REST clients.

import (
	"encoding/base64"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"k8s.io/client-go/rest"
	"sigs.k8s.io/yaml"
)

type kubeconfigFile struct {
	APIVersion     string            `json:"apiVersion"`
	Kind           string            `json:"kind"`
	Clusters       []namedCluster    `json:"clusters"`
	Contexts       []namedContext    `json:"contexts"`
	CurrentContext string            `json:"current-context"`
	Preferences    map[string]string `json:"preferences"`
	Users          []namedUser       `json:"users"`
}

type namedCluster struct {
	Name    string `json:"name"`
	Cluster struct {
		Server                   string `json:"server"`
		CertificateAuthorityData string `json:"certificate-authority-data,omitempty"`
		CertificateAuthority     string `json:"certificate-authority,omitempty"`
	} `json:"cluster"`
}

type namedContext struct {
	Name    string `json:"name"`
	Context struct {
		Cluster string `json:"cluster"`
		User    string `json:"user"`
	} `json:"context"`
}

type namedUser struct {
	Name string `json:"name"`
	User struct {
		ClientCertificateData string `json:"client-certificate-data,omitempty"`
		ClientKeyData         string `json:"client-key-data,omitempty"`
		ClientCertificate     string `json:"client-certificate,omitempty"`
		ClientKey             string `json:"client-key,omitempty"`
		Token                 string `json:"token,omitempty"`
	} `json:"user"`
}

// kubeconfigYAML renders a kubeconfig with embedded CA, client certificate and key.
func kubeconfigYAML(server string, caPEM, certPEM, keyPEM []byte) ([]byte, error) {
	kc := kubeconfigFile{APIVersion: "v1", Kind: "Config", CurrentContext: "default", Preferences: map[string]string{}}
	var c namedCluster
	c.Name = "default"
	c.Cluster.Server = server
	c.Cluster.CertificateAuthorityData = base64.StdEncoding.EncodeToString(caPEM)
	var x namedContext
	x.Name = "default"
	x.Context.Cluster = "default"
	x.Context.User = "default"
	var u namedUser
	u.Name = "default"
	u.User.ClientCertificateData = base64.StdEncoding.EncodeToString(certPEM)
	u.User.ClientKeyData = base64.StdEncoding.EncodeToString(keyPEM)
	kc.Clusters, kc.Contexts, kc.Users = []namedCluster{c}, []namedContext{x}, []namedUser{u}
	return yaml.Marshal(kc)
}

func writeKubeconfig(path, server string, caPEM, certPEM, keyPEM []byte, mode os.FileMode) error {
	data, err := kubeconfigYAML(server, caPEM, certPEM, keyPEM)
	if err != nil {
		return err
	}
	return writeFileAtomic(path, data, mode)
}

// restConfigFromKubeconfig reads the current context of a kubeconfig.
func restConfigFromKubeconfig(path string) (*rest.Config, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var kc kubeconfigFile
	if err := yaml.Unmarshal(data, &kc); err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	ctxName := kc.CurrentContext
	clusterName, userName := "", ""
	for _, c := range kc.Contexts {
		if c.Name == ctxName || ctxName == "" {
			clusterName, userName = c.Context.Cluster, c.Context.User
			break
		}
	}
	cfg := &rest.Config{}
	found := false
	for _, c := range kc.Clusters {
		if c.Name == clusterName || clusterName == "" {
			cfg.Host = c.Cluster.Server
			if c.Cluster.CertificateAuthorityData != "" {
				if cfg.CAData, err = base64.StdEncoding.DecodeString(c.Cluster.CertificateAuthorityData); err != nil {
					return nil, fmt.Errorf("%s: certificate-authority-data: %w", path, err)
				}
			}
			cfg.CAFile = resolveRel(path, c.Cluster.CertificateAuthority)
			found = true
			break
		}
	}
	if !found {
		return nil, fmt.Errorf("%s: no cluster for context %q", path, ctxName)
	}
	for _, u := range kc.Users {
		if u.Name == userName || userName == "" {
			if u.User.ClientCertificateData != "" {
				if cfg.CertData, err = base64.StdEncoding.DecodeString(u.User.ClientCertificateData); err != nil {
					return nil, err
				}
			}
			if u.User.ClientKeyData != "" {
				if cfg.KeyData, err = base64.StdEncoding.DecodeString(u.User.ClientKeyData); err != nil {
					return nil, err
				}
			}
			cfg.CertFile = resolveRel(path, u.User.ClientCertificate)
			cfg.KeyFile = resolveRel(path, u.User.ClientKey)
			cfg.BearerToken = u.User.Token
			break
		}
	}
	if cfg.Host == "" {
		return nil, errors.New(path + ": no server")
	}
	return cfg, nil
}

func resolveRel(kubeconfigPath, p string) string {
	if p == "" || filepath.IsAbs(p) {
		return p
	}
	return filepath.Join(filepath.Dir(kubeconfigPath), p)
}

// clientConfig adds the stand-in's user agent and sane timeouts.
func clientConfig(cfg *rest.Config, component string) *rest.Config {
	c := rest.CopyConfig(cfg)
	c.UserAgent = fmt.Sprintf("k3s/%s (linux) %s", version, component)
	if c.Timeout == 0 {
		c.Timeout = 30 * time.Second
	}
	c.QPS, c.Burst = 20, 40
	return c
}
