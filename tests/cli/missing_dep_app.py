"""An app module whose own import of a dependency fails."""

import cairn_no_such_dependency  # noqa: F401
