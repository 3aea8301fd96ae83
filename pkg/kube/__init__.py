"""Kubernetes access layer: resource descriptors, typed API errors, a raw-JSON REST client,
client configuration and event recording. Imports nothing from the rest of `pkg`."""
