"""Shared helpers for the benchmark harness.

* :func:`median_of` runs a workload several times and keeps the median (the
  machine is noisy; one sample means little).
* :func:`fresh_dir` hands out a temporary directory that is removed afterwards.
* :func:`print_table` prints absolute figures and ratios against named
  baselines measured in the same run.
* :func:`write_results` overwrites ``bench/results/latest.json`` with the run.
"""

from __future__ import annotations

import datetime as dt
import gc
import json
import os
import platform
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path
from typing import Any, TextIO

BENCH_DIR = Path(__file__).resolve().parent
REPO_ROOT = BENCH_DIR.parent
RESULTS_DIR = BENCH_DIR / "results"
LATEST_JSON = RESULTS_DIR / "latest.json"

#: Environment variable that moves the temporary databases elsewhere (e.g. to
#: the disk you actually want to measure). Defaults to the system temp dir.
TMP_ENV = "CAIRN_BENCH_TMPDIR"

MISSING = "—"


# -- timing ------------------------------------------------------------------


@dataclass(frozen=True)
class Sample:
    """Repeated measurements of one figure; ``median`` is the one reported."""

    values: tuple[float, ...]

    @property
    def median(self) -> float:
        return statistics.median(self.values)

    @property
    def low(self) -> float:
        return min(self.values)

    @property
    def high(self) -> float:
        return max(self.values)

    @property
    def spread_pct(self) -> float:
        """(max - min) / median, in percent: a rough noise indicator."""
        med = self.median
        return 0.0 if med == 0 else (self.high - self.low) / med * 100.0


def settle() -> None:
    """Call before each sample, outside the timed region.

    Collects garbage so one sample does not pay for another's, and flushes the
    file systems (``os.sync``) so a sample does not pay for the writeback of
    what the previous one left dirty: on ext4 an fsync can be made to wait for
    unrelated pending data, which otherwise shows up as huge outliers in
    whichever fsync-heavy figure happens to come next.
    """
    gc.collect()
    if hasattr(os, "sync"):
        os.sync()


def median_of(workload: Callable[[], float], repeats: int, warmup: int = 0) -> Sample:
    """Call ``workload`` ``warmup + repeats`` times; keep the last ``repeats`` figures.

    The workload measures itself and returns its figure (µs per step, runs/s,
    ...), so setup and teardown stay outside the timed region; :func:`settle`
    runs before each call.
    """
    if repeats < 1:
        raise ValueError("repeats must be >= 1")
    values: list[float] = []
    for i in range(warmup + repeats):
        settle()
        value = workload()
        if i >= warmup:
            values.append(value)
    return Sample(tuple(values))


@contextmanager
def stopwatch() -> Iterator[Callable[[], float]]:
    """Time a block; the yielded callable returns elapsed seconds (frozen at block exit).

    >>> with stopwatch() as elapsed:
    ...     do_work()
    >>> seconds = elapsed()
    """
    start = time.perf_counter()
    end: list[float] = []

    def elapsed() -> float:
        return (end[0] if end else time.perf_counter()) - start

    try:
        yield elapsed
    finally:
        end.append(time.perf_counter())


# -- temporary directories ----------------------------------------------------


def temp_base() -> Path | None:
    """Where temporary databases go: ``$CAIRN_BENCH_TMPDIR`` or the system default."""
    base = os.environ.get(TMP_ENV)
    if not base:
        return None
    path = Path(base)
    path.mkdir(parents=True, exist_ok=True)
    return path


@contextmanager
def fresh_dir(label: str) -> Iterator[Path]:
    """A new, empty directory for one measurement; removed (with its databases) afterwards."""
    with tempfile.TemporaryDirectory(prefix=f"cairn-bench-{label}-", dir=temp_base()) as name:
        yield Path(name)


def filesystem_of(path: Path) -> str:
    """File-system type holding ``path`` (from /proc/mounts); ``"unknown"`` elsewhere.

    Recorded because an fsync on tmpfs costs nothing and would make every
    durability figure meaningless.
    """
    try:
        lines = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return "unknown"
    target = str(path.resolve())
    best, best_type = "", "unknown"
    for line in lines:
        parts = line.split()
        if len(parts) < 3:
            continue
        mount_point, fs_type = parts[1], parts[2]
        inside = target == mount_point or target.startswith(mount_point.rstrip("/") + "/")
        if inside and len(mount_point) > len(best):
            best, best_type = mount_point, fs_type
    return best_type


def temp_filesystem() -> str:
    base = temp_base()
    return filesystem_of(base if base is not None else Path(tempfile.gettempdir()))


# -- results -----------------------------------------------------------------


@dataclass
class Result:
    """One figure of one system.

    ``metric`` groups rows that can be compared (ratios are only computed
    between rows of the same metric); ``system`` names the row, and is what a
    baseline name refers to. ``value`` is ``None`` when the figure was not
    measured (skipped, pending, failed); ``note`` then says why.
    """

    metric: str
    system: str
    unit: str
    sample: Sample | None = None
    note: str = ""
    lower_is_better: bool = True
    params: dict[str, Any] = field(default_factory=dict)

    @property
    def value(self) -> float | None:
        return None if self.sample is None else self.sample.median


def ratio(result: Result, baseline: Result | None) -> float | None:
    """``result / baseline`` for the same metric, or ``None`` if either is missing."""
    if baseline is None or result.metric != baseline.metric:
        return None
    if result.value is None or baseline.value is None or baseline.value == 0:
        return None
    return result.value / baseline.value


def find(results: Sequence[Result], metric: str, system: str) -> Result | None:
    for r in results:
        if r.metric == metric and r.system == system:
            return r
    return None


def fmt_value(value: float | None) -> str:
    if value is None:
        return MISSING
    if value >= 1000:
        return f"{value:,.0f}"
    if value >= 100:
        return f"{value:.0f}"
    if value >= 10:
        return f"{value:.1f}"
    return f"{value:.2f}"


def fmt_ratio(value: float | None) -> str:
    if value is None:
        return ""
    if value >= 10:
        return f"{value:.0f}x"
    if value >= 0.1:
        return f"{value:.2f}x"
    return f"{value:.3f}x"


def render_table(headers: Sequence[str], rows: Sequence[Sequence[str]], right: Sequence[bool]) -> str:
    """Plain-text table with aligned columns (right-aligned where ``right[i]``)."""
    widths = [len(h) for h in headers]
    for row in rows:
        for i, cell in enumerate(row):
            widths[i] = max(widths[i], len(cell))

    def line(cells: Sequence[str]) -> str:
        out = [c.rjust(w) if r else c.ljust(w) for c, w, r in zip(cells, widths, right, strict=True)]
        return "  ".join(out).rstrip()

    rule = "  ".join("-" * w for w in widths)
    return "\n".join([line(headers), rule, *(line(r) for r in rows)])


def print_table(
    results: Sequence[Result],
    baselines: Sequence[str] = (),
    out: TextIO | None = None,
) -> None:
    """Print every result with its median, spread and ratio against each baseline.

    A ratio is ``this row's median / the baseline row's median`` for the same
    metric in this run: below 1x is smaller (better for latencies, worse for
    throughputs: the unit column carries the direction).
    """
    stream = out if out is not None else sys.stdout
    headers = ["metric", "system", "median", "unit", "n", "spread", *(f"vs {b}" for b in baselines), "note"]
    right = [False, False, True, False, True, True, *(True for _ in baselines), False]
    rows: list[list[str]] = []
    for r in results:
        arrow = "lower=better" if r.lower_is_better else "higher=better"
        n = str(len(r.sample.values)) if r.sample else ""
        spread = f"{r.sample.spread_pct:.0f}%" if r.sample and len(r.sample.values) > 1 else ""
        ratios = [fmt_ratio(ratio(r, find(results, r.metric, b))) for b in baselines]
        unit = f"{r.unit} ({arrow})"
        rows.append([r.metric, r.system, fmt_value(r.value), unit, n, spread, *ratios, r.note])
    print(render_table(headers, rows, right), file=stream)


def ratio_lines(results: Sequence[Result], subject_prefix: str, baselines: Sequence[str]) -> list[str]:
    """One-line summaries such as ``cairn (process) step_us vs langgraph: 0.08x``."""
    lines: list[str] = []
    for r in results:
        if not r.system.startswith(subject_prefix) or r.value is None:
            continue
        for b in baselines:
            x = ratio(r, find(results, r.metric, b))
            if x is not None:
                lines.append(f"{r.system} {r.metric} vs {b}: {fmt_ratio(x)}")
    return lines


def package_version(name: str) -> str | None:
    try:
        return metadata.version(name)
    except metadata.PackageNotFoundError:
        return None


def environment() -> dict[str, Any]:
    """What the figures depend on: recorded with every run."""
    return {
        "date": dt.datetime.now(dt.UTC).isoformat(timespec="seconds"),
        "python": platform.python_version(),
        "python_implementation": platform.python_implementation(),
        "sqlite": sqlite3.sqlite_version,
        "platform": platform.platform(),
        "machine": platform.machine(),
        "cpu_count": os.cpu_count(),
        "temp_dir": str(temp_base() or tempfile.gettempdir()),
        "temp_filesystem": temp_filesystem(),
        "packages": {
            name: package_version(name)
            for name in ("cairn", "langgraph", "langgraph-checkpoint-sqlite", "dbos", "sqlalchemy")
        },
    }


def result_to_json(r: Result) -> dict[str, Any]:
    return {
        "metric": r.metric,
        "system": r.system,
        "unit": r.unit,
        "lower_is_better": r.lower_is_better,
        "median": r.value,
        "samples": list(r.sample.values) if r.sample else [],
        "spread_pct": r.sample.spread_pct if r.sample else None,
        "note": r.note,
        "params": r.params,
    }


def write_results(
    results: Sequence[Result],
    baselines: Sequence[str] = (),
    extra: Mapping[str, Any] | None = None,
    path: Path = LATEST_JSON,
) -> Path:
    """Overwrite ``path`` with this run's figures, ratios and environment (atomic rename)."""
    ratios: dict[str, dict[str, float]] = {}
    for r in results:
        for b in baselines:
            x = ratio(r, find(results, r.metric, b))
            if x is not None and r.system != b:
                ratios.setdefault(f"{r.metric}:{r.system}", {})[b] = x
    doc = {
        **environment(),
        **(dict(extra) if extra else {}),
        "baselines": list(baselines),
        "results": [result_to_json(r) for r in results],
        "ratios": ratios,
    }
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(doc, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
    os.replace(tmp, path)
    return path
