"""Process runtime shared by the binaries: injectable clock, leader election on a Lease,
the /metrics /healthz /readyz HTTP server, OpenTelemetry tracing setup and key=value logging.
Depends only on pkg.kube (never on pkg.informers, its peer tier)."""
