"""What every test tier shares: pytest's assertion messages inside `testsupport` too.

The shared machinery (`hack/testsupport`) asserts on behalf of the tests, and the fake API
server's suite (`testsupport.fakeapiserver_suite`) is made of tests; pytest rewrites only test
modules and conftests unless told, and must be told before the package is imported.
"""

from __future__ import annotations

import pytest

pytest.register_assert_rewrite("testsupport")
