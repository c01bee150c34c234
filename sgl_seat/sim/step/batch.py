"""Rank 0's continuous batching: admission, prefill/decode steps, outputs. Pure: no torch, no sockets.

Why separate: the scheduler process wraps this in collectives, sleeps and sockets; keeping the decisions
here makes them unit-testable and deterministic. As in SGLang, an iteration runs either a prefill
(``EXTEND``: admit waiting requests while slots and KV allow, emit each one's first token) or a decode
step over every running request (draft off: one token each; draft on: ``1 + accepted`` each). With
``--speculative-adaptive`` each decode step's draft steps come from the batch size's tier
(:mod:`sgl_seat.sim.step.adaptive`). With the draft on, each running request also holds KV for one verify's draft
tokens (the largest tier's under adaptive), as SGLang allocates them per verify; the sim-only ``draft_cost``
0 drops that with the draft's other costs.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

from sgl_seat.sim.step import tokens
from sgl_seat.sim.step.adaptive import AdaptivePolicy
from sgl_seat.sim.step.costmodel import CostModel, SpecShape, accepted_drafts
from sgl_seat.sim.step.radix import KVPool, Node, RadixCache

IDLE = 0
EXTEND = 1
DECODE = 2
SHUTDOWN = 3


@dataclass(slots=True)
class Req:
    rid: str
    input_ids: list[int]
    max_new_tokens: int
    stop: tuple[str, ...] = ()
    stop_token_ids: frozenset[int] = frozenset()
    output_ids: list[int] = field(default_factory=list)
    h: int = 0
    prompt_h: int | None = None  # the prompt's context hash when computed ahead (scheduler: beside the forward)
    cached: int = 0
    node: Node | None = None
    reserve: int = 0
    verify_ct: int = 0
    accepted: int = 0
    finish: dict[str, Any] | None = None

    @classmethod
    def from_msg(cls, msg: dict[str, Any]) -> Req:
        return cls(
            rid=str(msg["rid"]),
            input_ids=[int(t) for t in msg["input_ids"]],
            max_new_tokens=int(msg["max_new_tokens"]),
            stop=tuple(str(s) for s in msg.get("stop") or ()),
            stop_token_ids=frozenset(int(t) for t in msg.get("stop_token_ids") or ()),
        )


@dataclass(frozen=True, slots=True)
class StepPlan:
    kind: int
    step_no: int
    reqs: tuple[Req, ...]
    new_tokens: int
    cached_tokens: int
    gather: int
    step_ms: float
    spec_steps: int | None = None  # --speculative-adaptive: this step's draft steps


@dataclass(slots=True)
class Batcher:
    capacity: int
    max_running: int
    cost: CostModel
    spec: SpecShape | None = None
    flip_near_ties: bool = False
    disable_radix: bool = False
    adaptive: AdaptivePolicy | None = None
    waiting: deque[Req] = field(default_factory=deque)
    running: list[Req] = field(default_factory=list)
    step_no: int = 0
    pool: KVPool = field(init=False)
    rejected: list[dict[str, Any]] = field(default_factory=list)
    # Cumulative counters the scheduler turns into log lines and gauges.
    gen_tokens: int = 0
    spec_forwards: int = 0  # request-steps verified
    spec_tokens: int = 0  # tokens those verifies emitted
    spec_correct: int = 0  # accepted drafts
    spec_proposed: int = 0  # drafts proposed (varies per step under adaptive)

    def __post_init__(self) -> None:
        self.pool = KVPool(capacity=self.capacity, cache=RadixCache(disabled=self.disable_radix))

    # --- requests in -------------------------------------------------------------------------------------
    def add(self, req: Req) -> None:
        self.waiting.append(req)

    def abort(self, rid: str) -> dict[str, Any] | None:
        """Drop a request wherever it is; return its final output item (or None if unknown/finished)."""
        for r in self.waiting:
            if r.rid == rid:
                self.waiting.remove(r)
                r.finish = {"type": "abort", "message": "Abort before prefill"}
                return self._item(r, [])
        for r in self.running:
            if r.rid == rid:
                self.running.remove(r)
                r.finish = {"type": "abort", "message": "Abort in running"}
                self._release(r)
                return self._item(r, [])
        return None

    def has_work(self) -> bool:
        return bool(self.waiting or self.running)

    def flush_cache(self) -> bool:
        if self.has_work():
            return False
        self.pool.cache.reset()
        self.pool.hit_tokens = self.pool.prompt_tokens = 0
        return True

    # --- one iteration ------------------------------------------------------------------------------------
    def plan(self) -> StepPlan | None:
        """Choose this iteration's step, or None when there is nothing to run."""
        new = self._admit()
        if new:
            new_tokens = sum(len(r.input_ids) - r.cached for r in new)
            cached = sum(r.cached for r in new)
            return StepPlan(
                kind=EXTEND, step_no=self.step_no, reqs=tuple(new), new_tokens=new_tokens, cached_tokens=cached,
                gather=new_tokens, step_ms=self.cost.extend_step_ms(new_tokens, len(new), self.spec),
            )
        if self.running:
            n = len(self.running)
            steps = self.adaptive.steps_for(n) if self.adaptive is not None and self.spec is not None else None
            return StepPlan(
                kind=DECODE, step_no=self.step_no, reqs=tuple(self.running), new_tokens=0, cached_tokens=0,
                gather=n * self.cost.tokens_per_step(self.spec, steps),
                step_ms=self.cost.decode_step_ms(n, self.spec, steps), spec_steps=steps,
            )
        return None

    @property
    def lookahead(self) -> int:
        """KV tokens each running request holds for one verify's draft positions (0 with the draft off)."""
        if self.spec is None or self.cost.draft_cost == 0:
            return 0
        return self.adaptive.max_draft_tokens if self.adaptive is not None else self.spec.num_draft_tokens

    def complete(self, plan: StepPlan) -> list[dict[str, Any]]:
        """Apply a finished step: new tokens per request, finished requests released. Returns output items."""
        self.step_no += 1
        items: list[dict[str, Any]] = []
        batch = len(plan.reqs)
        kept_all: list[int] = []
        for r in plan.reqs:
            if plan.kind == EXTEND:
                r.h = r.prompt_h if r.prompt_h is not None else tokens.context_hash(r.input_ids)
                want = 1
            else:
                r.verify_ct += 1
                kept = (accepted_drafts(r.rid, r.verify_ct, self.spec, plan.spec_steps)
                        if self.spec is not None else 0)
                kept_all.append(kept)
                want = 1 + kept
            new_ids = self._generate(r, want, batch)
            self.gen_tokens += len(new_ids)
            if plan.kind == DECODE and self.spec is not None:
                self.spec_forwards += 1
                self.spec_tokens += len(new_ids)
                self.spec_correct += max(len(new_ids) - 1, 0)
                self.spec_proposed += self.spec.proposed_per_step if plan.spec_steps is None else plan.spec_steps
                r.accepted += max(len(new_ids) - 1, 0)
            if plan.kind == EXTEND and r.finish is None:
                self.running.append(r)
            if r.finish is not None:
                if r in self.running:
                    self.running.remove(r)
                self._release(r)
            items.append(self._item(r, new_ids))
        if plan.kind == DECODE and self.adaptive is not None and self.spec is not None:
            self.adaptive.on_verify(batch, kept_all)
        return items

    # --- internals ----------------------------------------------------------------------------------------
    def _admit(self) -> list[Req]:
        new: list[Req] = []
        cache = self.pool.cache
        while self.waiting and len(self.running) + len(new) < self.max_running:
            r = self.waiting[0]
            matched, node = cache.match_prefix(r.input_ids)
            matched = min(matched, max(len(r.input_ids) - 1, 0))  # at least one token is computed
            uncached = len(r.input_ids) - matched
            need = uncached + r.max_new_tokens + self.lookahead
            if need > self.capacity:
                self.waiting.popleft()
                r.finish = {
                    "type": "abort",
                    "message": f"request needs {need} KV tokens; the pool holds {self.capacity}",
                }
                self.rejected.append(self._item(r, []))
                continue
            cache.lock(node)
            if not self.pool.make_room(need):
                cache.unlock(node)
                break
            self.waiting.popleft()
            if cache.disabled:
                self.pool.private += len(r.input_ids)
            else:
                end = cache.insert(r.input_ids)
                cache.lock(end)
                cache.unlock(node)
                node = end
            r.node = node
            r.cached = matched
            r.reserve = r.max_new_tokens + self.lookahead
            self.pool.reserved += r.reserve
            self.pool.hit_tokens += matched
            self.pool.prompt_tokens += len(r.input_ids)
            new.append(r)
        return new

    def _generate(self, r: Req, want: int, batch: int) -> list[int]:
        out: list[int] = []
        for _ in range(want):
            if len(r.output_ids) >= r.max_new_tokens:
                break
            tid = tokens.next_token(r.h, batch_size=batch, flip_near_ties=self.flip_near_ties)
            r.h = tokens.mix(r.h, tid)
            r.output_ids.append(tid)
            out.append(tid)
            r.reserve -= 1
            self.pool.reserved -= 1
            self.pool.private += 1
            if tid in r.stop_token_ids:
                r.finish = {"type": "stop", "matched": tid}
                break
            if r.stop:
                tail = tokens.decode(r.output_ids[-(want + 16) :])
                hit = next((s for s in r.stop if s in tail), None)
                if hit is not None:
                    r.finish = {"type": "stop", "matched": hit}
                    break
        if r.finish is None and len(r.output_ids) >= r.max_new_tokens:
            r.finish = {"type": "length", "length": r.max_new_tokens}
        return out

    def _release(self, r: Req) -> None:
        """Return a request's KV: its sequence goes into the cache; its locks and reservation go away."""
        cache = self.pool.cache
        self.pool.reserved -= r.reserve
        r.reserve = 0
        if cache.disabled:
            self.pool.private -= len(r.input_ids) + len(r.output_ids)
        else:
            self.pool.private -= len(r.output_ids)
            if r.node is not None:
                end = cache.insert(r.input_ids + r.output_ids)
                cache.lock(end)
                cache.unlock(r.node)
                cache.unlock(end)
        r.node = None

    def _item(self, r: Req, new_ids: list[int]) -> dict[str, Any]:
        return {
            "rid": r.rid,
            "ids": new_ids,
            "fin": r.finish,
            "pt": len(r.input_ids),
            "ct": len(r.output_ids),
            "cached": r.cached,
            "sv": r.verify_ct,
            "acc": r.accepted,
        }
