"""Wiring of the ComputeDomain kubelet plugin: builds every part from a `PluginConfig`, runs them.

The sockets, registration, DRA and health services, slice publishing, claim fetching and the
per-request fan-out are the driver-agnostic library's (`pkg.draplugin`); this module is the
ComputeDomain driver on top of it (`KubeletPlugin` is its `pkg.draplugin.fanout.ClaimDriver`:
it receives whole, allocated ResourceClaims) and owns start/stop order:
start = plugin dir -> base CDI spec (driver root scan) -> checkpoint open (corrupt policy) ->
``nvidia.com/gpu.clique`` label (opt-in; an error stops start-up before any thread runs) and
the clique refresh thread (first tick one interval later) -> domain informers -> crash/boot
recovery -> DRA socket (with device health) -> registration socket -> health -> HTTP (metrics,
probes, opt-in debug documents) -> slices;
stop = device health streams end, then the reverse (the clique label is removed after the
sockets close), then the informer factory. The node's clique ID is
`pkg.kubeletplugin.clique.CliqueRefresher`'s: every reader (Prepare, readiness lookups, the
slice's ``cliqueID`` attribute) goes through its accessor, and a refreshed ID republishes the
slice; so does a change of the domain using the node's channel (`state.channel_domain`, read
from the checkpoint at start and on every change), whose device taint the slice's ``channel-0``
carries (`claims.slice_devices`). One
`pkg.informers.SharedInformerFactory` serves every watch of the process (ComputeDomains,
driver-namespace cliques, this node's slices), and the injected `pkg.base.Clock`
drives request deadlines, checkpoint timestamps, device-health resends and the informers'
backoff. Claims of one request run in parallel (`pkg.draplugin.fanout`; different claims never
share a lock except the short node-lock sections in `state`).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass, field
from pathlib import Path

from opentelemetry import trace
from prometheus_client import CollectorRegistry

from pkg.api.constants import DRIVER_NAME, IMEX_CHANNEL_COUNT
from pkg.base.clock import Clock, RealClock
from pkg.base.types import JSON
from pkg.draplugin.claims import ClaimRef
from pkg.draplugin.fanout import ClaimFanOut
from pkg.draplugin.health import HealthServer, HealthServicer
from pkg.draplugin.registration import RegistrationServicer
from pkg.draplugin.server import PluginServers
from pkg.draplugin.slices import SlicePublisher
from pkg.imex.ctl import CommandRunner, SubprocessCommandRunner
from pkg.imex.mode import DEFAULT_HOST_SOCKET_PATH, ImexModeConfig
from pkg.informers import BackoffPolicy, SharedInformerFactory
from pkg.informers.snapshot import factory_snapshot
from pkg.kube.client import KubeClient
from pkg.kubeletplugin import procdevices
from pkg.kubeletplugin.cdi import CdiWriter
from pkg.kubeletplugin.checkpoint import (
    CheckpointStore,
    ClaimEntry,
    ClaimState,
    PreparedDevice,
    read_boot_id,
)
from pkg.kubeletplugin.checkpointformat import CheckpointCompatibility
from pkg.kubeletplugin.claims import slice_devices
from pkg.kubeletplugin.cleanup import CheckpointCleanup
from pkg.kubeletplugin.clique import (
    LABEL_REMOVAL_TIMEOUT,
    REFRESH_INTERVAL,
    CliqueLabelError,
    CliqueRefresher,
    NodeCliqueLabel,
)
from pkg.kubeletplugin.computedomains import DomainTracker, LocalRecordReader
from pkg.kubeletplugin.devicehealth import DeviceHealthMonitor
from pkg.kubeletplugin.discovery import DeviceDiscovery, NodeDevices
from pkg.kubeletplugin.discovery.fabric import select_dev_root
from pkg.kubeletplugin.driverroot import BINARY_DIRS, DriverFiles, DriverRoot, management_edits
from pkg.kubeletplugin.hostimex import HostImexCtl, HostManagedChannels
from pkg.kubeletplugin.metrics import PluginMetrics
from pkg.kubeletplugin.state import DeviceState, NodeLock, NodeSetup, channel_domain, domain_dir
from pkg.runtime.httpserver import HealthChecks, ObservabilityServer
from pkg.runtime.logsetup import V

log = logging.getLogger(__name__)

NVIDIA_GPU_MAJOR = 195


@dataclass(frozen=True)
class PluginConfig:
    node_name: str
    namespace: str
    cdi_root: Path = Path("/var/run/cdi")
    registrar_dir: Path = Path("/var/lib/kubelet/plugins_registry")
    plugins_dir: Path = Path("/var/lib/kubelet/plugins")
    proc_devices: Path = Path("/proc/devices")
    # The host's driver installation (NVIDIA_DRIVER_ROOT) and where this process sees it
    # (DRIVER_ROOT_CTR_PATH); see pkg.kubeletplugin.driverroot.
    driver_root: Path = Path("/")
    container_driver_root: Path = Path("/driver-root")
    # Only read when the node has a clique; absent in fake mode is tolerated. None: the driver
    # root's proc/driver/nvidia/capabilities/fabric-imex-mgmt if present, else /proc's.
    imex_mgmt_caps_file: Path | None = None
    healthcheck_port: int = -1
    metrics_port: int = -1
    metrics_host: str = ""
    # --metrics-path: where the metrics endpoint serves them ("": not at all).
    metrics_path: str = "/metrics"
    # Also serve /debug/informers (cache keys and resourceVersions) on the metrics endpoint.
    debug_endpoints: bool = False
    boot_id_file: Path = Path("/proc/sys/kernel/random/boot_id")
    retry_delay: float = 1.0
    # ADDITIONAL_NAMESPACES (as the controller's): daemon claims are prepared there too.
    additional_namespaces: tuple[str, ...] = ()
    # How long a Prepare waits for a just-created ComputeDomain to reach the watch cache.
    domain_grace: float = 2.0
    # --gpu-clique-label-enabled: keep nvidia.com/gpu.clique on this node (clique.py).
    gpu_clique_label: bool = False
    clique_refresh_interval: float = REFRESH_INTERVAL
    clique_label_removal_timeout: float = LABEL_REMOVAL_TIMEOUT
    # IMEX_MODE / IMEX_ISOLATION (validated by the binary) and, for host-managed mode, the
    # host IMEX control socket as seen inside the driver root (IMEX_HOST_SOCKET_PATH).
    imex: ImexModeConfig = field(default_factory=ImexModeConfig)
    imex_host_socket_path: str = DEFAULT_HOST_SOCKET_PATH
    # --checkpoint-compatibility: the oldest Go plugin the checkpoint stays readable by.
    checkpoint_compatibility: CheckpointCompatibility = CheckpointCompatibility.V0_4_1

    @property
    def plugin_dir(self) -> Path:
        return self.plugins_dir / DRIVER_NAME

    @property
    def dra_socket(self) -> Path:
        return self.plugin_dir / "dra.sock"

    @property
    def registration_socket(self) -> Path:
        return self.registrar_dir / f"{DRIVER_NAME}-reg.sock"


class KubeletPlugin:
    """The running plugin; implements `pkg.draplugin.fanout.ClaimDriver`.

    Call `start` once and `stop` once, from one thread; the claim hooks are called by the
    library's fan-out from gRPC and pool threads, concurrently.
    """

    def __init__(
        self,
        *,
        config: PluginConfig,
        client: KubeClient,
        devices: NodeDevices,
        registry: CollectorRegistry | None = None,
        clock: Clock | None = None,
        store: CheckpointStore | None = None,
        tracer: trace.Tracer | None = None,
        discovery: DeviceDiscovery | None = None,
        command_runner: CommandRunner | None = None,
    ) -> None:
        """``tracer``: per-claim request spans and this node's part of each domain's formation
        trace (default: no tracing). ``devices``: start-up discovery's result; ``discovery``:
        what the periodic clique refresh runs again (None: the clique ID stays ``devices``').

        Builds every part and starts none (`start` does, in order)."""
        self.config = config
        self._client = client
        self._tracer = tracer or trace.NoOpTracer()
        self.devices = devices
        # Runs the host's nvidia-imex-ctl in host-managed IMEX mode (tests inject a fake).
        self._command_runner: CommandRunner = command_runner or SubprocessCommandRunner()
        self.clock: Clock = clock or RealClock()
        self._monotonic = self.clock.monotonic
        self._stop = threading.Event()
        self.metrics = PluginMetrics(
            registry=registry or CollectorRegistry(), node_name=config.node_name
        )
        # Node-local state; Prepare's state and the cleanup exist once `start` opened the store.
        self.cdi = CdiWriter(root=config.cdi_root)
        self.driver_root = DriverRoot(
            host=config.driver_root, container=config.container_driver_root
        )
        self.driver_files = DriverFiles((), (), "", ())
        self.store = store or self._checkpoint_store()
        self.checkpoint_problem = ""
        self.state: DeviceState | None = None
        self.cleanup: CheckpointCleanup | None = None
        # What the cluster and the node say: the node's clique, its domains, device health.
        self.informers = self._informer_factory()
        self.clique = self._clique_refresher(discovery)
        self._clique_started = False
        self.domains = self._domain_tracker()
        self.device_health = self._device_health()
        # The kubelet-facing library (`pkg.draplugin`): claim fan-out, sockets, health, HTTP.
        self.fanout = self._claim_fanout()
        self.registration = RegistrationServicer(
            driver_name=DRIVER_NAME, endpoint=str(config.dra_socket)
        )
        self.servers = self._plugin_servers()
        self.health: HealthServer | None = None
        self.http: ObservabilityServer | None = None
        # What this node publishes: its ResourceSlice, republished on a clique or channel change.
        self._devices_lock = threading.Lock()
        self._clique_published = devices.clique_id
        self._channel_domain = ""  # the domain the slice's channel-0 is tainted for
        self.slices = self._slice_publisher()

    def _checkpoint_store(self) -> CheckpointStore:
        """The checkpoint in the plugin directory, stamped with this boot's ID."""
        cfg = self.config
        return CheckpointStore(
            directory=cfg.plugin_dir,
            boot_id=read_boot_id(cfg.boot_id_file),
            now=self.clock.now,
            compatibility=cfg.checkpoint_compatibility,
        )

    def _informer_factory(self) -> SharedInformerFactory:
        """The one informer factory of the process; failed LIST/WATCH calls back off from
        ``retry_delay`` up to 30x it (jittered)."""
        delay = self.config.retry_delay
        backoff = BackoffPolicy(initial=delay, cap=30 * delay)
        return SharedInformerFactory(self._client, clock=self.clock, backoff=backoff)

    def _clique_refresher(self, discovery: DeviceDiscovery | None) -> CliqueRefresher:
        """The node's clique ID from start-up discovery, refreshed with ``discovery``; it keeps
        the opt-in ``nvidia.com/gpu.clique`` label and republishes the slice on a change."""
        cfg = self.config
        label = (
            NodeCliqueLabel(client=self._client, node_name=cfg.node_name, clock=self.clock)
            if cfg.gpu_clique_label
            else None
        )
        return CliqueRefresher(
            initial=self.devices.clique_id,
            discovery=discovery,
            clock=self.clock,
            label=label,
            interval=cfg.clique_refresh_interval,
            on_change=self._clique_changed,
            label_removal_timeout=cfg.clique_label_removal_timeout,
        )

    def _domain_tracker(self) -> DomainTracker:
        """The domains Prepare reads (watched), with the daemons' node-local readiness."""
        cfg = self.config
        return DomainTracker(
            client=self._client,
            informers=self.informers,
            node_name=cfg.node_name,
            driver_namespace=cfg.namespace,
            clique_id=self.clique.clique_id,
            clock=self.clock,
            domain_grace=cfg.domain_grace,
            local_ready=LocalRecordReader(
                lambda uid: domain_dir(cfg.plugin_dir, uid), clock=self.clock
            ),
        )

    def _device_health(self) -> DeviceHealthMonitor:
        """Device health from the domains' daemon readiness, told of every domain change."""
        monitor = DeviceHealthMonitor(readiness=self.domains.daemon_readiness, clock=self.clock)
        self.domains.add_listener(monitor.changed)
        return monitor

    def _claim_fanout(self) -> ClaimFanOut:
        """The library's per-request fan-out, calling this driver's claim hooks."""
        return ClaimFanOut(
            driver=self,
            client=self._client,
            monotonic=self._monotonic,
            tracer=self._tracer,
            observer=self.metrics,
        )

    def _plugin_servers(self) -> PluginServers:
        """The DRA and registration sockets, serving the fan-out and device health."""
        cfg = self.config
        return PluginServers(
            handler=self.fanout,
            registration=self.registration,
            dra_socket=cfg.dra_socket,
            registration_socket=cfg.registration_socket,
            device_health=self.device_health,
        )

    def _slice_publisher(self) -> SlicePublisher:
        """This node's ResourceSlice, first with the start-up clique ID and no channel taint."""
        cfg = self.config
        return SlicePublisher(
            client=self._client,
            informers=self.informers,
            driver_name=DRIVER_NAME,
            node_name=cfg.node_name,
            devices=slice_devices(
                self.devices.clique_id,
                daemon=not cfg.imex.host_managed,
                shared=cfg.checkpoint_compatibility.keeps_share_id,
            ),
            retry_delay=cfg.retry_delay,
        )

    def _node_setup(self) -> NodeSetup:
        cfg = self.config
        major = procdevices.char_device_major(
            procdevices.IMEX_CHANNELS_DEVICE, path=cfg.proc_devices
        )
        mgmt = None
        caps_file = cfg.imex_mgmt_caps_file or self.driver_root.imex_mgmt_caps_file()
        if caps_file.exists():
            # Read even without a clique: a refresh may give the node one later. Only a node
            # that has a clique now cannot start without it.
            try:
                caps_major = procdevices.char_device_major(
                    procdevices.NVIDIA_CAPS_DEVICE, path=cfg.proc_devices
                )
                mgmt = procdevices.imex_mgmt_node(caps_file=caps_file, caps_major=caps_major)
            except (procdevices.ProcDevicesError, OSError) as err:
                if self.devices.clique_id:
                    raise
                log.log(V(4), "no fabric-imex-mgmt device node on this node: %s", err)
        return NodeSetup(
            node_name=cfg.node_name,
            clique_id=self.clique.clique_id,
            channel_nodes=procdevices.imex_channel_nodes(major, IMEX_CHANNEL_COUNT),
            imex_mgmt_node=mgmt,
            plugin_dir=cfg.plugin_dir,
            driver_namespace=cfg.namespace,
            daemon_namespaces=cfg.additional_namespaces,
        )

    def start(self) -> None:
        """Bring every part up in the order of the module docstring; the kubelet can call in
        once it returns. Raises on a broken node (procdevices, driver root) or socket."""
        cfg = self.config
        cfg.plugin_dir.mkdir(parents=True, exist_ok=True)
        setup = self._node_setup()
        # Type and major are explicit (NVIDIA GPUs are always char major 195) so CDI consumers
        # need not stat the host node: fake-GPU nodes have none, and real ones gain nothing.
        gpu_nodes = tuple(
            {
                "path": f"/dev/nvidia{g.minor}",
                "type": "c",
                "major": NVIDIA_GPU_MAJOR,
                "minor": g.minor,
            }
            for g in self.devices.gpus
            if g.minor is not None
        )
        self.driver_files = self.driver_root.scan()
        if self.driver_files.missing_imex and not cfg.imex.host_managed:
            log.warning(
                "driver root %s (mounted at %s) has no %s in %s: IMEX daemons on this node "
                "cannot start (their pods report DriverRootIncomplete); install the IMEX "
                "package in the driver root and restart this plugin",
                cfg.driver_root,
                cfg.container_driver_root,
                " or ".join(self.driver_files.missing_imex),
                ", ".join(BINARY_DIRS),
            )
        uvm_major = procdevices.optional_char_device_major(
            procdevices.NVIDIA_UVM_DEVICE, path=cfg.proc_devices
        )
        self.cdi.write_base_spec(
            management_edits(self.driver_files, uvm_major=uvm_major, extra_nodes=gpu_nodes)
        )
        report = self.store.open()
        if report.corrupt:
            self.checkpoint_problem = (
                f"checkpoint was corrupt ({report.problem}); kept as {report.moved_to}, "
                f"recovered {report.recovered} entries, lost {report.lost}"
            )
            self.metrics.checkpoint_corruptions.labels(DRIVER_NAME).inc()
        self.state = DeviceState(
            store=self.store,
            cdi=self.cdi,
            domains=self.domains,
            lock=NodeLock(cfg.plugin_dir / "pu.lock"),
            setup=setup,
            monotonic=self._monotonic,
            on_checkpoint_change=self._on_checkpoint_change,
            tracer=self._tracer,
            now=self.clock.now,
            host_imex=self._host_imex(setup),
        )
        self._on_checkpoint_change(list(self.store.entries().values()))
        try:
            self.clique.start()
        except CliqueLabelError as err:
            raise CliqueLabelError(f"error starting ComputeDomain manager: {err}") from err
        self._clique_started = True
        self.domains.start()
        self.domains.wait_synced(10.0)  # best effort: recovery reads domains
        self.state.recover(report)
        self.cleanup = CheckpointCleanup(claims=self.state, client=self._client, clock=self.clock)
        self.cleanup.start()  # the start-up pass runs before the kubelet can call in
        self.servers.start()
        if cfg.healthcheck_port >= 0:
            servicer = HealthServicer(
                registration_socket=cfg.registration_socket,
                dra_socket=cfg.dra_socket,
                registration=self.registration,
                checks={"checkpoint": lambda: not self.checkpoint_problem},
            )
            self.health = HealthServer(servicer=servicer, port=cfg.healthcheck_port)
            self.health.start()
        if cfg.metrics_port >= 0:
            self.http = self._http_server()
            self.http.start()
        self.slices.start()

    def _host_imex(self, setup: NodeSetup) -> HostManagedChannels | None:
        """Host-managed IMEX mode's channel preparer (None in driver-managed mode): it asks the
        host's IMEX through ``chroot <dev root> nvidia-imex-ctl`` (`pkg.kubeletplugin.hostimex`)."""
        cfg = self.config
        if not cfg.imex.host_managed:
            return None
        ctl = HostImexCtl(
            dev_root=select_dev_root(cfg.container_driver_root),
            socket_path=cfg.imex_host_socket_path,
            runner=self._command_runner,
        )
        return HostManagedChannels(
            ctl=ctl, clique_id=setup.clique_id, channel_nodes=setup.channel_nodes
        )

    def _http_server(self) -> ObservabilityServer:
        """Metrics at ``metrics_path`` (``/metrics``); ``/healthz`` (the process answers);
        ``/readyz`` (every cache synced); with ``debug_endpoints`` also ``/debug/informers``
        (``pkg.informers.snapshot``)."""
        cfg = self.config
        liveness, readiness = HealthChecks(), HealthChecks()
        liveness.add("ping", lambda: True)
        readiness.add("informers", lambda: self.informers.wait_for_cache_sync(0.0))

        def informers_document() -> dict[str, object]:
            return {
                "component": "compute-domain-kubelet-plugin",
                "node": cfg.node_name,
                "informers": factory_snapshot(self.informers),
            }

        debug = {"/debug/informers": informers_document} if cfg.debug_endpoints else {}
        return ObservabilityServer(
            f"{cfg.metrics_host}:{cfg.metrics_port}",
            registry=self.metrics.registry,
            metrics_path=cfg.metrics_path,
            liveness=liveness,
            readiness=readiness,
            debug=debug,
        )

    def stop(self) -> None:
        """Stop every part in reverse order; health streams end first. Call once."""
        self._stop.set()
        self.device_health.close()
        self.servers.stop()
        if self.health is not None:
            self.health.stop()
        if self.http is not None:
            self.http.stop()
        self.slices.stop()
        if self._clique_started:
            self.clique.stop()
        if self.cleanup is not None:
            self.cleanup.stop()
        self.domains.stop()
        self.informers.shutdown()
        self.fanout.shutdown()

    def _clique_changed(self, clique_id: str) -> None:
        """A refresh adopted ``clique_id``: the slice's ``cliqueID`` attribute follows."""
        self._publish_devices(clique_id=clique_id)

    def _publish_devices(self, *, clique_id: str | None = None, channel: str | None = None) -> None:
        """Publish the slice's devices with the current clique ID and the domain using the
        channel (its device taint), either given or as last published."""
        with self._devices_lock:
            if clique_id is not None:
                self._clique_published = clique_id
            if channel is not None:
                self._channel_domain = channel
            devices = slice_devices(
                self._clique_published,
                daemon=not self.config.imex.host_managed,
                channel_domain=self._channel_domain,
                shared=self.config.checkpoint_compatibility.keeps_share_id,
            )
            self.slices.set_devices(devices)

    def _on_checkpoint_change(self, entries: list[ClaimEntry]) -> None:
        domain = channel_domain(entries)
        if domain != self._channel_domain:
            self._publish_devices(channel=domain)
        self.device_health.set_prepared(entries)
        cleanup = self.cleanup
        if cleanup is not None:  # it sleeps while no entry can expire; this wakes it
            cleanup.checkpoint_changed(entries)
        self.metrics.set_prepared_devices(
            g.kind
            for e in entries
            if e.state == ClaimState.PREPARE_COMPLETED
            for g in e.groups
            for _ in g.devices
        )

    # -- pkg.draplugin.fanout.ClaimDriver ----------------------------------------------------------

    def prepare_claim(self, claim: JSON, *, deadline: float) -> tuple[PreparedDevice, ...]:
        """Prepare one allocated claim (`state.DeviceState.prepare`); `ClaimError` on failure."""
        assert self.state is not None, "plugin not started"
        return self.state.prepare(claim, deadline=deadline)

    def unprepare_claim(self, claim: ClaimRef, *, deadline: float) -> None:
        """Undo one claim (`state.DeviceState.unprepare`); `ClaimError` on failure."""
        assert self.state is not None, "plugin not started"
        self.state.unprepare(claim, deadline=deadline)
