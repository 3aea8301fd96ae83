"""Simulated IMEX for machines without NVIDIA hardware (unit/e2e tests, ``make demo``).

``python -m pkg.imex.sim.imexd -c imexd.cfg`` stands in for ``nvidia-imex`` and
``python -m pkg.imex.sim.ctl -c imexd.cfg -q`` for ``nvidia-imex-ctl``; ``bin/`` holds wrapper
scripts with the real binary names, so ``IMEX_BIN_DIR=<repo>/pkg/imex/sim/bin`` selects them.
The simulator is never chosen implicitly. It uses the standard library and ``pkg.imex`` only, so
any ``python3`` can run it.
"""
