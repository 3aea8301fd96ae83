"""The ComputeDomain DRA driver of the kubelet plugin, built on `pkg.draplugin`.

The library owns sockets, registration, the DRA and health services, slice publishing, claim
fetching and the fan-out; this package is the driver: which devices a node publishes
(`claims.slice_devices`), what preparing a claim means (`state`, `cdi`, `checkpoint`,
`computedomains`), device discovery and health verdicts, and the wiring (`driver`).
"""
