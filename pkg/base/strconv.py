"""Go's ``strconv.ParseBool``: the one boolean parser of every flag, env variable and gate.

Owns the spellings a boolean may take anywhere in the driver's configuration: exactly the twelve
Go's ``strconv.ParseBool`` accepts (``1 t T TRUE true True`` and ``0 f F FALSE false False``),
which are also what the Go driver's flags, env variables (urfave/cli) and feature gates
(component-base) accept. Nothing else counts: not ``yes``/``no``/``on``/``off``, not other
capitalisations, not surrounding whitespace, not the empty string (an empty env variable means
"unset" one layer up, in `pkg.runtime.flags`). The base layer: standard library only.
"""

from __future__ import annotations

from typing import Final

__all__ = ["FALSE_SPELLINGS", "TRUE_SPELLINGS", "parse_bool"]

TRUE_SPELLINGS: Final = ("1", "t", "T", "TRUE", "true", "True")
FALSE_SPELLINGS: Final = ("0", "f", "F", "FALSE", "false", "False")


def parse_bool(text: str) -> bool:
    """``True``/``False`` for one of Go's spellings; raises ``ValueError`` naming the accepted
    ones for anything else (the caller prefixes the flag, env variable or gate)."""
    if text in TRUE_SPELLINGS:
        return True
    if text in FALSE_SPELLINGS:
        return False
    accepted = ", ".join(TRUE_SPELLINGS + FALSE_SPELLINGS)
    raise ValueError(f'invalid boolean "{text}" (accepted: {accepted})')
