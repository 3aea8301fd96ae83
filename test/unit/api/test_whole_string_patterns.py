"""Whole-string checks refuse a trailing newline (``$`` alone would accept one), so such a value
never reaches a CEL selector, a label or an object name."""

from __future__ import annotations

import pytest

from pkg.api.computedomain import InvalidComputeDomainError, validate_name
from pkg.api.placement import valid_clique_id


@pytest.mark.parametrize(
    ("value", "valid"),
    [("abc.1", True), ("abc.1\n", False), ("\nabc.1", False), ("abc.1\n\n", False)],
    ids=["plain", "trailing-newline", "leading-newline", "two-newlines"],
)
def test_clique_id(value: str, valid: bool) -> None:
    assert valid_clique_id(value) is valid


@pytest.mark.parametrize("value", ["rct\n", "rct\r\n", "rct.example\n"])
def test_a_name_with_a_trailing_newline_is_refused_naming_the_field(value: str) -> None:
    with pytest.raises(InvalidComputeDomainError, match=r"^spec\.channel\.resourceClaimTemplate"):
        validate_name(value, field="spec.channel.resourceClaimTemplate.name")
    validate_name(value.rstrip(), field="spec.channel.resourceClaimTemplate.name")
