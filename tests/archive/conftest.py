"""Fixtures of the archive tests: the audit tests' database URL on each backend, and encryption off / on."""

from tests.audit.conftest import place, sealed

__all__ = ["place", "sealed"]
