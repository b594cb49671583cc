"""The workflow code the bundle tests deploy: one function per version of
workflow ``order``, shared by every app module that serves that version (a
bundle pins the code's hash, so two deployments of version 1 must run the
very same function). ``mark`` appends to the effects file (``$BUNDLES_EFFECTS``)
which version of the code executed which step of which run."""

from __future__ import annotations

import json
import os

import cairn
from cairn.engine.definitions import StepDef
from cairn.engine.steps import Step
from cairn.retry import NO_RETRY


def _mark(version: str, i: int) -> str:
    info = cairn.step_info()
    path = os.environ.get("BUNDLES_EFFECTS")
    if path:
        with open(path, "a", encoding="utf-8") as out:
            out.write(json.dumps({"run": info.run_id, "version": version, "i": i, "pid": os.getpid()}) + "\n")
    return f"{version}:{i}"


mark = Step(StepDef.build(_mark, "mark", NO_RETRY))


def order_v1(ctx: cairn.Context, steps: int, pause: float) -> str:
    done = [mark("v1", i) for i in range(steps)]
    ctx.sleep(pause)
    done.append(mark("v1", steps))
    return f"v1 {ctx.prompt('greeting')} {','.join(done)}"


def order_v2(ctx: cairn.Context, steps: int, pause: float) -> str:
    done = [mark("v2", i) for i in range(steps)]
    ctx.sleep(pause)
    done.append(mark("v2", steps))
    done.append(mark("v2", steps + 1))  # v2 does one more step: its journal differs from v1's
    return f"v2 {ctx.prompt('greeting')} {','.join(done)}"


def order_v1_drifted(ctx: cairn.Context, steps: int, pause: float) -> str:
    done = [mark("drift", i) for i in range(steps + 1)]
    return f"drift {','.join(done)}"
