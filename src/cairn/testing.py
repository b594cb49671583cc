"""Helpers for users' test suites: ``cairn.testing.replay(app, "run.json")``
(see ``cairn.api.testing``)."""

from cairn.api.testing import replay

__all__ = ["replay"]
