"""klog's verbosity levels as Python logging levels: ``log.log(V(n), ...)`` is klog's ``V(n)``.

Defined here, in the lowest layer, so every layer logs at upstream's levels (0 start-up,
1 per-claim results, 2 processing, 3 list/watch, 4 details, 6 API round trips, 7 probes); the
handler that honours ``-v`` lives in `pkg.runtime.logsetup`. ``V(0)`` is INFO and ``V(1..9)``
lie strictly between DEBUG and INFO.
"""

from __future__ import annotations

import logging
from typing import Final

__all__ = ["MAX_V", "V"]

MAX_V: Final = 9


def V(n: int) -> int:  # noqa: N802 - klog's name
    """The logging level of klog's ``V(n)``: INFO for 0, between DEBUG and INFO for 1..9.

    Raises ``ValueError`` outside 0..9."""
    if not 0 <= n <= MAX_V:
        raise ValueError(f"klog verbosity must be 0..{MAX_V}, got {n}")
    return logging.INFO - n


for _n in range(1, MAX_V + 1):
    logging.addLevelName(V(_n), f"V{_n}")
