"""The fake API server's suite (`testsupport.fakeapiserver_suite`) against `FakeApiServer`.

``test/e2e/test_fakeapiserver_conformance.py`` runs the same tests against a real
kube-apiserver; here ``server`` is the fake, with the garbage collector on.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from testsupport import fakeapiserver_suite as suite
from testsupport.fakeapiserver_suite import ApiTarget, FakeTarget, apply_server_markers

from pkg.testing.fakeapiserver import FakeApiServer

# Every test of the suite, collected here against the fake.
globals().update({k: v for k, v in vars(suite).items() if k.startswith("test_")})


@pytest.fixture
def server(request: pytest.FixtureRequest) -> Iterator[ApiTarget]:
    apply_server_markers(request, "fake")
    with FakeApiServer(gc=True, bookmark_interval=0.05) as api:
        yield FakeTarget(api)
