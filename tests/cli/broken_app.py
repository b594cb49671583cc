"""An app module that fails while being imported."""

raise RuntimeError("the config file is missing")
