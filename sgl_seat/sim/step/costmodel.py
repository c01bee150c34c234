"""The sim's cost model: how long a step takes and how many draft tokens it keeps (synthetic figures).

Why this shape: on a cross-node MoE seat a decode step is dominated by a fixed floor (the cross-node
all-reduces and expert dispatch), plus a small cost per token in the batch. The draft (MTP/EAGLE head)
adds a few cheap draft forwards per step and makes the target verify ``num_draft_tokens`` positions per
request, and in exchange emits ``1 + accepted`` tokens per request per step. With the paper's acceptance
(0.81 of proposed drafts kept, mean accepted length 1 + 0.81 x drafts), single-stream output rises with
the draft; at 64 concurrent the draft-on seat is capped at fewer slots (8 vs 32 on the large seat), so its
aggregate falls. Step time is real wall time: schedulers sleep until the step's modelled end.

``--speculative-adaptive`` (:mod:`sgl_seat.sim.step.adaptive`) changes the step count per decode step; a step
with 0 draft steps still runs a 1-position verify and one draft forward (SGLang's draft-extend keeps the
draft KV warm). ``draft_cost`` is a sim-only multiplier on the draft's own costs (its forwards, its extra
prefill, its per-request KV look-ahead); 0 makes the draft free, which no real seat can be.

``accept_rate`` follows SGLang's definition (``accepted drafts / proposed drafts``); the number kept per
request per step is a deterministic draw from ``Binomial(num_draft_tokens - 1, accept_rate)`` seeded by
the request and step, so runs replay exactly.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass

DEFAULT_FLOOR_MS = 30.0
DEFAULT_ACCEPT_RATE = 0.81
# Synthetic memory figures the sim reports (log lines, /server_info memory_usage).
KV_BYTES_PER_TOKEN = 44_032  # one token of KV on one rank
SYNTHETIC_WEIGHT_GB = 38.5  # weights per rank
SYNTHETIC_AVAILABLE_GB = 8.0  # "free GPU memory" after the KV pool


@dataclass(frozen=True, slots=True)
class SpecShape:
    """The draft's shape as SGLang's flags give it (topk 1: num_draft_tokens = steps + 1)."""

    algorithm: str
    num_steps: int
    eagle_topk: int
    num_draft_tokens: int
    accept_rate: float

    @property
    def proposed_per_step(self) -> int:
        """Draft tokens proposed per request per step (SGLang: ``num_draft_tokens - 1``)."""
        return max(self.num_draft_tokens - 1, 0)

    @property
    def expected_accept_length(self) -> float:
        return 1.0 + self.accept_rate * self.proposed_per_step


@dataclass(frozen=True, slots=True)
class CostModel:
    """Per-step latency in milliseconds (all synthetic)."""

    floor_ms: float = DEFAULT_FLOOR_MS
    token_ms: float = 0.25  # per token the target processes in a decode/verify step
    draft_step_frac: float = 0.06  # one draft forward, as a fraction of the floor
    draft_token_ms: float = 0.05  # per request per draft forward
    prefill_token_ms: float = 0.02  # per uncached prompt token
    draft_prefill_factor: float = 1.25  # draft-extend on top of the target's prefill
    draft_cost: float = 1.0  # sim-only: multiplies the draft's own costs (0 = a free draft)

    def tokens_per_step(self, spec: SpecShape | None, steps: int | None = None) -> int:
        """Positions per request the target runs (and the row fetch gathers) each decode step; ``steps`` is the
        adaptive tier's step count for this step (None: the static shape)."""
        if spec is None:
            return 1
        return max(spec.num_draft_tokens, 1) if steps is None else steps + 1

    def decode_step_ms(self, n_running: int, spec: SpecShape | None, steps: int | None = None) -> float:
        if n_running <= 0:
            return 0.0
        ms = self.floor_ms + self.token_ms * n_running * self.tokens_per_step(spec, steps)
        if spec is not None:
            # Steps 0 (adaptive, large batch) still runs one draft forward: SGLang's draft-extend.
            forwards = spec.num_steps if steps is None else max(steps, 1)
            ms += self.draft_cost * forwards * (self.draft_step_frac * self.floor_ms + self.draft_token_ms * n_running)
        return ms

    def extend_step_ms(self, new_tokens: int, n_seqs: int, spec: SpecShape | None) -> float:
        if n_seqs <= 0:
            return 0.0
        prefill = self.prefill_token_ms * new_tokens
        if spec is not None:
            prefill *= 1.0 + self.draft_cost * (self.draft_prefill_factor - 1.0)
        return self.floor_ms + prefill + self.token_ms * n_seqs


def accepted_drafts(key: str, step: int, spec: SpecShape, proposed: int | None = None) -> int:
    """Deterministic ``Binomial(proposed, accept_rate)`` draw for one request at one step (``proposed``: the
    adaptive tier's steps for this step; None: the static shape's)."""
    n = spec.proposed_per_step if proposed is None else proposed
    if n == 0:
        return 0
    digest = hashlib.blake2b(f"{key}:{step}".encode(), digest_size=8 * n).digest()
    kept = 0
    for i in range(n):
        u = int.from_bytes(digest[8 * i : 8 * i + 8], "little") / 2.0**64
        if u < spec.accept_rate:
            kept += 1
    return kept
