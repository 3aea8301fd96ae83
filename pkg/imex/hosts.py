"""A hosts file (``/etc/hosts`` format) holding the IMEX name -> pod IP mapping.

Owns reading and rewriting one marker block inside a hosts file that other parties (the
kubelet, the container runtime, a test harness) also write.

Invariants:
- every line outside our marker block is preserved byte for byte, in order;
- the block is delimited by :data:`BEGIN_MARKER`/:data:`END_MARKER` and holds ``IP<TAB>name``
  lines sorted by name, so the same mapping always renders the same bytes;
- legacy unmarked lines for one of our names (written by an older daemon) are dropped, so a name
  never resolves twice;
- the write is atomic (temp file + rename) when possible. A kubelet-managed ``/etc/hosts`` is a
  bind mount that cannot be renamed over (EBUSY/EXDEV), in a directory no temp file can be
  created in when the container's root filesystem is read-only (EROFS, the daemon pod's
  ``readOnlyRootFilesystem``; EACCES/EPERM without write permission on the directory); then the
  file is rewritten in place, which is what upstream always does.

:func:`resolve` is the reader used by the simulated IMEX: first matching line wins, as in glibc.
"""

from __future__ import annotations

import errno
import os
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Final

from pkg.base.files import write_file_atomically

BEGIN_MARKER: Final = "# BEGIN compute-domain-daemon mappings (managed, do not edit)"
END_MARKER: Final = "# END compute-domain-daemon mappings"

# Why a temp file + rename next to the hosts file can fail while the file itself is writable.
_IN_PLACE_ERRNOS: Final = frozenset(
    {errno.EBUSY, errno.EXDEV, errno.EROFS, errno.EACCES, errno.EPERM}
)


def parse_hosts(text: str) -> list[tuple[str, list[str]]]:
    """``(address, [names])`` for every non-comment line."""
    entries = []
    for raw in text.splitlines():
        fields = raw.split("#", 1)[0].split()
        if len(fields) >= 2:
            entries.append((fields[0], fields[1:]))
    return entries


def resolve(text: str, name: str) -> str | None:
    """The address of ``name`` in hosts-file ``text`` (first match), or None."""
    for address, names in parse_hosts(text):
        if name in names:
            return address
    return None


def render_hosts(existing: str, mapping: Mapping[str, str], *, name_prefix: str) -> str:
    """``existing`` with our block replaced by ``mapping`` (name -> address).

    Lines outside the block are kept unless they are unmarked legacy entries naming a host that
    starts with ``name_prefix``. An empty mapping removes the block.
    """
    kept: list[str] = []
    inside = False
    for line in existing.splitlines():
        stripped = line.strip()
        if stripped == BEGIN_MARKER:
            inside = True
            continue
        if stripped == END_MARKER:
            inside = False
            continue
        if inside:
            continue
        fields = stripped.split("#", 1)[0].split()
        if len(fields) >= 2 and any(n.startswith(name_prefix) for n in fields[1:]):
            continue
        kept.append(line)
    if mapping:
        kept.append(BEGIN_MARKER)
        kept += [f"{mapping[name]}\t{name}" for name in sorted(mapping)]
        kept.append(END_MARKER)
    return "\n".join(kept) + "\n" if kept else ""


class HostsFile:
    """Our block in the hosts file at ``path``; :meth:`update` is thread-safe."""

    def __init__(self, path: str | os.PathLike[str], *, name_prefix: str) -> None:
        self._path = Path(path)
        self._prefix = name_prefix
        self._lock = threading.Lock()

    @property
    def path(self) -> Path:
        return self._path

    def read(self) -> str:
        try:
            return self._path.read_text(encoding="utf-8")
        except FileNotFoundError:
            return ""

    def update(self, mapping: Mapping[str, str]) -> bool:
        """Make our block equal ``mapping``; True if the file content changed."""
        with self._lock:
            current = self.read()
            wanted = render_hosts(current, mapping, name_prefix=self._prefix)
            if wanted == current:
                return False
            try:
                write_file_atomically(self._path, wanted)
            except OSError as err:
                if err.errno not in _IN_PLACE_ERRNOS:
                    raise
                # Bind-mounted file (the pod's /etc/hosts, writable in a read-only /etc): only
                # an in-place rewrite works.
                with self._path.open("w", encoding="utf-8") as f:
                    f.write(wanted)
            return True
