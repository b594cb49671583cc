"""What importing Cairn costs: the heavy and optional dependencies load where
they are used, never at ``import cairn`` (issue 22: every test that spawned a
worker paid numpy, jsonschema and the rest, and so did every CLI call).

Each check runs in a fresh interpreter: this process has imported everything
already, so its ``sys.modules`` says nothing about what an import pulls in.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

import cairn

#: loaded only by the feature that needs them (vector search, an approval edit's
#: schema check, the CLI's rendering, the OpenAI adapter, the LangGraph store)
HEAVY = ("numpy", "httpx", "jsonschema", "rich", "langgraph", "openai")
#: optional extras: never loaded by the library's core (App, a worker, the SQLite store)
EXTRAS = ("psycopg", "starlette", "uvicorn", "pydantic", "opentelemetry", "schemathesis")


def loaded_after(statement: str) -> list[str]:
    """The top-level packages of HEAVY and EXTRAS that ``statement`` imports in a new interpreter."""
    probe = (f"{statement}\nimport json, sys\n"
             f"print(json.dumps(sorted({{m.split('.')[0] for m in sys.modules}} & {set(HEAVY + EXTRAS)!r})))")
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=120,
                          check=False)
    assert done.returncode == 0, f"{statement!r} failed:\n{done.stderr}"
    loaded: list[str] = json.loads(done.stdout.strip().splitlines()[-1])
    return loaded


@pytest.mark.slow
def test_import_cairn_loads_no_heavy_or_optional_dependency() -> None:
    assert loaded_after("import cairn") == []


@pytest.mark.slow
def test_an_app_with_a_worker_on_sqlite_loads_no_heavy_or_optional_dependency() -> None:
    """What a worker process imports: App, the worker, the SQLite store."""
    assert loaded_after("from cairn import App\nimport cairn.worker, cairn.store.sqlite, cairn.testing") == []


def test_every_public_name_resolves() -> None:
    """``cairn`` imports its public names on first use (``__getattr__``): each
    one of ``__all__`` must resolve, and the table it imports from must name
    exactly those."""
    for name in cairn.__all__:
        assert getattr(cairn, name) is not None, name
    assert sorted(cairn._LAZY) == sorted(cairn.__all__)


def test_an_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nope'"):
        cairn.Nope  # type: ignore[attr-defined]  # noqa: B018
