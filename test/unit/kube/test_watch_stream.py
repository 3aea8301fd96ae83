"""HttpWatchStream's cancellation never leaves a live watch connection in the client's pool.

A `stop()` that lands while the watch request is in flight finds no response to shut down; the
stream then ends at once, and the connection (on which the server is already streaming) must
go back to the pool closed: the next request on a live one would read watch chunks as its
response. The opener here runs `stop()` itself, so the race is won the same way every run.
"""

from __future__ import annotations

import json

import urllib3

from pkg.kube import resources as res
from pkg.kube.watch import HttpWatchStream
from pkg.testing.fakeapiserver import FakeApiServer


def test_a_stop_during_the_request_returns_no_live_connection_to_the_pool() -> None:
    # Bookmarks are the only thing the server sends on this watch; until the first one the
    # connection looks idle, which is when a leaked one would be reused.
    with FakeApiServer(bookmark_interval=0.5) as api:
        pool = urllib3.PoolManager(num_pools=1, maxsize=1, retries=False)
        path = res.NODES.path()
        query = "?watch=true&allowWatchBookmarks=true&timeoutSeconds=30"
        stream: HttpWatchStream | None = None

        def opener() -> urllib3.BaseHTTPResponse:
            resp = pool.request("GET", api.url + path + query, preload_content=False)
            assert resp.status == 200 and stream is not None
            stream.stop()  # after the request, before the stream holds its response
            return resp

        stream = HttpWatchStream(opener, path=path, timeout_seconds=30)
        assert list(stream) == []
        api.clear_log()
        for _ in range(3):  # the pool's one connection slot, used again and again
            resp = pool.request("GET", api.url + path, timeout=5.0)
            assert resp.status == 200 and json.loads(resp.data)["kind"] == "NodeList"
        assert api.request_log == [("GET", path)] * 3
        pool.clear()
