"""The simulated host nvidia-imex.service and ``nvidia-imex-ctl -q --u=<socket>`` against it."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from pkg.imex.sim import ctl, hostservice
from pkg.testing.eventually import eventually

SOCKET = "/etc/nvidia-imex/imex_ctrl.sock"


def write_config(path: Path, **values: str) -> Path:
    path.write_text("".join(f"{k}={v}\n" for k, v in values.items()))
    return path


@pytest.fixture
def root(tmp_path: Path) -> Path:
    # Unix socket paths are limited to 108 bytes; pytest's tmp_path stays below that here.
    return tmp_path / "driver-root"


@pytest.fixture
def service(tmp_path: Path, root: Path) -> Iterator[Path]:
    config = write_config(
        tmp_path / "config.cfg", IMEX_CMD_ENABLED="1", IMEX_CMD_UNIX_DOMAIN_PATH=SOCKET
    )
    stop = threading.Event()
    result: list[int] = []
    thread = threading.Thread(
        target=lambda: result.append(hostservice.serve(config, root=root, stop=stop))
    )
    thread.start()
    sock = root / SOCKET.lstrip("/")
    eventually(sock.is_socket)
    yield config
    stop.set()
    thread.join(5)
    assert result == [0]
    assert not sock.exists(), "the socket is removed on stop"


def query(root: Path, capsys: pytest.CaptureFixture[str]) -> tuple[int, str]:
    code = ctl.main(["-q", f"--u={root / SOCKET.lstrip('/')}"])
    return code, capsys.readouterr().out


def test_ready_then_unavailable_while_held(
    service: Path, root: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert query(root, capsys) == (0, "READY\n")
    hold = service.parent / hostservice.HOLD_FILE
    hold.touch()
    code, out = query(root, capsys)
    assert (code, out) == (0, "UNAVAILABLE\n")
    assert "READY" not in out  # the plugin's check is a substring match, as upstream's
    hold.unlink()
    assert query(root, capsys) == (0, "READY\n")


def test_unreachable_socket_exits_1(root: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = ctl.main(["-q", f"--u={root / 'nothing.sock'}"])
    assert code == 1
    assert "IMEX daemon not reachable" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (
            {"IMEX_CMD_ENABLED": "0", "IMEX_CMD_UNIX_DOMAIN_PATH": SOCKET},
            "IMEX_CMD_ENABLED is not 1",
        ),
        ({"IMEX_CMD_ENABLED": "1"}, "IMEX_CMD_UNIX_DOMAIN_PATH='' is not an absolute path"),
    ],
    ids=["cmd-disabled", "no-socket-path"],
)
def test_host_without_a_control_socket_exits_1(
    tmp_path: Path,
    root: Path,
    values: dict[str, str],
    message: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    config = write_config(tmp_path / "config.cfg", **values)
    assert hostservice.serve(config, root=root, stop=threading.Event()) == 1
    assert message in capsys.readouterr().err


def test_a_regular_file_at_the_socket_path_is_never_replaced(tmp_path: Path, root: Path) -> None:
    config = write_config(
        tmp_path / "config.cfg", IMEX_CMD_ENABLED="1", IMEX_CMD_UNIX_DOMAIN_PATH=SOCKET
    )
    path = root / SOCKET.lstrip("/")
    path.parent.mkdir(parents=True)
    path.write_text("not a socket")
    assert hostservice.serve(config, root=root, stop=threading.Event()) == 1
    assert path.read_text() == "not a socket"
