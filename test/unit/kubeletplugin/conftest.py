from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from testsupport.kp_harness import seed_world, short_tmpdir

from pkg.testing.fakeapiserver import FakeApiServer


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    with FakeApiServer() as server:
        seed_world(server)
        yield server


@pytest.fixture
def root() -> Iterator[Path]:
    with short_tmpdir() as path:
        yield path
