//go:build tools

// Package containerd only exists to pin the containerd version (and its runc
// shim and ctr) that hack/build-node.sh builds for the real-node e2e tier.
// Nothing here is compiled into the driver.
package containerd

import (
	_ "github.com/containerd/containerd/v2/cmd/containerd"
	_ "github.com/containerd/containerd/v2/cmd/containerd-shim-runc-v2"
	_ "github.com/containerd/containerd/v2/cmd/ctr"
)
