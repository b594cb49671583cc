"""``Context`` moved into the engine (``cairn.engine.context``); this name
stays for code that imported it from here."""

from cairn.engine.context import ChildHandle, Context

__all__ = ["ChildHandle", "Context"]
