"""Benchmark scripts (run as files, e.g. ``hack/bench/import_time.py``); nothing imports them
(import contract in ``hack/.importlinter``): what a benchmark and a test share lives in the
package it measures or in ``pkg.testing``."""
