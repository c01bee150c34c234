"""The sim's fault-injection admin routes, on every node, bound to 127.0.0.1 only.

Port: this node's admin port (:mod:`sgl_seat.sim.front.ports`: its listen port + 2), always on ``127.0.0.1``
whatever ``--host`` says: fault injection is never reachable from
another machine. A fault goes to the node that runs its rank (the answer names the right node otherwise).

- ``GET /sim/ranks``: each local rank's forward count, whether it is mid-step and whether its row fetch is
  stalled (answered by the rank's control thread, so it answers even while the rank is stuck).
- ``GET /sim/faults``: armed faults per local rank.
- ``POST /sim/faults`` ``{"fault": "rowfetch-stall:rank=3"}``: arm a fault now (``after_s`` counts from now).
- ``DELETE /sim/faults``: disarm every fault and release a stalled row fetch.
"""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from sgl_seat.errors import UsageError
from sgl_seat.sim import contract
from sgl_seat.sim.faults import parse_fault
from sgl_seat.sim.front import api, ports
from sgl_seat.sim.node import NodeRuntime
from sgl_seat.sim.wire import ChannelClosed

ASK_TIMEOUT_S = 3.0


def _err(message: str, status: int = 400) -> Response:
    return JSONResponse({"error": {"message": message}}, status_code=status)


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    return _err(f"{exc.detail}: {request.method} {request.url.path}", exc.status_code)


def build_admin_app(node: NodeRuntime) -> Starlette:
    cfg = node.cfg

    async def ask_all(msg: dict[str, Any]) -> list[dict[str, Any]]:
        async def one(rank: int) -> dict[str, Any]:
            try:
                return await node.ask(rank, msg, ASK_TIMEOUT_S)
            except (TimeoutError, asyncio.TimeoutError):
                return {"tp_rank": rank, "error": f"no answer within {ASK_TIMEOUT_S:g} s"}
            except ChannelClosed:
                return {"tp_rank": rank, "error": "the rank's process is gone"}

        return list(await asyncio.gather(*(one(r) for r in sorted(node.ctl))))

    async def ranks(request: Request) -> Response:
        out = await ask_all({"t": "status"})
        for r in out:
            r.pop("id", None)
            r.pop("t", None)
        return JSONResponse({"node_rank": cfg.node_rank, "ranks": out})

    async def faults(request: Request) -> Response:
        if request.method == "GET":
            out = await ask_all({"t": "status"})
            return JSONResponse({"node_rank": cfg.node_rank,
                                 "faults": {str(r.get("tp_rank")): r.get("faults", []) for r in out}})
        if request.method == "DELETE":
            await ask_all({"t": "clear_faults"})
            return JSONResponse({"node_rank": cfg.node_rank, "cleared": sorted(node.ctl)})
        try:
            body = api.parse_json(await request.body())
        except api.ApiError as e:
            return _err(e.message)
        text = body.get("fault")
        if not isinstance(text, str):
            return _err('send {"fault": "KIND:key=value,..."}, e.g. {"fault": "rowfetch-stall:rank=3"}')
        try:
            fault = parse_fault(text)
        except UsageError as e:
            return _err(str(e))
        if fault.rank >= cfg.tp_size:
            return _err(f"rank {fault.rank} does not exist: the seat has ranks 0..{cfg.tp_size - 1}")
        if fault.rank not in node.ctl:
            other = cfg.node_of(fault.rank)
            return _err(f"rank {fault.rank} runs on node_rank {other}, not on node_rank {cfg.node_rank}; send the "
                        f"fault to that node's admin route (its port + {ports.ADMIN_PORT_OFFSET} on "
                        f"{ports.ADMIN_HOST})")
        try:
            res = await node.ask(fault.rank, {"t": "fault", "spec": fault.spec()}, ASK_TIMEOUT_S)
        except (TimeoutError, asyncio.TimeoutError):
            return _err(f"rank {fault.rank} did not answer within {ASK_TIMEOUT_S:g} s", 504)
        if res.get("t") != "ok":
            return _err(str(res.get("message", "the rank refused the fault")))
        return JSONResponse({"node_rank": cfg.node_rank, "tp_rank": fault.rank, "armed": fault.spec()})

    handlers = {"/sim/ranks": ranks, "/sim/faults": faults}
    methods: dict[str, list[str]] = {}
    for method, path in contract.SIM_ONLY_ROUTES:
        methods.setdefault(path, []).append(method)
    return Starlette(routes=[Route(p, handlers[p], methods=m) for p, m in methods.items()],
                     exception_handlers={HTTPException: _http_error})
