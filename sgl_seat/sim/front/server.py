"""The ASGI apps: node 0's SGLang-compatible API, and node >= 1's dummy health server.

Routes come from :data:`sgl_seat.sim.contract.ROUTES` (and ``DUMMY_ROUTES``), so the contract test checks
exactly the routes served. Every error is JSON: OpenAI routes and unknown routes use SGLang's
``ErrorResponse`` body, ``/generate`` uses ``{"error": {"message": ...}}``.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

from starlette.applications import Starlette
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

from sgl_seat.sim import contract, simlog
from sgl_seat.sim.args import SimConfig
from sgl_seat.sim.front import api
from sgl_seat.sim.front.frontend import EngineUnavailable, Frontend
from sgl_seat.sim.front.metrics import CONTENT_TYPE, render_empty

Handler = Callable[[Request], Awaitable[Response]]


def _routes(table: tuple[tuple[str, str], ...], handlers: dict[str, Handler]) -> list[Route]:
    methods: dict[str, list[str]] = {}
    for method, path in table:
        methods.setdefault(path, []).append(method)
    return [Route(path, handlers[path], methods=ms) for path, ms in methods.items() if path in handlers]


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, HTTPException)
    detail = exc.detail
    if exc.status_code == 404:
        detail = f"Not Found: no route {request.method} {request.url.path}"
    elif exc.status_code == 405:
        detail = f"Method Not Allowed: {request.method} {request.url.path}"
    body = api.openai_error(str(detail), exc.status_code, err_type=str(exc.status_code))
    return JSONResponse(body, status_code=exc.status_code, headers=getattr(exc, "headers", None))


async def _server_error(request: Request, exc: Exception) -> Response:
    simlog.get().error(f"[http_server] Error on {request.method} {request.url.path}: {type(exc).__name__}: {exc}")
    return JSONResponse(api.openai_error(f"Internal error: {type(exc).__name__}", 500), status_code=500)


def _openai_err(e: api.ApiError) -> Response:
    return JSONResponse(api.openai_error(e.message, e.status), status_code=e.status)


def _unavailable(e: Exception, native: bool) -> Response:
    msg = f"The engine is unavailable: {e}"
    body = api.native_error(msg) if native else api.openai_error(msg, 503)
    return JSONResponse(body, status_code=503)


async def _json_body(request: Request, *, require_json_type: bool) -> dict[str, Any]:
    if require_json_type:
        ctype = request.headers.get("content-type", "").split(";", 1)[0].strip().lower()
        if ctype != "application/json":
            raise api.ApiError("Unsupported Media Type: Only 'application/json' is allowed")
    return api.parse_json(await request.body())


def build_main_app(fe: Frontend, cfg: SimConfig) -> Starlette:
    """Node 0: SGLang's routes over the sim's engine."""
    cache_report = cfg.enable_cache_report

    async def health(request: Request) -> Response:
        return Response(status_code=await fe.health())

    async def ready(request: Request) -> Response:
        return Response(status_code=200 if fe.server_status == "Up" else 503)

    async def model_info(request: Request) -> Response:
        return JSONResponse(fe.model_info())

    async def server_info(request: Request) -> Response:
        return JSONResponse(fe.server_info())

    async def models(request: Request) -> Response:
        return JSONResponse(fe.models())

    async def flush_cache(request: Request) -> Response:
        ok, text = await fe.flush_cache()
        return Response(text, status_code=200 if ok else 400)

    async def metrics(request: Request) -> Response:
        assert fe.metrics is not None
        return Response(fe.metrics.render(), media_type=CONTENT_TYPE)

    async def generate(request: Request) -> Response:
        try:
            p = api.parse_generate(await _json_body(request, require_json_type=False))
            api.check_context(len(p.input_ids), p.max_new_tokens, cfg.context_length)
        except api.ApiError as e:
            return JSONResponse(api.native_error(e.message), status_code=e.status)
        if p.stream:
            return StreamingResponse(_generate_stream(p), media_type="text/event-stream")
        try:
            text, ids, last = "", [], None
            async for item in fe.generate(p):
                text += item.get("text", "")
                ids += item["ids"]
                last = item
            assert last is not None
        except EngineUnavailable as e:
            return _unavailable(e, native=True)
        except api.ApiError as e:
            return JSONResponse(api.native_error(e.message), status_code=e.status)
        return JSONResponse({"text": text, "output_ids": ids, "meta_info": fe.meta_info(last, final=True)})

    async def _generate_stream(p: api.GenParams) -> AsyncIterator[bytes]:
        # SGLang streams cumulative text and ids per chunk (incremental_streaming_output is off by default).
        text, ids = "", []
        try:
            async for item in fe.generate(p):
                text += item.get("text", "")
                ids += item["ids"]
                fin = bool(item.get("fin"))
                yield api.sse({"text": text, "output_ids": ids, "meta_info": fe.meta_info(item, final=fin)})
        except (EngineUnavailable, api.ApiError) as e:
            yield api.sse({"error": {"message": str(e), "type": "invalid_request_error", "code": 503}})
        yield api.sse("[DONE]")

    async def _openai(
        request: Request,
        parse: Callable[[Any], api.GenParams],
        id_prefix: str,
        stream: Callable[[api.GenParams, str, str, int], AsyncIterator[bytes]],
        body_of: Callable[..., dict[str, Any]],
    ) -> Response:
        """One OpenAI route: parse + log + context check, then stream, or collect and answer in one body."""
        try:
            body = await _json_body(request, require_json_type=True)
            p = parse(body)
            fe.reqlog.received_openai(body)  # SGLang: the raw payload, at --log-requests-level >= 2 only
            api.check_context(len(p.input_ids), p.max_new_tokens, cfg.context_length)
        except api.ApiError as e:
            return _openai_err(e)
        rid, model, created = api.new_id(id_prefix), p.model, int(time.time())
        if p.stream:
            return StreamingResponse(stream(p, rid, model, created), media_type="text/event-stream")
        try:
            text, last = "", None
            async for item in fe.generate(p, rid=rid):
                text += item.get("text", "")
                last = item
            assert last is not None
        except EngineUnavailable as e:
            return _unavailable(e, native=False)
        except api.ApiError as e:
            return _openai_err(e)
        u = api.usage(last["pt"], last["ct"], last["cached"], cache_report=cache_report)
        return JSONResponse(body_of(rid=rid, model=model, text=text, fin=last["fin"], usage_=u, created=created))

    async def completions(request: Request) -> Response:
        return await _openai(request, api.parse_completion, "cmpl-", _completion_stream, api.completion_body)

    async def _completion_stream(p: api.GenParams, rid: str, model: str, created: int) -> AsyncIterator[bytes]:
        last: dict[str, Any] | None = None
        try:
            async for item in fe.generate(p, rid=rid):
                last = item
                fin = item.get("fin")
                if item.get("text") or fin:
                    yield api.sse(api.completion_chunk(rid=rid, model=model, text=item.get("text", ""), fin=fin,
                                                       created=created))
        except (EngineUnavailable, api.ApiError) as e:
            yield api.sse(api.openai_error(str(e), 503))
        if p.include_usage and last is not None:
            u = api.usage(last["pt"], last["ct"], last["cached"], cache_report=cache_report)
            yield api.sse(api.completion_chunk(rid=rid, model=model, text="", fin=None, created=created, usage_=u,
                                               no_choices=True))
        yield api.sse("[DONE]")

    async def chat(request: Request) -> Response:
        return await _openai(request, api.parse_chat, "chatcmpl-", _chat_stream, api.chat_body)

    async def _chat_stream(p: api.GenParams, rid: str, model: str, created: int) -> AsyncIterator[bytes]:
        last: dict[str, Any] | None = None
        first = True
        try:
            async for item in fe.generate(p, rid=rid):
                last = item
                if first:
                    first = False
                    yield api.sse(api.chat_chunk(rid=rid, model=model, created=created, role="assistant", content=""))
                if item.get("text"):
                    yield api.sse(api.chat_chunk(rid=rid, model=model, created=created, content=item["text"]))
                if item.get("fin"):
                    yield api.sse(api.chat_chunk(rid=rid, model=model, created=created, fin=item["fin"]))
        except (EngineUnavailable, api.ApiError) as e:
            yield api.sse(api.openai_error(str(e), 503))
        if p.include_usage and last is not None:
            u = api.usage(last["pt"], last["ct"], last["cached"], cache_report=cache_report)
            yield api.sse(api.chat_chunk(rid=rid, model=model, created=created, usage_=u, no_choices=True))
        yield api.sse("[DONE]")

    handlers: dict[str, Handler] = {
        "/health": health, "/health_generate": health, "/ready": ready,
        "/model_info": model_info, "/get_model_info": model_info,
        "/server_info": server_info, "/get_server_info": server_info,
        "/flush_cache": flush_cache, "/generate": generate,
        "/v1/completions": completions, "/v1/chat/completions": chat, "/v1/models": models,
    }
    if cfg.enable_metrics:
        handlers[contract.METRICS_ROUTE] = metrics
    return Starlette(routes=_routes(contract.ROUTES, handlers),
                     exception_handlers={HTTPException: _http_error, Exception: _server_error})


def build_dummy_app(cfg: SimConfig) -> Starlette:
    """Nodes >= 1: ``/ping``, ``/health``, ``/health_generate`` always 200 (+ ``/metrics``), as SGLang's."""

    async def ok(request: Request) -> Response:
        return Response(status_code=200)

    async def metrics(request: Request) -> Response:
        return Response(render_empty(cfg.node_rank), media_type=CONTENT_TYPE)

    handlers: dict[str, Handler] = {path: ok for _, path in contract.DUMMY_ROUTES}
    table = contract.DUMMY_ROUTES
    if cfg.enable_metrics:
        handlers[contract.METRICS_ROUTE] = metrics
        table = (*table, ("GET", contract.METRICS_ROUTE))
    return Starlette(routes=_routes(table, handlers),
                     exception_handlers={HTTPException: _http_error, Exception: _server_error})
