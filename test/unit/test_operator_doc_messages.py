"""Every message docs/operators.md quotes for an operator to match is one the code can print.

An operator greps a log or an Event for the text the docs quote; a quoted message the code does
not print (reworded since, or never ours) sends them nowhere. The check reads every inline code
span of docs/operators.md that reads like a message (three or more words, lower-case prose, not a
command) and requires each of its literal parts -- the text between the docs' placeholders
(``<uid>``, ``...``) -- to be produced by a string of pkg/ or cmd/ (f-string fields, ``%s`` and
``.format`` fields and module constants resolved where they are constants, any value otherwise)
or to appear in config/ or the chart. The section on upstream's behaviour quotes upstream, and
`NOT_OURS` lists, with the reason, the texts quoted from Kubernetes itself.
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable, Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "operators.md"
ANY = "\x00"  # a field of a code string: matches any text
COMMANDS = re.compile(
    r"^(kubectl|helm|make|hack/|python|pipx|skopeo|buildx|promtool|curl|sudo|apt-get|manifest|"
    r"nvidia-imex-ctl|nvidia-ctk|count|histogram_quantile)[ (]"
)
# A klog structured line: the message quoted, then key="value" pairs the log setup adds.
KLOG_FIELDS = re.compile(r'^"(?P<message>[^"]+)"(?: [\w.]+="[^"]*")+$')
# Texts the docs quote that Kubernetes (not this driver) prints or defines.
NOT_OURS = {
    "cannot allocate all claims": "kube-scheduler's DRA plugin: the pod's FailedScheduling Event",
    "Last State": "a heading of `kubectl describe pod`",
    "PriorityClass in (system-node-critical, system-cluster-critical)": (
        "a ResourceQuota scopeSelector the operator writes"
    ),
    "checkpoint is corrupted": "an older Go plugin's error on a checkpoint shape it cannot verify",
}
# Messages composed at run time from parts no one literal holds (prefix -> where).
COMPOSED = {
    "starting compute-domain-": "BuildInfo.startup_message: its key=value pairs are log_fields()",
}
# Sections that quote other software's messages on purpose.
SKIPPED_SECTIONS = ("## How this differs from the upstream Go driver",)


def _module_constants(tree: ast.Module) -> dict[str, str]:
    out = {}
    for stmt in tree.body:
        target = stmt.targets[0] if isinstance(stmt, ast.Assign) else getattr(stmt, "target", None)
        value = getattr(stmt, "value", None)
        if isinstance(target, ast.Name) and isinstance(value, ast.Constant):
            out.update({target.id: value.value} if isinstance(value.value, str) else {})
    return out


def _field_of(value: ast.expr, field: Callable[[ast.expr], str]) -> str:
    return field(value.value) if isinstance(value, ast.FormattedValue) else ANY


def _code_strings() -> list[str]:
    """Every string literal of pkg/ and cmd/, fields as `ANY` unless they name a constant."""
    trees = [ast.parse(p.read_text()) for r in ("pkg", "cmd") for p in (REPO / r).rglob("*.py")]
    constants: dict[str, str] = {}
    for tree in trees:
        constants.update(_module_constants(tree))

    def field(node: ast.expr) -> str:
        if isinstance(node, ast.Name) and node.id in constants:
            return constants[node.id]
        if isinstance(node, ast.Attribute) and node.attr in constants:
            return constants[node.attr]
        return ANY

    out = []
    for tree in trees:
        docstrings = {
            id(stmt.value)
            for node in ast.walk(tree)
            if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef)
            for stmt in node.body[:1]
            if isinstance(stmt, ast.Expr) and isinstance(stmt.value, ast.Constant)
        }
        for node in ast.walk(tree):
            if id(node) in docstrings:
                continue  # a docstring describes messages; only code prints them
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = node.value
            elif isinstance(node, ast.JoinedStr):
                text = "".join(
                    str(v.value) if isinstance(v, ast.Constant) else _field_of(v, field)
                    for v in node.values
                )
            else:
                continue
            out.append(re.sub(r"%[-#0-9.]*[sdrfxi]|\{[^{}]*\}", ANY, text))
    return out


def _config_text() -> str:
    return "\n".join(
        p.read_text()
        for r in ("config", "deployments")
        for p in (REPO / r).rglob("*")
        if p.suffix in (".yaml", ".tpl", ".json")
    )


def _spaced(text: str) -> str:
    return re.sub(r"\s+", " ", text)


def quoted_messages(doc: str) -> Iterator[str]:
    """The code spans of ``doc`` that read like a message (see the module docstring)."""
    for section in re.split(r"\n(?=## )", doc):
        if section.startswith(SKIPPED_SECTIONS):
            continue
        body = re.sub(r"```.*?```", "", section, flags=re.S).replace("\n", " ")
        for span in re.findall(r"`([^`]+)`", body):
            text = re.sub(r"^[IWEF]\d{4} [^\]]*\] ", "", _spaced(span))  # a klog header
            structured = KLOG_FIELDS.match(text)
            if structured:
                text = structured["message"]
            if len(text.split()) < 3 or not re.search(r"[a-z] [a-z]", text):
                continue  # a name, a value or a command line, not a message
            if COMMANDS.match(text) or text in NOT_OURS or text.startswith(tuple(COMPOSED)):
                continue
            yield text


def _any_suffix(text: str) -> str:
    return "(?:" + "|".join(re.escape(text[i:]) for i in range(len(text) + 1)) + ")"


def _any_prefix(text: str) -> str:
    return "(?:" + "|".join(re.escape(text[:i]) for i in range(len(text), -1, -1)) + ")"


def _fits(fragment: str, string: str) -> bool:
    """Whether ``fragment`` is a stretch of some text ``string`` can print: its literal parts in
    order with anything in their fields, the stretch starting and ending anywhere."""
    parts = string.split(ANY)
    # Only strings sharing a real piece of literal text with the fragment can print it.
    if not any(len(part) >= 6 and part in fragment for part in parts):
        return False
    for first in range(len(parts)):
        for last in range(first + 1, len(parts)):
            # Lazy fields and longest pieces first: the match credits the string's own text.
            middle = "".join("(.*?)" + re.escape(part) for part in parts[first + 1 : last])
            pattern = _any_suffix(parts[first]) + middle + "(.*?)" + _any_prefix(parts[last])
            found = re.fullmatch(pattern, fragment)
            # A real share of the fragment must be the string's own text, not its fields'.
            own = len(fragment) - sum(map(len, found.groups())) if found else 0
            if own >= max(10, len(fragment) / 3):
                return True
    return False


def _printed_by(fragment: str, code: list[str], config: str) -> bool:
    if fragment in config:
        return True
    return any(fragment in string or (ANY in string and _fits(fragment, string)) for string in code)


def unprinted(doc: str) -> list[str]:
    """The quoted messages of ``doc`` with a literal part no code string or config produces."""
    code = [_spaced(s) for s in _code_strings()]
    config = _spaced(_config_text())
    missing = []
    for message in quoted_messages(doc):
        parts = [p.strip(" .,:;\"'()") for p in re.split(r"<[^>]*>|\.\.\.|…", message)]
        if any(len(p) >= 6 and not _printed_by(p, code, config) for p in parts):
            missing.append(message)
    return missing


def test_every_quoted_message_is_printed_by_the_code() -> None:
    assert unprinted(DOC.read_text()) == []


def test_the_check_catches_a_reworded_message() -> None:
    """The message the plugin printed before (`is in use by claim`) is caught; today's passes."""
    section = (
        "## Troubleshooting\n\n"
        "- `IMEX channel 0 ... is in use by claim ...`\n"
        "- `allocation failed: channel 0 already allocated by claim <uid>`\n"
        "- `error refreshing nvidia.com/gpu.clique node label: ...`\n"
    )
    assert unprinted(section) == ["IMEX channel 0 ... is in use by claim ..."]
