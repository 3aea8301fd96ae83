"""`eventually`: returns the first truthy value, ignores only the exceptions it is told to, and
names what it waited for (and the last ignored error) when it gives up."""

from __future__ import annotations

import itertools

import pytest

from pkg.testing.eventually import eventually


def test_returns_the_first_truthy_value() -> None:
    values = iter([0, "", None, "done", "later"])
    assert eventually(lambda: next(values), 5.0) == "done"


def test_ignored_errors_count_as_not_yet() -> None:
    calls = itertools.count()

    def flaky() -> int:
        n = next(calls)
        if n < 3:
            raise AssertionError(f"kubectl failed ({n})")
        return n

    assert eventually(flaky, 5.0, ignore=(AssertionError,)) == 3


def test_other_errors_propagate_at_once() -> None:
    def broken() -> bool:
        raise KeyError("boom")

    with pytest.raises(KeyError):
        eventually(broken, 5.0, ignore=(AssertionError,))


def test_timeout_names_what_the_last_value_and_the_last_error() -> None:
    calls = itertools.count()

    def never() -> int:
        if next(calls) % 2:
            raise AssertionError("still failing")
        return 0

    with pytest.raises(AssertionError) as err:
        eventually(never, 0.05, what="the pod", every=0.01, ignore=(AssertionError,))
    text = str(err.value)
    assert text.startswith("not reached within 0.05s: the pod (last: 0)"), text
    assert "last error: still failing" in text


def test_a_fixed_interval_polls_that_often() -> None:
    calls = itertools.count(1)
    with pytest.raises(AssertionError):
        eventually(lambda: next(calls) < 0, 0.1, every=0.05)
    assert next(calls) <= 5  # 3 polls in 100 ms at 50 ms; the back-off from 1 ms makes 8
