"""The start-up configuration dump: one level-0 log line, shaped as the Go driver prints it.

Upstream's binaries log, once at start, ``Commit: <sha>``, a blank line, ``Feature gates:``
with Go's ``%#v`` of the full gate map (``map[string]bool{"A":false, "B":true}``, keys
sorted) and ``Flags:`` with a go-spew dump of the flag values (``name: (type) value``). Runbooks
and upstream's own e2e suite grep that line (``Verbosity:``, ``"MPSSupport":false``,
``additionalNamespaces:``, ``nodeName``), so ours has the same shape. Flag names are
camelCase of the command-line names; nothing secret is a flag (a kubeconfig is a path).
"""

from __future__ import annotations

from collections.abc import Mapping

__all__ = ["camel_case", "go_map", "spew_value", "startup_config"]


def camel_case(flag: str) -> str:
    """``max-nodes-per-imex-domain`` / ``max_nodes_per_imex_domain`` → ``maxNodesPerImexDomain``."""
    head, *rest = flag.replace("_", "-").split("-")
    return head + "".join(part[:1].upper() + part[1:] for part in rest)


def go_map(values: Mapping[str, bool]) -> str:
    """Go's ``%#v`` of a ``map[string]bool``: keys sorted, ``"Name":true`` joined by ``, ``."""
    body = ", ".join(f'"{k}":{str(values[k]).lower()}' for k in sorted(values))
    return f"map[string]bool{{{body}}}"


def spew_value(value: object) -> str:
    """go-spew's rendering of one value: ``(string) (len=3) "abc"``, ``(int) 4``,
    ``(bool) true``, ``(float64) 5``; sequences as ``([]string) (len=2) {"a", "b"}``; ``None``
    as ``(interface {}) <nil>``."""
    if value is None:
        return "(interface {}) <nil>"
    if isinstance(value, bool):
        return f"(bool) {str(value).lower()}"
    if isinstance(value, int):
        return f"(int) {value}"
    if isinstance(value, float):
        return f"(float64) {value:g}"
    if isinstance(value, list | tuple | frozenset | set):
        items = ", ".join(f'"{v}"' for v in value)
        return f"([]string) (len={len(value)}) {{{items}}}"
    text = str(value)
    quoted = text.replace("\\", "\\\\").replace('"', '\\"')
    return f'(string) (len={len(text)}) "{quoted}"'


def startup_config(
    *, revision: str, gates: Mapping[str, bool], flags: Mapping[str, object], type_name: str
) -> str:
    """The dump's text (several lines, logged as one record). ``flags`` maps flag names (any
    spelling `camel_case` understands) to values; ``verbosity`` is printed as upstream's
    ``klogVerbosity``."""
    lines = [
        f"Commit: {revision}",
        "",
        f"Feature gates: {go_map(gates)}",
        f"Flags: ({type_name}) {{",
    ]
    printed = {
        "klogVerbosity" if name in ("v", "verbosity") else camel_case(name): value
        for name, value in flags.items()
    }
    lines.extend(f" {key}: {spew_value(printed[key])}," for key in sorted(printed))
    lines.append("}")
    return "\n".join(lines)
