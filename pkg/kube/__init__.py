"""Kubernetes access layer: resource descriptors, typed API errors, a raw-JSON REST client,
client configuration and event recording. Imports nothing from the rest of `pkg`.

Importing it defers the official client's package initialisation (`pkg.kube.lazypkg`): the
parts used here load alone, the rest only when something asks for it.
"""

from pkg.kube.lazypkg import defer_package_init

defer_package_init("kubernetes")
defer_package_init("kubernetes.config")
# kubernetes.client.rest needs two small modules of kubernetes.utils, whose __init__ loads the
# YAML object creator (PyYAML) and the metrics helpers.
defer_package_init("kubernetes.utils")
