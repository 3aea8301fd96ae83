"""Simulated IMEX for machines without NVIDIA hardware (unit/e2e tests, ``make demo``, kind).

``python -m pkg.imex.sim.imexd -c imexd.cfg`` stands in for ``nvidia-imex`` and
``python -m pkg.imex.sim.ctl -c imexd.cfg -q`` for ``nvidia-imex-ctl``. The daemon never selects
the simulator: a test driver root (``pkg.testing.fakedriverroot``) installs it as
``usr/bin/nvidia-imex``/``nvidia-imex-ctl``, and it reaches a daemon only the way the real
binaries do, through the kubelet plugin's CDI spec. It uses the standard library and
``pkg.imex`` only, so any ``python3`` can run it.
"""
