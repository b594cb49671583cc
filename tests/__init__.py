"""The test suite. This file runs before any test module or conftest body.

Bytecode: where the environment asks Python not to write ``.pyc`` files
(``PYTHONDONTWRITEBYTECODE``, set on this project's machines), every test
process and every worker process a test spawns would compile Cairn and the
test modules from source again: measured, collecting the suite took 7.0 s of
CPU that way and 2.4 s from cached bytecode, and each spawned worker paid
0.2 s more to import Cairn. The suite keeps its bytecode out of the source
tree, as that setting wants, but not uncached: in one directory under the
temporary directory (``sys.pycache_prefix``, which pytest's rewritten test
modules honour too), for this process and, through the environment, for
every process it starts (pytest-xdist's workers included). Python checks each
cached file against its source's modification time and size, as usual.
"""

from __future__ import annotations

import os
import sys
import tempfile

if sys.dont_write_bytecode:
    _prefix = os.environ.get("PYTHONPYCACHEPREFIX") or os.path.join(
        tempfile.gettempdir(), f"cairn-tests-pycache-{os.getuid()}")
    sys.pycache_prefix = _prefix
    sys.dont_write_bytecode = False
    os.environ["PYTHONPYCACHEPREFIX"] = _prefix
    os.environ.pop("PYTHONDONTWRITEBYTECODE", None)
