// Lab-only pulumi-resource-hcloud: Hetzner's Terraform provider
// (github.com/hetznercloud/terraform-provider-hcloud) bridged to Pulumi with
// pulumi-terraform-bridge, mapped the way the pulumi-hcloud Python SDK that requirements.txt
// pins expects (tokens hcloud:index/<camelName>:<PascalName>, the bridge's standard property
// names). Built and registered by lab/build/hcloud_provider.sh; never shipped.
//
// The provider serves two Terraform providers through one plugin: the SDKv2 provider
// (servers, networks, firewalls, placement groups, ...) and the plugin-framework provider
// (SSH keys, server networks, zones, storage boxes, ...), as Hetzner's own Terraform binary
// muxes them. A resource is served by whichever of the two defines it.
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"

	hetzner "github.com/hetznercloud/terraform-provider-hcloud/hcloud"
	pfbridge "github.com/pulumi/pulumi-terraform-bridge/v3/pkg/pf/tfbridge"
	"github.com/pulumi/pulumi-terraform-bridge/v3/pkg/tfbridge"
	tks "github.com/pulumi/pulumi-terraform-bridge/v3/pkg/tfbridge/tokens"
	"github.com/pulumi/pulumi-terraform-bridge/v3/pkg/tfgen"
	shim "github.com/pulumi/pulumi-terraform-bridge/v3/pkg/tfshim"
	shimv2 "github.com/pulumi/pulumi-terraform-bridge/v3/pkg/tfshim/sdk-v2"
	"github.com/pulumi/pulumi-terraform-bridge/v3/pkg/x/muxer"
	"github.com/pulumi/pulumi-terraform-bridge/v3/unstable/metadata"
	"github.com/pulumi/pulumi/sdk/v3/go/common/diag"
	"github.com/pulumi/pulumi/sdk/v3/go/common/diag/colors"
	"github.com/pulumi/pulumi/sdk/v3/go/common/resource"
)

const (
	pkgName = "hcloud"
	// Every hcloud_<x> resource is hcloud:index/<x>:<X>, every data source
	// hcloud:index/get<X>:get<X>, as the Python SDK's tokens are.
	mainModule = "index"
	// An auto-name (a resource's Pulumi name, "-" and a random suffix, for a resource given
	// no name) is at most this long, as pulumi-hcloud generates them.
	autoNameMax = 255
)

// version is what the plugin reports (GetPluginInfo, --version): the pulumi-hcloud SDK
// version whose tokens and property names it serves, set by the build (-ldflags -X).
var version = "0.0.0-dev"

func providerInfo(ctx context.Context) tfbridge.ProviderInfo {
	prov := tfbridge.ProviderInfo{
		P: pfbridge.MuxShimWithPF(ctx,
			shimv2.NewProvider(hetzner.Provider()),
			hetzner.NewPluginProvider()),
		Name:       pkgName,
		GitHubOrg:  "hetznercloud",
		Repository: "https://github.com/hetznercloud/terraform-provider-hcloud",
		Version:    version,
		// No bridge-metadata.json from an earlier schema generation: every field's
		// list-or-object shape comes from the Terraform schema as it is now.
		MetadataInfo: tfbridge.NewProviderMetadata([]byte("{}")),
		Resources: map[string]*tfbridge.ResourceInfo{
			"hcloud_server": {
				// The Terraform provider reads a server network's alias_ips back as an empty
				// list: one given without them would plan a change at every run, so they
				// default to an empty list.
				PreCheckCallback: defaultAliasIPs,
			},
		},
	}
	prov.MustComputeTokens(tks.SingleModule("hcloud_", mainModule, tks.MakeStandard(pkgName)))
	prov.MustApplyAutoAliases()
	// Pulumi ids are strings; a Terraform id of another type is declared a string.
	prov.P.ResourcesMap().Range(func(key string, value shim.Resource) bool {
		if id, ok := value.Schema().GetOk("id"); ok && id.Type() != shim.TypeString {
			r := prov.Resources[key]
			if r.Fields == nil {
				r.Fields = map[string]*tfbridge.SchemaInfo{}
			}
			r.Fields["id"] = &tfbridge.SchemaInfo{Type: "string"}
		}
		return true
	})
	prov.SetAutonaming(autoNameMax, "-")
	return prov
}

func defaultAliasIPs(
	_ context.Context, config resource.PropertyMap, _ resource.PropertyMap,
) (resource.PropertyMap, error) {
	networks, ok := config["networks"]
	if !ok || !networks.IsArray() {
		return config, nil
	}
	for _, n := range networks.ArrayValue() {
		if !n.IsObject() {
			continue
		}
		if _, has := n.ObjectValue()["aliasIps"]; !has {
			n.ObjectValue()["aliasIps"] = resource.NewProperty([]resource.PropertyValue{})
		}
	}
	return config, nil
}

// dispatch records which of the two muxed providers serves each token, as the bridge's
// schema generation would have stored it in bridge-metadata.json.
func dispatch(prov *tfbridge.ProviderInfo) error {
	resolver, ok := prov.P.(interface {
		ResolveDispatch(*tfbridge.ProviderInfo) (muxer.DispatchTable, error)
	})
	if !ok {
		return fmt.Errorf("the muxed provider cannot resolve its dispatch table")
	}
	table, err := resolver.ResolveDispatch(prov)
	if err != nil {
		return err
	}
	return metadata.Set(prov.GetMetadata(), "mux", table)
}

// schemaFile is the Pulumi package schema the plugin serves (GetSchema, and the bridge's type
// checks of config and inputs), beside the executable. The build writes it with
// -write-schema: generating it takes the bridge's whole schema generation, too slow to
// repeat at every start of the plugin.
const schemaFile = "schema.json"

// writeSchema generates the package schema from the Terraform schemas and this mapping, the
// way the bridge's tfgen does, with the descriptions the Terraform schema carries (no
// upstream Markdown docs are read).
func writeSchema(prov tfbridge.ProviderInfo, path string) error {
	sink := diag.DefaultSink(os.Stderr, os.Stderr, diag.FormatOptions{Color: colors.Never})
	res, err := tfgen.GenerateSchemaWithOptions(tfgen.GenerateSchemaOptions{
		ProviderInfo: prov, DiagnosticsSink: sink, XInMemoryDocs: true,
	})
	if err != nil {
		return err
	}
	data, err := json.MarshalIndent(res.PackageSpec, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, data, 0o644)
}

func readSchema() ([]byte, error) {
	exe, err := os.Executable()
	if err != nil {
		return nil, err
	}
	path := filepath.Join(filepath.Dir(exe), schemaFile)
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("no package schema (%w): build the plugin with lab/build/hcloud_provider.sh", err)
	}
	return data, nil
}

func fail(err error) {
	fmt.Fprintf(os.Stderr, "pulumi-resource-hcloud: %v\n", err)
	os.Exit(1)
}

func main() {
	ctx := context.Background()
	prov := providerInfo(ctx)
	if err := dispatch(&prov); err != nil {
		fail(err)
	}
	switch {
	case len(os.Args) == 3 && os.Args[1] == "-write-schema":
		if err := writeSchema(prov, os.Args[2]); err != nil {
			fail(err)
		}
		return
	case len(os.Args) == 2 && (os.Args[1] == "-version" || os.Args[1] == "--version"):
		// Answered before the schema is read, as the bridge answers it: the build checks
		// what a new binary reports before it has a schema.
		fmt.Println(version)
		return
	}
	schema, err := readSchema()
	if err != nil {
		fail(err)
	}
	pfbridge.MainWithMuxer(ctx, pkgName, prov, schema)
}
