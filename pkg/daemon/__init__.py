"""The per-ComputeDomain IMEX daemon (``compute-domain-daemon``).

``options`` (flags/env), ``membership`` (our entry in the ComputeDomainClique or CD status),
``imexsync`` (membership -> IMEX files and process), ``metrics``, ``logs`` and ``daemon`` (the
control loop, ``run`` and ``check``; it follows the membership object with a `pkg.informers`
SharedInformer).
"""
