#!/usr/bin/env python3
"""Hand a running driver from ``kubectl apply -k`` to a Helm release of the chart, and back,
without deleting anything in between.

Deleting the driver to reinstall it another way deletes its ServiceAccounts, and with them the
tokens of every IMEX daemon pod already running (a recreated ServiceAccount has a new UID, so the
API server refuses the old pods' tokens until the kubelet renews them), and opens a window in
which no Prepare or Unprepare is served. Handing the objects over in place avoids both:

``adopt``
    Replaces every object the chart renders that already exists (as ``config/`` created it) by
    that rendering (``helm template`` with the same release name, namespace and values), with
    Helm's ownership metadata added (label ``app.kubernetes.io/managed-by=Helm``, annotations
    ``meta.helm.sh/release-name`` / ``-namespace``); the following ``helm install`` then takes
    them over. Labelling alone is not enough: Helm patches an adopted object without knowing
    which fields kustomize set, so those stay (e.g. ``allowPrivilegeEscalation: false`` next to
    the chart's ``privileged: true``, which the API server refuses). CRDs are left alone: Helm
    installs ``crds/`` only when they are missing and never owns them.

``release``
    The opposite: every object of the release that the kustomize directory also renders is
    replaced by that rendering (a full update, which drops the fields and labels only the chart
    set), the directory is applied server-side (creating what the chart did not have, e.g. the
    ConfigMap under its kustomize name), the release's objects the directory does not render
    are deleted (the chart's ConfigMap), and Helm's release records are deleted last, so Helm
    forgets the release without uninstalling anything.

Both are idempotent and can be re-run after an interruption (``release`` keeps the records until
everything else is done). Prints each object it acts on.

    hack/helm-handover.py adopt --release compute-domain-driver -n nvidia-dra-driver \\
        -f values.yaml
    helm install compute-domain-driver deployments/helm/compute-domain-driver \\
        -n nvidia-dra-driver -f values.yaml
    hack/helm-handover.py release --release compute-domain-driver -n nvidia-dra-driver \\
        -k config/default
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
CHART = REPO / "deployments" / "helm" / "compute-domain-driver"
MANAGED_BY = "app.kubernetes.io/managed-by"
RELEASE_NAME = "meta.helm.sh/release-name"
RELEASE_NAMESPACE = "meta.helm.sh/release-namespace"

Obj = dict[str, Any]


class HandoverError(RuntimeError):
    """A kubectl or helm step failed; the message names the command and its stderr."""


def key(obj: Obj) -> tuple[str, str, str, str]:
    """``(apiVersion's group, kind, namespace, name)``: what identifies an object."""
    group = obj["apiVersion"].rpartition("/")[0]
    meta = obj["metadata"]
    return group, obj["kind"], meta.get("namespace", ""), meta["name"]


def documents(text: str) -> list[Obj]:
    """The non-empty YAML documents of a multi-document stream."""
    return [d for d in yaml.safe_load_all(text) if d]


def plan_release(
    release: Iterable[Obj], ours: Iterable[Obj], namespace: str
) -> tuple[list[Obj], list[Obj]]:
    """For ``release``: ``(replace, delete)``. ``replace`` holds the kustomize rendering of each
    release object the directory also renders; ``delete`` the release objects it does not. A
    release object without a namespace matches a rendered one in ``namespace`` (a chart may
    leave a namespaced object's namespace to Helm), so no object is deleted for that."""
    rendered = {key(o): o for o in ours}

    def match(obj: Obj) -> Obj | None:
        group, kind, ns, name = key(obj)
        found = rendered.get((group, kind, ns, name))
        return found if found or ns else rendered.get((group, kind, namespace, name))

    replace: list[Obj] = []
    delete: list[Obj] = []
    for obj in release:
        found = match(obj)
        if found is None:
            delete.append(obj)
        else:
            replace.append(found)
    return replace, delete


class Tools:
    """``kubectl`` and ``helm`` against one kubeconfig."""

    def __init__(self, kubectl: str, helm: str, kubeconfig: str | None) -> None:
        self.kubectl = kubectl
        self.helm = helm
        self.flags = [f"--kubeconfig={kubeconfig}"] if kubeconfig else []

    def run(self, argv: Sequence[str], stdin: str = "", *, ok: bool = False) -> str:
        """Run ``argv``; raise :class:`HandoverError` on a non-zero exit unless ``ok``."""
        done = subprocess.run(
            list(argv), input=stdin, capture_output=True, text=True, check=False, timeout=300
        )
        if done.returncode != 0 and not ok:
            raise HandoverError(f"{' '.join(argv[:4])} ...: {done.stderr.strip()}")
        return done.stdout

    def k(self, *args: str, stdin: str = "", ok: bool = False) -> str:
        """``kubectl <args>``."""
        return self.run([self.kubectl, *self.flags, *args], stdin, ok=ok)

    def h(self, *args: str) -> str:
        """``helm <args>``."""
        return self.run([self.helm, *self.flags, *args])


def describe(obj: Obj) -> str:
    group, kind, ns, name = key(obj)
    return f"{kind}{'.' + group.split('/')[0] if group else ''} {ns + '/' if ns else ''}{name}"


def adopt(t: Tools, release: str, namespace: str, chart: Path, values: Sequence[str]) -> None:
    """Replace each existing object the chart renders by that rendering, marked as owned by
    ``release``; leave absent ones to ``helm install``."""
    args = ["template", release, str(chart), "-n", namespace]
    for v in values:
        args += ["-f", v]
    for obj in documents(t.h(*args)):
        found = t.k(
            "-n",
            namespace,
            "get",
            "-f",
            "-",
            "-o",
            "name",
            "--ignore-not-found",
            stdin=yaml.safe_dump(obj),
        )
        if not found.strip():
            print(f"absent, helm install creates it: {describe(obj)}")
            continue
        meta = obj["metadata"]
        meta.setdefault("labels", {})[MANAGED_BY] = "Helm"
        meta.setdefault("annotations", {}).update(
            {RELEASE_NAME: release, RELEASE_NAMESPACE: namespace}
        )
        t.k("-n", namespace, "replace", "-f", "-", stdin=yaml.safe_dump(obj))
        print(f"replaced by the chart's rendering, owned by {release}: {describe(obj)}")


def release_to_kustomize(t: Tools, release: str, namespace: str, kustomize: Path) -> None:
    """Hand the release's objects to ``kubectl apply -k kustomize``; make Helm forget it."""
    manifest = documents(t.h("get", "manifest", release, "-n", namespace))
    ours = documents(t.k("kustomize", str(kustomize)))
    replace, delete = plan_release(manifest, ours, namespace)
    for obj in replace:
        t.k("-n", namespace, "replace", "-f", "-", stdin=yaml.safe_dump(obj))
        print(f"replaced by the kustomize rendering: {describe(obj)}")
    t.k("apply", "--server-side", "--force-conflicts", "-k", str(kustomize))
    print(f"applied: {kustomize}")
    for obj in delete:
        t.k("-n", namespace, "delete", "--ignore-not-found", "-f", "-", stdin=yaml.safe_dump(obj))
        print(f"deleted (the chart's only): {describe(obj)}")
    t.k("-n", namespace, "delete", "secret", "-l", f"owner=helm,name={release}")
    print(f"helm release {namespace}/{release} forgotten (its objects stay)")


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("action", choices=["adopt", "release"])
    p.add_argument("--release", required=True, help="the Helm release name")
    p.add_argument("-n", "--namespace", required=True, help="the driver's namespace")
    p.add_argument("--chart", type=Path, default=CHART, help="adopt: the chart (default: ours)")
    p.add_argument(
        "-f",
        "--values",
        action="append",
        default=[],
        help="adopt: a values file, as for helm install (repeatable)",
    )
    p.add_argument("-k", "--kustomize", type=Path, help="release: the kustomize directory")
    p.add_argument("--kubeconfig")
    p.add_argument("--kubectl", default="kubectl")
    p.add_argument("--helm", default="helm")
    a = p.parse_args(argv)
    tools = Tools(a.kubectl, a.helm, a.kubeconfig)
    try:
        if a.action == "adopt":
            adopt(tools, a.release, a.namespace, a.chart, a.values)
        else:
            if a.kustomize is None:
                p.error("release needs -k/--kustomize (the directory that takes the objects)")
            release_to_kustomize(tools, a.release, a.namespace, a.kustomize)
    except HandoverError as err:
        print(f"helm-handover: {err}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
