# ruff: noqa: E501, E741  (test fixtures read best one object per line)
"""``kubectl computedomain get/describe`` against the fake API server."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import yaml
from testsupport.cliseed import NS, seed_domain

from pkg.api import constants as c
from pkg.cli.computedomain import age, run
from pkg.kube import resources as res
from pkg.kube.errors import ForbiddenError
from pkg.testing.fakeapiserver import FakeApiServer

NOW = 1_700_000_600.0


def test_describe_shows_the_whole_domain_on_one_screen() -> None:
    with FakeApiServer() as api:
        seed_domain(api)
        code, text = run(["describe", "train", "-n", NS], api.client(), now=NOW)
    assert code == 0, text
    lines = text.splitlines()
    assert lines[0].split() == ["Name:", "train"]
    assert "Status:          NotReady (2/3 nodes ready, numNodes 3)" in text
    # conditions, with the cliques named
    assert any(l.split()[:3] == ["SingleClique", "False", "MultipleCliques"] for l in lines)
    assert "clique cl.0: gpu-1, gpu-2; clique cl.1: gpu-5" in text
    # per-daemon IMEX state from the clique entries
    gpu1 = next(l for l in lines if l.split()[:2] == ["cl.0", "gpu-1"])
    assert "0 peers connected; cannot reach gpu-2" in gpu1
    gpu5 = next(l for l in lines if l.split()[:2] == ["cl.1", "gpu-5"])
    assert "NotReady" in gpu5 and "not reported" in gpu5
    # daemon pods (another namespace, by the domain label) and workload pods (by RCT)
    assert any("train-daemon-gpu-5" in l and "CrashLoopBackOff" in l for l in lines)
    workloads = text.split("Workload pods:")[1].split("Events:")[0]
    assert "worker-0" in workloads and "worker-1" in workloads and "other" not in workloads
    events = text.split("Events:")[1]
    assert "MultipleCliques happened" in events and "Unrelated" not in events
    assert len(lines) < 40  # one screen


def test_get_lists_domains_and_not_found_is_an_error() -> None:
    with FakeApiServer() as api:
        seed_domain(api)
        code, text = run(["get", "-A"], api.client(), now=NOW)
        assert code == 0
        header, row = text.splitlines()
        assert header.split() == ["NAMESPACE", "NAME", "STATUS", "NODES", "CLIQUES", "AGE"]
        assert row.split()[:5] == [NS, "train", "NotReady", "2/3", "cl.0,cl.1"]
        code, text = run(["describe", "nope", "-n", NS], api.client(), now=NOW)
        assert code == 1 and 'computedomain "nope" not found in namespace "team"' in text
        assert run(["get", "-n", "empty"], api.client(), now=NOW)[1] == "No ComputeDomains found.\n"


def test_age_is_kubectl_like() -> None:
    t0 = "2023-11-14T22:13:20Z"  # 1_700_000_000
    assert [age(t0, 1_700_000_000 + s) for s in (5, 90, 600, 7300, 3 * 86400)] == [
        "5s",
        "1m",
        "10m",
        "2h",
        "3d",
    ]
    assert age(None, 0) == "<unknown>"


def test_installed_entry_point_uses_kubeconfig_context_namespace(tmp_path: Path) -> None:
    exe = Path(sys.executable).parent / "kubectl-computedomain"
    assert exe.exists(), "pip install -e . installs the kubectl-computedomain console script"
    with FakeApiServer() as api:
        seed_domain(api)
        cfg = tmp_path / "kubeconfig"
        cfg.write_text(
            json.dumps(
                {
                    "apiVersion": "v1",
                    "kind": "Config",
                    "current-context": "other",
                    "clusters": [{"name": "fake", "cluster": {"server": api.url}}],
                    "users": [{"name": "u", "user": {}}],
                    "contexts": [
                        {
                            "name": "mine",
                            "context": {"cluster": "fake", "user": "u", "namespace": NS},
                        },
                        {"name": "other", "context": {"cluster": "fake", "user": "u"}},
                    ],
                }
            )
        )
        done = subprocess.run(
            [str(exe), "--kubeconfig", str(cfg), "--context", "mine", "get"],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        assert "train" in done.stdout
        done = subprocess.run(
            [str(exe), "--kubeconfig", str(cfg), "get"],  # namespace "default"
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert done.stdout == "No ComputeDomains found.\n"


def test_output_json_and_yaml_carry_the_objects() -> None:
    with FakeApiServer() as api:
        uid = seed_domain(api)
        code, text = run(["get", "-n", NS, "-o", "json"], api.client(), now=NOW)
        assert code == 0
        listing = json.loads(text)
        assert (listing["apiVersion"], listing["kind"]) == ("v1", "List")
        assert [(i["kind"], i["metadata"]["name"]) for i in listing["items"]] == [
            (c.COMPUTE_DOMAIN_KIND, "train")
        ]
        assert listing["items"][0]["status"]["readyNodes"] == 2
        code, text = run(["describe", "train", "-n", NS, "-o", "yaml"], api.client(), now=NOW)
        assert code == 0
        doc = yaml.safe_load(text)
        assert doc["computeDomain"]["metadata"]["uid"] == uid
        assert sorted(x["metadata"]["name"] for x in doc["cliques"]) == [
            f"{uid}.cl.0",
            f"{uid}.cl.1",
        ]
        assert sorted(p["metadata"]["name"] for p in doc["workloadPods"]) == [
            "worker-0",
            "worker-1",
        ]
        assert len(doc["daemonPods"]) == 3 and doc["hidden"] == []
        assert {e["reason"] for e in doc["events"]} == {"MultipleCliques", "NodeJoined"}
        code, text = run(["describe", "train", "-n", NS, "-o", "json"], api.client(), now=NOW)
        assert json.loads(text)["computeDomain"]["kind"] == c.COMPUTE_DOMAIN_KIND


class OneNamespaceClient:
    """The fake API server's client as a user with read rights in ``NS`` only sees it."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def get(self, resource: res.Resource, name: str, **kw: Any) -> Any:
        if kw.get("namespace") != NS:
            raise ForbiddenError(403, "Forbidden")
        return self._inner.get(resource, name, **kw)

    def list(self, resource: res.Resource, **kw: Any) -> Any:
        if kw.get("namespace") != NS:
            raise ForbiddenError(403, "Forbidden")
        return self._inner.list(resource, **kw)


def test_a_user_of_one_namespace_sees_what_its_rights_allow() -> None:
    with FakeApiServer() as api:
        seed_domain(api)
        client = OneNamespaceClient(api.client())
        code, text = run(["describe", "train", "-n", NS], client, now=NOW)  # type: ignore[arg-type]
        assert code == 0, text
        assert "worker-0" in text.split("Workload pods:")[1]  # its own namespace: shown
        assert "MultipleCliques happened" in text.split("Events:")[1]
        hidden = text.split("Hidden (your account may not read these; ask for read access):")[1]
        assert (
            "cliques (IMEX state per daemon): you may not list computedomaincliques in all namespaces"
            in hidden
        )
        assert "daemon pods: you may not list pods in all namespaces" in hidden
        assert "train-daemon-gpu-1" not in text
        code, text = run(["describe", "train", "-n", NS, "-o", "json"], client, now=NOW)  # type: ignore[arg-type]
        assert len(json.loads(text)["hidden"]) == 2
        code, text = run(["get", "-A"], client, now=NOW)  # type: ignore[arg-type]
        assert code == 1
        assert (
            text
            == "Error: you may not read ComputeDomains in all namespaces; name one with -n NAMESPACE\n"
        )
        code, text = run(["get", "-n", NS], client, now=NOW)  # type: ignore[arg-type]
        assert code == 0 and "train" in text


def test_version_prints_the_installed_version_and_exits_0() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "pkg.cli.computedomain", "--version"],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.startswith("kubectl-computedomain version ")
    assert done.stdout.split()[-1] not in ("", "unknown")
