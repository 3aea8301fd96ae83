"""hack/checkpoint-compat.py's own judgement, without Go: what it makes of a faithful reader,
of one that lost a claim, of a refusal, and of a rewrite our reader cannot take back."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from pkg.kubeletplugin.checkpointformat import (
    CheckpointCompatibility,
    ClaimState,
    encode_checkpoint,
    persisted,
)

SCRIPT = Path(__file__).resolve().parents[2] / "hack" / "checkpoint-compat.py"


@pytest.fixture(scope="module")
def compat() -> ModuleType:
    spec = importlib.util.spec_from_file_location("checkpoint_compat", SCRIPT)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def faithful(data: bytes) -> dict[str, Any]:
    """What a Go reader that knows every field reports: the claims, and its rewrite."""
    return {
        "claims": json.loads(data)["v2"].get("preparedClaims") or {},
        "rewritten": data.decode(),
    }


@pytest.mark.parametrize("level", list(CheckpointCompatibility))
def test_a_faithful_reader_passes_every_case(
    compat: ModuleType, level: CheckpointCompatibility
) -> None:
    cases = compat.cases(level)
    assert set(cases) >= {"all.json", "aborted.json", "shared-channel.json", "started.json"}
    shares = [d.share_id for e in cases["all.json"].values() for g in e.groups for d in g.devices]
    assert any(shares) == level.keeps_share_id
    for name, entries in cases.items():
        data = encode_checkpoint(entries, boot_id=compat.BOOT_ID, compatibility=level)
        assert compat.check(name, persisted(entries, level), faithful(data)) == [], name


def test_a_lost_claim_a_refusal_and_a_bad_rewrite_are_reported(compat: ModuleType) -> None:
    level = CheckpointCompatibility.V0_4_1
    entries = compat.cases(level)["all.json"]
    assert {e.state for e in entries.values()} == set(ClaimState)
    data = encode_checkpoint(entries, boot_id=compat.BOOT_ID)
    lost = faithful(data)
    lost["claims"].pop(next(iter(lost["claims"])))
    assert compat.check("all.json", entries, lost)
    refused = {"error": "verify: checkpoint is corrupted"}
    assert compat.check("all.json", entries, refused) == ["verify: checkpoint is corrupted"]
    garbled = faithful(data) | {"rewritten": "{}"}
    assert compat.check("all.json", entries, garbled)
