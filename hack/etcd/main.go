// Command etcd is a plain build of the upstream etcd server, used only by the
// local e2e control plane (hack/localcluster).  The version is pinned in go.mod.
package main

import (
	"os"

	"go.etcd.io/etcd/server/v3/etcdmain"
)

func main() { etcdmain.Main(os.Args) }
