"""The apps ``bench/server.py`` serves: a Cairn app with one quick workflow,
and a bare Starlette app answering the same JSON as a floor for HTTP costs."""

from __future__ import annotations

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

import cairn

app = cairn.App()


@app.step
def tick(i: int) -> int:
    return i


@app.workflow(name="bench")
def bench(ctx: cairn.Context, n: int = 1) -> int:
    return sum(tick(i) for i in range(n))


async def _bare(request: Request) -> Response:
    return JSONResponse({"run_id": request.path_params.get("run_id", ""), "status": "pending"})


#: the floor: uvicorn + Starlette + JSON, no auth, no database
bare = Starlette(routes=[Route("/bare/{run_id}", _bare, methods=["GET", "POST"])])
