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


def is_permanent(err: Exception) -> bool:
    """Whether retrying cannot help: a permanent `ClaimError` or a malformed request."""
    return isinstance(err, ValueError) or bool(getattr(err, "permanent", False))


def _classified(err: Exception) -> str:
    if isinstance(err, ClaimError):
        return err.user_message()
    if isinstance(err, ValueError):
        return f"permanent error: {err}"
    return f"retryable error: internal error: {err}"


def prepare_error_text(claim: str, err: Exception) -> str:
    """The per-claim error the kubelet shows (Event ``FailedPrepareDynamicResources``).

    Starts with upstream's ``error preparing devices for claim '<ns>/<name>:<uid>': `` so that
    runbooks written for the Go driver match; the class (permanent/retryable) follows.
    """
    return f"error preparing devices for claim '{claim}': {_classified(err)}"


def unprepare_error_text(claim: str, err: Exception) -> str:
    """The per-claim Unprepare error, with upstream's ``error unpreparing devices ...`` prefix."""
    return f"error unpreparing devices for claim '{claim}': {_classified(err)}"
