"""`eventually`: the one way a test waits for another thread (or process) to make something true.

Owns polling for asynchronous progress in tests: a watch thread filling a cache, a worker
reconciling, a subprocess answering. It is not a way to let time pass: code that waits for a
timeout, period or grace period takes an injected clock and the test steps
`pkg.testing.clock.FakeClock` instead. Invariant: the predicate is evaluated at least once, and
the first truthy value it returns is returned; polling backs off from 1 ms to 100 ms so a slow
predicate (an API call) does not spin.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

__all__ = ["eventually"]

T = TypeVar("T")

_FIRST_POLL = 0.001
_MAX_POLL = 0.1


def eventually(predicate: Callable[[], T], timeout: float = 10.0, *, what: str = "") -> T:
    """Poll ``predicate`` until it returns a truthy value and return that value.

    Raises AssertionError naming ``what`` (or the predicate) and the last value seen when
    ``timeout`` real seconds pass first. Exceptions from the predicate propagate at once.
    """
    deadline = time.monotonic() + timeout
    pause = _FIRST_POLL
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() >= deadline:
            label = what or getattr(predicate, "__qualname__", repr(predicate))
            raise AssertionError(f"not reached within {timeout:g}s: {label} (last: {value!r})")
        time.sleep(pause)  # polling another thread's progress, not waiting out a timeout
        pause = min(pause * 2, _MAX_POLL)
