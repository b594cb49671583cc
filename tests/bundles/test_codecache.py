"""The code hash in a fresh process (issue 21: resume got slower when the
hash grew to cover what a workflow reaches).

Each figure here is a count taken in a fresh Python process (a worker
starting): how many files' paths it resolves (``os.path.realpath``) and how
many sources it parses (``ast.parse``) and how much bytecode it
disassembles (``dis.get_instructions``) to hash one workflow; never a time.
What a parse yields is kept in a per-user cache on disk
(``cairn.engine.codecache``), keyed by the content of the source it was
parsed from: an edit that keeps a file's size, mtime and inode still misses
it, and a cache file that is corrupt or not the user's own is ignored. In
every case the hash is the one computed without the cache."""

from __future__ import annotations

import functools
import inspect
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

FILES = {
    "flows.py": '''
        from . import helpers

        LIMITS = {"max": 5}


        class Quote:
            rate = 3

            def total(self, x):
                return x * self.rate


        def flow(ctx, x):
            return min(Quote().total(x), LIMITS["max"]) + helpers.fee(x)
    ''',
    "helpers.py": '''
        def fee(x):
            return x // 10
    ''',
}

_HASH_IN_A_FRESH_PROCESS = """
import ast, dis, json, os, sys
sys.path.insert(0, sys.argv[1])
import importlib
from cairn.engine.bundles import code_hash
module = importlib.import_module(sys.argv[2] + ".flows")
counts = {"parses": 0, "realpaths": 0, "disassemblies": 0}
real_parse, real_realpath, real_dis = ast.parse, os.path.realpath, dis.get_instructions
def parse(*args, **kwargs):
    counts["parses"] += 1
    return real_parse(*args, **kwargs)
def realpath(*args, **kwargs):
    counts["realpaths"] += 1
    return real_realpath(*args, **kwargs)
def get_instructions(*args, **kwargs):
    counts["disassemblies"] += 1
    return real_dis(*args, **kwargs)
ast.parse, os.path.realpath, dis.get_instructions = parse, realpath, get_instructions
print(json.dumps({"hash": code_hash(module.flow), "modules": len(sys.modules), **counts}))
"""


@pytest.fixture
def package(tmp_path: Path) -> Path:
    root = tmp_path / "code"
    (root / "cached_pay").mkdir(parents=True)
    (root / "cached_pay" / "__init__.py").write_text("")
    for name, text in FILES.items():
        (root / "cached_pay" / name).write_text(textwrap.dedent(text))
    return root


def _fresh(root: Path, cache: Path | None) -> dict[str, Any]:
    """The hash of ``cached_pay.flows.flow`` in a new process, with what it
    took; ``cache`` is ``$XDG_CACHE_HOME`` (``None``: the cache switched off)."""
    env = {**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}
    if cache is None:
        env["CAIRN_CODE_CACHE"] = "off"
    else:
        env["XDG_CACHE_HOME"] = str(cache)
        env.pop("CAIRN_CODE_CACHE", None)
    child = subprocess.run([sys.executable, "-c", _HASH_IN_A_FRESH_PROCESS, str(root), "cached_pay"],
                           env=env, capture_output=True, text=True, timeout=120)
    assert child.returncode == 0, child.stderr
    result: dict[str, Any] = json.loads(child.stdout)
    return result


def _entries(cache: Path) -> list[Path]:
    return sorted((cache / "cairn").rglob("*.json"))


@pytest.mark.slow  # each hashes in fresh interpreters (tests.processes)
def test_a_fresh_process_does_not_resolve_every_loaded_module_to_find_a_source(package: Path) -> None:
    """Asking ``inspect`` for a code object's source makes it resolve the
    path of every module loaded (``inspect.getmodule``): hundreds in a
    worker, most of the hash's time in a fresh process."""
    found = _fresh(package, None)
    assert found["modules"] > 100  # the old lookup resolved about this many (178 with lazy imports)
    assert found["realpaths"] < 20, found


@pytest.mark.slow  # each hashes in fresh interpreters (tests.processes)
def test_a_second_process_takes_what_it_would_parse_from_the_cache(package: Path, tmp_path: Path) -> None:
    uncached = _fresh(package, None)
    first = _fresh(package, tmp_path / "xdg")
    second = _fresh(package, tmp_path / "xdg")
    assert first["parses"] > 0
    assert first["disassemblies"] > 0
    assert _entries(tmp_path / "xdg")
    assert second["parses"] == 0, second
    assert second["disassemblies"] == 0, second
    assert uncached["hash"] == first["hash"] == second["hash"]


@pytest.mark.slow  # each hashes in fresh interpreters (tests.processes)
@pytest.mark.parametrize("edited", ["helpers.py", "flows.py"])
def test_an_edit_keeping_size_mtime_and_inode_misses_the_cache(
    package: Path, tmp_path: Path, edited: str
) -> None:
    """What a stat-keyed cache would get wrong: a deploy that rewrites a
    reached file in place within the clock's granularity."""
    before = _fresh(package, tmp_path / "xdg")
    path = package / "cached_pay" / edited
    stat = path.stat()
    text = path.read_text()
    old, new = ("x // 10", "x // 20") if edited == "helpers.py" else ("rate = 3", "rate = 4")
    changed = text.replace(old, new)
    assert changed != text
    assert len(changed) == len(text)
    with path.open("r+") as f:  # in place: the same inode
        f.write(changed)
    os.utime(path, ns=(stat.st_atime_ns, stat.st_mtime_ns))
    assert (path.stat().st_ino, path.stat().st_size, path.stat().st_mtime_ns) == \
        (stat.st_ino, stat.st_size, stat.st_mtime_ns)
    after = _fresh(package, tmp_path / "xdg")
    assert after["hash"] != before["hash"]
    assert after["hash"] == _fresh(package, None)["hash"]


def _poison(cache: Path) -> None:
    for entry in _entries(cache):
        _poison_file(entry)


def _poison_file(path: Path) -> None:
    """The entry's value replaced by another, with the check that matches it:
    an entry only its file's owner and mode tell from a true one."""
    from cairn.engine.codecache import entry_check

    body = json.loads(path.read_text())
    path.write_text(json.dumps({**body, "value": "poisoned", "check": entry_check(body["key"], "poisoned")}))


def _spoil(how: str, cache: Path) -> None:
    entries = _entries(cache)
    assert entries
    for entry in entries:
        if how == "garbage":
            entry.write_bytes(b"\x00\xffnot json{")
        elif how == "wrong types":
            entry.write_text(json.dumps({"key": 1, "value": ["a"], "check": None}))
        elif how == "a value that fails its check":
            body = json.loads(entry.read_text())
            entry.write_text(json.dumps({**body, "value": "poisoned"}))
        elif how == "writable by others":
            _poison(cache)
            entry.chmod(0o666)
        elif how == "another user's":
            _poison(cache)
            os.chown(entry, 65534, 65534)
        elif how == "a symlink":
            target = entry.with_suffix(".target")
            entry.rename(target)
            _poison_file(target)
            entry.symlink_to(target)
        elif how == "a directory":
            entry.unlink()
            entry.mkdir()


@pytest.mark.slow  # each hashes in fresh interpreters (tests.processes)
def test_a_consistent_entry_of_the_users_own_is_what_the_hash_is_made_of(
    package: Path, tmp_path: Path
) -> None:
    """The control of the test below: the poisoned entries it writes are
    read when nothing else marks them (so ignoring them is what keeps the
    hash right there). The cache trusts what its user wrote, as the user's
    own code is trusted."""
    good = _fresh(package, tmp_path / "xdg")
    _poison(tmp_path / "xdg")
    assert _fresh(package, tmp_path / "xdg")["hash"] != good["hash"]


@pytest.mark.slow  # each hashes in fresh interpreters (tests.processes)
@pytest.mark.parametrize("how", ["garbage", "wrong types", "a value that fails its check",
                                 "writable by others", "another user's", "a symlink", "a directory"])
def test_a_cache_that_cannot_be_trusted_is_ignored(package: Path, tmp_path: Path, how: str) -> None:
    if how == "another user's" and os.geteuid() != 0:
        pytest.skip("giving a file to another user needs root")
    good = _fresh(package, tmp_path / "xdg")
    _spoil(how, tmp_path / "xdg")
    found = _fresh(package, tmp_path / "xdg")
    assert found["hash"] == good["hash"]
    assert found["parses"] > 0  # computed again, not read


@pytest.mark.slow  # each hashes in fresh interpreters (tests.processes)
def test_a_cache_directory_that_cannot_be_made_leaves_the_hash(package: Path, tmp_path: Path) -> None:
    blocked = tmp_path / "xdg"
    blocked.write_text("a file where the cache directory would go")
    assert _fresh(package, blocked)["hash"] == _fresh(package, None)["hash"]


def _outer() -> Any:
    factor = 3

    def traced(fn: Any) -> Any:
        @functools.wraps(fn)
        def wrapper(*args: Any) -> Any:
            return fn(*args) * factor
        return wrapper

    @traced
    def decorated(x: int) -> int:
        return x + factor

    return decorated


class _Holder:
    @staticmethod
    def method(x: int) -> int:
        return (lambda y: y + 1)(x)


@pytest.mark.parametrize("fn", [
    _fresh, _outer, _outer(), inspect.unwrap(_outer()), _Holder.method, (lambda x: x * 2),
], ids=["function", "closure maker", "wrapper", "wrapped closure", "static method", "lambda"])
def test_the_source_read_is_the_one_inspect_reads_from_the_code_object(fn: Any) -> None:
    """Stored bundles keep their ids: the source the hash reads (through a
    bare function, ``_shell``) is what ``inspect`` gives for the code object."""
    from cairn.engine.bundles import _shell

    assert inspect.getsource(_shell(fn)) == inspect.getsource(fn.__code__)
