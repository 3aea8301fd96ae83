"""The claims the kubelet names, and fetching the ResourceClaim objects behind them.

Owns the library's half of upstream ``kubeletplugin``'s claim handling:

* `ClaimRef` is a claim as the kubelet names it in ``Node(Un)PrepareResources``
  (namespace, name, UID); `ClaimRef.validate` checks that it can name a real ResourceClaim
  before it reaches a URL path or a file name;
* `fetch_claim` reads the ResourceClaim for a reference and checks what the library promises a
  driver: the object exists, has the referenced UID (it was not deleted and re-created) and is
  allocated. Every failure is a `pkg.draplugin.errors.ClaimError`: a missing, replaced or
  unallocated claim is permanent, any other API error retryable.

Nothing here knows any driver's API: drivers receive the whole claim and decide what in it is
theirs. Everything is stateless; `fetch_claim` is as thread-safe as the client it is given.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from pkg.base.types import JSON
from pkg.draplugin.errors import PermanentError, RetryableError
from pkg.kube.client import KubeClient
from pkg.kube.errors import ApiError, NotFoundError
from pkg.kube.resources import RESOURCE_CLAIMS

_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
_DNS1123_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
# Kubernetes UIDs are UUIDs; anything file-name safe and short is accepted (CDI spec names).
_UID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")


@dataclass(frozen=True)
class ClaimRef:
    """A claim as the kubelet names it in Node(Un)PrepareResources (immutable, thread-safe)."""

    namespace: str
    uid: str
    name: str

    def __str__(self) -> str:
        """Upstream's ``<namespace>/<name>:<uid>`` (``ResourceClaimToString``)."""
        return f"{self.namespace}/{self.name}:{self.uid}"

    @classmethod
    def of(cls, claim: JSON) -> ClaimRef:
        """The reference of a ResourceClaim object (its metadata namespace, UID and name)."""
        meta = claim.get("metadata") or {}
        return cls(
            namespace=str(meta.get("namespace", "")),
            uid=str(meta.get("uid", "")),
            name=str(meta.get("name", "")),
        )

    def validate(self, *, uid_only: bool = False) -> None:
        """`PermanentError` naming the field unless this can name a real ResourceClaim.

        The kubelet only sends names the API server accepted; anything else must not reach a
        URL path (a ``/`` would address another object) or a file name (CDI spec per UID).
        ``uid_only`` checks just the UID (Unprepare needs nothing else).
        """
        if not _UID.fullmatch(self.uid):
            raise PermanentError(
                f"invalid claim reference: uid {self.uid[:80]!r} is not a Kubernetes UID "
                "(1-128 characters: letters, digits, '-', '.', '_')"
            )
        if uid_only:
            return
        if len(self.namespace) > 63 or not _DNS1123_LABEL.fullmatch(self.namespace):
            raise PermanentError(
                f"invalid claim reference: namespace {self.namespace[:80]!r} is not a "
                "namespace name (RFC 1123 label)"
            )
        if len(self.name) > 253 or not _DNS1123_SUBDOMAIN.fullmatch(self.name):
            raise PermanentError(
                f"invalid claim reference: name {self.name[:80]!r} is not a ResourceClaim name "
                "(RFC 1123 subdomain)"
            )


def fetch_claim(client: KubeClient, ref: ClaimRef) -> JSON:
    """The allocated ResourceClaim ``ref`` names, read from the API server (one GET).

    Raises `PermanentError` if it does not exist, has another UID (deleted and re-created) or
    is not allocated, and `RetryableError` on any other API error. The caller must have
    validated ``ref`` (`ClaimRef.validate`); the object returned is the caller's to keep.
    """
    try:
        claim = client.get(RESOURCE_CLAIMS, ref.name, namespace=ref.namespace)
    except NotFoundError as err:
        raise PermanentError(f"ResourceClaim {ref.namespace}/{ref.name} not found") from err
    except ApiError as err:
        raise RetryableError(
            f"cannot read ResourceClaim {ref.namespace}/{ref.name}: {err}"
        ) from err
    uid = (claim.get("metadata") or {}).get("uid")
    if uid != ref.uid:
        raise PermanentError(
            f"ResourceClaim {ref.namespace}/{ref.name} has UID {uid}, not {ref.uid} "
            "(it was deleted and re-created)"
        )
    if not (claim.get("status") or {}).get("allocation"):
        raise PermanentError(f"ResourceClaim {ref.namespace}/{ref.name} is not allocated")
    return claim
