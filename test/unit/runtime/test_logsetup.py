"""One log setup for every binary: klog text and component-base JSON lines, klog ``-v`` levels,
``--vmodule``, the process context, and the binaries' ``--logging-format`` / ``--vmodule`` flags."""

from __future__ import annotations

import io
import json
import logging
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from testsupport.binaries import BINARIES, start_binary

from pkg.runtime.logsetup import (
    JsonFormatter,
    KlogTextFormatter,
    LoggingConfigError,
    V,
    parse_vmodule,
    setup_logging,
    validate_logging_format,
    verbosity_to_level,
)

REPO = Path(__file__).resolve().parents[3]
KLOG_HEADER = re.compile(r"^([IWEF])(\d{4}) (\d\d:\d\d:\d\d\.\d{6}) +(\d+) ([\w.]+):(\d+)\] (.*)$")


def _record(msg: str, level: int = logging.INFO, **fields: object) -> logging.LogRecord:
    record = logging.LogRecord("pkg.x", level, "/src/pkg/x/mod.py", 42, msg, (), None)
    for key, value in fields.items():
        setattr(record, key, value)
    return record


@pytest.fixture
def root_restored() -> Iterator[logging.Logger]:
    root = logging.getLogger()
    level, handlers = root.level, list(root.handlers)
    yield root
    for h in list(root.handlers):
        if h not in handlers:
            root.removeHandler(h)
    for h in handlers:
        if h not in root.handlers:
            root.addHandler(h)
    root.setLevel(level)


def test_klog_text_without_fields_is_infof_style() -> None:
    line = KlogTextFormatter().format(_record("Processing ComputeDomain: ns/cd/uid"))
    m = KLOG_HEADER.match(line)
    assert m, line
    severity, _mmdd, _time, pid, file, lineno, body = m.groups()
    assert (severity, file, lineno) == ("I", "mod.py", "42")
    assert int(pid) > 0
    assert body == "Processing ComputeDomain: ns/cd/uid"


def test_klog_text_with_fields_is_infos_style_and_quotes_every_value() -> None:
    line = KlogTextFormatter().format(_record('say "hi"', key="ns/cd 1", count=3))
    body = KLOG_HEADER.match(line).group(7)  # type: ignore[union-attr]
    assert body == '"say \\"hi\\"" key="ns/cd 1" count="3"'


@pytest.mark.parametrize(
    ("level", "letter"),
    [(logging.WARNING, "W"), (logging.ERROR, "E"), (logging.CRITICAL, "F"), (V(4), "I")],
)
def test_klog_severity_letters(level: int, letter: str) -> None:
    assert KlogTextFormatter().format(_record("m", level)).startswith(letter)


def test_json_lines_follow_component_base() -> None:
    info = json.loads(JsonFormatter().format(_record("hello", V(2), key="ns/cd")))
    assert info["caller"] == "mod.py:42" and info["msg"] == "hello"
    assert info["v"] == 2 and info["key"] == "ns/cd" and isinstance(info["ts"], float)
    assert "err" not in info
    err = json.loads(JsonFormatter().format(_record("failed", logging.ERROR)))
    assert "v" not in err and "err" in err


def test_verbosity_follows_klog_levels(root_restored: logging.Logger) -> None:
    out = io.StringIO()
    setup_logging(2, stream=out)
    log = logging.getLogger("klog")
    log.log(V(2), "at two")
    log.log(V(3), "at three")
    log.debug("debug line")
    log.info("info line")
    text = out.getvalue()
    assert "at two" in text and "info line" in text
    assert "at three" not in text and "debug line" not in text
    out.truncate(0)
    out.seek(0)
    setup_logging(4, stream=out)
    log.log(V(4), "at four")
    log.log(V(5), "at five")
    log.debug("debug line")
    assert "at four" in out.getvalue() and "debug line" in out.getvalue()
    assert "at five" not in out.getvalue()
    with pytest.raises(ValueError):
        V(10)
    assert verbosity_to_level(0) == logging.INFO
    assert verbosity_to_level(2) == V(2)
    assert verbosity_to_level(7) == logging.DEBUG


def test_vmodule_raises_one_file_above_the_global_level(root_restored: logging.Logger) -> None:
    out = io.StringIO()
    setup_logging(0, vmodule="test_logs*=6", stream=out)
    logging.getLogger("here").log(V(6), "from this file")
    logging.getLogger("here").log(V(7), "too verbose")
    assert "from this file" in out.getvalue() and "too verbose" not in out.getvalue()
    assert parse_vmodule("a=1, b*=4") == (("a", 1), ("b*", 4))
    for bad in ("a", "a=x", "=3"):
        with pytest.raises(LoggingConfigError, match="invalid entry"):
            parse_vmodule(bad)
    with pytest.raises(LoggingConfigError, match='Unsupported log format "xml"'):
        validate_logging_format("xml")


def test_setup_is_idempotent_and_context_reaches_every_line(
    root_restored: logging.Logger,
) -> None:
    out = io.StringIO()
    setup_logging(0, stream=out)
    setup_logging(0, logging_format="json", context={"cd": "ns/cd", "node": "n1"}, stream=out)
    ours = [h for h in root_restored.handlers if getattr(h, "_klog_handler", False)]
    assert len(ours) == 1
    logging.getLogger("other.lib").warning("from a library")
    obj = json.loads(out.getvalue().strip())
    assert obj["cd"] == "ns/cd" and obj["node"] == "n1" and obj["msg"] == "from a library"


@pytest.mark.parametrize("binary", sorted(BINARIES))
def test_every_binary_writes_klog_text_and_json(binary: str) -> None:
    text = start_binary(binary).stderr.splitlines()[0]
    m = KLOG_HEADER.match(text)
    assert m and m.group(1) == "I" and f"starting {binary}" in m.group(7), text
    first = start_binary(binary, "--logging-format=json").stderr.splitlines()[0]
    obj = json.loads(first)
    assert obj["v"] == 0 and obj["msg"].startswith(f"starting {binary}")


@pytest.mark.parametrize("binary", sorted(BINARIES))
def test_every_binary_refuses_a_bad_format_or_vmodule(binary: str) -> None:
    for flag, needle in (
        ("--logging-format=xml", 'Unsupported log format "xml"'),
        ("--vmodule=oops", "--vmodule"),
    ):
        out = start_binary(binary, flag)
        assert out.returncode in (1, 2) and needle in out.stderr, out.stderr
