"""API error hierarchy: one exception class per HTTP status the project reacts to.

Owns the translation from an HTTP status (+ optional `Status` body) to a typed exception, so
callers write `except NotFoundError` instead of comparing integers. Invariant: every `ApiError`
carries the numeric `status`, the Kubernetes `reason` (e.g. "AlreadyExists"), a human message
and the decoded body when there was one. Transport failures (no HTTP status) are
`ConnectionFailedError`, which is deliberately *not* an `ApiError`. Loops that must survive an
API server outage catch :data:`TRANSIENT_ERRORS` (or ask :func:`is_transient`): connection
failures, client-side timeouts, 5xx and 429 all mean "the same request may succeed later".
"""

from __future__ import annotations

from typing import Any

__all__ = [
    "TRANSIENT_ERRORS",
    "AlreadyExistsError",
    "ApiError",
    "BadRequestError",
    "ConflictError",
    "ConnectionFailedError",
    "ForbiddenError",
    "GoneError",
    "InvalidError",
    "NotFoundError",
    "ServerError",
    "TooManyRequestsError",
    "UnauthorizedError",
    "error_from_status",
    "is_transient",
]


class ApiError(Exception):
    """The API server answered with a non-success status."""

    def __init__(
        self, status: int, reason: str = "", message: str = "", body: dict[str, Any] | None = None
    ) -> None:
        super().__init__(f"{status} {reason}: {message}" if message else f"{status} {reason}")
        self.status = status
        self.reason = reason
        self.message = message
        self.body = body


class BadRequestError(ApiError):
    """400: the request was malformed (bad patch, bad selector, ...)."""


class UnauthorizedError(ApiError):
    """401: credentials missing or rejected."""


class ForbiddenError(ApiError):
    """403: RBAC denies the verb."""


class NotFoundError(ApiError):
    """404: the object (or its namespace) does not exist."""


class ConflictError(ApiError):
    """409 Conflict: stale resourceVersion or failed delete precondition; re-read and retry."""


class AlreadyExistsError(ConflictError):
    """409 AlreadyExists: create of a name that is taken."""


class GoneError(ApiError):
    """410: the requested resourceVersion was compacted away; the caller must re-list."""


class InvalidError(ApiError):
    """422: the object failed validation."""


class TooManyRequestsError(ApiError):
    """429: throttled (API priority and fairness); back off and retry."""


class ServerError(ApiError):
    """5xx: the server failed; usually retryable."""


class ConnectionFailedError(Exception):
    """The request never produced an HTTP status (refused, reset, timed out, TLS failure)."""


TRANSIENT_ERRORS: tuple[type[Exception], ...] = (
    ConnectionFailedError,
    ServerError,
    TooManyRequestsError,
    TimeoutError,
)
"""Failures that say nothing about the request itself: retry it, with backoff."""


def is_transient(exc: BaseException) -> bool:
    """Whether ``exc`` is an outage or overload (retry later), not an answer about the request."""
    return isinstance(exc, TRANSIENT_ERRORS)


_BY_STATUS: dict[int, type[ApiError]] = {
    400: BadRequestError,
    401: UnauthorizedError,
    403: ForbiddenError,
    404: NotFoundError,
    409: ConflictError,
    410: GoneError,
    422: InvalidError,
    429: TooManyRequestsError,
}


def error_from_status(status: int, body: dict[str, Any] | None) -> ApiError:
    """Build the most specific `ApiError` for an HTTP status and its decoded body (if any)."""
    reason = ""
    message = ""
    if isinstance(body, dict):
        reason = str(body.get("reason") or "")
        message = str(body.get("message") or "")
    cls: type[ApiError]
    if status == 409 and reason == "AlreadyExists":
        cls = AlreadyExistsError
    elif status >= 500:
        cls = ServerError
    else:
        cls = _BY_STATUS.get(status, ApiError)
    return cls(status, reason, message, body)
