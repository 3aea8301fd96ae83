"""Go's ``encoding/json`` and the kubelet checkpoint checksum, for files shared with Go programs.

The Go driver verifies its checkpoint by *re-marshalling* what it decoded and hashing the bytes,
so a file this driver writes is accepted by the Go driver only if it is byte-for-byte what Go's
``json.Marshal`` would produce from the same Go structs. This module owns these pieces:

* `marshal` -- compact JSON with Go's escaping (``<``, ``>``, ``&``, U+2028 and U+2029 as
  ``\\uXXXX``; short escapes for ``\\b \\f \\n \\r \\t``; lone surrogates as U+FFFD), keys in
  the order given (struct field order; map keys are sorted by `canonical`);
* `loads` -- JSON parsing that keeps every number's source text (`RawNumber`), so raw values
  (``runtime.RawExtension``) re-marshal exactly as Go re-compacts them;
* `checksum` -- ``k8s.io/kubernetes/pkg/kubelet/checkpointmanager/checksum.New(bytes)``: FNV-1a
  (32 bit) over ``spew``'s ``%#v`` rendering of the ``[]byte``, i.e. ``([]uint8)[b0 b1 ...]``
  with decimal bytes, stored as a uint64;
* `canonical` -- the value Go would hold after ``json.Unmarshal`` into a struct described by a
  `GoType`, ready to `marshal`: unknown keys dropped, keys matched exactly or case-insensitively
  (last one wins), absent fields as zero values, ``omitempty`` applied, maps sorted, nil slices
  and pointers as ``null``, ``metav1.Time`` as RFC 3339 seconds in UTC. A JSON value of the
  wrong type raises `SchemaError`, as Go's decoder would fail.

Standard library only; nothing here knows about checkpoints or claims.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Final


class SchemaError(ValueError):
    """A JSON value that Go could not decode into the expected type."""


class RawNumber(str):
    """A JSON number kept as its source text (Go keeps raw messages verbatim)."""


def loads(raw: bytes | str) -> Any:
    """Parse JSON; numbers become `RawNumber`, NaN/Infinity are rejected (Go rejects them)."""

    def no_constant(name: str) -> Any:
        raise ValueError(f"invalid JSON number {name}")

    return json.loads(raw, parse_int=RawNumber, parse_float=RawNumber, parse_constant=no_constant)


_ESCAPE: Final = re.compile('["\\\\\x00-\x1f<>&\u2028\u2029\ud800-\udfff]')
_SHORT: Final = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\f": "\\f", "\n": "\\n", "\r": "\\r"}
_SHORT["\t"] = "\\t"


def _escape(match: re.Match[str]) -> str:
    ch = match.group(0)
    if ch in _SHORT:
        return _SHORT[ch]
    if 0xD800 <= ord(ch) <= 0xDFFF:
        return "\ufffd"
    return f"\\u{ord(ch):04x}"


def _encode(value: Any, out: list[str]) -> None:
    if value is None:
        out.append("null")
    elif value is True:
        out.append("true")
    elif value is False:
        out.append("false")
    elif isinstance(value, RawNumber):
        out.append(str.__str__(value))
    elif isinstance(value, str):
        out.append('"' + _ESCAPE.sub(_escape, value) + '"')
    elif isinstance(value, int):
        out.append(str(value))
    elif isinstance(value, float) and math.isfinite(value):
        # Only inside raw values (opaque parameters of any driver, parsed by the API client):
        # Go keeps raw text verbatim, so any exact JSON spelling is stable.
        out.append(repr(value))
    elif isinstance(value, Mapping):
        out.append("{")
        for i, (key, item) in enumerate(value.items()):
            if i:
                out.append(",")
            _encode(str(key), out)
            out.append(":")
            _encode(item, out)
        out.append("}")
    elif isinstance(value, list | tuple):
        out.append("[")
        for i, item in enumerate(value):
            if i:
                out.append(",")
            _encode(item, out)
        out.append("]")
    else:
        raise TypeError(f"cannot marshal {type(value).__name__} like Go")


def marshal(value: Any) -> bytes:
    """Compact JSON exactly as Go's ``json.Marshal`` writes the equivalent value."""
    out: list[str] = []
    _encode(value, out)
    return "".join(out).encode("utf-8")


def checksum(data: bytes) -> int:
    """The kubelet checkpointmanager checksum of ``data`` (see module docstring)."""
    rendered = ("([]uint8)[" + " ".join(map(str, data)) + "]").encode("ascii")
    value = 0x811C9DC5
    for byte in rendered:
        value = ((value ^ byte) * 0x01000193) & 0xFFFFFFFF
    return value


# -- Go types ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scalar:
    """``string``, ``int``/``uint64`` or ``bool``."""

    kind: str  # "string" | "int" | "bool"


@dataclass(frozen=True)
class Time:
    """``metav1.Time`` (a struct: never omitted by ``omitempty``; zero marshals as null)."""


@dataclass(frozen=True)
class Raw:
    """``runtime.RawExtension`` or ``json.RawMessage``: any JSON, kept as is (null if absent)."""


@dataclass(frozen=True)
class Ptr:
    elem: GoType


@dataclass(frozen=True)
class Slice:
    elem: GoType


@dataclass(frozen=True)
class Map:
    """``map[string]T``: marshalled with sorted keys."""

    elem: GoType


@dataclass(frozen=True)
class Field:
    name: str
    type: GoType
    omitempty: bool = False


@dataclass(frozen=True)
class Struct:
    fields: tuple[Field, ...]


GoType = Scalar | Time | Raw | Ptr | Slice | Map | Struct

STRING: Final = Scalar("string")
INT: Final = Scalar("int")
BOOL: Final = Scalar("bool")


def _scalar(value: Any, kind: str, where: str) -> Any:
    if value is None:
        return {"string": "", "int": 0, "bool": False}[kind]
    if kind == "string" and isinstance(value, str) and not isinstance(value, RawNumber):
        return str(value)
    if kind == "bool" and isinstance(value, bool):
        return value
    if kind == "int" and not isinstance(value, bool) and isinstance(value, int | RawNumber):
        try:
            return int(value)
        except ValueError:
            pass
    raise SchemaError(f"{where}: cannot decode {value!r} into a Go {kind}")


def _time(value: Any, where: str) -> str | None:
    if value is None:
        return None
    if not isinstance(value, str) or isinstance(value, RawNumber):
        raise SchemaError(f"{where}: cannot decode {value!r} into a metav1.Time")
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError as err:
        raise SchemaError(f"{where}: {value!r} is not an RFC 3339 time") from err
    if parsed.tzinfo is None:
        raise SchemaError(f"{where}: {value!r} has no time zone")
    try:
        return parsed.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except OverflowError as err:  # e.g. 0001-01-01T00:00:00+01:00 is before year 1 in UTC
        raise SchemaError(f"{where}: {value!r} is out of range in UTC") from err


def _is_empty(value: Any, t: GoType) -> bool:
    if isinstance(t, Scalar):
        return bool(value == {"string": "", "int": 0, "bool": False}[t.kind])
    if isinstance(t, Ptr):
        return value is None
    if isinstance(t, Slice | Map):
        return value is None or len(value) == 0
    return False  # structs (including metav1.Time and RawExtension) are never empty


def _struct(value: Any, t: Struct, where: str) -> dict[str, Any]:
    if value is None:
        value = {}
    if not isinstance(value, Mapping):
        raise SchemaError(f"{where}: cannot decode {type(value).__name__} into a Go struct")
    exact = {f.name: f for f in t.fields}
    folded = {f.name.lower(): f for f in t.fields}
    given: dict[str, Any] = {}
    for key, item in value.items():
        found = exact.get(key) or folded.get(str(key).lower())
        if found is not None:
            given[found.name] = item
    out: dict[str, Any] = {}
    for f in t.fields:
        item = canonical(given.get(f.name), f.type, where=f"{where}.{f.name}")
        if f.omitempty and _is_empty(item, f.type):
            continue
        out[f.name] = item
    return out


def canonical(value: Any, t: GoType, *, where: str = "$") -> Any:
    """``value`` (parsed JSON) as Go holds it after decoding into ``t``, in marshal form."""
    if isinstance(t, Scalar):
        return _scalar(value, t.kind, where)
    if isinstance(t, Time):
        return _time(value, where)
    if isinstance(t, Raw):
        return value
    if isinstance(t, Ptr):
        return None if value is None else canonical(value, t.elem, where=where)
    if isinstance(t, Slice):
        if value is None:
            return None
        if not isinstance(value, Sequence) or isinstance(value, str):
            raise SchemaError(f"{where}: cannot decode {type(value).__name__} into a Go slice")
        return [canonical(item, t.elem, where=f"{where}[{i}]") for i, item in enumerate(value)]
    if isinstance(t, Map):
        if value is None:
            return None
        if not isinstance(value, Mapping):
            raise SchemaError(f"{where}: cannot decode {type(value).__name__} into a Go map")
        return {
            str(k): canonical(value[k], t.elem, where=f"{where}[{k!r}]")
            for k in sorted(value, key=str)
        }
    return _struct(value, t, where)
