"""imexd.cfg rendering against golden files, parsing and atomic writes."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pkg.base.files import write_file_atomically
from pkg.imex.config import (
    AuthConfig,
    ImexConfig,
    ImexConfigError,
    parse_config,
)

GOLDEN = Path(__file__).parent / "golden"
UPDATE = os.environ.get("UPDATE_GOLDEN") == "1"


def _check_golden(name: str, content: str) -> None:
    path = GOLDEN / name
    if UPDATE:
        path.write_text(content, encoding="utf-8")
    assert content == path.read_text(encoding="utf-8"), (
        f"re-run with UPDATE_GOLDEN=1 to update {path}"
    )


@pytest.mark.parametrize(
    ("golden", "config"),
    [
        ("imexd-default.cfg", ImexConfig(bind_ip="10.0.0.7", node_config_path="/imexd/nodes.cfg")),
        (
            "imexd-ports-auth.cfg",
            ImexConfig(
                bind_ip="127.0.0.11",
                node_config_path="/tmp/n1/nodes.cfg",
                server_port=41000,
                cmd_port=41005,
                auth=AuthConfig(
                    enabled=True,
                    source="FILE",
                    server_key="/keys/server.key",
                    server_cert="/keys/server.crt",
                    server_cert_auth="/keys/ca.crt",
                    client_key="/keys/client.key",
                    client_cert="/keys/client.crt",
                    client_cert_auth="/keys/ca.crt",
                ),
            ),
        ),
    ],
    ids=["default", "ports-and-auth"],
)
def test_render_matches_golden(golden: str, config: ImexConfig) -> None:
    _check_golden(golden, config.render())


def test_render_has_every_upstream_key_once() -> None:
    text = ImexConfig(bind_ip="10.0.0.7", node_config_path="/imexd/nodes.cfg").render()
    keys = [line.split("=", 1)[0] for line in text.splitlines() if not line.startswith("#")]
    assert len(keys) == len(set(keys)) == 33
    values = parse_config(text)
    assert values["BIND_INTERFACE_IP"] == values["IMEX_CMD_BIND_INTERFACE_IP"] == "10.0.0.7"
    assert values["SERVER_PORT"] == "50000"
    assert values["IMEX_CMD_PORT"] == "50005"
    assert values["IMEX_WAIT_FOR_QUORUM"] == "RECOVERY"
    assert values["IMEX_NODE_CONFIG_FILE"] == "/imexd/nodes.cfg"
    assert values["IMEX_ENABLE_AUTH_ENCRYPTION"] == "0"


@pytest.mark.parametrize(
    "config",
    [
        ImexConfig(bind_ip="1.2.3.4\nEVIL=1", node_config_path="/n"),
        ImexConfig(bind_ip="1.2.3.4", node_config_path="/n#x"),
        ImexConfig(bind_ip="1.2.3.4", node_config_path="/n", server_port=0),
        ImexConfig(bind_ip="1.2.3.4", node_config_path="/n", cmd_port=70000),
    ],
    ids=["newline", "hash", "port-zero", "port-too-big"],
)
def test_render_rejects_bad_values(config: ImexConfig) -> None:
    with pytest.raises(ImexConfigError):
        config.render()


def test_parse_skips_comments_and_rejects_garbage() -> None:
    assert parse_config("# c\n\nA=1\n B = x \nA=2\nEMPTY=\n") == {"A": "2", "B": "x", "EMPTY": ""}
    with pytest.raises(ImexConfigError, match="line 2"):
        parse_config("A=1\nnot a pair\n")


def test_atomic_write_reports_change(tmp_path: Path) -> None:
    target = tmp_path / "sub" / "imexd.cfg"
    assert write_file_atomically(target, "A=1\n")
    assert not write_file_atomically(target, "A=1\n")
    assert write_file_atomically(target, "A=2\n")
    assert target.read_text() == "A=2\n"
    assert [p.name for p in target.parent.iterdir()] == ["imexd.cfg"]
