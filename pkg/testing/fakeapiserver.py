"""Public entry point of the fake API server (`FakeApiServer`); see docs/contracts.md.

Implementation lives in `pkg.testing.fakeapi` (store, selectors, patch, handlers, watch,
server); this module only re-exports the supported surface.
"""

from pkg.testing.fakeapi.server import FakeApiServer, LoggedRequest

__all__ = ["FakeApiServer", "LoggedRequest"]
