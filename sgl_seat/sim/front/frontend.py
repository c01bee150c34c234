"""Node 0's TokenizerManager stand-in: requests in (to rank 0), outputs back (from the detokenizer).

Why: this is where SGLang's per-request bookkeeping lives (time to first token, inter-token latency, usage
counts, the health check that needs a real token to come back), so the sim keeps it in the same place:
the main process of node 0, driven by the asyncio loop of its HTTP server.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from typing import Any

from sgl_seat.sim import contract, simlog
from sgl_seat.sim.args import SimConfig
from sgl_seat.sim.front import api, ports, reqlog
from sgl_seat.sim.front.metrics import SimMetrics
from sgl_seat.sim.node import NodeRuntime
from sgl_seat.sim.step.costmodel import KV_BYTES_PER_TOKEN, SYNTHETIC_AVAILABLE_GB, SYNTHETIC_WEIGHT_GB
from sgl_seat.sim.wire import ChannelClosed

HEALTH_CHECK_RID_PREFIX = "HEALTH_CHECK"
HEALTH_CHECK_TIMEOUT = float(os.environ.get("SGLANG_HEALTH_CHECK_TIMEOUT", "20"))
WEIGHT_VERSION = "default"


@dataclass(slots=True)
class ReqState:
    rid: str
    stream: bool
    log_metrics: bool
    created: float = field(default_factory=time.perf_counter)
    first_t: float | None = None
    last_t: float = 0.0
    queue: asyncio.Queue[dict[str, Any]] = field(default_factory=asyncio.Queue)


class EngineUnavailable(Exception):
    pass


class Frontend:
    def __init__(self, cfg: SimConfig, node: NodeRuntime, metrics: SimMetrics | None) -> None:
        self.cfg = cfg
        self.node = node
        self.metrics = metrics
        self.log = simlog.get()
        self.states: dict[str, ReqState] = {}
        self.server_status = "Starting"
        self.last_receive = 0.0
        self.startup_time = time.time()
        node.on_out = self.on_out
        node.on_stats = self.on_stats
        # SGLang's TokenizerManager logs requests (--log-requests); so does the sim's stand-in for it.
        self.reqlog = reqlog.RequestLog(enabled=cfg.log_requests, level=cfg.log_requests_level,
                                        fmt=cfg.log_requests_format, targets=cfg.log_requests_target)
        if metrics is not None:
            metrics.set_constants(max_total_num_tokens=cfg.kv_tokens, context_len=cfg.context_length)

    # --- outputs ------------------------------------------------------------------------------------------
    def on_stats(self, msg: dict[str, Any]) -> None:
        if self.metrics is not None:
            self.metrics.set_stats(msg)

    def on_out(self, msg: dict[str, Any]) -> None:
        self.last_receive = time.time()
        for item in msg.get("items", []):
            st = self.states.get(item["rid"])
            if st is None:
                continue
            now = time.perf_counter()
            ids = item.get("ids") or []
            if ids:
                if st.first_t is None:
                    st.first_t = now
                    if self.metrics is not None and st.log_metrics:
                        self.metrics.first_token(now - st.created, st.stream)
                elif self.metrics is not None and st.log_metrics:
                    self.metrics.inter_token((now - st.last_t) / len(ids))
                st.last_t = now
            if item.get("fin") and self.metrics is not None and st.log_metrics:
                self.metrics.finished(prompt=item["pt"], generated=item["ct"], cached=item["cached"],
                                      e2e_s=now - st.created, streaming=st.stream,
                                      spec_verify=item.get("sv", 0) if self.cfg.spec_on else 0)
            item["e2e_latency"] = now - st.created
            st.queue.put_nowait(item)

    # --- requests -----------------------------------------------------------------------------------------
    async def generate(self, p: api.GenParams, *, rid: str | None = None,
                       log_metrics: bool = True) -> AsyncIterator[dict[str, Any]]:
        """Submit to rank 0 and yield output items until the request finishes (abort it if cancelled)."""
        api.check_context(len(p.input_ids), p.max_new_tokens, self.cfg.context_length)
        rid = rid or p.rid or uuid.uuid4().hex
        if rid in self.states:
            raise api.ApiError(f"rid {rid!r} is already in use.")
        st = ReqState(rid=rid, stream=p.stream, log_metrics=log_metrics)
        self.states[rid] = st
        finished = False
        logging_on = self.reqlog.enabled
        obj: dict[str, Any] = {}
        text = ""
        ids: list[int] = []
        if logging_on:
            sp = p.sampling_params or {"max_new_tokens": p.max_new_tokens}
            obj = reqlog.generate_req_obj(rid=rid, text=p.text, input_ids=p.input_ids, sampling_params=sp,
                                          stream=p.stream, log_metrics=log_metrics, openai=p.openai)
            self.reqlog.received(obj)
        try:
            try:
                self.node.send(0, {
                    "t": "req", "rid": rid, "input_ids": p.input_ids, "max_new_tokens": p.max_new_tokens,
                    "stop": list(p.stop), "stop_token_ids": list(p.stop_token_ids),
                })
            except ChannelClosed:
                raise EngineUnavailable("the engine's scheduler is not running") from None
            while True:
                item = await st.queue.get()
                finished = bool(item.get("fin"))
                if logging_on:
                    text += item.get("text", "")
                    ids += item.get("ids") or []
                    if finished:
                        self.reqlog.finished(obj, {"text": text, "output_ids": ids,
                                                   "meta_info": self.meta_info(item, final=True)})
                yield item
                if finished:
                    return
        finally:
            self.states.pop(rid, None)
            if not finished:
                with contextlib.suppress(ChannelClosed):
                    self.node.send(0, {"t": "abort", "rid": rid})

    def meta_info(self, item: dict[str, Any], *, final: bool) -> dict[str, Any]:
        meta: dict[str, Any] = {
            "id": item["rid"],
            "finish_reason": item.get("fin"),
            "prompt_tokens": item["pt"],
            "weight_version": WEIGHT_VERSION,
            "completion_tokens": item["ct"],
            "cached_tokens": item["cached"],
        }
        if final:
            meta["e2e_latency"] = item.get("e2e_latency", 0.0)
            if self.cfg.spec_on and item.get("sv"):
                proposed = item["sv"] * max((self.cfg.speculative_num_draft_tokens or 1) - 1, 1)
                meta["spec_verify_ct"] = item["sv"]
                meta["spec_accept_rate"] = item["acc"] / proposed
                meta["spec_accept_length"] = item["ct"] / item["sv"]
        return meta

    # --- health -------------------------------------------------------------------------------------------
    async def warmup(self) -> None:
        """SGLang sends one request before it calls itself ready; so does the sim."""
        p = api.GenParams(input_ids=[0], max_new_tokens=1, stream=False)
        try:
            async for _ in self.generate(p, rid=f"{HEALTH_CHECK_RID_PREFIX}_warmup", log_metrics=False):
                pass
        except (EngineUnavailable, api.ApiError) as e:
            self.log.error(f"warmup failed: {e}")
            return
        self.server_status = "Up"
        self.log.info(contract.LOG_SERVER_READY)

    async def health(self) -> int:
        if self.server_status == "Starting" or self.node.phase != "running":
            return 503
        tic = time.time()
        rid = f"{HEALTH_CHECK_RID_PREFIX}_{uuid.uuid4().hex}"

        async def one() -> None:
            p = api.GenParams(input_ids=[0], max_new_tokens=1, stream=False)
            async for _ in self.generate(p, rid=rid, log_metrics=False):
                break

        task = asyncio.create_task(one())
        try:
            while time.time() < tic + HEALTH_CHECK_TIMEOUT:
                await asyncio.sleep(0.1)
                if self.last_receive > tic:
                    self.server_status = "Up"
                    return 200
                if task.done() and task.exception() is not None:
                    break
        finally:
            task.cancel()
        self.log.error(
            f"Health check failed. Server couldn't get a response from detokenizer for last "
            f"{HEALTH_CHECK_TIMEOUT:g} seconds. tic start time: {time.strftime('%H:%M:%S', time.localtime(tic))}. "
            f"last_heartbeat time: {time.strftime('%H:%M:%S', time.localtime(self.last_receive))}"
        )
        self.server_status = "UnHealthy"
        return 503

    # --- info ---------------------------------------------------------------------------------------------
    def server_info(self) -> dict[str, Any]:
        cfg = self.cfg
        stats = self.node.stats
        ready0 = self.node.ready.get(0, {})
        state: dict[str, Any] = {
            "world_size": cfg.tp_size,
            "startup_time": ready0.get("startup_time", self.startup_time),
            "effective_max_running_requests_per_dp": cfg.max_running_requests,
            "last_gen_throughput": float(stats.get("gen_throughput", 0.0)),
            "memory_usage": {
                "weight": SYNTHETIC_WEIGHT_GB,
                "kvcache": round(cfg.kv_tokens * KV_BYTES_PER_TOKEN / 1e9, 3),
                "startup_available": SYNTHETIC_AVAILABLE_GB,
                "token_capacity": cfg.kv_tokens,
                "token_capacity_swa": None,
                "graph": {},
            },
        }
        if cfg.spec_on:
            state["avg_spec_accept_length"] = float(stats.get("spec_accept_length", 0.0))
        return {
            **cfg.server_args(),
            "launch_command": cfg.launch_command,
            "kv_events": None,
            "status": "ready",
            "max_total_num_tokens": cfg.kv_tokens,
            "max_req_input_len": cfg.context_length - 1,
            "startup_time": self.startup_time,
            "internal_states": [state],
            "version": contract.SGLANG_VERSION,
            "frontend": "python",
            contract.SIM_ONLY_SERVER_INFO_KEY: {
                "synthetic": True,
                "note": simlog.SYNTHETIC_NOTE,
                "kv_tokens": cfg.kv_tokens,
                "accept_rate": cfg.accept_rate,
                "step_floor_ms": cfg.floor_ms,
                "faults": list(cfg.faults),
                "admin": f"http://{ports.ADMIN_HOST}:{cfg.admin_port}",
            },
        }

    def model_info(self) -> dict[str, Any]:
        cfg = self.cfg
        return {
            "model_path": cfg.model_path,
            "served_model_name": cfg.served_model_name,
            "tokenizer_path": cfg.model_path,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": WEIGHT_VERSION,
            "load_format": "dummy",
            "model_type": "sgl_seat_sim",
            "architectures": ["SglSeatSimForCausalLM"],
        }

    def models(self) -> dict[str, Any]:
        cfg = self.cfg
        card = {"id": cfg.served_model_name, "object": "model", "created": int(self.startup_time),
                "owned_by": contract.MODEL_OWNED_BY, "root": cfg.model_path, "parent": None,
                "max_model_len": cfg.context_length}
        return {"object": contract.OPENAI_OBJECTS["ModelList"], "data": [card]}

    async def flush_cache(self) -> tuple[bool, str]:
        try:
            res = await self.node.ask(0, {"t": "flush"}, timeout=10.0)
        except (TimeoutError, asyncio.TimeoutError):
            return False, "Flush cache failed: the scheduler did not answer within 10 s.\n"
        except ChannelClosed:
            return False, "Flush cache failed: the scheduler is not running.\n"
        if res.get("success"):
            return True, (
                "Cache flushed.\nPlease check backend logs for more details. "
                "(When there are running or waiting requests, the operation will not be performed.)\n"
            )
        return False, "Flush cache failed: there are running or waiting requests.\n"
