//go:build libcni13

package main

import (
	"context"
	"strings"

	"github.com/containernetworking/cni/libcni"
	"github.com/containernetworking/cni/pkg/types"
)

// gc runs libcni 1.3's GCNetworkList: a DEL for every cached attachment of the network that is not valid,
// then GC (with cni.dev/valid-attachments) to every plugin of a conflist at 1.1.0 or later.
func gc(ctx context.Context, conflist string, pluginDirs []string, valid []string) error {
	list, err := libcni.ConfListFromFile(conflist)
	if err != nil {
		return err
	}
	attachments := []types.GCAttachment{}
	for _, v := range valid {
		parts := strings.SplitN(v, ":", 2)
		a := types.GCAttachment{ContainerID: parts[0]}
		if len(parts) == 2 {
			a.IfName = parts[1]
		}
		attachments = append(attachments, a)
	}
	return libcni.NewCNIConfig(pluginDirs, nil).GCNetworkList(ctx, list, &libcni.GCArgs{ValidAttachments: attachments})
}
