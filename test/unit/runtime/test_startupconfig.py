"""The start-up configuration dump has the shape of upstream's (what its e2e suite and runbooks
grep), and every binary prints it once at level 0."""

from __future__ import annotations

import pytest
from testsupport.binaries import BINARIES, start_binary

from pkg.featuregates import FeatureGates
from pkg.runtime.startupconfig import camel_case, go_map, spew_value, startup_config


def test_go_map_is_gos_percent_hash_v_with_sorted_keys() -> None:
    assert go_map({"B": True, "A": False}) == 'map[string]bool{"A":false, "B":true}'


@pytest.mark.parametrize(
    ("value", "text"),
    [
        ("abc", '(string) (len=3) "abc"'),
        ('a"b', '(string) (len=3) "a\\"b"'),
        (4, "(int) 4"),
        (True, "(bool) true"),
        (0.2, "(float64) 0.2"),
        (None, "(interface {}) <nil>"),
        (("x", "y"), '([]string) (len=2) {"x", "y"}'),
    ],
)
def test_spew_values(value: object, text: str) -> None:
    assert spew_value(value) == text


def test_dump_names_commit_gates_and_flags_in_camel_case() -> None:
    gates = FeatureGates.parse("MPSSupport=false").all_values()
    flags: dict[str, object] = {"additional-namespaces": "", "v": 4, "node_name": "n1"}
    dump = startup_config(revision="abc", gates=gates, type_name="*main.Flags", flags=flags)
    lines = dump.splitlines()
    assert lines[:2] == ["Commit: abc", ""]
    assert lines[2].startswith('Feature gates: map[string]bool{"AllAlpha":false, ')
    assert '"MPSSupport":false' in lines[2] and '"HostManagedIMEXDaemon":false' in lines[2]
    assert lines[3:] == [
        "Flags: (*main.Flags) {",
        ' additionalNamespaces: (string) (len=0) "",',
        " klogVerbosity: (int) 4,",
        ' nodeName: (string) (len=2) "n1",',
        "}",
    ]
    assert camel_case("max-nodes-per-imex-domain") == "maxNodesPerImexDomain"


NEEDLES = {
    "compute-domain-controller": ("additionalNamespaces:", "imageName:"),
    "compute-domain-kubelet-plugin": ("nodeName:", "cdiRoot:"),
    "compute-domain-daemon": ("nodeName:", "configDir:"),
}


@pytest.mark.parametrize("binary", sorted(BINARIES))
def test_every_binary_dumps_its_configuration_atstart_binary(binary: str) -> None:
    err = start_binary(binary).stderr
    assert err.count("\nFeature gates: map[string]bool{") == 1, err
    assert '"MPSSupport":false' in err and "klogVerbosity: (int) " in err
    for needle in NEEDLES[binary]:
        assert f"\n {needle} " in err, needle
    # the dump is one level-0 record: its header line starts with "Commit: "
    assert any(line.split("] ", 1)[-1].startswith("Commit: ") for line in err.splitlines())
