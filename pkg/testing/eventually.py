"""`eventually`: the one way a test waits for another thread (or process) to make something true.

Owns polling for asynchronous progress in tests: a watch thread filling a cache, a worker
reconciling, a subprocess answering. It is not a way to let time pass: code that waits for a
timeout, period or grace period takes an injected clock and the test steps
`pkg.testing.clock.FakeClock` instead. Invariant: the predicate is evaluated at least once, and
the first truthy value it returns is returned; polling backs off from 1 ms to 100 ms so a slow
predicate (an API call) does not spin, or runs at a fixed interval the caller names. The
harnesses in hack/ and the e2e suites poll through it too (their ``wait_for`` helpers only
adapt its signature).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["eventually"]

T = TypeVar("T")

_FIRST_POLL = 0.001
_MAX_POLL = 0.1


def eventually(
    predicate: Callable[[], T],
    timeout: float = 10.0,
    *,
    what: str = "",
    every: float | None = None,
    ignore: tuple[type[Exception], ...] = (),
) -> T:
    """Poll ``predicate`` until it returns a truthy value and return that value.

    Raises AssertionError naming ``what`` (or the predicate), the last value seen and the last
    ignored exception when ``timeout`` real seconds pass first. Exceptions from the predicate
    propagate at once, except those of a type in ``ignore`` (a command that fails until the
    state is reached), which count as a falsy value. ``every`` polls at that fixed interval
    (an expensive predicate: a subprocess, a remote call) instead of backing off from 1 ms to
    100 ms.
    """
    deadline = time.monotonic() + timeout
    pause = _FIRST_POLL if every is None else every
    value: T | None = None
    error: Exception | None = None
    while True:
        try:
            value = predicate()
        except ignore as err:
            error = err
        else:
            if value:
                return value
        if time.monotonic() >= deadline:
            label = what or getattr(predicate, "__qualname__", repr(predicate))
            why = f"; last error: {error}" if error is not None else ""
            raise AssertionError(f"not reached within {timeout:g}s: {label} (last: {value!r}){why}")
        time.sleep(pause)  # polling another thread's progress, not waiting out a timeout
        if every is None:
            pause = min(pause * 2, _MAX_POLL)
