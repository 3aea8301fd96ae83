"""HTTP probes and metrics endpoint, key=value log lines, no-op vs exporting tracing."""

from __future__ import annotations

import json
import socket
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, Counter

from pkg.runtime.httpserver import HealthChecks, ObservabilityServer, parse_endpoint
from pkg.runtime.tracing import setup_tracing
from pkg.testing.eventually import eventually


def fetch(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as exc:
        return exc.code, exc.read().decode()


@pytest.mark.parametrize(
    ("endpoint", "expected"),
    [(":8080", ("", 8080)), ("127.0.0.1:0", ("127.0.0.1", 0)), ("[::1]:9", ("::1", 9))],
)
def test_parse_endpoint(endpoint: str, expected: tuple[str, int]) -> None:
    assert parse_endpoint(endpoint) == expected


def test_parse_endpoint_rejects_garbage() -> None:
    with pytest.raises(ValueError, match="invalid HTTP endpoint"):
        parse_endpoint("localhost")


def test_server_serves_metrics_and_probes() -> None:
    registry = CollectorRegistry()
    Counter("demo_total", "demo", registry=registry).inc()
    live, ready = HealthChecks(), HealthChecks()
    state = {"synced": False}
    ready.add("caches-synced", lambda: state["synced"])
    ready.add("boom", lambda: 1 / 0 == 0)
    server = ObservabilityServer(
        "127.0.0.1:0", registry=registry, metrics_path="/metrics", liveness=live, readiness=ready
    )
    server.start()
    try:
        base = f"http://127.0.0.1:{server.port}"
        code, body = fetch(base + "/metrics")
        assert code == 200 and "demo_total 1.0" in body
        assert fetch(base + "/healthz") == (200, "ok")
        code, body = fetch(base + "/readyz")
        assert code == 503
        assert "[-]caches-synced failed" in body and "[-]boom failed" in body
        state["synced"] = True
        ready.add("boom", lambda: True)
        assert fetch(base + "/readyz") == (200, "ok")
        assert fetch(base + "/nope")[0] == 404
    finally:
        server.stop()
        server.stop()


def test_debug_documents_only_when_registered() -> None:
    def probes() -> tuple[HealthChecks, HealthChecks]:
        live, ready = HealthChecks(), HealthChecks()
        live.add("ping", lambda: True)
        return live, ready

    registry = CollectorRegistry()
    plain = ObservabilityServer(
        "127.0.0.1:0", registry=registry, liveness=probes()[0], readiness=probes()[1]
    )
    state = {"n": 1}

    def broken() -> object:
        raise RuntimeError("cache gone")

    live, ready = probes()
    debug = ObservabilityServer(
        "127.0.0.1:0",
        registry=registry,
        liveness=live,
        readiness=ready,
        debug={
            "/debug/informers": lambda: {"informers": [{"objects": {"ns/a": str(state["n"])}}]},
            "/debug/broken": broken,
        },
    )
    plain.start()
    debug.start()
    try:
        assert fetch(f"http://127.0.0.1:{plain.port}/debug/informers")[0] == 404  # off by default
        url = f"http://127.0.0.1:{debug.port}/debug/informers"
        with urllib.request.urlopen(url, timeout=5) as resp:
            assert resp.headers["Content-Type"] == "application/json"
            assert json.loads(resp.read()) == {"informers": [{"objects": {"ns/a": "1"}}]}
        state["n"] = 2  # rendered per request
        assert json.loads(fetch(url + "?x=1")[1])["informers"][0]["objects"] == {"ns/a": "2"}
        code, body = fetch(f"http://127.0.0.1:{debug.port}/debug/broken")
        assert (code, body) == (500, "RuntimeError: cache gone\n")
        assert fetch(f"http://127.0.0.1:{debug.port}/healthz") == (200, "ok")  # still serving
    finally:
        plain.stop()
        debug.stop()
    with pytest.raises(ValueError, match="/debug/"):
        ObservabilityServer(
            "127.0.0.1:0",
            registry=registry,
            liveness=live,
            readiness=ready,
            debug={"/metrics2": dict},
        )


def voluntary_switches(thread: threading.Thread) -> int:
    """How often ``thread`` blocked so far (a blocked thread adds none, however busy the box)."""
    status = Path(f"/proc/self/task/{thread.native_id}/status").read_text()
    line = next(x for x in status.splitlines() if x.startswith("voluntary_ctxt_switches:"))
    return int(line.split()[1])


def settled(thread: threading.Thread) -> int:
    """The thread's switch count once it stopped switching for 0.2 s (at most ~5 s)."""
    last = voluntary_switches(thread)
    for _ in range(25):
        time.sleep(0.2)
        now = voluntary_switches(thread)
        if now == last:
            return now
        last = now
    return last


@pytest.mark.skipif(not Path("/proc/self/task").is_dir(), reason="needs Linux /proc")
def test_idle_server_thread_blocks_without_a_timer_and_stops_on_stop() -> None:
    """``serve_forever`` woke every 0.5 s to look at its shutdown flag; the
    serving thread now sleeps until a connection or `stop` (which still ends it)."""
    live, ready = HealthChecks(), HealthChecks()
    server = ObservabilityServer(
        "127.0.0.1:0", registry=CollectorRegistry(), liveness=live, readiness=ready
    )
    server.start()
    thread = server.serving_thread
    assert thread is not None
    try:
        assert fetch(f"http://127.0.0.1:{server.port}/healthz") == (200, "ok")
        before = settled(thread)
        time.sleep(1.5)  # three polls of the old loop
        assert voluntary_switches(thread) == before, "the idle serving thread woke up"
        assert fetch(f"http://127.0.0.1:{server.port}/healthz") == (200, "ok")
    finally:
        server.stop()
    assert not thread.is_alive()  # stop woke the blocked loop and it returned


def _server(**limits: float) -> ObservabilityServer:
    server = ObservabilityServer(
        "127.0.0.1:0",
        registry=CollectorRegistry(),
        liveness=HealthChecks(),
        readiness=HealthChecks(),
        **limits,  # type: ignore[arg-type]
    )
    server.start()
    return server


def _closed_by_server(conn: socket.socket) -> bytes:
    """What the server sent before it closed ``conn``; fails if it keeps it open for 30 s."""
    conn.settimeout(30)
    data = b""
    while chunk := conn.recv(4096):
        data += chunk
    return data


def test_a_connection_that_sends_no_request_is_closed_after_the_read_timeout() -> None:
    """A client that connects and sends nothing (or half a request) must not hold a thread."""
    server = _server(read_timeout=0.2)
    try:
        with socket.create_connection(("127.0.0.1", server.port)) as idle:
            assert _closed_by_server(idle) == b""
        with socket.create_connection(("127.0.0.1", server.port)) as half:
            half.sendall(b"GET /healthz HTTP/1.0\r\n")  # headers never end
            assert _closed_by_server(half) == b""
        assert fetch(f"http://127.0.0.1:{server.port}/healthz") == (200, "ok")
    finally:
        server.stop()


def test_connections_beyond_the_cap_are_answered_503_without_a_thread() -> None:
    """Two idle connections hold both slots (accepted in connect order); the third is answered
    503 at once; once one idle client leaves, probes are served again."""
    server = _server(max_connections=2)
    try:
        first = socket.create_connection(("127.0.0.1", server.port))
        second = socket.create_connection(("127.0.0.1", server.port))
        with socket.create_connection(("127.0.0.1", server.port)) as third:
            assert _closed_by_server(third).startswith(b"HTTP/1.0 503 ")
        first.close()
        eventually(
            lambda: fetch(f"http://127.0.0.1:{server.port}/healthz") == (200, "ok"),
            timeout=30,
            what="a probe served once a slot is free",
        )
        second.close()
    finally:
        server.stop()


@pytest.mark.parametrize("limits", [{"read_timeout": 0}, {"max_connections": 0}])
def test_limits_must_be_positive(limits: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="read_timeout must be > 0"):
        ObservabilityServer(
            "127.0.0.1:0",
            registry=CollectorRegistry(),
            liveness=HealthChecks(),
            readiness=HealthChecks(),
            **limits,  # type: ignore[arg-type]
        )


@pytest.mark.parametrize(
    "env",
    [
        {},
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318", "OTEL_SDK_DISABLED": "true"},
        {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:4318", "OTEL_TRACES_EXPORTER": "none"},
    ],
    ids=["unset", "sdk-disabled", "exporter-none"],
)
def test_tracing_is_noop_unless_configured(env: dict[str, str]) -> None:
    tracing = setup_tracing("svc", env=env)
    assert not tracing.enabled
    with tracing.tracer.start_as_current_span("x") as span:
        assert not span.is_recording()
    tracing.shutdown()


def test_tracing_exports_when_endpoint_configured(monkeypatch: pytest.MonkeyPatch) -> None:
    # Port 9 on loopback: nothing listens; a short exporter timeout keeps shutdown prompt.
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_TRACES_TIMEOUT", "0.2")
    env = {"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "http://127.0.0.1:9/v1/traces"}
    tracing = setup_tracing("svc", env=env)
    assert tracing.enabled
    with tracing.tracer.start_as_current_span("x") as span:
        assert span.is_recording()
    tracing.shutdown()
    tracing.shutdown()
