"""Per-claim error taxonomy of the kubelet plugin.

Owns the distinction the kubelet never sees but operators do: a *permanent* error means retrying
the same claim cannot succeed (bad opaque config, ComputeDomain missing or in another namespace);
a *retryable* error means the condition may clear (daemon not ready yet, node held by another
ComputeDomain, API hiccup). Both end up as the per-claim ``error`` string of the gRPC response;
the class decides metrics labels and log level, and the prefix tells the user whether to wait or
to fix something.
"""

from __future__ import annotations


class ClaimError(Exception):
    """A claim could not be (un)prepared; the message is shown to the user by the kubelet."""

    permanent: bool = False

    def user_message(self) -> str:
        kind = "permanent error" if self.permanent else "retryable error"
        return f"{kind}: {self}"


class PermanentError(ClaimError):
    """Retrying the same claim cannot help; the user must change something."""

    permanent = True


class RetryableError(ClaimError):
    """The condition may clear on its own; the kubelet's retry may succeed."""
