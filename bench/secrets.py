"""What secrets cost a journaled step, side by side in one run.

    python -m bench.secrets            # 300-step runs, 5 rounds, medians
    python -m bench.secrets --steps 1000 --rounds 7

Rows (µs per journaled step on SQLite, default durability; ratio = row /
the baseline row, measured alternately in the same rounds):

* ``plain step, nothing revealed``: the baseline, a step with no secret in
  a process where no secret was ever revealed (the scan is one truth test);
* ``plain step, 1 / 256 values revealed``: the same step after other runs of
  the process revealed values (256 is the registry's capacity): scans are
  scoped to what the run itself revealed, so this run scans nothing;
* ``step with a SecretValue parameter``: the reference resolved before each
  body runs (a ``CallableSecrets`` provider answering from its cache), and
  each recorded payload searched for its value; with 1 and with 256 values
  revealed in the process.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import cairn
from cairn.security import redaction

Variant = Callable[[cairn.App, int], None]


def build(db: Path) -> tuple[cairn.App, cairn.Workflow[int], cairn.Workflow[int]]:
    provider = cairn.CallableSecrets(lambda ref, access: "bench-token-0001")
    app = cairn.App(db=f"sqlite:///{db}", secrets=provider)

    @app.step()
    def inc(x: int) -> int:
        return x + 1

    @app.step()
    def authed(x: int, token: cairn.SecretValue) -> int:
        return x + 1

    @app.workflow(name="plain")
    def plain(ctx: cairn.Context, n: int) -> int:
        x = 0
        for _ in range(n):
            x = inc(x)
        return x

    @app.workflow(name="secret")
    def secret(ctx: cairn.Context, n: int) -> int:
        x = 0
        ref = cairn.Secret("api")
        for _ in range(n):
            x = authed(x, ref)
        return x

    return app, plain, secret


def reveal(count: int) -> None:
    redaction.forget_all()
    for i in range(count):
        cairn.SecretValue(f"bench-secret-value-{i:04d}", ref=cairn.Secret("bench"))


def sample(directory: Path, name: str, revealed: int, steps: int) -> float:
    db = directory / f"{name}-{time.monotonic_ns()}.db"
    app, plain, secret = build(db)
    workflow = secret if name == "secret" else plain
    try:
        reveal(revealed)
        app.run(workflow, 1)  # warm-up
        started = time.perf_counter()
        result = app.run(workflow, steps)
        elapsed = time.perf_counter() - started
    finally:
        app.close()
        redaction.forget_all()
    assert result == steps
    return elapsed / steps * 1e6


ROWS = [
    ("plain step, nothing revealed", "plain", 0),
    ("plain step, 1 value revealed", "plain", 1),
    ("plain step, 256 values revealed", "plain", 256),
    ("step with a SecretValue parameter", "secret", 1),
    ("same, 256 values revealed", "secret", 256),
]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--steps", type=int, default=300)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args(argv)
    samples: dict[str, list[float]] = {label: [] for label, _, _ in ROWS}
    with tempfile.TemporaryDirectory(prefix="cairn-bench-secrets-") as tmp:
        for _ in range(args.rounds):
            for label, name, revealed in ROWS:  # alternated: a noisy moment hits every row alike
                samples[label].append(sample(Path(tmp), name, revealed, args.steps))
    base = statistics.median(samples[ROWS[0][0]])
    print(f"secrets: µs per journaled step, {args.steps}-step runs, median of {args.rounds} (SQLite)")
    for label, _, _ in ROWS:
        values = samples[label]
        median = statistics.median(values)
        spread = (max(values) - min(values)) / median * 100
        print(f"  {label:<36} {median:8.1f} µs  x{median / base:5.2f}  (spread {spread:.0f} %)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
