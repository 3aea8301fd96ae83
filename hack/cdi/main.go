// Command cdi-resolve resolves fully-qualified CDI device IDs (vendor/class=name)
// against CDI spec directories with the real CDI library, the same way a
// container runtime does, and prints the resulting container edits as JSON.
// It exits non-zero with the library's error on invalid specs or unresolvable IDs.
//
//	cdi-resolve --spec-dirs /etc/cdi,/var/run/cdi nvidia.com/gpu=0 ...
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"strings"

	oci "github.com/opencontainers/runtime-spec/specs-go"
	"tags.cncf.io/container-device-interface/pkg/cdi"
)

type deviceNode struct {
	Path  string `json:"path"`
	Type  string `json:"type"`
	Major int64  `json:"major"`
	Minor int64  `json:"minor"`
}

type result struct {
	Env         []string     `json:"env"`
	DeviceNodes []deviceNode `json:"deviceNodes"`
	Mounts      []oci.Mount  `json:"mounts"`
	Hooks       *oci.Hooks   `json:"hooks,omitempty"`
}

func fail(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "cdi-resolve: "+format+"\n", args...)
	os.Exit(1)
}

func main() {
	specDirs := flag.String("spec-dirs", strings.Join(cdi.DefaultSpecDirs, ","),
		"comma-separated CDI spec directories (later ones take precedence)")
	flag.Parse()
	if flag.NArg() == 0 {
		fail("usage: cdi-resolve [--spec-dirs d1,d2] vendor/class=name ...")
	}

	cache, err := cdi.NewCache(cdi.WithAutoRefresh(false), cdi.WithSpecDirs(strings.Split(*specDirs, ",")...))
	if err != nil {
		fail("%v", err)
	}
	if err := cache.Refresh(); err != nil {
		fail("invalid CDI specs: %v", err)
	}

	spec := &oci.Spec{Process: &oci.Process{}, Linux: &oci.Linux{}}
	if _, err := cache.InjectDevices(spec, flag.Args()...); err != nil {
		fail("%v", err)
	}

	res := result{Env: spec.Process.Env, DeviceNodes: []deviceNode{}, Mounts: spec.Mounts, Hooks: spec.Hooks}
	if res.Env == nil {
		res.Env = []string{}
	}
	if res.Mounts == nil {
		res.Mounts = []oci.Mount{}
	}
	for _, d := range spec.Linux.Devices {
		res.DeviceNodes = append(res.DeviceNodes, deviceNode{Path: d.Path, Type: d.Type, Major: d.Major, Minor: d.Minor})
	}
	enc := json.NewEncoder(os.Stdout)
	enc.SetIndent("", "  ")
	if err := enc.Encode(res); err != nil {
		fail("%v", err)
	}
}
