"""Switching a running ComputeDomain workload between upstream's Go driver and ours.

Used by ``hack/switch-drivers.py``. Nothing of upstream is committed: every
module takes the path of an upstream checkout (``kubernetes-sigs/dra-driver-nvidia-gpu``) and of
an ``NVIDIA/k8s-test-infra`` checkout and builds from them into the e2e cache.

Modules:

* ``upstream``: resolve a ref, extract that tree, build its three compute-domain binaries
  offline (``vendor/``, cgo for go-nvml's dlopen), put them in an OCI archive on a base made of
  our own driver image's Debian and python3 layers, and build NVIDIA's mock NVML.
* ``nodeprep``: what a real node needs on top of ``realsupport.prepare_node`` for upstream's
  plugin: the mock ``libnvidia-ml.so.1`` and its GB200 profile in the fake driver root, an
  ``nvidia-smi`` that answers ``--version``, and a no-op ``nvidia-cdi-hook``.
* ``drivers``: install and remove either driver (upstream with its own Helm chart, ours with
  ``config/overlays/e2e-real-nodes``), following the runbook of ``docs/migration.md``.
* ``workload``: the 2-pod ComputeDomain workload, its formation time, and the checks made after
  each switch (channel still there, clean Unprepare, a new workload forms).
"""
