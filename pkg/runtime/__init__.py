"""Process runtime shared by the binaries: injectable clock, leader election on a Lease,
the /metrics /healthz /readyz HTTP server, OpenTelemetry tracing setup, key=value logging and
which build is running (``buildinfo``: version, revision, build date; the ``--version`` flag;
the ``<prefix>_build_info`` gauge).
Depends only on pkg.kube (never on pkg.informers, its peer tier)."""
