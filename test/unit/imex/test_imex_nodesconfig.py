"""Nodes config and DNS mapping: per-domain unique names, sentinel for empty slots."""

from __future__ import annotations

import pytest

from pkg.imex import nodesconfig as nc

UID_A = "4f1c2d3e-0000-4000-8000-00000000000a"
UID_B = "4f1c2d3e-0000-4000-8000-00000000000b"


def test_names_are_per_domain_and_padded() -> None:
    a = nc.node_names(UID_A, max_nodes=18)
    b = nc.node_names(UID_B, max_nodes=18)
    assert len(a) == 18 and not set(a) & set(b)
    assert a[0].startswith(nc.NAME_PREFIX) and a[0].endswith("-0000") and a[17].endswith("-0017")
    assert a[0] == f"compute-domain-daemon-{nc.domain_hash(UID_A)}-0000"


def test_render_dns_nodes_config_is_static() -> None:
    text = nc.render_dns_nodes_config(UID_A, max_nodes=3)
    assert nc.parse_nodes_config(text) == nc.node_names(UID_A, max_nodes=3)


def test_mapping_fills_unused_slots_with_sentinel() -> None:
    mapping = nc.dns_mapping(UID_A, {0: "10.0.0.1", 2: "10.0.0.3"}, max_nodes=4)
    names = nc.node_names(UID_A, max_nodes=4)
    assert mapping == {
        names[0]: "10.0.0.1",
        names[1]: nc.SENTINEL_ADDRESS,
        names[2]: "10.0.0.3",
        names[3]: nc.SENTINEL_ADDRESS,
    }


@pytest.mark.parametrize(
    "members",
    [{18: "10.0.0.1"}, {-1: "10.0.0.1"}, {0: "not-an-ip"}, {0: nc.SENTINEL_ADDRESS}],
    ids=["index-too-big", "negative", "bad-ip", "sentinel-ip"],
)
def test_mapping_rejects(members: dict[int, str]) -> None:
    with pytest.raises(nc.NodesConfigError):
        nc.dns_mapping(UID_A, members, max_nodes=18)


def test_ip_nodes_config() -> None:
    assert nc.render_ip_nodes_config(["10.0.0.2", "10.0.0.1", "10.0.0.2"]) == "10.0.0.2\n10.0.0.1\n"
    with pytest.raises(nc.NodesConfigError):
        nc.render_ip_nodes_config(["compute-domain-daemon-0000"])
    assert nc.parse_nodes_config("# x\n10.0.0.1 # c\n\n") == ["10.0.0.1"]


@pytest.mark.parametrize(
    ("text", "ok"),
    [
        ("10.0.0.1", True),
        ("fd00::1", True),
        ("::ffff:a00:1", True),
        ("fe80::1%a\n10.0.0.9\tcompute-domain-daemon-x-0000", False),
        ("fe80::1%eth0", False),
        ("010.0.0.1", False),
        ("FD00::1", False),
        ("fd00:0::1", False),
        ("10.0.0.1 ", False),
        ("", False),
        ("node-a", False),
    ],
)
def test_only_canonical_ip_literals(text: str, ok: bool) -> None:
    assert nc.is_canonical_ip(text) is ok
    if not ok:
        with pytest.raises(nc.NodesConfigError, match="not a canonical IP address"):
            nc.render_ip_nodes_config([text])
        with pytest.raises(nc.NodesConfigError, match="not a canonical IP address"):
            nc.dns_mapping(UID_A, {0: text}, max_nodes=2)


def test_domain_hash_is_short_and_stable() -> None:
    assert nc.domain_hash(UID_A) == nc.domain_hash(UID_A)
    assert len(nc.domain_hash(UID_A)) == nc.HASH_LENGTH
    with pytest.raises(nc.NodesConfigError):
        nc.domain_hash("")
