// Command longhorn-csi-plugin is the lab's stand-in for Longhorn's CSI node plugin (LAB ONLY,
// never shipped): what runs on every node of a real Longhorn as the longhorn-csi-plugin
// DaemonSet pod (the longhorn-manager image's `csi` command beside the node-driver-registrar
// sidecar). The real kubelet of a pod-capable lab host finds it, registers it and calls it
// exactly as it would call Longhorn's.
//
// What it models, and the source each follows:
//   - Registration with the kubelet (node-driver-registrar; k8s.io/kubelet
//     pkg/apis/pluginregistration/v1): a Registration service on
//     /var/lib/kubelet/plugins_registry/driver.longhorn.io-reg.sock answering GetInfo with
//     type CSIPlugin, name driver.longhorn.io, the CSI endpoint
//     /var/lib/kubelet/plugins/driver.longhorn.io/csi.sock and CSI version 1.0.0; the kubelet
//     then calls NodeGetInfo and writes the node ID into the node's CSINode object.
//   - CSI Identity (longhorn-manager csi/identity_server.go): the plugin name
//     driver.longhorn.io and Longhorn's version, the CONTROLLER_SERVICE capability, Probe ready.
//   - CSI Node (longhorn-manager csi/node_server.go): NodeGetInfo's node ID is the node's name;
//     the STAGE_UNSTAGE_VOLUME capability; NodeStageVolume refuses a volume that is not
//     attached to this node ("hasn't been attached yet": Longhorn checks the volume's state and
//     engine; the lab's engine stand-in is the file /dev/longhorn/<volume> the manager stand-in
//     makes on the node the volume is attached to, where Longhorn's engine makes the block
//     device), then mounts the volume's filesystem at the staging path; NodePublishVolume
//     bind-mounts the staging path at the pod's target path ("bind", plus "ro" for a read-only
//     publish), as Longhorn does; NodeUnpublishVolume and NodeUnstageVolume unmount and remove
//     the mount point. Each call is idempotent, as CSI requires.
//
// Not modelled: the data plane. Longhorn formats /dev/longhorn/<volume> (ext4) and mounts it;
// here the volume's filesystem is the folder <data-dir>/<volume> on this node's Longhorn disk,
// bind-mounted: its data stays on this node (Longhorn's would follow the volume's replicas).
// Also not modelled: block volumes, RWX (share-manager) volumes, encryption, volume stats and
// expansion (Longhorn's node server offers GET_VOLUME_STATS and EXPAND_VOLUME too).
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"sync"
	"syscall"

	"github.com/container-storage-interface/spec/lib/go/csi"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	registerapi "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

const (
	driverName = "driver.longhorn.io"
	// The Longhorn release the lab's stand-in chart is named after.
	driverVersion = "v1.9.1"
)

func main() {
	nodeID := flag.String("node-id", "", "this node's Kubernetes node name")
	endpoint := flag.String("csi-endpoint", "/var/lib/kubelet/plugins/"+driverName+"/csi.sock", "the CSI socket")
	registry := flag.String("registration-dir", "/var/lib/kubelet/plugins_registry", "the kubelet's plugin registry")
	dataDir := flag.String("data-dir", "/var/lib/longhorn/lab-csi", "where each volume's folder lives")
	deviceDir := flag.String("device-dir", "/dev/longhorn", "where an attached volume's device appears")
	version := flag.Bool("version", false, "print the version and exit")
	flag.Parse()
	if *version {
		fmt.Printf("longhorn-csi-plugin (lab stand-in) %s %s\n", driverName, driverVersion)
		return
	}
	if *nodeID == "" {
		log.Fatal("--node-id is required (the node's Kubernetes name)")
	}
	node := &nodeServer{nodeID: *nodeID, dataDir: *dataDir, deviceDir: *deviceDir}
	csiServer := grpc.NewServer()
	csi.RegisterIdentityServer(csiServer, identityServer{})
	csi.RegisterNodeServer(csiServer, node)
	regServer := grpc.NewServer()
	registerapi.RegisterRegistrationServer(regServer, &registrationServer{endpoint: *endpoint})
	regSocket := filepath.Join(*registry, driverName+"-reg.sock")

	csiListener, err := listen(*endpoint)
	if err != nil {
		log.Fatal(err)
	}
	// The registration socket last: the kubelet calls the CSI endpoint as soon as it sees it.
	regListener, err := listen(regSocket)
	if err != nil {
		log.Fatal(err)
	}
	stop := make(chan os.Signal, 1)
	signal.Notify(stop, syscall.SIGTERM, syscall.SIGINT)
	var wg sync.WaitGroup
	for _, pair := range []struct {
		s *grpc.Server
		l net.Listener
	}{{csiServer, csiListener}, {regServer, regListener}} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := pair.s.Serve(pair.l); err != nil {
				log.Printf("serving %s: %v", pair.l.Addr(), err)
			}
		}()
	}
	log.Printf("%s node plugin for node %s: CSI at %s, registration at %s", driverName, *nodeID, *endpoint, regSocket)
	<-stop
	// The registration socket goes first, so the kubelet deregisters the driver.
	regServer.Stop()
	csiServer.Stop()
	_ = os.Remove(regSocket)
	_ = os.Remove(*endpoint)
	wg.Wait()
}

func listen(path string) (net.Listener, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o750); err != nil {
		return nil, err
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, err
	}
	return net.Listen("unix", path)
}

type registrationServer struct {
	registerapi.UnimplementedRegistrationServer
	endpoint string
}

func (r *registrationServer) GetInfo(context.Context, *registerapi.InfoRequest) (*registerapi.PluginInfo, error) {
	return &registerapi.PluginInfo{
		Type:              registerapi.CSIPlugin,
		Name:              driverName,
		Endpoint:          r.endpoint,
		SupportedVersions: []string{"1.0.0"},
	}, nil
}

func (r *registrationServer) NotifyRegistrationStatus(_ context.Context, s *registerapi.RegistrationStatus) (*registerapi.RegistrationStatusResponse, error) {
	if !s.PluginRegistered {
		log.Printf("the kubelet did not register the plugin: %s", s.Error)
	} else {
		log.Printf("registered with the kubelet")
	}
	return &registerapi.RegistrationStatusResponse{}, nil
}

type identityServer struct {
	csi.UnimplementedIdentityServer
}

func (identityServer) GetPluginInfo(context.Context, *csi.GetPluginInfoRequest) (*csi.GetPluginInfoResponse, error) {
	return &csi.GetPluginInfoResponse{Name: driverName, VendorVersion: driverVersion}, nil
}

func (identityServer) GetPluginCapabilities(context.Context, *csi.GetPluginCapabilitiesRequest) (*csi.GetPluginCapabilitiesResponse, error) {
	return &csi.GetPluginCapabilitiesResponse{Capabilities: []*csi.PluginCapability{{
		Type: &csi.PluginCapability_Service_{Service: &csi.PluginCapability_Service{Type: csi.PluginCapability_Service_CONTROLLER_SERVICE}},
	}}}, nil
}

func (identityServer) Probe(context.Context, *csi.ProbeRequest) (*csi.ProbeResponse, error) {
	return &csi.ProbeResponse{}, nil
}

type nodeServer struct {
	csi.UnimplementedNodeServer
	nodeID, dataDir, deviceDir string
	// One call at a time: the kubelet may retry a call while an earlier one still runs.
	mu sync.Mutex
}

func (n *nodeServer) NodeGetInfo(context.Context, *csi.NodeGetInfoRequest) (*csi.NodeGetInfoResponse, error) {
	return &csi.NodeGetInfoResponse{NodeId: n.nodeID}, nil
}

func (n *nodeServer) NodeGetCapabilities(context.Context, *csi.NodeGetCapabilitiesRequest) (*csi.NodeGetCapabilitiesResponse, error) {
	return &csi.NodeGetCapabilitiesResponse{Capabilities: []*csi.NodeServiceCapability{{
		Type: &csi.NodeServiceCapability_Rpc{Rpc: &csi.NodeServiceCapability_RPC{Type: csi.NodeServiceCapability_RPC_STAGE_UNSTAGE_VOLUME}},
	}}}, nil
}

func (n *nodeServer) NodeStageVolume(_ context.Context, req *csi.NodeStageVolumeRequest) (*csi.NodeStageVolumeResponse, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	staging, volume := req.GetStagingTargetPath(), req.GetVolumeId()
	if err := required(map[string]string{"staging target path": staging, "volume id": volume}); err != nil {
		return nil, err
	}
	if req.GetVolumeCapability() == nil {
		return nil, status.Error(codes.InvalidArgument, "volume capability missing in request")
	}
	if req.GetVolumeCapability().GetBlock() != nil {
		return nil, status.Errorf(codes.InvalidArgument, "volume %s: block volumes are not modelled by the lab's stand-in", volume)
	}
	if _, err := os.Stat(filepath.Join(n.deviceDir, volume)); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "volume %s hasn't been attached yet", volume)
	}
	mounted, err := isMountPoint(staging)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "volume %s: %v", volume, err)
	}
	if mounted {
		return &csi.NodeStageVolumeResponse{}, nil
	}
	source := filepath.Join(n.dataDir, volume)
	if err := os.MkdirAll(source, 0o755); err != nil {
		return nil, status.Errorf(codes.Internal, "volume %s: %v", volume, err)
	}
	if err := os.MkdirAll(staging, 0o750); err != nil {
		return nil, status.Errorf(codes.Internal, "volume %s: %v", volume, err)
	}
	if err := bindMount(source, staging, false); err != nil {
		return nil, status.Errorf(codes.Internal, "volume %s: mounting at %s: %v", volume, staging, err)
	}
	log.Printf("volume %s staged at %s", volume, staging)
	return &csi.NodeStageVolumeResponse{}, nil
}

func (n *nodeServer) NodeUnstageVolume(_ context.Context, req *csi.NodeUnstageVolumeRequest) (*csi.NodeUnstageVolumeResponse, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	staging, volume := req.GetStagingTargetPath(), req.GetVolumeId()
	if err := required(map[string]string{"staging target path": staging, "volume id": volume}); err != nil {
		return nil, err
	}
	if err := unmountAndRemove(staging); err != nil {
		return nil, status.Errorf(codes.Internal, "volume %s: %v", volume, err)
	}
	log.Printf("volume %s unstaged from %s", volume, staging)
	return &csi.NodeUnstageVolumeResponse{}, nil
}

func (n *nodeServer) NodePublishVolume(_ context.Context, req *csi.NodePublishVolumeRequest) (*csi.NodePublishVolumeResponse, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	target, staging, volume := req.GetTargetPath(), req.GetStagingTargetPath(), req.GetVolumeId()
	if err := required(map[string]string{"target path": target, "staging target path": staging, "volume id": volume}); err != nil {
		return nil, err
	}
	if req.GetVolumeCapability() == nil {
		return nil, status.Error(codes.InvalidArgument, "volume capability missing in request")
	}
	if _, err := os.Stat(filepath.Join(n.deviceDir, volume)); err != nil {
		return nil, status.Errorf(codes.InvalidArgument, "volume %s hasn't been attached yet", volume)
	}
	if staged, err := isMountPoint(staging); err != nil || !staged {
		return nil, status.Errorf(codes.FailedPrecondition, "volume %s is not staged at %s", volume, staging)
	}
	if err := os.MkdirAll(target, 0o750); err != nil {
		return nil, status.Errorf(codes.Internal, "volume %s: %v", volume, err)
	}
	mounted, err := isMountPoint(target)
	if err != nil {
		return nil, status.Errorf(codes.Internal, "volume %s: %v", volume, err)
	}
	if !mounted {
		if err := bindMount(staging, target, req.GetReadonly()); err != nil {
			return nil, status.Errorf(codes.Internal, "failed to bind mount volume %s: %v", volume, err)
		}
	}
	log.Printf("volume %s published at %s", volume, target)
	return &csi.NodePublishVolumeResponse{}, nil
}

func (n *nodeServer) NodeUnpublishVolume(_ context.Context, req *csi.NodeUnpublishVolumeRequest) (*csi.NodeUnpublishVolumeResponse, error) {
	n.mu.Lock()
	defer n.mu.Unlock()
	target, volume := req.GetTargetPath(), req.GetVolumeId()
	if err := required(map[string]string{"target path": target, "volume id": volume}); err != nil {
		return nil, err
	}
	if err := unmountAndRemove(target); err != nil {
		return nil, status.Errorf(codes.Internal, "failed to cleanup volume %s mount point %s: %v", volume, target, err)
	}
	log.Printf("volume %s unmounted from %s", volume, target)
	return &csi.NodeUnpublishVolumeResponse{}, nil
}

func required(fields map[string]string) error {
	for name, value := range fields {
		if value == "" {
			return status.Errorf(codes.InvalidArgument, "%s missing in request", name)
		}
	}
	return nil
}

func bindMount(source, target string, readOnly bool) error {
	if err := syscall.Mount(source, target, "", syscall.MS_BIND, ""); err != nil {
		return err
	}
	if readOnly {
		return syscall.Mount("", target, "", syscall.MS_REMOUNT|syscall.MS_BIND|syscall.MS_RDONLY, "")
	}
	return nil
}

// unmountAndRemove unmounts every mount stacked at path, then removes the directory.
func unmountAndRemove(path string) error {
	for {
		mounted, err := isMountPoint(path)
		if err != nil {
			return err
		}
		if !mounted {
			break
		}
		if err := syscall.Unmount(path, 0); err != nil {
			return fmt.Errorf("unmounting %s: %w", path, err)
		}
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, os.ErrNotExist) {
		return err
	}
	return nil
}

// isMountPoint: path is a mount point in this mount namespace (by /proc/self/mountinfo, which
// also sees a bind mount of a folder of the same filesystem).
func isMountPoint(path string) (bool, error) {
	clean, err := filepath.Abs(path)
	if err != nil {
		return false, err
	}
	data, err := os.ReadFile("/proc/self/mountinfo")
	if err != nil {
		return false, err
	}
	for _, line := range strings.Split(string(data), "\n") {
		fields := strings.Fields(line)
		if len(fields) > 4 && unescapeOctal(fields[4]) == clean {
			return true, nil
		}
	}
	return false, nil
}

// unescapeOctal undoes mountinfo's \ooo escapes (spaces, tabs, newlines and backslashes).
func unescapeOctal(s string) string {
	if !strings.Contains(s, `\`) {
		return s
	}
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+4 <= len(s) {
			var v int
			if _, err := fmt.Sscanf(s[i+1:i+4], "%3o", &v); err == nil {
				b.WriteByte(byte(v))
				i += 3
				continue
			}
		}
		b.WriteByte(s[i])
	}
	return b.String()
}
