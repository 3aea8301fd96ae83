"""Everything about NVIDIA IMEX itself, with no Kubernetes knowledge.

``config`` (imexd.cfg), ``nodesconfig`` (peer names/IPs, sentinel), ``hosts`` (name -> IP block
in a hosts file), ``supervisor`` (the nvidia-imex child process), ``ctl`` (readiness query) and
``sim`` (a simulated nvidia-imex/nvidia-imex-ctl for machines without NVIDIA hardware).
"""
