"""The daemon's control loop in-process: fake API server, fake IMEX process, fake clock."""

from __future__ import annotations

import json
import random
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from pkg.api import constants as c
from pkg.api import localready
from pkg.api.daemonentry import DaemonEntry
from pkg.daemon.check import LocalReadiness, run_check
from pkg.daemon.daemon import Daemon, Timing
from pkg.daemon.metrics import DaemonMetrics
from pkg.daemon.options import CDI_MISSING, Options, OptionsError, parse
from pkg.imex.ctl import CommandResult, ReadinessResult
from pkg.kube import resources as res
from pkg.kube.client import KubeClient
from pkg.testing.clock import FakeClock
from pkg.testing.eventually import eventually
from pkg.testing.fakeapiserver import FakeApiServer

REPO = Path(__file__).resolve().parents[3]
NS = "nvidia-dra-driver"
CLIQUE = "cl.1"
UID = "uid-d"


def fake_clock() -> FakeClock:
    """The daemon's loop clock: every wait returns at once, advancing virtual time."""
    return FakeClock(start=100.0, monotonic_start=100.0, advance_on_wait=True)


class FakeProcess:
    """A child that runs until a test sets ``code``; ``wait()`` blocks until then, as the
    supervisor's exit watcher needs (``Popen.wait``)."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self._code: int | None = None
        self._exited = threading.Event()
        self.signals: list[int] = []

    @property
    def code(self) -> int | None:
        return self._code

    @code.setter
    def code(self, value: int | None) -> None:
        self._code = value
        if value is not None:
            self._exited.set()

    def poll(self) -> int | None:
        return self.code

    def send_signal(self, sig: int) -> None:
        self.signals.append(sig)
        if sig == signal.SIGTERM:
            self.code = 0

    def wait(self, timeout: float | None = None) -> int:
        # Real time, but only the exit watcher waits unbounded; nothing measures it.
        if not self._exited.wait(timeout):
            raise subprocess.TimeoutExpired("nvidia-imex", timeout or 0.0)
        assert self._code is not None
        return self._code

    def kill(self) -> None:
        self.code = -9


class FakeRunner:
    def __init__(self) -> None:
        self.procs: list[FakeProcess] = []
        self.envs: list[Mapping[str, str] | None] = []
        self.argvs: list[list[str]] = []

    def start(self, argv: Sequence[str], *, env: Mapping[str, str] | None) -> FakeProcess:
        self.procs.append(FakeProcess(100 + len(self.procs)))
        self.envs.append(env)
        self.argvs.append(list(argv))
        return self.procs[-1]


class FakeCtl:
    """READY whenever the latest fake IMEX runs."""

    def __init__(self, runner: FakeRunner) -> None:
        self.runner = runner
        self.calls = 0

    def run(self, argv: Sequence[str], *, timeout: float) -> CommandResult:
        self.calls += 1
        alive = self.runner.procs and self.runner.procs[-1].code is None
        return CommandResult(0, "READY\n" if alive else "NOT_READY\n")


def options(tmp: Path, **env: str) -> Options:
    base = {
        "CLIQUE_ID": CLIQUE,
        "COMPUTE_DOMAIN_UUID": UID,
        "COMPUTE_DOMAIN_NAME": "cd",
        "COMPUTE_DOMAIN_NAMESPACE": "team",
        "NODE_NAME": "n0",
        "POD_IP": "10.0.0.1",
        "POD_UID": "pu",
        "POD_NAME": "daemon-n0",
        "POD_NAMESPACE": NS,
        "IMEX_CONFIG_DIR": str(tmp / "imexd"),
        "IMEX_HOSTS_FILE": str(tmp / "hosts"),
    }
    return parse(["run"], {**base, **env})


def make(
    api: FakeApiServer,
    opts: Options,
    *,
    timing: Timing | None = None,
    rng: random.Random | None = None,
) -> tuple[Daemon, FakeRunner, FakeCtl, DaemonMetrics]:
    """A daemon on fakes; its entry says Ready as soon as its record is written unless
    ``timing`` spreads that write (see the ``ready_write_spread`` tests)."""
    runner = FakeRunner()
    ctl = FakeCtl(runner)
    metrics = DaemonMetrics()
    daemon = Daemon(
        opts,
        client=api.client(),
        clock=fake_clock(),
        runner=runner,
        commands=ctl,
        metrics=metrics,
        child_env={"PATH": "/bin"},
        timing=timing or Timing(ready_write_spread=0.0),
        informer_clock=FakeClock(advance_on_wait=True),
        locate=lambda program: f"/usr/bin/{program}",
        rng=rng,
    )
    return daemon, runner, ctl, metrics


@contextmanager
def following(daemon: Daemon) -> Iterator[None]:
    """Run the daemon's membership informer (what ``run`` does) around direct ``step`` calls."""
    daemon.informers.start()
    eventually(lambda: daemon.informers.wait_for_cache_sync(0))
    try:
        yield
    finally:
        daemon.informers.shutdown()


def observe(daemon: Daemon, written: dict[str, Any]) -> None:
    """Wait until the daemon's informer has seen ``written`` (and woke the loop for it)."""
    rv = written["metadata"]["resourceVersion"]

    def seen() -> bool:
        snap = daemon._snapshot()
        return (
            snap is not None
            and snap[1] is not None
            and snap[1]["metadata"]["resourceVersion"] == rv
        )

    eventually(seen)
    eventually(daemon._kick.is_set)


def own_entry(api: FakeApiServer) -> dict[str, object]:
    (clique,) = api.objects(res.COMPUTE_DOMAIN_CLIQUES)
    (entry,) = clique["daemons"]
    return dict(entry)


def seed_clique(client: KubeClient, daemons: list[tuple[str, str, int]]) -> None:
    """Our domain's clique, holding Ready entries (node, IP, index) of other daemons."""
    client.create(
        res.COMPUTE_DOMAIN_CLIQUES,
        {
            "apiVersion": c.API_VERSION,
            "kind": c.COMPUTE_DOMAIN_CLIQUE_KIND,
            "metadata": {
                "name": f"{UID}.{CLIQUE}",
                "namespace": NS,
                "labels": {c.COMPUTE_DOMAIN_LABEL: UID, c.CLIQUE_ID_LABEL: CLIQUE},
            },
            "daemons": [
                {
                    "nodeName": node,
                    "ipAddress": ip,
                    "cliqueID": CLIQUE,
                    "index": index,
                    "status": "Ready",
                }
                for node, ip, index in daemons
            ],
        },
        namespace=NS,
    )


def test_step_joins_starts_imex_and_tracks_readiness(api: FakeApiServer, tmp_path: Path) -> None:
    daemon, runner, _, metrics = make(api, options(tmp_path))
    daemon.label_pod()
    daemon._write_imex_config()
    daemon.step()
    assert len(runner.procs) == 1
    assert runner.argvs[0] == ["nvidia-imex", "-c", str(tmp_path / "imexd" / "imexd.cfg")]
    env = runner.envs[0]
    assert env is not None and env["IMEX_HOSTS_FILE"] == str(tmp_path / "hosts")
    assert env["IMEX_DOMAIN_ID"] == UID and env["PATH"] == "/bin"
    assert own_entry(api)["status"] == c.STATUS_READY
    assert metrics.registry.get_sample_value("compute_domain_daemon_imex_ready") == 1
    pod = api.objects(res.PODS)[0]
    assert pod["metadata"]["labels"] == {c.CLIQUE_ID_LABEL: CLIQUE}

    runner.procs[0].code = 1  # IMEX crashes: NotReady at once, restarted after backoff
    daemon.step()
    assert own_entry(api)["status"] == c.STATUS_NOT_READY
    assert len(runner.procs) == 1
    daemon.supervisor._clock.step(1.0)  # type: ignore[attr-defined]
    daemon.step()
    daemon.step()
    assert len(runner.procs) == 2 and own_entry(api)["status"] == c.STATUS_READY
    assert metrics.registry.get_sample_value("compute_domain_daemon_imex_restarts_total") == 1


def test_entry_removed_externally_is_restored(api: FakeApiServer, tmp_path: Path) -> None:
    daemon, _, _, _ = make(api, options(tmp_path))
    daemon._write_imex_config()
    with following(daemon):
        daemon.step()
        client = api.client()
        (clique,) = api.objects(res.COMPUTE_DOMAIN_CLIQUES)
        clique["daemons"] = []
        daemon._kick.clear()
        observe(daemon, client.update(res.COMPUTE_DOMAIN_CLIQUES, clique))
        assert daemon._snapshot() == ([], api.objects(res.COMPUTE_DOMAIN_CLIQUES)[0])
        daemon.step()
    assert own_entry(api)["index"] == 0 and own_entry(api)["status"] == c.STATUS_READY
    # One field-selected watch on the membership object, no polling of it.
    watches = [r for r in api.requests if r.query.get("watch") in ("true", "1")]
    assert watches and all(
        r.query.get("fieldSelector") == f"metadata.name={UID}.{CLIQUE}" for r in watches
    )


def test_run_and_shutdown_removes_entry(
    api: FakeApiServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level("INFO", logger="pkg.daemon.daemon")
    daemon, runner, _, _ = make(api, options(tmp_path, METRICS_ADDRESS="127.0.0.1:0"))
    stop = threading.Event()
    ran = threading.Thread(target=daemon.run, args=(stop,))
    ran.start()
    try:
        for _ in range(400):
            cliques = api.objects(res.COMPUTE_DOMAIN_CLIQUES)
            if cliques and cliques[0].get("daemons") and daemon._metrics._server is not None:
                break
            threading.Event().wait(0.01)
        server = daemon._metrics._server
        assert server is not None
        host, port = server.server_address[:2]
        body = urllib.request.urlopen(f"http://{host!s}:{port}/metrics", timeout=5).read().decode()
        assert "compute_domain_daemon_imex_ready" in body
        assert "compute_domain_daemon_imex_restarts_total" in body
    finally:
        stop.set()
        daemon.wake()
        ran.join(20)
    assert not ran.is_alive()
    assert api.objects(res.COMPUTE_DOMAIN_CLIQUES)[0]["daemons"] == []
    assert runner.procs[0].signals[-1] == signal.SIGTERM
    # Upstream's line, which its e2e tests grep for.
    assert (
        f"Successfully removed daemon with IP 10.0.0.1 from CDClique {UID}.{CLIQUE} "
        "(from ComputeDomain team/cd)"
    ) in caplog.messages


def test_non_nvlink_node_runs_nothing(api: FakeApiServer, tmp_path: Path) -> None:
    daemon, runner, _, _ = make(api, options(tmp_path, CLIQUE_ID=""))
    stop = threading.Event()
    stop.set()
    assert daemon.run(stop) == 0
    assert runner.procs == [] and api.objects(res.COMPUTE_DOMAIN_CLIQUES) == []
    assert api.objects(res.PODS)[0]["metadata"]["labels"] == {c.CLIQUE_ID_LABEL: ""}
    assert not (tmp_path / "imexd").exists()
    ok, msg = run_check(daemon.opts, FakeCtl(runner))
    assert ok and msg == "check succeeded (noop, clique ID is empty)"


def test_probe_and_loop_ask_one_readiness_rule(api: FakeApiServer, tmp_path: Path) -> None:
    """The loop's Ready and the probe's answer come from the same `LocalReadiness`: no clique
    is ready without running nvidia-imex-ctl; with one, READY from the ctl and nothing else."""
    daemon, runner, ctl, _ = make(api, options(tmp_path))
    assert isinstance(daemon.readiness, LocalReadiness) and daemon.ctl is daemon.readiness.ctl
    assert not daemon.readiness.query().ready and ctl.calls == 1  # no IMEX runs yet
    runner.procs.append(FakeProcess(1))
    assert daemon.readiness.query() == ReadinessResult(True, "READY") and ctl.calls == 2
    none = LocalReadiness(options(tmp_path, CLIQUE_ID=""), ctl)
    assert none.query().ready and not none.has_clique and ctl.calls == 2


def test_check_requires_exact_ready(tmp_path: Path) -> None:
    runner = FakeRunner()
    ok, msg = run_check(options(tmp_path), FakeCtl(runner))
    assert not ok and "NOT_READY" in msg
    runner.procs.append(FakeProcess(1))
    assert run_check(options(tmp_path), FakeCtl(runner))[0]


def test_cli_reports_missing_cdi_edits() -> None:
    done = subprocess.run(
        [sys.executable, str(REPO / "cmd/compute-domain-daemon/compute_domain_daemon.py"), "run"],
        env={"PATH": "/usr/bin:/bin"},
        capture_output=True,
        text=True,
        cwd="/",
        check=False,
    )
    assert done.returncode == 1
    assert CDI_MISSING in done.stderr


def test_ip_mode_uses_cd_status_and_waits_for_num_nodes(api: FakeApiServer, tmp_path: Path) -> None:
    cd = api.seed(
        res.COMPUTE_DOMAINS,
        {
            "apiVersion": c.API_VERSION,
            "kind": c.COMPUTE_DOMAIN_KIND,
            "metadata": {"name": "cd", "namespace": "team"},
            "spec": {"numNodes": 2, "channel": {"resourceClaimTemplate": {"name": "r"}}},
        },
    )
    gates = "IMEXDaemonsWithDNSNames=false,ComputeDomainCliques=false"
    opts = options(tmp_path, FEATURE_GATES=gates, COMPUTE_DOMAIN_UUID=cd["metadata"]["uid"])
    daemon, runner, _, _ = make(api, opts)
    daemon._write_imex_config()
    with following(daemon):
        daemon.step()
        assert runner.procs == []  # barrier: 1 of 2
        client = api.client()
        obj = client.get(res.COMPUTE_DOMAINS, "cd", namespace="team")
        assert [n["name"] for n in obj["status"]["nodes"]] == ["n0"]
        obj["status"]["nodes"].append(
            {
                "name": "n1",
                "ipAddress": "10.0.0.2",
                "cliqueID": CLIQUE,
                "index": 1,
                "status": "NotReady",
            }
        )
        daemon._kick.clear()
        observe(daemon, client.update(res.COMPUTE_DOMAINS, obj, subresource="status"))
        daemon.step()
    assert len(runner.procs) == 1
    assert (tmp_path / "imexd" / "nodes.cfg").read_text() == "10.0.0.1\n10.0.0.2\n"
    assert not (tmp_path / "hosts").exists()


def test_restarted_daemon_takes_back_ready_before_it_starts_imex(
    api: FakeApiServer, tmp_path: Path
) -> None:
    """SIGKILL or OOM kill of the daemon: the kubelet restarts the container in the same pod
    (same IP), which finds the entry its predecessor left Ready. Until its own IMEX is up
    the plugin must not release workloads against it."""
    client = api.client()
    seed_clique(client, [("n0", "10.0.0.1", 0)])
    daemon, runner, _, _ = make(api, options(tmp_path))
    seen_at_start: list[object] = []
    start = runner.start

    def recording_start(argv: Sequence[str], *, env: Mapping[str, str] | None) -> FakeProcess:
        seen_at_start.append(own_entry(api)["status"])
        return start(argv, env=env)

    runner.start = recording_start  # type: ignore[method-assign]
    daemon._write_imex_config()
    with following(daemon):
        api.clear_log()
        daemon.step()
    assert seen_at_start == [c.STATUS_NOT_READY]
    assert own_entry(api)["status"] == c.STATUS_READY and own_entry(api)["index"] == 0
    # NotReady (a guarded PUT: our pod becomes an owner), Ready (a patch of our own entry)
    assert [m for m, _ in api.request_log if m in ("PUT", "PATCH")] == ["PUT", "PATCH"]


def test_full_clique_is_reported_once_and_retried_slowly(
    api: FakeApiServer, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    seed_clique(api.client(), [(f"x{i}", f"10.0.1.{i}", i) for i in range(2)])
    daemon, runner, _, _ = make(api, options(tmp_path, MAX_NODES_PER_IMEX_DOMAIN="2"))
    clock = fake_clock()
    daemon._clock = clock
    stop = threading.Event()
    clock.on_wait = lambda _w: stop.set() if len(clock.waits) >= 5 else None
    ran = threading.Thread(target=daemon.run, args=(stop,))
    with caplog.at_level("DEBUG", logger="pkg.daemon.daemon"):
        ran.start()
        ran.join(20)
    assert not ran.is_alive()
    errors = [r.getMessage() for r in caplog.records if r.levelname == "ERROR"]
    assert len(errors) == 1 and "MAX_NODES_PER_IMEX_DOMAIN=2" in errors[0]
    assert "cannot join ComputeDomainClique" in errors[0]
    assert set(clock.waits[:5]) == {Timing().slow_interval}  # no fast retry loop
    assert runner.procs == []  # IMEX never starts without a slot


def test_readiness_of_a_fresh_imex_is_polled_at_once_then_backing_off(
    api: FakeApiServer, tmp_path: Path
) -> None:
    """At once after IMEX starts, then 0.05, 0.1, 0.2, 0.4, 0.5 s apart; steps in between
    (membership changes) do not query it; a restarted IMEX is polled at once again."""
    daemon, runner, ctl, _ = make(api, options(tmp_path))
    answers = ["NOT_READY\n"] * 6
    polled: list[float] = []
    clock = daemon._clock

    def run(argv: Sequence[str], *, timeout: float) -> CommandResult:
        polled.append(round(clock.monotonic() - 100.0, 3))
        return CommandResult(0, answers.pop(0) if answers else "READY\n")

    ctl.run = run  # type: ignore[method-assign]
    daemon._write_imex_config()
    for _ in range(3):
        daemon.step()  # one poll (at 0): not due again within these steps
    assert polled == [0.0] and len(runner.procs) == 1
    while own_entry(api)["status"] != c.STATUS_READY:
        clock.step(0.01)  # type: ignore[attr-defined]
        daemon.step()
    assert polled == [0.0, 0.05, 0.15, 0.35, 0.75, 1.25, 1.75]
    runner.procs[0].code = 1  # dies: NotReady; the restarted one is polled at once
    daemon.step()
    daemon.supervisor._clock.step(1.0)  # type: ignore[attr-defined]
    polled.clear()
    daemon.step()
    assert len(runner.procs) == 2 and polled == [round(clock.monotonic() - 100.0, 3)]


def record_timeouts(clock: FakeClock) -> list[float | None]:
    """Every timeout the loop waits with, ``None`` (until kicked) included."""
    timeouts: list[float | None] = []
    wait = clock.wait

    def recording(event: threading.Event, timeout: float | None) -> bool:
        timeouts.append(timeout)
        return wait(event, timeout)

    clock.wait = recording  # type: ignore[method-assign]
    return timeouts


def test_loop_sleeps_until_kicked_while_imex_waits_for_its_barrier(
    api: FakeApiServer, tmp_path: Path
) -> None:
    """IP mode behind its numNodes barrier: IMEX does not run and nothing else is due, so the
    loop sleeps until something changes (a kick), with no timeout at all: it woke every 0.5 s
    (fast_interval) before, and spun every 10 ms in a first version."""
    cd = api.seed(
        res.COMPUTE_DOMAINS,
        {
            "apiVersion": c.API_VERSION,
            "kind": c.COMPUTE_DOMAIN_KIND,
            "metadata": {"name": "cd", "namespace": "team"},
            "spec": {"numNodes": 2, "channel": {"resourceClaimTemplate": {"name": "r"}}},
        },
    )
    gates = "IMEXDaemonsWithDNSNames=false,ComputeDomainCliques=false"
    opts = options(tmp_path, FEATURE_GATES=gates, COMPUTE_DOMAIN_UUID=cd["metadata"]["uid"])
    daemon, runner, _, _ = make(api, opts)
    clock = daemon._clock
    assert isinstance(clock, FakeClock)
    timeouts = record_timeouts(clock)
    stop = threading.Event()
    ran = threading.Thread(target=daemon.run, args=(stop,))
    ran.start()
    try:
        eventually(lambda: timeouts)  # the first pass is done: asleep
        daemon.wake()  # a membership event: one more pass, then asleep again
        eventually(lambda: len(timeouts) >= 2)
        assert set(timeouts) == {None} and runner.procs == []
    finally:
        stop.set()
        daemon.wake()
        ran.join(20)
    assert not ran.is_alive()


def test_first_peer_poll_waits_one_interval_after_ready(api: FakeApiServer, tmp_path: Path) -> None:
    """A fresh IMEX is still connecting to its peers: polling it at once would publish a partial
    count (one more write per daemon while a domain forms); the first poll comes one
    peer_interval after Ready, then every peer_interval."""
    seed_clique(api.client(), [("x1", "10.0.1.1", 1)])
    daemon, _, ctl, _ = make(api, options(tmp_path))
    polls: list[float] = []
    clock = daemon._clock
    answer = ctl.run

    def run(argv: Sequence[str], *, timeout: float) -> CommandResult:
        if "-N" in argv:
            polls.append(round(clock.monotonic() - 100.0, 3))
            return CommandResult(1, "")
        return answer(argv, timeout=timeout)

    ctl.run = run  # type: ignore[method-assign]
    daemon._write_imex_config()
    with following(daemon):
        daemon.step()
        assert own_entry_of(api, "n0")["status"] == c.STATUS_READY
        ready_at = round(clock.monotonic() - 100.0, 3)
        for _ in range(12):
            clock.step(1.0)  # type: ignore[attr-defined]
            daemon.step()
    interval = Timing().peer_interval
    assert polls == [ready_at + interval, ready_at + 2 * interval]


def own_entry_of(api: FakeApiServer, node: str) -> dict[str, object]:
    (clique,) = api.objects(res.COMPUTE_DOMAIN_CLIQUES)
    return next(dict(e) for e in clique["daemons"] if e["nodeName"] == node)


def test_the_join_does_not_wait_for_the_pod_label(api: FakeApiServer, tmp_path: Path) -> None:
    """Labelling the pod (for the controller) runs beside the loop: a slow pod PATCH does not
    delay the join and the Ready write that the domain's other daemons wait for."""
    api.inject_stall("PATCH", res.PODS, 3.0)
    daemon, _, _, _ = make(api, options(tmp_path))
    stop = threading.Event()
    ran = threading.Thread(target=daemon.run, args=(stop,))
    started = time.monotonic()
    ran.start()
    try:
        eventually(
            lambda: (
                bool(api.objects(res.COMPUTE_DOMAIN_CLIQUES))
                and own_entry(api)["status"] == c.STATUS_READY
            ),
            timeout=2.5,
        )
        assert time.monotonic() - started < 2.9
        assert not api.objects(res.PODS)[0]["metadata"].get("labels")
    finally:
        stop.set()
        ran.join(20)
    assert not ran.is_alive()
    assert api.objects(res.PODS)[0]["metadata"]["labels"] == {c.CLIQUE_ID_LABEL: CLIQUE}


def clique_writes(api: FakeApiServer) -> list[str]:
    return [
        m
        for m, p in api.request_log
        if m in ("POST", "PUT", "PATCH") and "computedomaincliques" in p
    ]


def test_with_the_controller_writing_entries_the_daemon_waits_for_its_own(
    api: FakeApiServer, tmp_path: Path
) -> None:
    """CLIQUE_JOIN_BY_CONTROLLER=true (our DaemonSets): no join of its own while the entry
    is coming; the entry the controller wrote is taken as is (no write), IMEX starts, and
    only the Ready is the daemon's write."""
    opts = options(tmp_path, **{c.CLIQUE_JOIN_BY_CONTROLLER_ENV: "true"})
    assert opts.join_by_controller
    daemon, runner, _, _ = make(api, opts)
    daemon._write_imex_config()
    client = api.client()
    with following(daemon):
        api.request_log.clear()
        daemon.step()
        daemon.step()
        assert clique_writes(api) == [] and runner.procs == []
        seed_clique(client, [("n1", "10.0.0.2", 0)])
        (clique,) = api.objects(res.COMPUTE_DOMAIN_CLIQUES)
        clique["daemons"].append(
            {
                "nodeName": "n0",
                "ipAddress": "10.0.0.1",
                "cliqueID": CLIQUE,
                "index": 1,
                "status": "NotReady",
            }
        )
        clique["metadata"]["ownerReferences"] = [
            {"apiVersion": "v1", "kind": "Pod", "name": "daemon-n0", "uid": "pu"}
        ]
        daemon._kick.clear()
        observe(daemon, client.update(res.COMPUTE_DOMAIN_CLIQUES, clique))
        api.request_log.clear()
        daemon.step()
    assert len(runner.procs) == 1
    assert clique_writes(api) == ["PATCH"]  # only its own Ready
    entry = own_entry_of(api, "n0")
    assert (entry["index"], entry["status"]) == (1, c.STATUS_READY)


def test_without_an_entry_from_the_controller_the_daemon_joins_after_the_grace(
    api: FakeApiServer, tmp_path: Path
) -> None:
    opts = options(tmp_path, **{c.CLIQUE_JOIN_BY_CONTROLLER_ENV: "true"})
    daemon, runner, _, _ = make(api, opts)
    daemon._write_imex_config()
    clock = daemon._clock
    assert isinstance(clock, FakeClock)
    with following(daemon):
        daemon.step()
        clock.step(Timing().controller_join_grace - 0.1)
        daemon.step()
        assert api.objects(res.COMPUTE_DOMAIN_CLIQUES) == [] and runner.procs == []
        clock.step(0.2)
        daemon.step()
    assert own_entry(api)["status"] == c.STATUS_READY and len(runner.procs) == 1


def test_join_by_controller_must_be_true_or_false(tmp_path: Path) -> None:
    assert not options(tmp_path).join_by_controller
    assert not options(tmp_path, **{c.CLIQUE_JOIN_BY_CONTROLLER_ENV: "false"}).join_by_controller
    with pytest.raises(OptionsError, match=c.CLIQUE_JOIN_BY_CONTROLLER_ENV):
        options(tmp_path, **{c.CLIQUE_JOIN_BY_CONTROLLER_ENV: "yes please"})


def test_progress_of_the_connected_count_is_rewritten_at_most_every_peer_count_interval(
    api: FakeApiServer, tmp_path: Path
) -> None:
    """While peers keep connecting, each poll sees one more; rewriting the shared clique for
    each was most of a large domain's writes. The first report, a newly unreachable peer and
    "all connected" are written at once; progress alone at most every peer_count_interval."""
    peers = [(f"x{i}", f"10.0.1.{i}", i) for i in range(1, 6)]
    seed_clique(api.client(), peers)
    daemon, _, ctl, _ = make(api, options(tmp_path))
    clock = daemon._clock
    assert isinstance(clock, FakeClock)
    connected = [0]
    answer = ctl.run

    def run(argv: Sequence[str], *, timeout: float) -> CommandResult:
        if "-N" in argv:
            conns = {
                str(i): {"host": ip, "status": "CONNECTED"}
                for i, (_, ip, _) in enumerate(peers[: connected[0]])
            }
            own = {"host": "10.0.0.1", "connections": conns}
            return CommandResult(0, json.dumps({"nodes": {"0": own}}))
        return answer(argv, timeout=timeout)

    ctl.run = run  # type: ignore[method-assign]
    daemon._write_imex_config()
    interval = Timing().peer_interval

    def poll(count: int) -> tuple[object, object]:
        connected[0] = count
        clock.step(interval)
        daemon.step()
        entry = own_entry_of(api, "n0")
        return entry.get("connectedPeers"), entry.get("unreachablePeers")

    with following(daemon):
        daemon.step()
        assert poll(1) == (1, [])  # first report: at once (not-connected peers are suspects)
        assert poll(2) == (2, ["x3", "x4", "x5"])  # newly unreachable: at once
        assert poll(3) == (2, ["x3", "x4", "x5"])  # progress only: held back
        assert poll(4) == (2, ["x3", "x4", "x5"])
        assert poll(5) == (5, [])  # all connected: at once
        assert poll(4) == (5, [])  # x5 dropped: a suspect first, only the count moved: held
        assert poll(4) == (4, ["x5"])  # newly unreachable: at once
        assert poll(5) == (5, [])  # resolved: at once
    assert Timing().peer_count_interval > 4 * interval


def test_a_peer_that_is_not_ready_is_never_reported_unreachable(
    api: FakeApiServer, tmp_path: Path
) -> None:
    """A NotReady peer's IMEX cannot be connected (yet); listing it as unreachable was a
    write per daemon for every member still starting."""
    seed_clique(api.client(), [("x1", "10.0.1.1", 1), ("x2", "10.0.1.2", 2)])
    (clique,) = api.objects(res.COMPUTE_DOMAIN_CLIQUES)
    clique["daemons"][1]["status"] = c.STATUS_NOT_READY
    api.client().update(res.COMPUTE_DOMAIN_CLIQUES, clique)
    daemon, _, ctl, _ = make(api, options(tmp_path))
    clock = daemon._clock
    assert isinstance(clock, FakeClock)
    answer = ctl.run

    def run(argv: Sequence[str], *, timeout: float) -> CommandResult:
        if "-N" in argv:
            conns = {"1": {"host": "10.0.1.1", "status": "CONNECTED"}}
            own = {"host": "10.0.0.1", "connections": conns}
            return CommandResult(0, json.dumps({"nodes": {"0": own}}))
        return answer(argv, timeout=timeout)

    ctl.run = run  # type: ignore[method-assign]
    daemon._write_imex_config()
    with following(daemon):
        daemon.step()
        for _ in range(4):
            clock.step(Timing().peer_interval)
            daemon.step()
    entry = own_entry_of(api, "n0")
    assert (entry["connectedPeers"], entry["unreachablePeers"]) == (1, [])


def record_path(tmp: Path) -> Path:
    return tmp / "imexd" / localready.FILE_NAME


def test_the_node_local_record_precedes_ready_and_follows_not_ready(
    api: FakeApiServer, tmp_path: Path
) -> None:
    """The plugin releases a workload on the record or the entry: the record goes out before
    the entry says Ready and is gone before it says anything else."""
    daemon, runner, _, _ = make(api, options(tmp_path))
    seen: list[tuple[str, bool]] = []
    set_status = daemon.membership.set_status

    def recording(status: str) -> Any:
        seen.append((status, record_path(tmp_path).exists()))
        return set_status(status)

    daemon.membership.set_status = recording  # type: ignore[method-assign]
    daemon._take_local_lock()  # what run() does first
    daemon._write_imex_config()
    daemon.step()
    assert seen == [(c.STATUS_NOT_READY, False), (c.STATUS_READY, True)]
    assert localready.read(tmp_path / "imexd") == localready.LocalReady(UID, "n0", "10.0.0.1")

    seen.clear()
    runner.procs[0].code = 1  # IMEX crashes
    daemon.step()
    assert seen == [(c.STATUS_NOT_READY, False)]
    daemon.supervisor._clock.step(1.0)  # type: ignore[attr-defined]
    daemon.step()
    daemon.step()
    assert seen[-1] == (c.STATUS_READY, True) and len(runner.procs) == 2


class FixedDraw(random.Random):
    """``uniform(a, b)`` is ``a + share * (b - a)``."""

    def __init__(self, share: float) -> None:
        super().__init__(0)
        self.share = share

    def uniform(self, a: float, b: float) -> float:
        return a + self.share * (b - a)


def test_the_entrys_ready_follows_the_record_after_a_random_share_of_the_spread(
    api: FakeApiServer, tmp_path: Path
) -> None:
    """The daemons one controller batch joined turn ready together: each holds its entry's
    Ready back by ``uniform(0, ready_write_spread)`` after its record released the workload,
    so their patches of the one clique do not pile up; a crash in between cancels it."""
    daemon, runner, _, _ = make(
        api, options(tmp_path), timing=Timing(ready_write_spread=0.3), rng=FixedDraw(0.5)
    )
    clock = daemon._clock
    daemon._take_local_lock()
    daemon._write_imex_config()
    daemon.step()
    assert localready.read(tmp_path / "imexd") is not None  # the workload may start
    assert own_entry(api)["status"] == c.STATUS_NOT_READY
    clock.step(0.14)  # type: ignore[attr-defined]
    daemon.step()
    assert own_entry(api)["status"] == c.STATUS_NOT_READY
    clock.step(0.01)  # type: ignore[attr-defined]
    daemon.step()
    assert own_entry(api)["status"] == c.STATUS_READY
    runner.procs[0].code = 1  # IMEX crashes: NotReady at once, and the next Ready waits again
    daemon.step()
    assert own_entry(api)["status"] == c.STATUS_NOT_READY
    daemon.supervisor._clock.step(1.0)  # type: ignore[attr-defined]
    daemon.step()
    daemon.step()
    assert len(runner.procs) == 2 and localready.read(tmp_path / "imexd") is not None
    assert own_entry(api)["status"] == c.STATUS_NOT_READY
    clock.step(0.15)  # type: ignore[attr-defined]
    daemon.step()
    assert own_entry(api)["status"] == c.STATUS_READY


def test_without_a_record_the_entry_says_ready_at_once(api: FakeApiServer, tmp_path: Path) -> None:
    """No lock (another process holds it), no record: only the entry releases the workload,
    so nothing holds it back."""
    daemon, _, _, _ = make(
        api, options(tmp_path), timing=Timing(ready_write_spread=0.3), rng=FixedDraw(1.0)
    )
    daemon._write_imex_config()
    daemon.step()
    assert localready.read(tmp_path / "imexd") is None
    assert own_entry(api)["status"] == c.STATUS_READY


def test_no_record_while_the_entry_carries_another_ip(api: FakeApiServer, tmp_path: Path) -> None:
    """A record speaks for the entry with our IP; while ours is not written yet, none."""
    daemon, _, _, _ = make(api, options(tmp_path))
    daemon._ready = True
    own = DaemonEntry("n0", "10.0.0.1", CLIQUE, 0, c.STATUS_NOT_READY)
    daemon._signal_node(own)
    assert not record_path(tmp_path).exists()  # no lock, no record
    daemon._take_local_lock()
    daemon._signal_node(None)
    assert not record_path(tmp_path).exists()
    daemon._signal_node(DaemonEntry("n0", "10.9.9.9", CLIQUE, 0, c.STATUS_NOT_READY))
    assert not record_path(tmp_path).exists()
    daemon._signal_node(own)
    assert localready.read(tmp_path / "imexd") == localready.LocalReady(UID, "n0", "10.0.0.1")
    daemon.local.abandon()  # the process is gone: the lock is free, the record counts no more
    assert record_path(tmp_path).exists() and localready.read(tmp_path / "imexd") is None


def test_a_new_process_withdraws_the_record_it_finds_and_shutdown_withdraws_its_own(
    api: FakeApiServer, tmp_path: Path
) -> None:
    """A daemon restarted in the same pod finds its predecessor's record: it must not speak
    for an IMEX that is not up yet."""
    predecessor = localready.Publisher(tmp_path / "imexd")
    assert predecessor.acquire()
    predecessor.publish(localready.LocalReady(UID, "n0", "10.0.0.1"))
    predecessor.abandon()  # killed: its record stays behind
    daemon, runner, _, _ = make(api, options(tmp_path))
    at_start: list[bool] = []
    start = runner.start

    def recording_start(argv: Sequence[str], *, env: Mapping[str, str] | None) -> FakeProcess:
        at_start.append(record_path(tmp_path).exists())
        return start(argv, env=env)

    runner.start = recording_start  # type: ignore[method-assign]
    stop = threading.Event()
    ran = threading.Thread(target=daemon.run, args=(stop,))
    ran.start()
    try:
        eventually(lambda: at_start == [False])
        eventually(record_path(tmp_path).exists)  # ours, once its IMEX is READY
    finally:
        stop.set()
        daemon.wake()
        ran.join(20)
    assert not ran.is_alive()
    assert not record_path(tmp_path).exists()
