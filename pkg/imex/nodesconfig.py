"""The IMEX nodes config (``IMEX_NODE_CONFIG_FILE``): who the peers of one IMEX domain are.

Two shapes, chosen by the ``IMEXDaemonsWithDNSNames`` gate:

- **DNS names** (default): a *static* list of ``max_nodes`` host names, one per index, that never
  changes while the domain lives. Membership changes only touch the hosts mapping
  (:mod:`pkg.imex.hosts`) followed by a SIGUSR1, so IMEX keeps its node IDs.
- **IPs** (legacy): one peer IP per line; any change means rewriting the file and restarting IMEX.

Invariants (upstream #1447):
- names are unique per ComputeDomain: ``compute-domain-daemon-<hash>-NNNN`` where ``<hash>`` is a
  short digest of the CD UID, so a reused pod IP or a neighbouring domain's daemon can never be
  reached under one of our names;
- every slot is always mapped: a slot with no daemon points at :data:`SENTINEL_ADDRESS`, which no
  daemon ever uses, so a lookup never falls through to cluster DNS and never hits a stranger.
  Readers (the simulator) treat a name resolving to the sentinel as an empty slot.
- only canonical IP literals are written (:func:`is_canonical_ip`): the addresses come from
  ComputeDomainClique entries other daemons write, and ``ipaddress`` alone accepts IPv6 scope
  IDs with arbitrary text (``fe80::1%a\n10.0.0.9\t<name>`` would add a line to the hosts
  file).
"""

from __future__ import annotations

import hashlib
import ipaddress
from collections.abc import Iterable, Mapping
from typing import Final

NAME_PREFIX: Final = "compute-domain-daemon-"
# Upstream (PR #1465) uses 127.0.0.2. The local e2e runs every simulated node on 127.0.0.x of
# one host, so a far corner of the loopback net keeps the sentinel clear of real node IPs.
SENTINEL_ADDRESS: Final = "127.255.255.254"
HASH_LENGTH: Final = 8


class NodesConfigError(ValueError):
    """An index or address that cannot appear in a nodes config."""


def is_canonical_ip(text: str) -> bool:
    """True iff ``text`` is an IPv4 or IPv6 literal exactly as ``ipaddress`` prints it (no
    leading zeros, upper case, uncompressed IPv6 or whitespace) and has no scope ID (``%``)."""
    if "%" in text:
        return False
    try:
        return str(ipaddress.ip_address(text)) == text
    except ValueError:
        return False


def _check_ip(ip: str, where: str = "") -> None:
    if not is_canonical_ip(ip):
        raise NodesConfigError(f"{where}not a canonical IP address: {ip!r}")


def domain_hash(domain_uid: str) -> str:
    """Short, stable digest of a ComputeDomain UID used inside daemon host names."""
    if not domain_uid:
        raise NodesConfigError("domain UID must not be empty")
    return hashlib.sha256(domain_uid.encode()).hexdigest()[:HASH_LENGTH]


def node_name(domain_uid: str, index: int, *, max_nodes: int) -> str:
    """The host name of slot ``index`` in the domain of ``domain_uid``."""
    if not 0 <= index < max_nodes:
        raise NodesConfigError(f"index {index} outside 0..{max_nodes - 1}")
    return f"{NAME_PREFIX}{domain_hash(domain_uid)}-{index:04d}"


def node_names(domain_uid: str, *, max_nodes: int) -> list[str]:
    """All slot names of a domain, in index order."""
    if max_nodes < 1:
        raise NodesConfigError(f"max_nodes must be >= 1, got {max_nodes}")
    return [node_name(domain_uid, i, max_nodes=max_nodes) for i in range(max_nodes)]


def render_dns_nodes_config(domain_uid: str, *, max_nodes: int) -> str:
    """The static DNS-mode nodes config: one name per line, indices 0..max_nodes-1."""
    return "".join(f"{name}\n" for name in node_names(domain_uid, max_nodes=max_nodes))


def render_ip_nodes_config(ips: Iterable[str]) -> str:
    """The IP-mode nodes config: the given peer IPs, validated, de-duplicated, in given order."""
    seen: dict[str, None] = {}
    for ip in ips:
        _check_ip(ip)
        seen.setdefault(ip, None)
    return "".join(f"{ip}\n" for ip in seen)


def dns_mapping(domain_uid: str, members: Mapping[int, str], *, max_nodes: int) -> dict[str, str]:
    """Full name -> address mapping for the hosts file: members at their slots, sentinel elsewhere.

    ``members`` maps index -> IP. Two indices sharing one IP is allowed (a stale entry the
    controller has not pruned yet); an out-of-range index is an error.
    """
    mapping = dict.fromkeys(node_names(domain_uid, max_nodes=max_nodes), SENTINEL_ADDRESS)
    for index, ip in sorted(members.items()):
        name = node_name(domain_uid, index, max_nodes=max_nodes)
        _check_ip(ip, f"index {index}: ")
        if ip == SENTINEL_ADDRESS:
            raise NodesConfigError(f"index {index}: {ip} is reserved for empty slots")
        mapping[name] = ip
    return mapping


def parse_nodes_config(text: str) -> list[str]:
    """Entries of a nodes config (names or IPs), skipping blank lines and ``#`` comments."""
    entries = []
    for raw in text.splitlines():
        line = raw.split("#", 1)[0].strip()
        if line:
            entries.append(line)
    return entries
