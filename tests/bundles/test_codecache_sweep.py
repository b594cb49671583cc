"""The code hash's cache on disk stays the size of the code in use: an
entry no process used for ``RETAIN_DAYS`` is deleted by a sweep that runs
after a miss, at most once a day; an entry read refreshes its mtime."""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from cairn.engine import codecache

DAY = 86400.0


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv("CAIRN_CODE_CACHE", raising=False)
    monkeypatch.setattr(codecache, "_memo", {})
    folder = codecache.directory()
    folder.mkdir(parents=True)
    return folder


def _entry(folder: Path, key: str, value: str, *, age_days: float) -> Path:
    path = folder / f"{key}.json"
    codecache._write(path, key, value)
    stamp = time.time() - age_days * DAY
    os.utime(path, (stamp, stamp))
    return path


def test_a_miss_sweeps_entries_unused_for_the_retention_period(cache: Path) -> None:
    stale = _entry(cache, "a" * 64, "old", age_days=codecache.RETAIN_DAYS + 1)
    recent = _entry(cache, "b" * 64, "recent", age_days=codecache.RETAIN_DAYS - 1)
    foreign = cache / "notes.txt"
    foreign.write_text("not an entry")
    os.utime(foreign, (0, 0))

    assert codecache.keyed("test", "fresh material", lambda: "computed") == "computed"

    assert not stale.exists()
    assert recent.exists()
    assert foreign.exists(), "only the cache's own files are swept"
    assert len(list(cache.glob("*.json"))) == 2, "the new entry and the recent one"


def test_a_sweep_runs_at_most_once_a_day(cache: Path) -> None:
    now = time.time()
    assert codecache.sweep(cache, now=now) == 0
    stale = _entry(cache, "c" * 64, "old", age_days=codecache.RETAIN_DAYS + 5)
    assert codecache.sweep(cache, now=now + DAY / 2) == 0
    assert stale.exists()
    assert codecache.sweep(cache, now=now + DAY + 1) == 1
    assert not stale.exists()


def test_reading_an_entry_marks_it_used(cache: Path) -> None:
    key = "d" * 64
    path = _entry(cache, key, "kept", age_days=codecache.RETAIN_DAYS - 0.5)
    assert codecache._read(path, key) == "kept"
    assert path.stat().st_mtime > time.time() - 60, "a hit refreshes the entry's mtime"
    assert codecache.sweep(cache, now=time.time() + DAY) == 0
    assert path.exists()


def test_symlinks_and_other_users_files_are_left_alone(cache: Path, tmp_path: Path) -> None:
    target = tmp_path / "elsewhere.json"
    target.write_text("{}")
    os.utime(target, (0, 0))
    link = cache / ("e" * 64 + ".json")
    link.symlink_to(target)
    os.utime(link, (0, 0), follow_symlinks=False)
    assert codecache.sweep(cache) == 0
    assert link.is_symlink()
    assert target.exists()
