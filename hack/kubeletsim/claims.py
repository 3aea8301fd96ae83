"""The kubelet's DRA manager for one node: which claims a pod uses, and which are prepared.

Owns (1) resolving ``pod.spec.resourceClaims`` to ResourceClaim objects (``resourceClaimName``
directly; templates through ``pod.status.resourceClaimStatuses``) and checking that each is
allocated and reserved for the pod, (2) the prepared-claim cache with per-pod reference counts
(a shared claim is prepared once and unprepared after its last pod on the node is gone) and
(3) its checkpoint file ``kubelet/dra_manager_state.json``, so tests can look for leaks.
Claims are read in v1 shape whatever resource.k8s.io version the cluster serves: the node's
client converts (`SimulatedNode.start` discovers the version, `pkg.kube.resourceapi`).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pkg.draplugin.claims import ClaimRef
from pkg.kube.client import KubeClient
from pkg.kube.errors import ForbiddenError, NotFoundError
from pkg.kube.resources import RESOURCE_CLAIMS

from .registration import DraPlugin, PreparedDevice


class ClaimNotReadyError(RuntimeError):
    """A claim of the pod does not exist yet or is not allocated/reserved for it (retry)."""


@dataclass
class PodClaim:
    """One entry of ``pod.spec.resourceClaims`` resolved to its ResourceClaim."""

    pod_claim_name: str
    claim: dict[str, Any]

    @property
    def ref(self) -> ClaimRef:
        m = self.claim["metadata"]
        return ClaimRef(namespace=m["namespace"], name=m["name"], uid=m["uid"])

    def drivers(self) -> set[str]:
        alloc = self.claim.get("status", {}).get("allocation") or {}
        return {r["driver"] for r in (alloc.get("devices") or {}).get("results") or []}


def claim_name_for(pod: Mapping[str, Any], entry: Mapping[str, Any]) -> str | None:
    """The ResourceClaim name behind one ``pod.spec.resourceClaims`` entry (None: not yet)."""
    if entry.get("resourceClaimName"):
        return str(entry["resourceClaimName"])
    for st in pod.get("status", {}).get("resourceClaimStatuses") or []:
        if st.get("name") == entry["name"]:
            name = st.get("resourceClaimName")
            return str(name) if name else None
    return None


def resolve_pod_claims(client: KubeClient, pod: Mapping[str, Any]) -> list[PodClaim]:
    """Fetch every claim of the pod; raise ClaimNotReadyError unless all are allocated+reserved."""
    meta = pod["metadata"]
    out = []
    for entry in pod.get("spec", {}).get("resourceClaims") or []:
        name = claim_name_for(pod, entry)
        if name is None:
            raise ClaimNotReadyError(f"claim for pod claim {entry['name']!r} not created yet")
        try:
            claim = client.get(RESOURCE_CLAIMS, name, namespace=meta["namespace"])
        except NotFoundError as e:
            raise ClaimNotReadyError(f"resourceclaim {name} not found") from e
        except ForbiddenError as e:
            # The Node authorizer learns pod -> claim edges from its informers: retry.
            raise ClaimNotReadyError(f"resourceclaim {name}: {e}") from e
        status = claim.get("status") or {}
        if not status.get("allocation"):
            raise ClaimNotReadyError(f"resourceclaim {name} is not allocated")
        reserved = {r.get("uid") for r in status.get("reservedFor") or []}
        if meta["uid"] not in reserved:
            raise ClaimNotReadyError(f"resourceclaim {name} is not reserved for pod {meta['name']}")
        out.append(PodClaim(pod_claim_name=entry["name"], claim=claim))
    return out


@dataclass
class ClaimInfo:
    ref: ClaimRef
    driver: str
    devices: list[PreparedDevice] = field(default_factory=list)
    pods: set[str] = field(default_factory=set)
    prepared: bool = False


class DraManager:
    """Prepared claims of one node with per-pod reference counts (thread-safe)."""

    def __init__(self, state_file: Path) -> None:
        self._file = state_file
        self._lock = threading.RLock()
        self._claims: dict[str, ClaimInfo] = {}

    def prepare(
        self, plugin: DraPlugin, pod_uid: str, claims: Sequence[PodClaim]
    ) -> dict[str, list[PreparedDevice]]:
        """Prepare (once) every claim of the pod handled by ``plugin``; devices by pod claim.

        Like the kubelet, a claim enters the cache (with the pod's reference) *before* the
        plugin is called, so a pod that goes away while Prepare keeps failing still gets its
        claims unprepared.
        """
        mine = [c for c in claims if plugin.name in c.drivers()]
        with self._lock:
            for c in mine:
                info = self._claims.setdefault(c.ref.uid, ClaimInfo(c.ref, plugin.name))
                info.pods.add(pod_uid)
            todo = [c for c in mine if not self._claims[c.ref.uid].prepared]
            self._save()
        result = plugin.prepare([c.ref for c in todo]) if todo else {}
        with self._lock:
            for c in todo:
                info = self._claims.setdefault(c.ref.uid, ClaimInfo(c.ref, plugin.name))
                info.devices, info.prepared = result[c.ref.uid], True
                info.pods.add(pod_uid)
            self._save()
            return {c.pod_claim_name: list(self._claims[c.ref.uid].devices) for c in mine}

    def release(self, pod_uid: str) -> list[ClaimInfo]:
        """Drop the pod's references; return claims no pod uses any more (to unprepare)."""
        with self._lock:
            orphaned = []
            for info in self._claims.values():
                info.pods.discard(pod_uid)
                if not info.pods:
                    orphaned.append(info)
            self._save()
            return orphaned

    def unprepared(self, uid: str) -> None:
        with self._lock:
            info = self._claims.get(uid)
            if info is not None and not info.pods:
                del self._claims[uid]
            self._save()

    def prepared(self) -> dict[str, ClaimInfo]:
        with self._lock:
            return dict(self._claims)

    def _save(self) -> None:
        doc = {
            uid: {
                "namespace": i.ref.namespace,
                "name": i.ref.name,
                "driver": i.driver,
                "pods": sorted(i.pods),
                "prepared": i.prepared,
                "devices": [
                    {
                        "requestNames": list(d.request_names),
                        "poolName": d.pool_name,
                        "deviceName": d.device_name,
                        "cdiDeviceIDs": list(d.cdi_device_ids),
                    }
                    for d in i.devices
                ],
            }
            for uid, i in self._claims.items()
        }
        self._file.parent.mkdir(parents=True, exist_ok=True)
        tmp = self._file.with_suffix(".tmp")
        tmp.write_text(json.dumps(doc, indent=1))
        tmp.replace(self._file)
