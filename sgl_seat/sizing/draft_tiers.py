"""The seat's draft policy ``draft.off_above: N`` as SGLang's ``--speculative-adaptive-config`` tiers, and back.

SGLang (0.5.11 and later) has no "speculation off above N running requests" switch. What it has is
``--speculative-adaptive``: per decode batch, ``AdaptiveSpeculativeParams`` (``sglang/srt/speculative/
adaptive_spec_params.py``, the same in 0.5.17 and 0.5.23) routes the batch size to the tier with the largest
key at or below it and runs that tier's draft steps; a tier whose only candidate is 0 runs no draft step. So
``off_above: N`` becomes two tiers, ``{"1": [steps], "N+1": [0]}``: one candidate each, so the EMA that moves
steps inside a tier has nothing to move (the draft runs exactly as the static draft up to N, and not above).

How the key is read: SGLang first pads the batch size up to a CUDA-graph batch size, but only to the list given
by ``--cuda-graph-bs-decode`` (``get_exec().graph.cuda_graph_bs_decode``, the flag as given: ``None`` when it is
not, and then no padding). The plan writes no such list, so the running requests themselves are the key and N
is exact. :func:`tiers_for` takes the list anyway (``graph_sizes``): with one, N rounds down to the largest
running-request count whose padded size still routes below the zero tier, and :func:`off_above_of` reads a
config back the same way (``tests/unit/test_draft_tiers.py`` maps both ways; ``tests/contract`` holds
:meth:`DraftTiers.steps_for` to SGLang's own routing in both versions).

What it cannot give back: SGLang sizes the KV pool and the slot cap for the draft at start (its cells are in every
token, its slots are the draft's), so the pool and the slots stay as with the draft on; at zero steps it still
runs a verify-shaped forward and a draft extend per decode step.
"""

from __future__ import annotations

import bisect
import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

__all__ = ["ADAPTIVE_CONFIG_NAME", "SEAT_FILES", "DraftTiers", "off_above_of", "route", "tiers_for"]

#: The per-seat directory of files the plan carries (the node agent writes them before the engine starts).
SEAT_FILES = "${seat_files}"
#: The adaptive tier config's name in that directory.
ADAPTIVE_CONFIG_NAME = "adaptive-config.json"


def _pad(batch: int, graph_sizes: Sequence[int] | None) -> int:
    """SGLang's ``_pad_to_cuda_graph_bs``: the smallest listed size >= batch, or batch itself past the list."""
    if not graph_sizes:
        return batch
    sizes = sorted(graph_sizes)
    i = bisect.bisect_left(sizes, batch)
    return sizes[i] if i < len(sizes) else batch


def route(batch: int, keys: Sequence[int], graph_sizes: Sequence[int] | None) -> int:
    """The tier key SGLang routes a decode batch of ``batch`` requests to (``_route``: pad, then the largest key
    at or below; the smallest key when none is)."""
    ks = sorted(keys)
    i = bisect.bisect_right(ks, _pad(batch, graph_sizes)) - 1
    return ks[max(0, i)]


@dataclass(frozen=True, slots=True)
class DraftTiers:
    """``off_above`` as SGLang's tiers: the config, the key it turns off at, and what it gives."""

    off_above: int  # the policy as written (draft.off_above)
    speculates_up_to: int  # the largest running-request count that still drafts (N, or less with padding)
    off_key: int  # the tier key whose only candidate is 0 steps
    steps: int
    graph_sizes: tuple[int, ...] | None

    def config(self) -> dict[str, dict[str, Any]]:
        """SGLang's ``--speculative-adaptive-config`` JSON (integer-string keys, ``candidate_steps`` each)."""
        return {"1": {"candidate_steps": [self.steps]}, str(self.off_key): {"candidate_steps": [0]}}

    def config_text(self) -> str:
        return json.dumps(self.config(), sort_keys=True) + "\n"

    def steps_for(self, batch: int) -> int:
        """Draft steps SGLang runs for a decode batch of ``batch`` requests under this config."""
        return self.steps if route(batch, (1, self.off_key), self.graph_sizes) == 1 else 0

    def how(self) -> str:
        pad = ("SGLang pads the batch to a --cuda-graph-bs-decode size first, so N rounds down to "
               f"{self.speculates_up_to}" if self.graph_sizes else
               "no --cuda-graph-bs-decode list is given, so SGLang routes the running batch unpadded and N is exact")
        return (f"tiers {{1: [{self.steps}], {self.off_key}: [0]}}: a decode batch routes to the largest key at or "
                f"below it; {pad}")

    def to_json(self) -> dict[str, Any]:
        return {"off_above": self.off_above, "speculates_up_to": self.speculates_up_to, "off_key": self.off_key,
                "steps": self.steps, "graph_sizes": list(self.graph_sizes) if self.graph_sizes else None,
                "config": self.config(), "how": self.how()}


def tiers_for(off_above: int, steps: int, graph_sizes: Sequence[int] | None = None) -> DraftTiers:
    """The tiers that draft at every decode batch of at most ``off_above`` requests and at none above.

    With ``graph_sizes`` (SGLang pads to them) the zero tier's key is the padded size of ``off_above + 1``: every
    larger batch pads at least as far, so none drafts; a smaller batch that pads to the same size cannot be told
    apart, so it does not draft either (the policy rounds down: speculation stops no later than asked).
    """
    if off_above < 1:
        raise ValueError(f"off_above must be at least 1, got {off_above}")
    if steps < 1:
        raise ValueError(f"steps must be at least 1, got {steps}")
    sizes = tuple(sorted(set(graph_sizes))) if graph_sizes else None
    key = _pad(off_above + 1, sizes)
    tiers = DraftTiers(off_above, off_above, key, steps, sizes)
    upto = max((b for b in range(1, off_above + 1) if tiers.steps_for(b) > 0), default=0)
    if upto < 1:
        raise ValueError(f"off_above {off_above}: with CUDA-graph sizes {list(sizes or ())} even one request pads "
                         "to the zero tier; no tier config drafts below it")
    return DraftTiers(off_above, upto, key, steps, sizes)


def off_above_of(config: Mapping[str, Any], graph_sizes: Sequence[int] | None = None) -> int | None:
    """The largest running-request count that still drafts under an adaptive ``config`` (SGLang's JSON), read
    back by SGLang's routing; ``None`` when the largest tier drafts (speculation never turns off)."""
    tiers = {int(k): [int(s) for s in v["candidate_steps"]] for k, v in config.items() if k.isdigit()}
    if not tiers:
        raise ValueError("the adaptive config names no batch-size tier (keys like \"1\", \"8\")")
    keys = sorted(tiers)
    if any(s > 0 for s in tiers[keys[-1]]):
        return None
    top = max(keys[-1], max(graph_sizes or (0,))) + 1
    drafting = [b for b in range(1, top + 1) if any(s > 0 for s in tiers[route(b, keys, graph_sizes)])]
    return max(drafting, default=0)
