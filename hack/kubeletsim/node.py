"""A simulated GPU node: Node object + heartbeat, the real kubelet plugin, the kubelet stand-in.

Owns the wiring of one node (:class:`SimulatedNode`): its folders and fake GPU inventory
(``layout``), the Node/Lease agent (``nodestatus``), the **real**
``compute-domain-kubelet-plugin`` process started with that node's paths and service-account
kubeconfig, the plugin watcher on its registry dir (``registration``) and the pod loop
(``kubelet``). Cluster access comes in as a :class:`FleetConfig` (see ``fleet`` for building one
from a ``localcluster.Cluster``), so nothing here knows how the control plane was started.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hostsys.ports import free_ports

from pkg.base.clock import RealClock
from pkg.kube.client import KubeClient, RestClient
from pkg.kube.config import load_api_client
from pkg.kube.errors import ApiError
from pkg.kube.events import EventRecorder
from pkg.kube.resourceapi import discover_resource_api
from pkg.kube.resources import NODES

from .cdi import CdiResolver
from .claims import DraManager
from .kubelet import Kubelet
from .layout import GPU_CLIQUE_LABEL, NodeDirs, NodeSpec
from .nodestatus import NodeAgent
from .podworker import NodeContext
from .registration import DraPlugin, PluginWatcher, kubelet_dra_services
from .runtime import REPO_ROOT, LocalCommands, driver_commands
from .tokens import TokenMinter, cluster_of

log = logging.getLogger(__name__)

DRIVER_NAME = "compute-domain.nvidia.com"
PLUGIN_SCRIPT = (
    REPO_ROOT / "cmd" / "compute-domain-kubelet-plugin" / "compute_domain_kubelet_plugin.py"
)


@dataclass
class FleetConfig:
    """How simulated nodes reach the cluster and where they keep their files."""

    root: Path
    log_dir: Path
    driver_namespace: str
    node_kubeconfig: Callable[[str], Path]  # node name -> kubeconfig (node or admin identity)
    admin_kubeconfig: Path  # mints the plugin's Node-bound token
    cdi_resolver: CdiResolver
    # True: pod-/Node-bound TokenRequest tokens (what config/admission requires);
    # False: the static-token kubeconfigs below, by ServiceAccount name.
    bound_tokens: bool = True
    static_kubeconfigs: dict[str, Path] = field(default_factory=dict)
    plugin_service_account: str = "compute-domain-kubelet-plugin"
    node_requests_pod_tokens: bool = False
    probe_period_scale: float = 1.0
    commands: LocalCommands = field(default_factory=driver_commands)
    plugin_argv: list[str] = field(default_factory=lambda: [sys.executable, str(PLUGIN_SCRIPT)])
    plugin_env: dict[str, str] = field(default_factory=dict)
    gfd_clique_label: bool = False  # set nvidia.com/gpu.clique like GPU feature discovery
    lease_period: float = 10.0
    # The plugins also serve /debug/informers on their HTTP endpoint (DEBUG_ENDPOINTS).
    debug_endpoints: bool = False
    # ``#!`` of the simulated IMEX zipapps (None: this Python with -S; see zygote/zclient.c).
    zipapp_interpreter: str | None = None


def _free_port() -> int:
    return free_ports(1)[0]  # outside the ephemeral range: see localcluster.free_ports


class SimulatedNode:
    def __init__(self, spec: NodeSpec, config: FleetConfig) -> None:
        self.spec = spec
        self.name = spec.name
        self.ip = spec.ip
        self.config = config
        self.dirs = NodeDirs(
            config.root,
            spec,
            logs=config.log_dir / f"node-{spec.name}",
            zipapp_interpreter=config.zipapp_interpreter,
        )
        node_api = load_api_client(str(config.node_kubeconfig(spec.name)))
        self._rest = RestClient(node_api, user_agent=f"kubeletsim/{spec.name}")
        self.client: KubeClient = self._rest
        server, ca_data = cluster_of(config.admin_kubeconfig)
        admin = RestClient(load_api_client(str(config.admin_kubeconfig)), user_agent="kubeletsim")
        self._admin_tokens = TokenMinter(admin, server=server, ca_data=ca_data)
        # The Node authorizer lets a node request a pod's token only for audiences the pod's
        # projected token volumes name; without ServiceAccount admission (localcluster) pods
        # have none, so by default the (identical) pod-bound token is requested as admin.
        self._pod_tokens = (
            TokenMinter(self.client, server=server, ca_data=ca_data)
            if config.node_requests_pod_tokens
            else self._admin_tokens
        )
        self.plugin_kubeconfig = self.dirs.root / "plugin.kubeconfig"
        labels = dict(spec.labels)
        if config.gfd_clique_label and spec.clique is not None:
            labels[GPU_CLIQUE_LABEL] = spec.clique.id
        self.agent = NodeAgent(
            self.client, name=spec.name, ip=spec.ip, labels=labels, lease_period=config.lease_period
        )
        self.plugins = PluginWatcher(self.dirs.registry)
        self.dra = DraManager(self.dirs.kubelet / "dra_manager_state.json")
        self.healthcheck_port = _free_port()
        self.http_port = _free_port()  # /metrics, probes (and /debug/... if enabled)
        self._plugin: subprocess.Popen[bytes] | None = None
        self.plugin_log = config.log_dir / f"plugin-{spec.name}.log"
        self.kubelet = Kubelet(
            NodeContext(
                node_name=spec.name,
                node_ip=spec.ip,
                client=self.client,
                events=EventRecorder(self.client, "kubelet", RealClock()),
                dirs=self.dirs,
                plugins=self.plugins,
                dra=self.dra,
                cdi=config.cdi_resolver,
                commands=config.commands,
                kubeconfig_for=self._kubeconfig_for,
                probe_period_scale=config.probe_period_scale,
            )
        )
        self._running = False

    def _kubeconfig_for(self, pod: dict[str, Any]) -> Path | None:
        """Like the projected SA token volume: a pod-bound token (or the static one)."""
        sa = pod["spec"].get("serviceAccountName") or "default"
        if not self.config.bound_tokens:
            return self.config.static_kubeconfigs.get(sa)
        path = self.dirs.pod_dir(pod["metadata"]["uid"]) / "kubeconfig"
        return self._pod_tokens.for_pod(pod, path)

    def _mint_plugin_kubeconfig(self) -> Path:
        sa = self.config.plugin_service_account
        if not self.config.bound_tokens:
            return self.config.static_kubeconfigs[sa]
        node = self.client.get(NODES, self.name)
        return self._admin_tokens.for_node(
            self.config.driver_namespace, sa, node, self.plugin_kubeconfig
        )

    # -- lifecycle --------------------------------------------------------------------------

    def start(self, *, plugin: bool = True) -> SimulatedNode:
        # The kubelet of the API server's release: its resource.k8s.io version (claims are
        # read in v1 shape whatever it serves) and its DRA gRPC services (1.32/1.33: v1beta1).
        api = discover_resource_api(self._rest)
        self._rest.use_resource_api(api)
        self.plugins.services = kubelet_dra_services(api.version)
        self.dirs.create()
        self.agent.start()
        self.plugins.start()
        if plugin:
            self.start_plugin()
        self.kubelet.start()
        self._running = True
        return self

    def stop(self, *, delete_node: bool = False) -> None:
        """Stop the kubelet (kills local containers), the plugin and the heartbeat."""
        self.kubelet.stop()
        self.stop_plugin()
        self.plugins.stop()
        self.agent.stop(mark_not_ready=not delete_node)
        if delete_node:
            try:
                self.client.delete(NODES, self.name)
            except ApiError as e:
                log.warning("node %s: delete failed: %s", self.name, e)
        self._running = False

    def kill_processes(self) -> None:
        """SIGKILL the plugin and every local container (no API calls): last-resort cleanup."""
        self.kill_plugin()
        for worker in self.kubelet.workers().values():
            worker.kill_processes()

    # -- the plugin process -----------------------------------------------------------------

    def plugin_env(self) -> dict[str, str]:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "PYTHONPATH": str(REPO_ROOT),
            "PYTHONUNBUFFERED": "1",
            "NODE_NAME": self.name,
            "NAMESPACE": self.config.driver_namespace,
            "POD_NAME": f"compute-domain-kubelet-plugin-{self.name}",
            "CDI_ROOT": str(self.dirs.cdi),
            "KUBELET_REGISTRAR_DIRECTORY_PATH": str(self.dirs.registry),
            "KUBELET_PLUGINS_DIRECTORY_PATH": str(self.dirs.plugins),
            "ALT_PROC_DEVICES_PATH": str(self.dirs.proc_devices),
            "NVIDIA_DRIVER_ROOT": str(self.dirs.driver_root),
            "DRIVER_ROOT_CTR_PATH": str(self.dirs.driver_root),
            "DEVICE_DISCOVERY": "fake",
            "FAKE_GPU_CONFIG": str(self.dirs.gpu_config),
            "HEALTHCHECK_PORT": str(self.healthcheck_port),
            "HTTP_ENDPOINT": self.http_endpoint,
        }
        if self.config.debug_endpoints:
            env["DEBUG_ENDPOINTS"] = "true"
        env.update(self.config.plugin_env)
        return env

    @property
    def http_endpoint(self) -> str:
        """``host:port`` of the plugin's HTTP server (the same across plugin restarts)."""
        return f"127.0.0.1:{self.http_port}"

    def start_plugin(self) -> None:
        if self.plugin_alive():
            return
        self.plugin_log.parent.mkdir(parents=True, exist_ok=True)
        env = self.plugin_env()
        env["KUBECONFIG"] = str(self._mint_plugin_kubeconfig())
        with self.plugin_log.open("ab") as log_file:
            log_file.write(f"=== {time.strftime('%H:%M:%S')} starting plugin\n".encode())
            log_file.flush()
            self._plugin = subprocess.Popen(
                self.config.plugin_argv,
                env=env,
                cwd=self.dirs.root,
                stdin=subprocess.DEVNULL,
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def plugin_alive(self) -> bool:
        return self._plugin is not None and self._plugin.poll() is None

    @property
    def plugin_pid(self) -> int | None:
        return self._plugin.pid if self.plugin_alive() and self._plugin else None

    def stop_plugin(self, grace: float = 10.0) -> None:
        p = self._plugin
        if p is None or p.poll() is not None:
            return
        os.killpg(p.pid, signal.SIGTERM)
        try:
            p.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=5)

    def kill_plugin(self) -> None:
        """SIGKILL the plugin (its sockets stay behind as stale files, like a crash)."""
        p = self._plugin
        if p is not None and p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait(timeout=5)

    def restart_plugin(self, *, kill: bool = False) -> None:
        if kill:
            self.kill_plugin()
        else:
            self.stop_plugin()
        self.start_plugin()

    def wait_plugin_registered(self, timeout: float = 60.0) -> DraPlugin:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            plugin = self.plugins.wait_for(DRIVER_NAME, 0.5)
            if plugin is not None and os.path.exists(plugin.endpoint):
                return plugin
            if self._plugin is not None and self._plugin.poll() is not None:
                raise RuntimeError(
                    f"plugin on {self.name} exited with {self._plugin.returncode}; "
                    f"log: {self.plugin_log}\n{_tail(self.plugin_log)}"
                )
        raise TimeoutError(
            f"plugin on {self.name} did not register within {timeout}s "
            f"(registration errors: {self.plugins.last_errors()}); log: {self.plugin_log}\n"
            f"{_tail(self.plugin_log)}"
        )

    # -- inspection -------------------------------------------------------------------------

    def plugin_checkpoint(self) -> Path:
        return self.dirs.plugins / DRIVER_NAME / "checkpoint.json"

    def container_records(self) -> list[Path]:
        return sorted(self.dirs.containers.glob("*.json"))


def _tail(path: Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return "<no log>"
