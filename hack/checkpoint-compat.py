#!/usr/bin/env python3
"""Rollback check: do the Go driver's own plugin sources accept the checkpoint we write?

An operator who switches a node back from this driver to upstream's Go kubelet plugin hands it
the checkpoint file ours wrote (`pkg.kubeletplugin.checkpointformat`). This script asks the Go
code itself, per upstream version, instead of reasoning about it:

1. writes checkpoint files with our encoder at every ``--checkpoint-compatibility`` level
   (`CheckpointCompatibility`): a completed channel claim, a completed daemon claim, a claim
   still PrepareStarted, a PrepareAborted tombstone, two claims of one domain sharing channel 0,
   and all of them in one file;
2. for each ``--ref`` of the upstream repository (a git dir or a checkout; nothing of it is
   copied here), extracts that tree to a temporary directory and runs, with ``go test`` against
   its ``vendor/`` (offline), a test file that lives only in a ``-overlay`` outside the tree:
   for every file it calls that version's ``Checkpoint.UnmarshalCheckpoint`` and
   ``VerifyChecksum`` (what its checkpoint manager does at start: a failure there is the
   plugin's ``checkpoint is corrupted``), then ``ToLatestVersion`` and ``MarshalCheckpoint``
   (its next write);
3. checks that Go saw every claim the level persists, with our state and devices, and that our
   decoder reads Go's rewrite back to the same entries (the switch forward again).

Prints one line per (version, level): ok, or the first failing file and why. Exits 1 if some
version cannot read the lowest level (meant to be readable by every version).

    .venv/bin/python hack/checkpoint-compat.py /work/.mirror/<owner>+<repo>/repo \\
        --ref v25.12.0 --ref v0.4.1 --ref HEAD
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from pkg.api import constants as c
from pkg.kubeletplugin.checkpointformat import (
    CheckpointCompatibility,
    ClaimEntry,
    ClaimState,
    DeviceGroup,
    PreparedDevice,
    canonical_status,
    decode_checkpoint,
    encode_checkpoint,
    go_time,
    persisted,
)

REPO = Path(__file__).resolve().parents[1]

PLUGIN_PKG = "./cmd/compute-domain-kubelet-plugin/"
NODE = "gpu-node-1"
DOMAIN = "cd0e0f00-aaaa-4bbb-8ccc-000000000042"
BOOT_ID = "8a4b6c1e-7d2f-4e3a-9b5c-0123456789ab"

GO_TEST = """package main

import (
\t"encoding/json"
\t"os"
\t"path/filepath"
\t"testing"
)

// Lives only in a -overlay of hack/checkpoint-compat.py: reads each checkpoint file the way
// this version's plugin does and reports what it saw.
func TestCheckpointCompat(t *testing.T) {
\tfiles, _ := filepath.Glob(filepath.Join(os.Getenv("CD_COMPAT_IN"), "*.json"))
\treport := map[string]map[string]any{}
\tfor _, f := range files {
\t\tdata, err := os.ReadFile(f)
\t\tif err != nil {
\t\t\tt.Fatal(err)
\t\t}
\t\tr := map[string]any{}
\t\tvar cp Checkpoint
\t\tif err := cp.UnmarshalCheckpoint(data); err != nil {
\t\t\tr["error"] = "unmarshal: " + err.Error()
\t\t} else if err := cp.VerifyChecksum(); err != nil {
\t\t\tr["error"] = "verify: " + err.Error()
\t\t} else {
\t\t\tr["claims"] = cp.ToLatestVersion().V2.PreparedClaims
\t\t\tif b, err := cp.MarshalCheckpoint(); err != nil {
\t\t\t\tr["error"] = "marshal: " + err.Error()
\t\t\t} else {
\t\t\t\tr["rewritten"] = string(b)
\t\t\t}
\t\t}
\t\treport[filepath.Base(f)] = r
\t}
\tb, _ := json.Marshal(report)
\tif err := os.WriteFile(os.Getenv("CD_COMPAT_OUT"), b, 0o644); err != nil {
\t\tt.Fatal(err)
\t}
}
"""


def _status(kind: str, request: str, device: str, pod: str) -> dict[str, Any]:
    config_kind = "ComputeDomainChannelConfig" if kind == "channel" else "ComputeDomainDaemonConfig"
    params: dict[str, Any] = {
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": config_kind,
        "domainID": DOMAIN,
    }
    if kind == "channel":
        params["allocationMode"] = "Single"
    return canonical_status(
        {
            "allocation": {
                "devices": {
                    "results": [
                        {
                            "request": request,
                            "driver": c.DRIVER_NAME,
                            "pool": NODE,
                            "device": device,
                        }
                    ],
                    "config": [
                        {
                            "source": "FromClaim",
                            "requests": [request],
                            "opaque": {"driver": c.DRIVER_NAME, "parameters": params},
                        }
                    ],
                },
                "nodeSelector": {
                    "nodeSelectorTerms": [
                        {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": [NODE]}
                            ]
                        }
                    ]
                },
            },
            "reservedFor": [
                {
                    "resource": "pods",
                    "name": pod,
                    "uid": f"0d000000-0000-4000-8000-00000000{pod[-4:]}",
                }
            ],
        }
    )


def _entry(uid: str, kind: str, state: ClaimState, *, share: str | None = None) -> ClaimEntry:
    request, device = ("channel", "channel-0") if kind == "channel" else ("daemon", "daemon-0")
    status = _status(kind, request, device, f"pod-{uid[-4:]}")
    groups: tuple[DeviceGroup, ...] = ()
    if state == ClaimState.PREPARE_COMPLETED:
        dev = PreparedDevice(
            request_names=(request,),
            pool_name=NODE,
            device_name=device,
            cdi_device_ids=(f"k8s.{c.DRIVER_NAME}/claim={uid}-{device}",),
            share_id=share,
        )
        groups = (DeviceGroup(kind=kind, domain_id=DOMAIN, devices=(dev,)),)
    return ClaimEntry(
        uid=uid,
        state=state,
        status=status,
        groups=groups,
        namespace="team-a" if kind == "channel" else "nvidia-dra-driver-gpu",
        name=f"{kind}-claim-{uid[-4:]}",
        aborted_at=go_time(1795765000.0) if state == ClaimState.PREPARE_ABORTED else None,
    )


def cases(level: CheckpointCompatibility) -> dict[str, dict[str, ClaimEntry]]:
    """Checkpoint contents to hand to the Go code, by file name: at a level without device
    sharing (`CheckpointCompatibility.keeps_share_id`; the plugin then publishes ``channel-0``
    exclusive) no claim shares a device."""
    uid = "5f0c9a52-{0}-4e2b-9d7e-00000000000{1}".format
    channel = _entry(uid("1111", 1), "channel", ClaimState.PREPARE_COMPLETED)
    daemon = _entry(uid("2222", 2), "daemon", ClaimState.PREPARE_COMPLETED)
    started = _entry(uid("3333", 3), "channel", ClaimState.PREPARE_STARTED)
    aborted = _entry(uid("4444", 4), "channel", ClaimState.PREPARE_ABORTED)
    shared = [
        _entry(uid("5555", 5), "channel", ClaimState.PREPARE_COMPLETED, share="share-a"),
        _entry(uid("6666", 6), "channel", ClaimState.PREPARE_COMPLETED, share="share-b"),
    ]
    if not level.keeps_share_id:
        shared = []
    everything = [channel, daemon, started, aborted, *shared]
    out = {
        "empty.json": [],
        "channel-completed.json": [channel],
        "daemon-completed.json": [daemon],
        "started.json": [started],
        "aborted.json": [aborted],
        "shared-channel.json": shared,
        "all.json": everything,
    }
    return {name: {e.uid: e for e in entries} for name, entries in out.items()}


def _go_view(entry: Any) -> tuple[str, list[str]]:
    devices = [
        str(((d.get(kind) or {}).get("device") or {}).get("DeviceName"))
        for g in entry.get("preparedDevices") or []
        for d in g.get("devices") or []
        for kind in ("channel", "daemon")
        if d.get(kind)
    ]
    return str(entry.get("checkpointState", "PrepareCompleted")), devices


def _our_view(entry: ClaimEntry) -> tuple[str, list[str]]:
    return str(entry.state), [d.device_name for g in entry.groups for d in g.devices]


def check(name: str, written: dict[str, ClaimEntry], seen: dict[str, Any]) -> list[str]:
    """Problems with what one Go version made of one file ([] when it read it faithfully)."""
    if "error" in seen:
        return [str(seen["error"])]
    problems = []
    go_claims = seen.get("claims") or {}
    want = {uid: _our_view(e) for uid, e in written.items()}
    got = {uid: _go_view(e) for uid, e in go_claims.items()}
    if got != want:
        problems.append(f"Go read {got}, we wrote {want}")
    back = decode_checkpoint(str(seen.get("rewritten", "")).encode())
    if {uid: _our_view(e) for uid, e in back.entries.items()} != want:
        problems.append(f"our reader of Go's rewrite: {back.problems or back.entries}")
    return problems


def _git_dir(source: Path) -> Path:
    """The git directory of ``source`` (a checkout or a bare/mirror git dir)."""
    return source / ".git" if (source / ".git").exists() else source


def run_ref(source: Path, ref: str, files: Path, work: Path) -> dict[str, Any]:
    """Extract ``ref`` of ``source``, run the overlay test against ``files``; Go's report."""
    tree = work / ref.replace("/", "_")
    tree.mkdir()
    archive = subprocess.run(
        ["git", f"--git-dir={_git_dir(source)}", "archive", ref], check=True, stdout=subprocess.PIPE
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    test_file = work / f"{tree.name}_compat_test.go"
    test_file.write_text(GO_TEST)
    overlay = work / f"{tree.name}_overlay.json"
    target = tree / PLUGIN_PKG / "zz_checkpoint_compat_test.go"
    overlay.write_text(json.dumps({"Replace": {str(target.resolve()): str(test_file)}}))
    out = work / f"{tree.name}_report.json"
    env = {
        **os.environ,
        "GOFLAGS": "-mod=vendor",
        "GOTOOLCHAIN": "local",
        "CD_COMPAT_IN": str(files),
        "CD_COMPAT_OUT": str(out),
    }
    done = subprocess.run(
        [
            "go",
            "test",
            "-vet=off",
            f"-overlay={overlay}",
            "-run",
            "TestCheckpointCompat",
            "-count=1",
            PLUGIN_PKG,
        ],
        cwd=tree,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        check=False,
    )
    if done.returncode != 0 or not out.exists():
        raise RuntimeError(f"go test at {ref} failed:\n{done.stdout[-4000:]}")
    shutil.rmtree(tree, ignore_errors=True)
    report: dict[str, Any] = json.loads(out.read_text())
    return report


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("source", type=Path, help="upstream git dir or checkout")
    ap.add_argument("--ref", action="append", required=True, help="tag, branch or commit")
    args = ap.parse_args()
    written: dict[str, dict[str, ClaimEntry]] = {}
    failed = 0
    lowest = list(CheckpointCompatibility)[-1]
    with tempfile.TemporaryDirectory(prefix="cd-ckpt-compat-") as tmp:
        work = Path(tmp)
        files = work / "in"
        files.mkdir()
        for level in CheckpointCompatibility:
            for name, entries in cases(level).items():
                data = encode_checkpoint(entries, boot_id=BOOT_ID, compatibility=level)
                (files / f"{level}--{name}").write_bytes(data)
                written[f"{level}--{name}"] = persisted(entries, level)
        for ref in args.ref:
            commit = subprocess.run(
                [
                    "git",
                    f"--git-dir={_git_dir(args.source)}",
                    "rev-parse",
                    "--short",
                    f"{ref}^{{commit}}",
                ],
                check=True,
                stdout=subprocess.PIPE,
                text=True,
            ).stdout.strip()
            report = run_ref(args.source, ref, files, work)
            for level in CheckpointCompatibility:
                bad = []
                for name in sorted(n for n in written if n.startswith(f"{level}--")):
                    seen = report.get(name) or {"error": "no report"}
                    bad += [f"{name.split('--')[1]}: {p}" for p in check(name, written[name], seen)]
                failed += bool(bad) and level == lowest
                names = sorted({b.split(":", 1)[0] for b in bad})
                verdict = "ok" if not bad else f"FAILED {names}: {bad[0][:300]}"
                print(f"{ref} ({commit}) reads level {level}: {verdict}", flush=True)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
