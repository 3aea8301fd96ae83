//go:build tools

// Package kube only exists to pin the Kubernetes version whose control plane
// and node components (kubelet, kube-proxy) hack/build-control-plane.sh builds.  Nothing here is compiled into the driver.
package kube

import (
	_ "k8s.io/kubernetes/cmd/kube-apiserver"
	_ "k8s.io/kubernetes/cmd/kube-controller-manager"
	_ "k8s.io/kubernetes/cmd/kube-proxy"
	_ "k8s.io/kubernetes/cmd/kube-scheduler"
	_ "k8s.io/kubernetes/cmd/kubelet"
)
