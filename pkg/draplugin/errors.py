"""Per-claim error taxonomy of a DRA kubelet plugin.

Owns the distinction the kubelet never sees but operators do: a *permanent* error means retrying
the same claim cannot succeed (bad opaque config, a referenced object missing or in another
namespace); a *retryable* error means the condition may clear (a dependency not ready yet, a
device held by another claim, API hiccup). Both end up as the per-claim ``error`` string of the
gRPC response; the class decides metrics labels and log level, and the prefix tells the user
whether to wait or to fix something.

Drivers raise these from their prepare/unprepare hooks; `pkg.draplugin.fanout` turns any
exception into the per-claim text with `prepare_error_text` / `unprepare_error_text`. Everything
here is immutable or pure and therefore safe from any thread.
"""

from __future__ import annotations


class ClaimError(Exception):
    """A claim could not be (un)prepared; the message is shown to the user by the kubelet.

    Subclass `PermanentError` or `RetryableError` rather than this class; a bare `ClaimError`
    counts as retryable.
    """

    permanent: bool = False

    def user_message(self) -> str:
        """``permanent error: <message>`` or ``retryable error: <message>``; never raises."""
        kind = "permanent error" if self.permanent else "retryable error"
        return f"{kind}: {self}"


class PermanentError(ClaimError):
    """Retrying the same claim cannot help; the user must change something."""

    permanent = True


class RetryableError(ClaimError):
    """The condition may clear on its own; the kubelet's retry may succeed."""


def is_permanent(err: Exception) -> bool:
    """Whether retrying cannot help: a permanent `ClaimError` or a malformed request.

    Any exception with a truthy ``permanent`` attribute and every `ValueError` count as
    permanent; everything else (including crashes) as retryable.
    """
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
    ``claim`` is the claim's `pkg.draplugin.claims.ClaimRef` string.
    """
    return f"error preparing devices for claim '{claim}': {_classified(err)}"


def unprepare_error_text(claim: str, err: Exception) -> str:
    """The per-claim Unprepare error, with upstream's ``error unpreparing devices ...`` prefix."""
    return f"error unpreparing devices for claim '{claim}': {_classified(err)}"
