"""The plan's draft-policy tiers route in SGLang's own code as the plan says (sgl_seat.sizing.draft_tiers).

For policies N with and without a CUDA-graph list (SGLang pads the batch to ``--cuda-graph-bs-decode`` when that
is given), SGLang's ``AdaptiveSpeculativeParams`` reads the plan's config file and answers the draft steps of
every decode batch from 1 to 120: the same as :meth:`DraftTiers.steps_for`, in SGLang 0.5.23 (the CPU engine's
environment) and 0.5.17 (the H200 seat's version, its Python first on that environment's path). SGLang's
``resolve_candidate_steps_from_config`` gives the largest step the sizing run assumes (the static draft's), so
sizing with the static flags is the same sizing (``sizing.capacity.for_sizing``).
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import pytest

from sgl_seat.engines.base import engine_venv
from sgl_seat.sizing.draft_tiers import tiers_for
from tests.contract.conftest import CHILD_S, require

pytestmark = [pytest.mark.contract]

OVERLAY = Path(os.environ.get("SGLSEAT_CACHE", Path.home() / ".cache" / "sgl-seat")) / "sglang-0.5.17-parser"
ENGINE = Path(engine_venv())
SPEC_GRAPHS_64 = [*range(1, 9), *range(10, 33, 2), *range(40, 65, 4)]
CASES = [(1, None), (7, None), (20, None), (47, None), (9, SPEC_GRAPHS_64), (12, SPEC_GRAPHS_64),
         (33, SPEC_GRAPHS_64), (70, SPEC_GRAPHS_64)]
_CHILD = r"""
import json, sys
import sglang
from sglang.srt.speculative.adaptive_spec_params import AdaptiveSpeculativeParams, resolve_candidate_steps_from_config
out = {"version": sglang.__version__, "file": sglang.__file__, "cases": []}
for path, graphs in json.load(sys.stdin):
    a = AdaptiveSpeculativeParams(3, path)
    a.set_cuda_graph_bs(graphs)
    out["cases"].append({"steps": [a.get_steps_for_batch(b) for b in range(1, 121)],
                         "candidates": resolve_candidate_steps_from_config(path)})
print(json.dumps(out))
"""


def _ask(tmp_path: Path, overlay: bool) -> dict[str, Any]:
    python = ENGINE / "bin" / "python"
    require(python.is_file(), "the engine environment (.venv-sglang) is not set up")
    if overlay:
        require(OVERLAY.joinpath("sglang", "srt", "speculative", "adaptive_spec_params.py").is_file(),
                "SGLang 0.5.17's Python is not installed (scripts/install-sglang-0517-parser.sh)")
    jobs = []
    for i, (n, graphs) in enumerate(CASES):
        f = tmp_path / f"tiers-{i}.json"
        f.write_text(tiers_for(n, 3, graphs).config_text())
        jobs.append([str(f), graphs])
    env = {"PATH": os.environ.get("PATH", ""), "HOME": os.environ.get("HOME", "/root"), "SGLANG_USE_CPU_ENGINE": "1",
           "HF_HUB_OFFLINE": "1", "LD_LIBRARY_PATH": str(ENGINE / "lib" / "sgl-seat-stub"),
           **({"PYTHONPATH": str(OVERLAY)} if overlay else {})}
    res = subprocess.run([str(python), "-c", _CHILD], input=json.dumps(jobs), env=env, capture_output=True, text=True,
                         timeout=CHILD_S, check=False)
    assert res.returncode == 0, res.stderr[-3000:]
    doc: dict[str, Any] = json.loads(res.stdout.strip().splitlines()[-1])
    return doc


@pytest.mark.parametrize("version", ["0.5.23", "0.5.17"])
def test_sglang_routes_the_plans_tiers_as_the_plan_says(tmp_path: Path, version: str) -> None:
    doc = _ask(tmp_path, overlay=version == "0.5.17")
    assert doc["version"] == version, doc["file"]
    for (n, graphs), got in zip(CASES, doc["cases"], strict=True):
        t = tiers_for(n, 3, graphs)
        assert got["steps"] == [t.steps_for(b) for b in range(1, 121)], (n, graphs)
        assert got["steps"].index(0) == t.speculates_up_to  # drafts at 1..upto, from upto + 1 not
        assert max(got["candidates"]) == 3  # the largest step: the static draft's, as sizing assumes
