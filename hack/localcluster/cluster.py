"""The local control plane: etcd, kube-apiserver, kube-scheduler, kube-controller-manager.

Owns the flags each component runs with, the start order and health waits
(etcd ``/health`` -> apiserver ``/readyz`` -> scheduler and controller-manager ``/healthz``), the
on-disk layout of a cluster directory, the identities (admin, the driver's service accounts, one
``system:node:<name>`` per node) and the ``cluster.json`` state file that lets another process
(``hack/local-cluster down``) re-attach to a running cluster.

Layout of ``workdir``::

    pki/            CA, apiserver serving cert, SA key pair, tokens.csv
    kubeconfigs/    <identity>.kubeconfig (self-contained)
    etcd/           etcd data (--unsafe-no-fsync)
    certs/          self-signed serving certs of scheduler / controller-manager
    logs/           <component>.log  (other harness processes may add their own logs here)
    cluster.json    ports, pids, argv, identities (for re-attaching)
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from hostsys.ports import free_ports

from .pki import PKI, Identity, token_identity, write_kubeconfig, write_tokens_csv
from .processes import ClusterError, Proc, etcd_healthy, http_ok, tail, wait_until

DEFAULT_DRIVER_NAMESPACE = "nvidia-dra-driver"
DRIVER_SERVICE_ACCOUNTS = (
    "compute-domain-controller",
    "compute-domain-kubelet-plugin",
    "compute-domain-daemon",
)
# Fake Nodes have no kubelet: node-lifecycle (and its taint eviction) would mark them NotReady.
# Service-account admission is off, so the SA controllers are not needed either.
DEFAULT_CONTROLLERS = (
    "*",
    "-node-lifecycle-controller",
    "-taint-eviction-controller",
    "-serviceaccount-controller",
    "-serviceaccount-token-controller",
)
KUBERNETES_SERVICE_IP = "10.0.0.1"  # first address of --service-cluster-ip-range
COMPONENTS = ("etcd", "kube-apiserver", "kube-scheduler", "kube-controller-manager")
STATE_FILE = "cluster.json"


@dataclass(frozen=True)
class Ports:
    etcd_client: int
    etcd_peer: int
    apiserver: int
    scheduler: int
    controller_manager: int


def kube_minor(bin_dir: Path) -> int:
    """The minor version of ``<bin_dir>/kube-apiserver`` (``Kubernetes v1.32.9`` -> 32)."""
    out = subprocess.run(
        [str(bin_dir / "kube-apiserver"), "--version"],
        capture_output=True,
        text=True,
        check=True,
        timeout=60,
    ).stdout
    match = re.search(r"v1\.(\d+)\.", out)
    if match is None:
        raise ClusterError(f"cannot read the version of {bin_dir / 'kube-apiserver'}: {out!r}")
    return int(match.group(1))


def dra_settings(minor: int) -> tuple[dict[str, bool], str]:
    """Feature gates and ``--runtime-config`` that turn DRA on in Kubernetes 1.<minor>: nothing
    from 1.34 (GA, resource.k8s.io/v1 on by default); before, DRA is beta and off by default,
    so the gate and the beta API versions (1.32: v1beta1; 1.33: v1beta1 and v1beta2)."""
    if minor >= 34:
        return {}, ""
    versions = ["v1beta1"] + (["v1beta2"] if minor >= 33 else [])
    return (
        {"DynamicResourceAllocation": True},
        ",".join(f"resource.k8s.io/{v}=true" for v in versions),
    )


def _gates(feature_gates: Mapping[str, bool]) -> list[str]:
    if not feature_gates:
        return []
    value = ",".join(f"{k}={str(v).lower()}" for k, v in sorted(feature_gates.items()))
    return [f"--feature-gates={value}"]


def _identity_to_json(i: Identity) -> dict[str, object]:
    return {
        "name": i.name,
        "user": i.user,
        "groups": list(i.groups),
        "uid": i.uid,
        "token": i.token,
        "cert_pem": i.cert_pem.decode() if i.cert_pem else None,
        "key_pem": i.key_pem.decode() if i.key_pem else None,
    }


def _identity_from_json(d: Mapping[str, object]) -> Identity:
    groups = d["groups"]
    assert isinstance(groups, list)
    cert, key, token = d.get("cert_pem"), d.get("key_pem"), d.get("token")
    return Identity(
        name=str(d["name"]),
        user=str(d["user"]),
        groups=tuple(str(g) for g in groups),
        uid=str(d["uid"]),
        token=str(token) if token else None,
        cert_pem=str(cert).encode() if cert else None,
        key_pem=str(key).encode() if key else None,
    )


class Cluster:
    """A running local control plane. Create with :meth:`start`, or :meth:`attach` to one."""

    def __init__(
        self,
        *,
        workdir: Path,
        bin_dir: Path,
        driver_namespace: str,
        ports: Ports,
        procs: dict[str, Proc],
        identities: dict[str, Identity],
        pki: PKI | None,
    ) -> None:
        self.workdir = workdir
        self.bin_dir = bin_dir
        self.driver_namespace = driver_namespace
        self.ports = ports
        self.procs = procs
        self._identities = identities
        self._pki = pki  # None when attached: no new client certs then
        self.server = f"https://127.0.0.1:{ports.apiserver}"
        self.ca_file = workdir / "pki" / "ca.crt"
        self.log_dir = workdir / "logs"
        self.kubeconfig_dir = workdir / "kubeconfigs"
        self.die_with_parent = False  # start() sets it: restarted components inherit it
        self.apiserver_restarts = 0  # restart_apiserver() calls, see restart_controllers()

    # ------------------------------------------------------------------ lifecycle

    @classmethod
    def start(
        cls,
        bin_dir: str | Path,
        workdir: str | Path,
        *,
        driver_namespace: str = DEFAULT_DRIVER_NAMESPACE,
        node_count: int = 64,
        node_names: Iterable[str] | None = None,
        controllers: Sequence[str] = DEFAULT_CONTROLLERS,
        feature_gates: Mapping[str, bool] | None = None,
        runtime_config: str | None = None,
        advertise_address: str | None = None,
        apiserver_args: Sequence[str] = (),
        scheduler_args: Sequence[str] = (),
        controller_manager_args: Sequence[str] = (),
        verbosity: int = 2,
        die_with_parent: bool = True,
        timeout: float = 90.0,
    ) -> Cluster:
        """Start a fresh cluster in ``workdir`` (its previous cluster state is wiped).

        Static-token identities are generated before apiserver start for ``admin``, each of
        ``DRIVER_SERVICE_ACCOUNTS`` in ``driver_namespace`` and each node (``node_names`` or
        ``node-1..node-<node_count>``). ``die_with_parent`` makes the components die with this
        Python process (PR_SET_PDEATHSIG); the CLI ``up`` turns it off.

        ``advertise_address`` (real-node tier, see ``realnode``): the apiserver also listens on
        that address (it binds all addresses), serves a certificate valid for it and for the
        ``kubernetes`` Service IP, publishes it as the ``kubernetes`` endpoint, authenticates
        to kubelets with a client certificate, and ServiceAccount admission plus the
        service-account, token and node-lifecycle controllers run: pods then authenticate with
        real projected tokens and a node whose kubelet stops turns NotReady. ``controllers``
        is ignored then (all controllers run).

        Before Kubernetes 1.34 (read from ``kube-apiserver --version``) DRA is turned on as
        `dra_settings` says, in addition to ``feature_gates`` and ``runtime_config``.
        """
        bin_dir = Path(bin_dir).resolve()
        workdir = Path(workdir).resolve()
        for c in COMPONENTS:
            if not (bin_dir / c).is_file():
                raise ClusterError(f"{bin_dir / c} missing: run hack/build-control-plane.sh")
        workdir.mkdir(parents=True, exist_ok=True)
        stale = workdir / STATE_FILE
        if stale.exists():
            with contextlib.suppress(ClusterError, OSError, ValueError, KeyError):
                cls.attach(workdir).stop()
        for sub in ("pki", "kubeconfigs", "etcd", "certs", "logs", STATE_FILE):
            p = workdir / sub
            if p.is_dir():
                shutil.rmtree(p)
            elif p.exists():
                p.unlink()

        extra_ips = (advertise_address, KUBERNETES_SERVICE_IP) if advertise_address else ()
        pki = PKI(workdir / "pki", extra_ips=extra_ips)
        identities: dict[str, Identity] = {}

        def add(i: Identity) -> None:
            identities[i.name] = i

        add(token_identity("admin", "admin", ("system:masters",)))
        # Bound to the system:node-proxier ClusterRole by the apiserver's bootstrap RBAC.
        add(token_identity("kube-proxy", "system:kube-proxy", ()))
        for sa in DRIVER_SERVICE_ACCOUNTS:
            add(
                token_identity(
                    sa,
                    f"system:serviceaccount:{driver_namespace}:{sa}",
                    ("system:serviceaccounts", f"system:serviceaccounts:{driver_namespace}"),
                )
            )
        names = (
            list(node_names)
            if node_names is not None
            else [f"node-{i}" for i in range(1, node_count + 1)]
        )
        for n in names:
            add(token_identity(n, f"system:node:{n}", ("system:nodes",)))
        tokens = write_tokens_csv(workdir / "pki" / "tokens.csv", list(identities.values()))

        ports = Ports(*free_ports(5))
        cluster = cls(
            workdir=workdir,
            bin_dir=bin_dir,
            driver_namespace=driver_namespace,
            ports=ports,
            procs={},
            identities=identities,
            pki=pki,
        )
        for ident in identities.values():
            write_kubeconfig(cluster.kubeconfig_path(ident.name), cluster.server, pki.ca_pem, ident)
        admin_kc = str(cluster.kubeconfig("admin"))
        dra_gates, dra_runtime = dra_settings(kube_minor(bin_dir))
        gates = _gates({**dra_gates, **(feature_gates or {})})
        runtime_config = ",".join(x for x in (dra_runtime, runtime_config) if x) or None
        etcd_url = f"http://127.0.0.1:{ports.etcd_client}"
        peer_url = f"http://127.0.0.1:{ports.etcd_peer}"

        etcd_argv = [
            str(bin_dir / "etcd"),
            "--name=e2e",
            f"--data-dir={workdir / 'etcd'}",
            f"--listen-client-urls={etcd_url}",
            f"--advertise-client-urls={etcd_url}",
            f"--listen-peer-urls={peer_url}",
            f"--initial-advertise-peer-urls={peer_url}",
            f"--initial-cluster=e2e={peer_url}",
            "--unsafe-no-fsync=true",
            "--log-level=warn",
        ]
        if advertise_address:
            kubelet_cert, kubelet_key = pki.issue("kube-apiserver-kubelet-client", ())
            kc_cert = workdir / "pki" / "apiserver-kubelet-client.crt"
            kc_key = workdir / "pki" / "apiserver-kubelet-client.key"
            kc_cert.write_bytes(kubelet_cert)
            kc_key.write_bytes(kubelet_key)
            kc_key.chmod(0o600)
            network_args = [
                "--bind-address=0.0.0.0",
                f"--advertise-address={advertise_address}",
                "--endpoint-reconciler-type=lease",
                f"--kubelet-client-certificate={kc_cert}",
                f"--kubelet-client-key={kc_key}",
                "--kubelet-preferred-address-types=InternalIP",
                "--enable-admission-plugins=NodeRestriction,ServiceAccount",
            ]
            controllers = ("*",)
        else:
            network_args = [
                "--bind-address=127.0.0.1",
                "--advertise-address=127.0.0.1",
                "--endpoint-reconciler-type=none",
                "--enable-admission-plugins=NodeRestriction",
                "--disable-admission-plugins=ServiceAccount,TaintNodesByCondition",
            ]
        apiserver_argv = [
            str(bin_dir / "kube-apiserver"),
            f"--etcd-servers={etcd_url}",
            *network_args,
            f"--secure-port={ports.apiserver}",
            f"--cert-dir={workdir / 'certs' / 'kube-apiserver'}",
            f"--tls-cert-file={pki.serving_cert_file}",
            f"--tls-private-key-file={pki.serving_key_file}",
            f"--client-ca-file={pki.ca_file}",
            f"--token-auth-file={tokens}",
            "--authorization-mode=Node,RBAC",
            "--enable-priority-and-fairness=false",
            "--service-account-issuer=https://kubernetes.default.svc",
            f"--service-account-key-file={pki.sa_pub_file}",
            f"--service-account-signing-key-file={pki.sa_key_file}",
            "--service-cluster-ip-range=10.0.0.0/24",
            "--allow-privileged=true",
            "--profiling=false",
            f"--v={verbosity}",
            *([f"--runtime-config={runtime_config}"] if runtime_config else []),
            *gates,
            *apiserver_args,
        ]
        common = [
            f"--kubeconfig={admin_kc}",
            f"--authentication-kubeconfig={admin_kc}",
            f"--authorization-kubeconfig={admin_kc}",
            "--bind-address=127.0.0.1",
            "--leader-elect=false",
            "--authentication-skip-lookup=true",
            "--profiling=false",
            f"--v={verbosity}",
            *gates,
        ]
        scheduler_argv = [
            str(bin_dir / "kube-scheduler"),
            f"--secure-port={ports.scheduler}",
            f"--cert-dir={workdir / 'certs' / 'kube-scheduler'}",
            *common,
            *scheduler_args,
        ]
        kcm_argv = [
            str(bin_dir / "kube-controller-manager"),
            f"--secure-port={ports.controller_manager}",
            f"--cert-dir={workdir / 'certs' / 'kube-controller-manager'}",
            f"--controllers={','.join(controllers)}",
            "--use-service-account-credentials=false",
            f"--root-ca-file={pki.ca_file}",
            f"--service-account-private-key-file={pki.sa_key_file}",
            f"--cluster-signing-cert-file={pki.ca_file}",
            f"--cluster-signing-key-file={pki.ca_key_file}",
            *common,
            *controller_manager_args,
        ]

        def spawn(name: str, argv: list[str]) -> Proc:
            proc = Proc.spawn(name, argv, cluster.log_dir, die_with_parent=die_with_parent)
            cluster.procs[name] = proc
            cluster._save()
            return proc

        cluster.die_with_parent = die_with_parent
        if die_with_parent:
            atexit.register(cluster.stop)
        try:
            etcd = spawn("etcd", etcd_argv)
            wait_until(
                "etcd /health",
                lambda: http_ok(f"{etcd_url}/health", check=etcd_healthy),
                [etcd],
                timeout,
            )
            apiserver = spawn("kube-apiserver", apiserver_argv)
            wait_until(
                "kube-apiserver /readyz", cluster.apiserver_ready, [etcd, apiserver], timeout
            )
            sched = spawn("kube-scheduler", scheduler_argv)
            kcm = spawn("kube-controller-manager", kcm_argv)
            for proc, port in ((sched, ports.scheduler), (kcm, ports.controller_manager)):
                url = f"https://127.0.0.1:{port}/healthz"
                wait_until(
                    f"{proc.name} /healthz",
                    lambda url=url: http_ok(url, insecure=True),  # type: ignore[misc]
                    [etcd, apiserver, sched, kcm],
                    timeout,
                )
        except BaseException:
            cluster.stop()
            raise
        return cluster

    @classmethod
    def attach(cls, workdir: str | Path) -> Cluster:
        """Re-attach to a cluster started by another process (reads ``cluster.json``)."""
        workdir = Path(workdir).resolve()
        state = json.loads((workdir / STATE_FILE).read_text())
        return cls(
            workdir=workdir,
            bin_dir=Path(state["bin_dir"]),
            driver_namespace=state["driver_namespace"],
            ports=Ports(**state["ports"]),
            procs={p["name"]: Proc.from_json(p) for p in state["procs"]},
            identities={i["name"]: _identity_from_json(i) for i in state["identities"]},
            pki=None,
        )

    def _save(self) -> None:
        state = {
            "server": self.server,
            "bin_dir": str(self.bin_dir),
            "driver_namespace": self.driver_namespace,
            "ports": self.ports.__dict__,
            "procs": [p.to_json() for p in self.procs.values()],
            "identities": [_identity_to_json(i) for i in self._identities.values()],
        }
        path = self.workdir / STATE_FILE
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(state, indent=1))
        tmp.chmod(0o600)
        tmp.replace(path)

    def stop(self, grace: float = 10.0) -> None:
        """Stop all components (SIGTERM, then SIGKILL after ``grace`` s), controllers first.

        Idempotent; leaves the directory (logs!) in place.
        """
        order = [*(n for n in self.procs if n not in COMPONENTS), *reversed(COMPONENTS)]
        for batch in (order[:-2], order[-2:-1], order[-1:]):  # controllers, apiserver, etcd
            live = [self.procs[n] for n in batch if n in self.procs]
            for p in live:
                p.signal(signal.SIGTERM)
            for p in live:
                p.stop(grace)

    def restart_apiserver(self, down_for: float = 3.0, *, timeout: float = 90.0) -> float:
        """Crash the kube-apiserver and bring it back: an API outage of about ``down_for`` s.

        SIGKILLs the running apiserver (no graceful shutdown: open watches and requests break
        mid-stream, like a crash), keeps it down for ``down_for`` seconds, starts it again with
        the same argv (same port, certificates and etcd, so every client reconnects to the same
        address) and waits for ``/readyz``. Returns the ``time.monotonic()`` at which it
        answered ready, so callers can measure recovery from the apiserver's return. Raises
        :class:`ClusterError` if it does not come back within ``timeout``.
        """
        old = self.procs["kube-apiserver"]
        old.kill()
        time.sleep(down_for)
        proc = Proc.spawn(old.name, old.argv, self.log_dir, die_with_parent=self.die_with_parent)
        self.procs[old.name] = proc
        self._save()
        deps = [p for n, p in self.procs.items() if n in ("etcd", old.name)]
        wait_until("kube-apiserver /readyz", self.apiserver_ready, deps, timeout, interval=0.05)
        self.apiserver_restarts += 1
        return time.monotonic()

    def restart_controllers(self, *, timeout: float = 60.0) -> None:
        """Restart kube-scheduler and kube-controller-manager (SIGTERM, same argv, /healthz).

        After apiserver restarts in quick succession their client-go reflectors back off
        exponentially (0.8 s doubling to 30 s, jitter up to 2x, reset only after 2 quiet
        minutes): measured here, the scheduler's Pod, ResourceClaim and Node caches stayed stale
        for 35-50 s after the last of five restarts 13 s apart, so a pod created then waited
        that long to be bound. A test that restarted the apiserver calls this (the e2e
        conftest does it after each such test) so the next test meets a control plane as
        fresh as the session's start, not one still sleeping off the previous test's outage.
        Both run with ``--leader-elect=false``, so a new process takes over at once.
        """
        for name, port in (
            ("kube-scheduler", self.ports.scheduler),
            ("kube-controller-manager", self.ports.controller_manager),
        ):
            old = self.procs[name]
            old.signal(signal.SIGTERM)
            old.stop(10.0)
            proc = Proc.spawn(name, old.argv, self.log_dir, die_with_parent=self.die_with_parent)
            self.procs[name] = proc
            self._save()
            url = f"https://127.0.0.1:{port}/healthz"
            deps = [p for n, p in self.procs.items() if n in ("etcd", "kube-apiserver", name)]
            wait_until(
                f"{name} /healthz", functools.partial(http_ok, url, insecure=True), deps, timeout
            )

    def __enter__(self) -> Cluster:
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # ------------------------------------------------------------------ health and logs

    def apiserver_ready(self) -> bool:
        return http_ok(f"{self.server}/readyz", token=self.token("admin"), ca_file=self.ca_file)

    def running(self) -> dict[str, bool]:
        return {name: p.alive() for name, p in self.procs.items()}

    def log_path(self, name: str) -> Path:
        """Where a harness process called ``name`` should log, so dump_logs() includes it."""
        self.log_dir.mkdir(parents=True, exist_ok=True)
        return self.log_dir / f"{name}.log"

    def dump_logs(self, lines: int = 50) -> str:
        """The last ``lines`` lines of every ``logs/*.log`` (for test failure reports)."""
        parts = []
        for f in sorted(self.log_dir.glob("*.log")):
            parts.append(f"===== {f.name} (last {lines} lines) =====\n{tail(f, lines)}")
        return "\n".join(parts)

    # ------------------------------------------------------------------ identities

    @property
    def identities(self) -> dict[str, Identity]:
        return dict(self._identities)

    def identity(self, name: str) -> Identity:
        """Look up by short name (``admin``, ``node-3``, ``compute-domain-controller``) or user."""
        if name in self._identities:
            return self._identities[name]
        for i in self._identities.values():
            if i.user == name:
                return i
        raise KeyError(
            f"no identity {name!r} (node identities must exist before start "
            f"or be added with add_node_identity)"
        )

    def token(self, identity: str) -> str:
        tok = self.identity(identity).token
        if tok is None:
            raise KeyError(f"identity {identity!r} uses a client certificate, not a token")
        return tok

    def kubeconfig_path(self, identity: str) -> Path:
        return self.kubeconfig_dir / f"{identity}.kubeconfig"

    def kubeconfig(self, identity: str = "admin") -> Path:
        """Path of the kubeconfig for ``identity`` (short name or username)."""
        path = self.kubeconfig_path(self.identity(identity).name)
        if not path.exists():
            raise KeyError(f"no kubeconfig for {identity!r}")
        return path

    def add_identity(self, name: str, user: str, groups: Sequence[str]) -> Identity:
        """Add an identity after start: authenticated by a client certificate from our CA."""
        if name in self._identities:
            return self._identities[name]
        if self._pki is None:
            raise ClusterError("cannot mint client certificates for an attached cluster")
        ident = self._pki.cert_identity(name, user, tuple(groups))
        self._identities[name] = ident
        write_kubeconfig(self.kubeconfig_path(name), self.server, self._pki.ca_pem, ident)
        self._save()
        return ident

    def add_node_identity(self, name: str) -> Identity:
        """``system:node:<name>`` (group system:nodes); pre-generated token if one exists."""
        if name in self._identities:
            return self._identities[name]
        return self.add_identity(name, f"system:node:{name}", ("system:nodes",))

    def service_account_identity(self, name: str) -> Identity:
        """One of the driver's service-account identities (``DRIVER_SERVICE_ACCOUNTS``)."""
        return self.identity(f"system:serviceaccount:{self.driver_namespace}:{name}")

    def describe(self) -> str:
        """Human-readable summary (used by the CLI)."""
        rows = [
            f"server:      {self.server}",
            f"ca:          {self.ca_file}",
            f"kubeconfig:  {self.kubeconfig('admin')}",
            f"logs:        {self.log_dir}",
        ]
        rows += [
            f"{n:<24} pid {p.pid:<8} {'running' if p.alive() else 'STOPPED'}"
            for n, p in self.procs.items()
        ]
        return "\n".join(rows)


__all__ = [
    "COMPONENTS",
    "DEFAULT_CONTROLLERS",
    "DEFAULT_DRIVER_NAMESPACE",
    "DRIVER_SERVICE_ACCOUNTS",
    "Cluster",
    "ClusterError",
    "Ports",
]
