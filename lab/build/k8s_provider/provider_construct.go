// The lab's replacement for pulumi-kubernetes's pkg/provider/provider_construct.go, written
// for the lab (lab/build/k8s_provider.sh copies it over the module's file before the build).
//
// Upstream's file registers the provider's four component resources (kubernetes:yaml/v2:
// ConfigFile and ConfigGroup, kubernetes:helm.sh/v4:Chart, kubernetes:kustomize/v2:Directory),
// whose implementations import the provider's own Go SDK: every API group's generated types,
// about 64 packages and most of the plugin's cold compile time. The program uses none of
// them (Longhorn is a helm.sh/v3 Release, a custom resource; the rest are plain resources), so
// the lab's plugin is built without them and answers a Construct of any type the way upstream
// answers one it does not know: an error naming the type. Every custom resource, Read, Diff,
// Check, Create, Update and Delete is upstream's code, unchanged.
package provider

import (
	"context"
	"fmt"

	providerresource "github.com/pulumi/pulumi-kubernetes/provider/v4/pkg/provider/resource"
	pulumirpc "github.com/pulumi/pulumi/sdk/v3/proto/go"
)

// resourceProviders is empty: no component resource is served (see above).
var resourceProviders = map[string]providerresource.ResourceProviderFactory{}

func (k *kubeProvider) getResourceProvider(typ string) (providerresource.ResourceProvider, bool) {
	providerF, found := k.resourceProviders[typ]
	if !found {
		return nil, false
	}
	return providerF(&providerresource.ResourceProviderOptions{ClientSet: k.clientSet}), true
}

// Construct refuses every type, as upstream's Construct refuses a type it has no factory for.
func (k *kubeProvider) Construct(_ context.Context, req *pulumirpc.ConstructRequest) (*pulumirpc.ConstructResponse, error) {
	typ := req.GetType()
	if _, found := k.getResourceProvider(typ); !found {
		return nil, fmt.Errorf("unknown resource type %q", typ)
	}
	return nil, fmt.Errorf("the lab's provider builds no component resources: %q", typ)
}
