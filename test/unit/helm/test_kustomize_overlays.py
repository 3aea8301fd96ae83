"""Overlays of config/default: the namespace reaches the admission policies; uninstall without
the CRDs.

config/admission embeds the namespace in strings (the ServiceAccount usernames of the policies'
matchConditions, the daemon-device binding's namespaceSelector); config/default rewrites them
with the replacements in config/default/namespace-replacements.yaml. kustomize runs those before
an overlay's own ``namespace:``, so an overlay that changes the namespace lists a copy of that
file (config/overlays/other-namespace is the worked example): its copy must stay equal, and the
result must name the overlay's namespace everywhere.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import yaml
from testsupport.helmchart import CONFIG, NS, Obj, find, kustomize

REPLACEMENTS = "namespace-replacements.yaml"
EXAMPLE = CONFIG / "overlays" / "other-namespace"


def admission_namespaces(objs: list[Obj]) -> set[str]:
    """Every namespace the admission objects name (usernames, the namespaceSelector and the
    controller policy's paramRef)."""
    found = set()
    for o in objs:
        if o["kind"] == "ValidatingAdmissionPolicy":
            for cond in o["spec"].get("matchConditions", []):
                found.add(cond["expression"].split("system:serviceaccount:")[1].split(":")[0])
    binding = find(objs, "ValidatingAdmissionPolicyBinding", "compute-domain-daemon-device-claims")
    [expr] = binding["spec"]["matchResources"]["namespaceSelector"]["matchExpressions"]
    found.update(expr["values"])
    # The controller's DaemonSet policy reads its Deployment in the driver namespace.
    params = find(objs, "ValidatingAdmissionPolicyBinding", "compute-domain-controller-daemonsets")
    found.add(params["spec"]["paramRef"]["namespace"])
    return found


def test_default_names_its_own_namespace() -> None:
    assert admission_namespaces(kustomize(CONFIG / "default")) == {NS}


def test_example_overlay_copy_is_current() -> None:
    assert (EXAMPLE / REPLACEMENTS).read_text() == (CONFIG / "default" / REPLACEMENTS).read_text()


def test_example_overlay_namespace_reaches_everything() -> None:
    ns = yaml.safe_load((EXAMPLE / "kustomization.yaml").read_text())["namespace"]
    assert ns != NS
    objs = kustomize(EXAMPLE)
    assert admission_namespaces(objs) == {ns}
    assert NS not in yaml.safe_dump_all(objs)
    [namespace] = [o for o in objs if o["kind"] == "Namespace"]
    assert namespace["metadata"]["name"] == ns


def test_overlay_without_the_copy_keeps_the_old_namespace(tmp_path: Path) -> None:
    """Why the copy exists: were kustomize ever to apply a base's replacements after the
    overlay's namespace, this fails and the copy can go."""
    shutil.copytree(CONFIG, tmp_path / "config")
    overlay = tmp_path / "config" / "overlays" / "bare"
    overlay.mkdir()
    (overlay / "kustomization.yaml").write_text(
        yaml.safe_dump({"namespace": "elsewhere", "resources": ["../../default"]})
    )
    assert admission_namespaces(kustomize(overlay)) == {NS}


def test_without_crds_is_default_minus_the_crds() -> None:
    """``kubectl delete -k config/overlays/without-crds`` removes the driver, keeps the API."""
    default = kustomize(CONFIG / "default")
    rest = kustomize(CONFIG / "overlays" / "without-crds")
    assert [o for o in default if o["kind"] != "CustomResourceDefinition"] == rest
    assert sum(o["kind"] == "CustomResourceDefinition" for o in default) == 2
