"""The ``ADDITIONAL_NAMESPACES`` list shared by the controller and the kubelet plugin.

Owns parsing and validating upstream's ``--additional-namespaces`` value (a string slice:
items separated by commas; blanks around items and empty items are ignored, and so is
whitespace between items, as the Helm chart's env value may carry it). Invariant: every name
returned is a valid namespace name (lowercase RFC 1123 label, at most 63 characters), in the
order given, without duplicates.
"""

from __future__ import annotations

import re

__all__ = ["parse_namespace_list", "valid_namespace"]

_DNS1123_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")


def valid_namespace(name: str) -> bool:
    """Whether ``name`` can name a namespace."""
    return len(name) <= 63 and _DNS1123_LABEL.fullmatch(name) is not None


def parse_namespace_list(text: str, *, flag: str = "additional-namespaces") -> tuple[str, ...]:
    """``"a, b,,c"`` → ``("a", "b", "c")``; ``ValueError`` naming ``flag`` and the bad item."""
    out: list[str] = []
    for item in re.split(r"[,\s]+", text):
        if not item:
            continue
        if not valid_namespace(item):
            raise ValueError(
                f"{flag}: {item!r} is not a valid namespace name (lowercase RFC 1123 label)"
            )
        if item not in out:
            out.append(item)
    return tuple(out)
