"""``--speculative-adaptive``: SGLang 0.5.23's step tiers by batch size, as the sim runs them.

Why the sim carries SGLang's policy rather than a simpler one: the gate's hybrid arm (speculation that backs
off at large batches) is only worth measuring if the step count moves the way SGLang moves it. So this is
``sglang/srt/speculative/adaptive_spec_params.py`` reduced to what a step needs: tiers keyed by batch size
(default ``1: [1,3,5,7] | 8: [0,1,3] | 32: [0,1] | 64: [0]``), a batch routed to the largest key <= its size
(the sim captures no CUDA graphs, so no padding: SGLang without graphs does the same), and per tier an EMA of
accepted drafts (alpha 0.2, 10 warm-up batches, a decision every 5) that steps up while the EMA clears
``step - 0.5`` and down below ``prev - 0.5 + down_hysteresis``; from 0 it probes the next tier step.

Its KV cost: SGLang allocates for the largest tier (the union's largest step), so the sim reserves that
tier's draft tokens per running request (:attr:`AdaptivePolicy.max_draft_tokens`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

DEFAULT_TIERS: dict[str, dict[str, Any]] = {
    "1": {"candidate_steps": [1, 3, 5, 7], "down_hysteresis": -0.25},
    "8": {"candidate_steps": [0, 1, 3], "down_hysteresis": 0.0},
    "32": {"candidate_steps": [0, 1], "down_hysteresis": 0.0},
    "64": {"candidate_steps": [0], "down_hysteresis": 0.0},
}
MAX_STEPS = 8  # the sim's acceptance draw supports up to 8 drafts per step


@dataclass(slots=True)
class Tier:
    """One batch-size slot: its candidate steps and the EMA that picks among them."""

    candidates: list[int]
    ema_alpha: float = 0.2
    update_interval: int = 5
    warmup_batches: int = 10
    down_hysteresis: float = -0.25
    up_hysteresis: float = 0.0
    current: int = 0
    ema: float = 0.0
    batches: int = 0

    def start(self, initial: int) -> None:
        self.current = initial if initial in self.candidates else self.candidates[len(self.candidates) // 2]
        self.ema = float(self.current - 1)

    def update(self, kept: list[int]) -> None:
        """Feed one verify's accepted drafts per request; maybe move the step count."""
        if not kept:
            return
        if self.current > 0:
            self.ema = (1 - self.ema_alpha) * self.ema + self.ema_alpha * sum(kept) / len(kept)
        self.batches += 1
        if self.batches <= self.warmup_batches or (self.batches - self.warmup_batches) % self.update_interval:
            return
        idx = self.candidates.index(self.current)
        if self.current == 0:
            idx = min(idx + 1, len(self.candidates) - 1)
            if self.candidates[idx] > 0 and self.ema < 0:
                self.ema = float(self.candidates[idx] - 1)
            self.current = self.candidates[idx]
            return
        start = idx
        while idx > 0:
            prev = self.candidates[idx - 1]
            if self.ema <= (0.5 if prev == 0 else prev - 0.5) + self.down_hysteresis:
                idx -= 1
            else:
                break
        if idx == start:
            while idx < len(self.candidates) - 1 and self.ema > self.candidates[idx] - 0.5 + self.up_hysteresis:
                idx += 1
        self.current = self.candidates[idx]


@dataclass(slots=True)
class AdaptivePolicy:
    """Batch size -> this step's draft steps, per SGLang's tiers."""

    tiers: dict[int, Tier] = field(default_factory=dict)

    @classmethod
    def from_config(cls, raw: dict[str, Any], initial_steps: int) -> AdaptivePolicy:
        tiers: dict[int, Tier] = {}
        for key, entry in raw.items():
            if not key.isdigit():
                continue  # SGLang keeps non-numeric keys as shared defaults
            steps = entry.get("candidate_steps")
            if not (isinstance(steps, list) and steps and all(isinstance(s, int) and 0 <= s <= MAX_STEPS
                                                              for s in steps)):
                raise ValueError(f"batch size {key}: candidate_steps must be a list of ints in 0..{MAX_STEPS}, "
                                 f"got {steps!r}")
            shared = {k: v for k, v in raw.items() if not k.isdigit()}
            opts = {**shared, **entry}
            t = Tier(candidates=sorted(set(steps)), ema_alpha=float(opts.get("ema_alpha", 0.2)),
                     update_interval=int(opts.get("update_interval", 5)),
                     warmup_batches=int(opts.get("warmup_batches", 10)),
                     down_hysteresis=float(opts.get("down_hysteresis", -0.25)),
                     up_hysteresis=float(opts.get("up_hysteresis", 0.0)))
            t.start(initial_steps)
            tiers[int(key)] = t
        if not tiers:
            raise ValueError("the adaptive config names no batch-size tier (keys like \"1\", \"8\")")
        return cls(tiers)

    @classmethod
    def load(cls, path: str | None, initial_steps: int) -> AdaptivePolicy:
        """SGLang's ``--speculative-adaptive-config`` JSON, or its defaults."""
        raw = DEFAULT_TIERS if path is None else json.loads(Path(path).read_text(encoding="utf-8"))
        if not isinstance(raw, dict):
            raise ValueError(f"{path}: the adaptive config must be a JSON object")
        return cls.from_config(raw, initial_steps)

    def _tier(self, batch: int) -> Tier:
        keys = sorted(self.tiers)
        chosen = keys[0]
        for k in keys:
            if k <= batch:
                chosen = k
        return self.tiers[chosen]

    def steps_for(self, batch: int) -> int:
        return self._tier(batch).current

    def on_verify(self, batch: int, kept: list[int]) -> None:
        self._tier(batch).update(kept)

    @property
    def max_steps(self) -> int:
        return max(max(t.candidates) for t in self.tiers.values())

    @property
    def max_draft_tokens(self) -> int:
        """Draft tokens of the largest tier (topk 1: steps + 1): what SGLang allocates KV for."""
        return self.max_steps + 1
