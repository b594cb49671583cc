"""The object ``@app.workflow`` returns: the engine's ``Workflow``, named here
too because users meet it through ``App``. It is defined in the engine so that
``ctx.child`` can take one without importing the layer above."""

from cairn.engine.workflow import Workflow

__all__ = ["Workflow"]
