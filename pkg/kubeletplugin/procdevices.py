"""Character-device majors from ``/proc/devices`` and the IMEX channel device nodes.

Owns parsing of the "Character devices:" section (the path is injectable: upstream's mock mode
reads ``ALT_PROC_DEVICES_PATH``) and the table of IMEX channel nodes
``/dev/nvidia-caps-imex-channels/channel<N>`` (char device, major from the
``nvidia-caps-imex-channels`` line, minor N, mode 0666). Invariant: a device name must appear
exactly once in the character section, otherwise start-up fails with a clear message.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final

PROC_DEVICES: Final = Path("/proc/devices")
IMEX_CHANNELS_DEVICE: Final = "nvidia-caps-imex-channels"
NVIDIA_CAPS_DEVICE: Final = "nvidia-caps"
NVIDIA_UVM_DEVICE: Final = "nvidia-uvm"
IMEX_CHANNEL_DIR: Final = "/dev/nvidia-caps-imex-channels"
CHANNEL_FILE_MODE: Final = 0o666


class ProcDevicesError(Exception):
    """The device table does not list a required major exactly once."""


@dataclass(frozen=True)
class DeviceNode:
    """One CDI ``deviceNodes`` entry for a character device created inside the container."""

    path: str
    major: int
    minor: int
    file_mode: int = CHANNEL_FILE_MODE

    def to_cdi(self) -> dict[str, object]:
        return {
            "path": self.path,
            "type": "c",
            "major": self.major,
            "minor": self.minor,
            "fileMode": self.file_mode,
        }


def char_device_major(name: str, *, path: Path = PROC_DEVICES) -> int:
    try:
        text = path.read_text()
    except OSError as err:
        raise ProcDevicesError(f"cannot read {path}: {err}") from err
    in_char = False
    majors: list[int] = []
    for line in text.splitlines():
        stripped = line.strip()
        if stripped == "Character devices:":
            in_char = True
            continue
        if stripped == "Block devices:":
            in_char = False
            continue
        match = re.fullmatch(r"(\d+)\s+(\S+)", stripped)
        if in_char and match and match.group(2) == name:
            majors.append(int(match.group(1)))
    if len(majors) != 1:
        found = "not found" if not majors else f"listed {len(majors)} times"
        raise ProcDevicesError(f'character device "{name}" {found} in {path}')
    return majors[0]


def optional_char_device_major(name: str, *, path: Path = PROC_DEVICES) -> int | None:
    """Like `char_device_major`, but None when ``name`` is not listed exactly once (or the
    table is unreadable): for optional devices such as ``nvidia-uvm``."""
    try:
        return char_device_major(name, path=path)
    except ProcDevicesError:
        return None


def imex_channel_nodes(major: int, count: int) -> tuple[DeviceNode, ...]:
    """Precomputed nodes for channels 0..count-1 (built once: All mode needs 2048 of them)."""
    return tuple(
        DeviceNode(path=f"{IMEX_CHANNEL_DIR}/channel{i}", major=major, minor=i)
        for i in range(count)
    )


def imex_mgmt_node(*, caps_file: Path, caps_major: int) -> DeviceNode:
    """Node for the fabric-imex-mgmt capability (``DeviceFileMinor``/``DeviceFileMode`` lines)."""
    try:
        text = caps_file.read_text()
    except OSError as err:
        raise ProcDevicesError(f"cannot read {caps_file}: {err}") from err
    pairs = (line.partition(":") for line in text.splitlines())
    fields = {k.strip(): v.strip() for k, _, v in pairs if v}
    try:
        minor = int(fields["DeviceFileMinor"])
        mode = int(fields.get("DeviceFileMode", "256"))
    except (KeyError, ValueError) as err:
        raise ProcDevicesError(f"{caps_file}: no valid DeviceFileMinor line") from err
    return DeviceNode(
        path=f"/dev/nvidia-caps/nvidia-cap{minor}", major=caps_major, minor=minor, file_mode=mode
    )
