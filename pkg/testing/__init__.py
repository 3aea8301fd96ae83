"""Test doubles shared by the unit and e2e tests (never imported by production code)."""
