"""How a plan's figures relate to the field report's observation (PT-R-2026-019, section 3), said honestly.

The report observed, on 2 nodes x 2 x 96 GB GPUs at memory fraction 0.85 and context 409,600: a KV pool of
"roughly 890,000" tokens with the draft off and 260,352 with it on, 8 slots with the draft (16 and 32 failed to
boot). Those are observations of one run of an SGLang build the report does not name; they are never inputs
here and never targets. When a plan has the report's shape, its text output carries these lines so an operator
sees where SGLang 0.5.23's computation and the observation part; ``runbooks/enable-draft.md`` has the table.
"""

from __future__ import annotations

from typing import Any

REPORT = "field report PT-R-2026-019"
#: The report's observations ("roughly 890,000"; "260,352"), for comparison only.
OBSERVED_DRAFT_OFF = 890_000
OBSERVED_DRAFT_ON = 260_352
OBSERVED_SLOTS_ON = 8


def has_report_shape(spec: Any, model_architecture: str) -> bool:
    """A seat of 2 nodes x 2 GPUs x 96 GiB, TP4, a DeepSeek-V4-family model at context 409,600: the report's large
    seat (asked of real SGLang seats only: a sim seat of that shape is not compared, its figures are synthetic)."""
    return bool(
        spec.cluster.nodes == 2 and spec.cluster.gpus_per_node == 2
        and spec.cluster.gpu_memory_gb == 96
        and spec.parallel.tp == 4 and spec.model.context_length == 409_600
        and model_architecture.startswith("DeepseekV4")
    )


def _pct(value: int, observed: int) -> str:
    return f"{100 * value / observed:.0f} %"


def report_notes(*, source_label: str, off_tokens: int | None, on_tokens: int | None, on_problem: str | None,
                 mem_fraction: float, model_type: str | None) -> list[str]:
    """Lines for the plan's text output (and JSON ``notes``) comparing this plan with the report."""
    lines = [
        f"{REPORT} observed roughly {OBSERVED_DRAFT_OFF:,} tokens draft off and {OBSERVED_DRAFT_ON:,} draft on "
        f"({OBSERVED_SLOTS_ON} slots; 16 and 32 did not boot), an observation, not an input here",
    ]
    computed = []
    if off_tokens:
        computed.append(f"{off_tokens:,} draft off ({_pct(off_tokens, OBSERVED_DRAFT_OFF)} of it)")
    if on_tokens:
        computed.append(f"{on_tokens:,} draft on ({_pct(on_tokens, OBSERVED_DRAFT_ON)} of it)")
    elif on_problem:
        computed.append(f"no draft-on pool ({on_problem})")
    if computed:
        lines.append(f"{source_label} for these inputs at fraction {mem_fraction:g}: " + ", ".join(computed))
    lines.append(
        "the difference is not fitted away: the inputs that would move it are the model type (deepseek_v41 sizes "
        "the SWA pool by a request cap, and SGLang 0.5.23 accepts only DSpark drafts for it), the Engram tables' "
        "placement (in HBM the report's 475 GiB checkpoint does not fit), the weights per GPU, and the draft "
        "(runbooks/enable-draft.md, 'What SGLang computes for the field report's seat')"
    )
    if model_type == "deepseek_v41":
        lines.append("this plan uses model_type deepseek_v41")
    return lines
