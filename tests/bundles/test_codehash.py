"""What a bundle's code hash covers (issue 21): the workflow function and
what it reaches in its own package (module constants, helpers, decorators
between ``@app.workflow`` and the function), not the rest of its module;
and the same hash in every process, also without source (a ``.pyc``-only
deploy) whatever ``PYTHONHASHSEED`` is.

Each variant is a package written to a temporary directory under a name of
its own, so two variants are two deployments of "the same" code."""

from __future__ import annotations

import compileall
import importlib
import os
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

import pytest

import cairn
from cairn.engine.bundles import code_hash

BASE = {
    "flows.py": '''
        import functools

        import cairn

        from . import helpers

        RATE = 3
        LIMITS = {"max": 5}
        KINDS = frozenset({"card", "bank", "cash", "wire", "check", "crypto", "gift", "store"})


        def traced(fn):
            @functools.wraps(fn)
            def wrapper(ctx, *args, **kwargs):
                return fn(ctx, *args, **kwargs)
            return wrapper


        def scaled(x):
            return x * RATE


        @traced
        def flow(ctx, x, kind):
            if kind not in {"card", "bank", "cash", "wire", "check", "crypto", "gift", "store"}:
                return 0
            assert kind in KINDS
            return min(scaled(x), LIMITS["max"]) + helpers.fee(x)


        def unrelated(ctx):
            return 1


        def importing(ctx, x):
            from .helpers import fee
            return fee(x)
    ''',
    "helpers.py": '''
        def fee(x):
            return x // 10


        def unused():
            return 2
    ''',
}


def _write(root: Path, package: str, files: dict[str, str]) -> None:
    (root / package).mkdir(parents=True)
    (root / package / "__init__.py").write_text("")
    for name, text in files.items():
        (root / package / name).write_text(textwrap.dedent(text))


@pytest.fixture
def packages(tmp_path: Path) -> Iterator[Path]:
    sys.path.insert(0, str(tmp_path))
    before = set(sys.modules)
    yield tmp_path
    sys.path.remove(str(tmp_path))
    for name in set(sys.modules) - before:
        if name.startswith("variant_"):
            del sys.modules[name]


_made = iter(range(1_000_000))


def _variant(root: Path, edits: dict[str, tuple[str, str]] | None = None) -> ModuleType:
    """The package BASE with ``edits`` (file: (old, new)) under a new name."""
    files = dict(BASE)
    for name, (old, new) in (edits or {}).items():
        assert old in files[name], old
        files[name] = files[name].replace(old, new)
    package = f"variant_{next(_made)}"
    _write(root, package, files)
    importlib.invalidate_caches()
    return importlib.import_module(f"{package}.flows")


def test_a_helper_imported_in_the_workflow_body_is_reached(packages: Path) -> None:
    base = _variant(packages)
    drifted = _variant(packages, {"helpers.py": ("return x // 10", "return x // 5")})
    assert code_hash(base.importing) == code_hash(_variant(packages).importing)
    assert code_hash(drifted.importing) != code_hash(base.importing)


def test_the_same_code_in_another_package_hashes_the_same(packages: Path) -> None:
    one, two = _variant(packages), _variant(packages)
    assert code_hash(one.flow) == code_hash(two.flow)
    assert one.flow(None, 1, "card") == 3 + 0


@pytest.mark.parametrize(("what", "edits"), [
    ("a module constant it reads", {"flows.py": ("RATE = 3", "RATE = 4")}),
    ("a module-level dict it reads", {"flows.py": ('LIMITS = {"max": 5}', 'LIMITS = {"max": 6}')}),
    ("a helper it calls", {"flows.py": ("return x * RATE", "return x * RATE + 1")}),
    ("a helper in another module", {"helpers.py": ("return x // 10", "return x // 5")}),
    ("the decorator between @app.workflow and it",
     {"flows.py": ("return fn(ctx, *args, **kwargs)", "return fn(ctx, *args, **kwargs) + 1")}),
    ("a decorator added", {"flows.py": ("@traced\n        def flow",
                                        "@traced\n        @traced\n        def flow")}),
])
def test_drift_in_what_the_workflow_reaches_changes_the_hash(
    packages: Path, what: str, edits: dict[str, tuple[str, str]]
) -> None:
    assert code_hash(_variant(packages, edits).flow) != code_hash(_variant(packages).flow), what


@pytest.mark.parametrize(("what", "edits"), [
    ("another function of the module", {"flows.py": ("return 1", "return 100")}),
    ("a version 2 added beside", {"flows.py": ("def unrelated(ctx):",
                                                "def flow_v2(ctx):\n            return scaled(7)\n\n\n"
                                                "        def unrelated(ctx):")}),
    ("an unused helper of a helper module", {"helpers.py": ("return 2", "return 3")}),
    ("comments and formatting", {"flows.py": ("RATE = 3", "RATE = (  # the rate\n            3\n        )")}),
])
def test_what_the_workflow_does_not_reach_leaves_the_hash(
    packages: Path, what: str, edits: dict[str, tuple[str, str]]
) -> None:
    assert code_hash(_variant(packages, edits).flow) == code_hash(_variant(packages).flow), what


def test_state_a_module_global_holds_at_run_time_is_not_code(packages: Path) -> None:
    module = _variant(packages)
    before = code_hash(module.flow)
    module.LIMITS["max"] = 99  # the process changes its state: the code is the same
    assert code_hash(module.flow) == before


def test_a_worker_with_a_drifted_helper_refuses_the_bundle(packages: Path, tmp_path: Path) -> None:
    db = f"sqlite:///{tmp_path}/cairn.db"
    started, drifted = cairn.App(db=db), cairn.App(db=db)
    try:
        started.workflow(name="pay")(_variant(packages).flow)
        drifted.workflow(name="pay")(_variant(packages, {"flows.py": ("RATE = 3", "RATE = 4")}).flow)
        run = started.start("pay", 1, "card")
        assert run.run_id
        bundle = started.get_run(run.run_id).bundle
        assert bundle is not None
        assert bundle not in drifted.runtime.registry.refresh(drifted.store)
        assert "code drift" not in drifted.runtime.registry.why_not("nope")
        assert "hashes to" in drifted.runtime.registry.why_not(bundle)
    finally:
        started.close()
        drifted.close()


_PRINT_HASH = """
import sys
sys.path.insert(0, sys.argv[1])
import importlib
from cairn.engine.bundles import code_hash
module = importlib.import_module(sys.argv[2] + ".flows")
assert module.__spec__.origin.endswith(".pyc"), module.__spec__.origin
print(code_hash(module.flow))
"""


@pytest.mark.slow
def test_without_source_the_hash_does_not_depend_on_the_hash_seed(packages: Path) -> None:
    _write(packages, "sourceless", BASE)
    assert compileall.compile_dir(str(packages / "sourceless"), legacy=True, quiet=1)
    for source in (packages / "sourceless").glob("*.py"):
        source.unlink()
    hashes = set()
    for seed in ("1", "2", "3", "4"):
        child = subprocess.run([sys.executable, "-c", _PRINT_HASH, str(packages), "sourceless"],
                               env={**os.environ, "PYTHONHASHSEED": seed}, capture_output=True, text=True,
                               timeout=60)
        assert child.returncode == 0, child.stderr
        hashes.add(child.stdout.strip())
    assert len(hashes) == 1, hashes


def test_a_bundle_stored_with_the_old_code_hash_is_still_served(packages: Path, tmp_path: Path) -> None:
    """Runs started before the hash covered what a workflow reaches pinned
    the function's own syntax tree (``ast:``): the same code still serves
    them, other code does not."""
    from cairn.engine.bundles import Bundle, legacy_code_hash

    module = _variant(packages)
    app = cairn.App(db=f"sqlite:///{tmp_path}/cairn.db")
    try:
        app.workflow(name="pay")(module.flow)
        registry = app.runtime.registry
        old = Bundle.build("pay", "1", legacy_code_hash(module.flow), {}, {}, [])
        assert old.code.startswith("ast:")
        other = Bundle.build("pay", "1", "ast:" + "0" * 32, {}, {}, [])
        app.store.put_bundles([old.record(), other.record()])
        served = registry.refresh(app.store)
        assert old.bundle_id in served
        assert other.bundle_id not in served
    finally:
        app.close()
