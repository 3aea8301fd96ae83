"""Our .proto files are wire-identical to the kubelet's (k8s.io/kubelet of the pinned version).

A tiny Go program is built at test time in a temporary module that requires the upstream
``k8s.io/kubelet`` module; it dumps the FileDescriptorProtos of the dra v1/v1beta1,
dra-health v1/v1alpha1 and pluginregistration packages, which are compared field by field with
our compiled descriptors.
Nothing from upstream is written into the repository.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
from google.protobuf import descriptor_pb2, json_format

from pkg.draplugin.proto.gen import (
    kubelet_dra_health_v1_pb2,
    kubelet_dra_health_v1alpha1_pb2,
    kubelet_dra_v1_pb2,
    kubelet_dra_v1beta1_pb2,
    kubelet_pluginregistration_v1_pb2,
)

REPO = Path(__file__).resolve().parents[3]

DUMPER = """package main

import (
	"fmt"
	"os"

	"google.golang.org/protobuf/encoding/protojson"
	"google.golang.org/protobuf/reflect/protodesc"
	"google.golang.org/protobuf/reflect/protoreflect"
	drav1 "k8s.io/kubelet/pkg/apis/dra/v1"
	drav1beta1 "k8s.io/kubelet/pkg/apis/dra/v1beta1"
	drahealthv1 "k8s.io/kubelet/pkg/apis/dra-health/v1"
	drahealthv1alpha1 "k8s.io/kubelet/pkg/apis/dra-health/v1alpha1"
	reg "k8s.io/kubelet/pkg/apis/pluginregistration/v1"
)

func main() {
	files := []protoreflect.FileDescriptor{
		(&reg.PluginInfo{}).ProtoReflect().Descriptor().ParentFile(),
		(&drav1.Claim{}).ProtoReflect().Descriptor().ParentFile(),
		(&drav1beta1.Claim{}).ProtoReflect().Descriptor().ParentFile(),
		(&drahealthv1.DeviceHealth{}).ProtoReflect().Descriptor().ParentFile(),
		(&drahealthv1alpha1.DeviceHealth{}).ProtoReflect().Descriptor().ParentFile(),
	}
	for _, f := range files {
		b, err := protojson.Marshal(protodesc.ToFileDescriptorProto(f))
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(1)
		}
		fmt.Println(string(b))
	}
}
"""


def _go() -> str | None:
    return shutil.which("go") or (
        "/usr/local/go/bin/go" if os.access("/usr/local/go/bin/go", os.X_OK) else None
    )


def pinned_kubelet_version() -> str:
    """k8s.io/kubelet version matching the pinned k8s.io/kubernetes (v1.X.Y -> v0.X.Y)."""
    gomod = (REPO / "hack" / "kube" / "go.mod").read_text()
    match = re.search(r"k8s\.io/kubernetes\s+v1\.(\d+\.\d+\S*)", gomod)
    assert match, "hack/kube/go.mod does not pin k8s.io/kubernetes"
    return f"v0.{match.group(1)}"


def _upstream_descriptors(tmp: Path) -> dict[str, descriptor_pb2.FileDescriptorProto]:
    go = _go()
    if go is None:
        pytest.skip("the Go toolchain ('go') is not installed; cannot fetch k8s.io/kubelet")
    version = pinned_kubelet_version()
    (tmp / "main.go").write_text(DUMPER)
    (tmp / "go.mod").write_text(
        f"module protodump\n\ngo 1.26.0\n\nrequire k8s.io/kubelet {version}\n"
    )
    env = {**os.environ, "GOTOOLCHAIN": "local", "GOFLAGS": "-mod=mod"}
    subprocess.run([go, "mod", "tidy"], cwd=tmp, env=env, check=True, capture_output=True)
    out = subprocess.run(
        [go, "run", "."], cwd=tmp, env=env, check=True, capture_output=True, text=True
    ).stdout
    result: dict[str, descriptor_pb2.FileDescriptorProto] = {}
    for line in out.splitlines():
        fdp = json_format.Parse(line, descriptor_pb2.FileDescriptorProto())
        result[fdp.package] = fdp
    return result


def _ours(module: Any) -> descriptor_pb2.FileDescriptorProto:
    fdp = descriptor_pb2.FileDescriptorProto()
    module.DESCRIPTOR.CopyToProto(fdp)
    return fdp


def _shape(fdp: descriptor_pb2.FileDescriptorProto) -> dict[str, Any]:
    """Everything that determines the wire format and the method paths."""

    def message(m: descriptor_pb2.DescriptorProto) -> dict[str, Any]:
        return {
            "fields": {
                f.name: (
                    f.number,
                    descriptor_pb2.FieldDescriptorProto.Type.Name(f.type),
                    descriptor_pb2.FieldDescriptorProto.Label.Name(f.label),
                    f.type_name,
                    f.proto3_optional,
                )
                for f in m.field
            },
            "nested": {n.name: message(n) for n in m.nested_type},
            "map_entry": m.options.map_entry,
            "oneofs": [o.name for o in m.oneof_decl],
            "enums": {e.name: [(v.name, v.number) for v in e.value] for e in m.enum_type},
        }

    return {
        "package": fdp.package,
        "syntax": fdp.syntax,
        "messages": {m.name: message(m) for m in fdp.message_type},
        "enums": {e.name: [(v.name, v.number) for v in e.value] for e in fdp.enum_type},
        "services": {
            s.name: {
                m.name: (m.input_type, m.output_type, m.client_streaming, m.server_streaming)
                for m in s.method
            }
            for s in fdp.service
        },
    }


@pytest.fixture(scope="module")
def upstream(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return _upstream_descriptors(tmp_path_factory.mktemp("kubelet-protos"))


@pytest.mark.parametrize(
    ("package", "module"),
    [
        ("pluginregistration", kubelet_pluginregistration_v1_pb2),
        ("k8s.io.kubelet.pkg.apis.dra.v1", kubelet_dra_v1_pb2),
        ("k8s.io.kubelet.pkg.apis.dra.v1beta1", kubelet_dra_v1beta1_pb2),
        ("v1", kubelet_dra_health_v1_pb2),
        ("v1alpha1", kubelet_dra_health_v1alpha1_pb2),
    ],
    ids=["pluginregistration", "dra-v1", "dra-v1beta1", "dra-health-v1", "dra-health-v1alpha1"],
)
def test_descriptor_matches_upstream(upstream: dict[str, Any], package: str, module: Any) -> None:
    assert package in upstream, f"upstream dump lacks {package}: {sorted(upstream)}"
    theirs, ours = _shape(upstream[package]), _shape(_ours(module))
    # Compare piecewise so a failure names the message/service that drifted.
    assert ours["package"] == theirs["package"]
    assert ours["syntax"] == theirs["syntax"]
    assert sorted(ours["messages"]) == sorted(theirs["messages"])
    for name, shape in theirs["messages"].items():
        assert ours["messages"][name] == shape, f"message {name} differs"
    assert ours["enums"] == theirs["enums"]
    assert ours["services"] == theirs["services"]


def test_pinned_version_is_a_kubelet_release() -> None:
    assert re.fullmatch(r"v0\.\d+\.\d+(-[0-9A-Za-z.]+)?", pinned_kubelet_version())
