"""Fixtures shared by the daemon's unit tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from pkg.kube import resources as res
from pkg.testing.fakeapiserver import FakeApiServer

NS = "nvidia-dra-driver"


@pytest.fixture
def api() -> Iterator[FakeApiServer]:
    """A fake API server holding the daemon's pod ``daemon-n0`` in the driver namespace."""
    with FakeApiServer() as srv:
        srv.seed(
            res.PODS,
            {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": "daemon-n0", "namespace": NS}},
        )
        yield srv
