"""The bottom layer: time, JSON and the shared vocabulary every other layer uses.

Owns nothing that talks to Kubernetes, IMEX or the OS beyond reading time: the one injectable
:class:`Clock` Protocol and its real implementation (`pkg.base.clock`), the one ``JSON`` alias and
the ``Literal`` event kinds (`pkg.base.types`). Invariant: ``pkg.base`` imports nothing from
``pkg`` (enforced by import-linter), so any layer may import it. The test double of the clock
lives in `pkg.testing.clock` (production code never imports test doubles).
"""

from pkg.base.clock import Clock, RealClock
from pkg.base.types import JSON, EventType, NotificationKind, WatchEventType

__all__ = ["JSON", "Clock", "EventType", "NotificationKind", "RealClock", "WatchEventType"]
