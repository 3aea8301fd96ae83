"""What the tests, the demo and the benchmarks drive the system with: one importable package.

Cluster and node harnesses shared by ``test/`` and ``hack/`` scripts (``e2e_support`` and
``workloads`` of the simulated-node lane, ``realsupport`` of the real-node lane), the chaos and
fault loops (``chaos``, ``faults``, ``chaosreal``, ``hostimex``), the in-process kubelet-plugin
harness (``kp_harness``, ``kp_crashing_plugin``), the chart renderer (``helmchart``), config/
rendered offline with the reviewed RBAC table (``manifests``), the binaries started past their
flags (``binaries``), the CLI's seeded domain (``cliseed``), the Lease fake of the runtime tests
(``runtime_fakes``) and the fake API server's suite (``fakeapiserver_suite``). ``test/`` holds
only tests; they import this package like any other::

    from testsupport.e2e_support import Driver, wait_for

The editable install (``hack/venv.sh``, ``pyproject.toml``) makes it importable from pytest,
from ``python hack/<script>.py`` and from any subprocess the tests start with the venv's
interpreter. In-process API server doubles stay in ``pkg.testing``.
"""
