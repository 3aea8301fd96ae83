"""ComputeDomain conditions that name fabric problems, and ``kubectl computedomain describe``.

An nvbandwidth-style job whose workers land in two NVLink cliques (gpu-node-1/2 in clique 0,
gpu-node-5 in clique 1) turns ``SingleClique=False`` naming both cliques and their nodes, with a
Warning Event; a link between two daemons of clique 0 dropped in the simulated IMEX turns
``IMEXConnected=False`` naming who cannot reach whom, and back to True once it returns. The
installed kubectl plugin, run through kubectl itself, shows all of it on one screen.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kubeletsim import NodeFleet
from localcluster import Cluster
from testsupport.e2e_support import events_for, wait_for
from testsupport.workloads import cd_status, create_cd, start_pods, wait_bound, wait_cd_ready

from pkg.api import constants as c
from pkg.kube.client import KubeClient

pytestmark = pytest.mark.e2e

VENV_BIN = Path(sys.executable).parent


def condition(admin: KubeClient, w: Any, type_: str) -> dict[str, Any]:
    conds = cd_status(admin, w).get("conditions") or []
    return dict(next((x for x in conds if x["type"] == type_), {}))


def check_one_namespace_user(cluster: Cluster, ns: str, env: dict[str, str]) -> None:
    """``kubectl computedomain`` as a user with read rights in ``ns`` only, on the real API
    server's RBAC: the namespace's sections are shown, the driver namespace's are named as
    hidden, and ``get -A`` says what is missing."""
    user = f"viewer-{ns}"[:60]
    cluster.add_identity(user, user, ())
    for args in (
        [
            "role",
            "cd-viewer",
            "--verb=get,list",
            "--resource=computedomains.resource.nvidia.com,pods,events",
        ],
        ["rolebinding", "cd-viewer", "--role=cd-viewer", f"--user={user}"],
    ):
        made = subprocess.run(
            [str(VENV_BIN / "kubectl"), "create", "-n", ns, *args],
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert made.returncode == 0, made.stderr
    mine = {**env, "KUBECONFIG": str(cluster.kubeconfig(user))}

    def cli(*args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(VENV_BIN / "kubectl"), "computedomain", *args],
            capture_output=True,
            text=True,
            env=mine,
            timeout=60,
            check=False,
        )

    def described() -> subprocess.CompletedProcess[str] | None:
        d = cli("describe", "nvbw", "-n", ns)
        return d if d.returncode == 0 else None

    done = wait_for("RBAC for the viewer", described, timeout=30)
    out = done.stdout
    sys.stderr.write(out)
    assert "nvbw-0" in out.split("Workload pods:")[1] and "MultipleCliques" in out
    hidden = out.split("Hidden (your account may not read these; ask for read access):")[1]
    assert "cliques (IMEX state per daemon): you may not list computedomaincliques" in hidden
    assert "daemon pods: you may not list pods in all namespaces" in hidden
    assert "computedomain-daemon-" not in out
    everywhere = cli("get", "-A")
    assert everywhere.returncode == 1
    assert "you may not read ComputeDomains in all namespaces" in everywhere.stderr
    listing = json.loads(cli("get", "-n", ns, "-o", "json").stdout)
    assert [i["metadata"]["name"] for i in listing["items"]] == ["nvbw"]


def test_job_over_two_cliques_names_them_and_describe_shows_it(
    admin: KubeClient, cluster: Cluster, fleet: NodeFleet, ns: str
) -> None:
    w = create_cd(admin, ns, "nvbw")
    start_pods(admin, w, 3, ["gpu-node-1", "gpu-node-2", "gpu-node-5"])
    wait_bound(admin, w)
    st = wait_cd_ready(admin, w, 3, timeout=120)
    cliques = sorted({n["cliqueID"] for n in st["nodes"]})
    assert len(cliques) == 2

    single = wait_for(
        "SingleClique=False",
        lambda: (
            cond if (cond := condition(admin, w, "SingleClique")).get("status") == "False" else None
        ),
        timeout=30,
    )
    assert single["reason"] == "MultipleCliques"
    by_node = {n["name"]: n["cliqueID"] for n in st["nodes"]}
    for cid in cliques:
        assert f"clique {cid}: " in single["message"]
    assert f"clique {by_node['gpu-node-5']}: gpu-node-5" in single["message"]
    assert "gpu-node-1, gpu-node-2" in single["message"]
    warnings = [e for e in events_for(admin, ns, w.cd_name) if e.get("reason") == "MultipleCliques"]
    assert warnings and warnings[0]["type"] == "Warning"

    # Both daemons of clique 0 report their peer; then the link between them drops.
    wait_for(
        "IMEXConnected=True",
        lambda: condition(admin, w, "IMEXConnected").get("status") == "True",
        timeout=60,
    )
    domain_dir = fleet["gpu-node-1"].dirs.plugins / c.DRIVER_NAME / "domains" / w.cd_uid
    ip_2 = next(n["ipAddress"] for n in st["nodes"] if n["name"] == "gpu-node-2")
    drop = domain_dir / "drop-peers"
    drop.write_text(ip_2 + "\n")
    try:
        both = ("gpu-node-1 cannot reach gpu-node-2", "gpu-node-2 cannot reach gpu-node-1")

        def both_named() -> dict[str, Any] | None:  # each end reports on its own poll
            cond = condition(admin, w, "IMEXConnected")
            ok = cond.get("status") == "False" and all(t in cond["message"] for t in both)
            return cond if ok else None

        broken = wait_for("IMEXConnected=False naming both ends", both_named, timeout=60)
        assert broken["reason"] == "PeersUnreachable"

        # kubectl finds the installed plugin on PATH: one screen with all of it.
        env = {
            **os.environ,
            "PATH": f"{VENV_BIN}:{os.environ.get('PATH', '')}",
            "KUBECONFIG": str(cluster.kubeconfig("admin")),
        }
        done = subprocess.run(
            [str(VENV_BIN / "kubectl"), "computedomain", "describe", "nvbw", "-n", ns],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        out = done.stdout
        sys.stderr.write(out)
        assert "MultipleCliques" in out and "PeersUnreachable" in out
        for cid in cliques:
            assert cid in out
        assert "cannot reach gpu-node-2" in out
        for pod in w.pods:
            assert pod in out.split("Workload pods:")[1]
        assert out.count(f"{w.cd_name}-") >= 3  # workload pods listed
        assert "Daemon pods:" in out and "MultipleCliques" in out.split("Events:")[1]
        listing = subprocess.run(
            [str(VENV_BIN / "kubectl"), "computedomain", "get", "-n", ns],
            capture_output=True,
            text=True,
            env=env,
            timeout=60,
            check=False,
        )
        assert "nvbw" in listing.stdout and "3/3" in listing.stdout
        check_one_namespace_user(cluster, ns, env)
    finally:
        drop.unlink(missing_ok=True)
    wait_for(
        "IMEXConnected=True again",
        lambda: condition(admin, w, "IMEXConnected").get("status") == "True",
        timeout=60,
    )
