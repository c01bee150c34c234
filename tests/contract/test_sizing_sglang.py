"""`plan` takes its KV pool from SGLang 0.5.23's own sizing, and SGLang reads every shipped planning config.

Acceptance of issue 10: for the large seat, draft off and on x memory fraction 0.80/0.85/0.90 x 4/8/32 slots,
``plan --json`` names SGLang as the source and its pool equals what an independent run of SGLang's code
(``tests/contract/sglang_sizing_driver.py``: SGLang's ``prepare_server_args`` on node 0's generated command
line, memory computed from the spec here) computes, within 1 %, with the same max running requests.
Under CI=true a missing SGLang fails these tests (conftest.py).
"""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sgl_seat.errors import CapacityError
from sgl_seat.plan import build_plan
from sgl_seat.sizing import SOURCE_SGLANG, installed_version
from sgl_seat.spec import load_spec
from tests.contract.conftest import CHILD_S, require

pytestmark = pytest.mark.contract

ROOT = Path(__file__).resolve().parents[2]
MODELS = ROOT / "launch" / "models"
GIB = 1 << 30
GRID = list(itertools.product((False, True), (0.80, 0.85, 0.90), (4, 8, 32)))


def _driver(request: dict[str, Any]) -> dict[str, Any]:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "tests" / "contract" / "sglang_sizing_driver.py")],
        input=json.dumps(request), capture_output=True, text=True, timeout=CHILD_S, cwd=ROOT, check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    doc: dict[str, Any] = json.loads(proc.stdout.strip().splitlines()[-1])
    return doc


def _node0_flags(plan_json: dict[str, Any]) -> list[str]:
    command = plan_json["nodes"][0]["command"]
    assert command[1:3] == ["-m", "sglang.launch_server"]
    return list(command[3:])


@pytest.fixture(scope="module")
def plans_and_sglang(monkeypatch_module: pytest.MonkeyPatch) -> list[tuple[tuple[bool, float, int], Any, Any]]:
    require(installed_version() == "0.5.23", "SGLang 0.5.23 is not installed")
    monkeypatch_module.setenv("SGLSEAT_SIZING", "sglang")  # no silent fallback to the mirror here
    spec = load_spec("large")
    weights_gb = spec.model.weights_gb
    assert weights_gb is not None, "the large seat must carry its weights as an input (model.weights_gb)"
    plans, cases = [], []
    cfg_dir = spec.model_config_path()
    assert cfg_dir is not None
    for draft, mf, slots in GRID:
        try:
            plan = build_plan(spec, draft=draft, slots=slots, mem_fraction=mf)
        except CapacityError as exc:
            plans.append(exc)
            flags = None
        else:
            doc = json.loads(plan.dumps())
            plans.append(doc)
            flags = _node0_flags(doc)
        if flags is None:  # refused: ask the driver with the spec's flags for the same state
            flags = ["--tp-size", "4", "--ep-size", "4", "--mem-fraction-static", str(mf),
                     "--max-running-requests", str(slots), "--context-length", str(spec.model.context_length)]
            if draft:
                d = spec.draft
                flags += ["--speculative-algorithm", d.algorithm, "--speculative-num-steps", str(d.steps),
                          "--speculative-eagle-topk", str(d.topk), "--speculative-num-draft-tokens",
                          str(d.draft_tokens)]
        # SGLang reads <model-path>/config.json: point it at the planning config, as the plan's sizing does.
        if "--model-path" in flags:
            flags[flags.index("--model-path") + 1] = str(cfg_dir.parent)
        else:
            flags = ["--model-path", str(cfg_dir.parent), *flags]
        cases.append({"argv": flags, "gpu_gib": spec.cluster.gpu_memory_gb,
                      "weights_per_gpu_bytes": int(weights_gb * GIB) // spec.parallel.tp,
                      "draft_bytes": int(spec.draft.extra_weights_gb * GIB) if draft else 0})
    # One driver run (one SGLang import) answers both tests: the grid and every shipped config.
    answers = _driver({"cases": cases, "configs": [str(d) for d in _shipped()]})
    _CONFIG_ANSWERS.extend(answers["configs"])
    return list(zip(GRID, plans, answers["cases"], strict=True))


_CONFIG_ANSWERS: list[dict[str, Any]] = []


def _shipped() -> list[Path]:
    return sorted(p.parent for p in MODELS.glob("*/config.json"))


@pytest.fixture(scope="module")
def monkeypatch_module() -> Any:
    mp = pytest.MonkeyPatch()
    yield mp
    mp.undo()


def test_plan_json_names_sglang_and_matches_an_independent_run(
    plans_and_sglang: list[tuple[tuple[bool, float, int], Any, Any]],
) -> None:
    checked = 0
    for (draft, mf, slots), plan, sglang in plans_and_sglang:
        where = f"draft {'on' if draft else 'off'}, mf {mf}, {slots} slots"
        if isinstance(plan, CapacityError):  # the plan refused: SGLang must not run what was asked either
            assert "error" in sglang or sglang["max_running_requests"] < slots, (
                f"{where}: plan refused ({plan}) but SGLang sizes it: {sglang}")
            if "error" in sglang:  # the same refusal, in SGLang's words
                assert sglang["error"].split(":", 1)[-1].strip()[:40] in str(plan), (where, sglang["error"])
            continue
        assert "error" not in sglang, f"{where}: the independent SGLang run failed: {sglang.get('error')}"
        cap = plan["capacity"]
        assert cap["source"] == SOURCE_SGLANG and cap["sglang_version"] == "0.5.23", where
        state = cap["draft_on" if draft else "draft_off"]
        assert abs(state["kv_pool_tokens"] - sglang["tokens"]) <= 0.01 * sglang["tokens"], (
            f"{where}: plan {state['kv_pool_tokens']} tokens, SGLang {sglang['tokens']}")
        assert state["max_running_requests"] == sglang["max_running_requests"], where
        assert state["swa_pool_tokens"] == sglang["swa"], where
        checked += 1
    assert checked >= 12, "most of the acceptance grid must produce a plan"


def test_every_shipped_planning_config_loads_in_sglangs_model_config(
    plans_and_sglang: list[tuple[tuple[bool, float, int], Any, Any]],
) -> None:
    dirs = _shipped()
    assert dirs, "no planning configs shipped"
    answers = _CONFIG_ANSWERS
    for d, got in zip(dirs, answers, strict=True):
        cfg = json.loads((d / "config.json").read_text())
        assert "error" not in got, f"{d.name}: SGLang's ModelConfig fails: {got.get('error')}"
        assert got["model_type"] == cfg["model_type"], d.name
        if cfg.get("engram_layer_ids"):
            # SGLang's EngramLayout draws each table's hash primes; their sum must be the table's row count.
            assert got["engram_rows_from_primes"] == cfg["engram_num_embeddings"] == got["engram_rows"], d.name


def test_a_cached_answer_is_what_sglangs_code_computes(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The second plan of the same seat reads SGLang's answers from the cache; they equal a fresh computation,
    and the plan says where they came from."""
    require(installed_version() == "0.5.23", "SGLang 0.5.23 is not installed")
    from sgl_seat.sizing import CACHE_ENV

    monkeypatch.setenv("SGLSEAT_SIZING", "sglang")
    monkeypatch.setenv("SGLSEAT_HOME", str(tmp_path))
    monkeypatch.setenv(CACHE_ENV, "on")
    spec = load_spec("large")
    first, second = (build_plan(spec, draft=True, slots=8).capacity for _ in range(2))
    monkeypatch.setenv(CACHE_ENV, "off")
    fresh = build_plan(spec, draft=True, slots=8).capacity
    assert first is not None and second is not None and fresh is not None
    assert not any("sizing cache" in n for n in first.notes)
    assert any("sizing cache (2 of 2" in n for n in second.notes)
    for got in (second, fresh):
        assert got.source == SOURCE_SGLANG
        assert (got.draft_off, got.draft_on) == (first.draft_off, first.draft_on)
    assert len(list((tmp_path / "cache" / "sizing").glob("*.json"))) == 2
