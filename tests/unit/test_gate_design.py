"""The battery's design and bookkeeping without a seat: ABBA order, the workloads file, per-cell files and resume,
and the report built from seeded synthetic cells whose true ratios are known."""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import pytest

from sgl_seat.errors import UsageError
from sgl_seat.gate import parse_arms
from sgl_seat.gate import runner as gate_runner
from sgl_seat.gate.arms import ArmSession, arm_spec
from sgl_seat.gate.design import Slot, cell_names, schedule
from sgl_seat.gate.report_html import PLOT_IDS, render_html
from sgl_seat.gate.report_text import render_text
from sgl_seat.gate.runner import BatteryDir, run_battery, start_battery
from sgl_seat.gate.verdict import build_report
from sgl_seat.gate.workloads import load_battery, prompt_words
from sgl_seat.spec import load_spec


def test_abba_gives_every_arm_the_same_mean_position() -> None:
    """GIVEN 2 or 4 arms over an even number of runs WHEN scheduled THEN the order alternates forward and reversed
    (A B B A ...) and every arm's mean position is the same, so a linear drift cancels."""
    s = schedule(["baseline", "candidate"], 4)
    assert [x.arm[0] for x in s] == list("bccbbccb")
    for arms in (["baseline", "candidate"], ["baseline", "candidate", "hybrid", "control"]):
        slots = schedule(arms, 4)
        means = {a: sum(x.position for x in slots if x.arm == a) / 4 for a in arms}
        assert len(set(means.values())) == 1, means
    with pytest.raises(ValueError):
        schedule(["baseline", "baseline"], 2)


def test_workloads_file_and_quick() -> None:
    """GIVEN the shipped workloads WHEN loaded THEN full has 3 runs, sweep 1..96 with 64, the five named gates; quick
    overrides runs and the sweep but keeps the gates; --arms must hold the baseline (test_gate_cli: and a candidate
    or a control)."""
    full, quick = load_battery(), load_battery(quick=True)
    assert full.runs == 3 and 64 in full.levels() and max(full.levels()) > 64
    assert {g.name for g in full.gates} >= {"aggregate_at_64", "cold_ttft", "prefix_hit_rate", "kv_pool", "hangs"}
    assert quick.runs < full.runs and quick.gates == full.gates and 64 in quick.levels()
    assert prompt_words(1, 5, tag="x") == prompt_words(1, 5, tag="x") != prompt_words(2, 5, tag="x")
    assert parse_arms("baseline,candidate,hybrid,control") == ["baseline", "candidate", "hybrid", "control"]
    with pytest.raises(UsageError):
        parse_arms("candidate,control")


def test_workloads_refuse_unknown_keys_and_a_gate_off_the_sweep(tmp_path: Path) -> None:
    bad = tmp_path / "w.yaml"
    bad.write_text("schema_version: 1\nfull:\n  runs: 2\n  turbo: true\n")
    with pytest.raises(UsageError, match="turbo"):
        load_battery(path=bad)
    src = (Path(__file__).resolve().parents[2] / "sgl_seat" / "gate" / "workloads.yaml").read_text()
    off = tmp_path / "off.yaml"
    off.write_text(src.replace("levels: [1, 8, 16, 32, 64, 96]", "levels: [1, 8, 16]"))
    with pytest.raises(UsageError, match="aggregate_at_64"):
        load_battery(path=off)


def test_hybrid_arm_spec_carries_speculative_adaptive() -> None:
    """GIVEN the local-sim spec WHEN the hybrid arm's spec is planned THEN node 0 runs --speculative-adaptive, and each
    arm is its own seat name."""
    from sgl_seat.plan import build_plan

    spec = load_spec("local-sim")
    hyb = arm_spec(spec, "hybrid", address="127.0.0.1:1")
    assert hyb.name == "local-sim-hybrid" and hyb.cluster.address == "127.0.0.1:1"
    assert "--speculative-adaptive" in build_plan(hyb, draft=True).nodes[0].command
    assert "--speculative-adaptive" not in build_plan(arm_spec(spec, "candidate"), draft=True).nodes[0].command


def test_a_seat_policy_is_the_hybrids_and_not_the_candidates() -> None:
    """GIVEN a seat with a draft policy (off_above) WHEN the arms are planned THEN the candidate is the static draft
    (no adaptive flag, no tier file) and the hybrid runs the policy's tiers; a draft adaptive cannot run is refused
    for the hybrid arm with the reason."""
    from sgl_seat.plan import build_plan

    spec = load_spec("local-sim")
    tuned = spec.model_copy(update={"draft": spec.draft.model_copy(update={"off_above": 5})})
    cand, hyb = build_plan(arm_spec(tuned, "candidate"), draft=True), build_plan(arm_spec(tuned, "hybrid"), draft=True)
    assert "--speculative-adaptive" not in cand.nodes[0].command and not cand.files
    assert "--speculative-adaptive-config" in hyb.nodes[0].command
    assert json.loads(dict(hyb.files)["adaptive-config.json"])["6"] == {"candidate_steps": [0]}
    standalone = spec.model_copy(update={"draft": spec.draft.model_copy(update={"algorithm": "STANDALONE"})})
    with pytest.raises(UsageError, match="EAGLE/EAGLE3 with topk 1"):
        arm_spec(standalone, "hybrid")


def test_an_engine_that_fails_to_start_is_started_once_more(monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN `up` failing once with an EngineError (as SGLang 0.5.17's graph capture did on the H200) WHEN the arm
    starts THEN the seat is taken down and started again, and the session says it took two starts and why; a
    second failure is raised."""
    from types import SimpleNamespace

    from sgl_seat.errors import ArmStartError, EngineError
    from sgl_seat.gate import arms as arms_mod

    calls: list[str] = []
    downs: list[str] = []

    def fake_up(spec: Any, opts: Any) -> Any:
        calls.append(spec.name)
        if len(calls) in (1, 3, 4):
            raise EngineError("node 0 exited: Capture cuda graph failed", fix="logs")
        return SimpleNamespace(endpoint="http://127.0.0.1:9/", bundles_dir=None), None

    monkeypatch.setattr(arms_mod.seat_up, "up", fake_up)
    monkeypatch.setattr(arms_mod.teardown, "down", lambda name: downs.append(name))
    spec = load_spec("local-sim").model_copy(update={"cluster": load_spec("local-sim").cluster.model_copy(
        update={"address": "127.0.0.1:1"})})
    said: list[str] = []
    sa = arms_mod.SeatArms(spec, say=said.append)
    s = sa.start("candidate")
    assert (s.starts, s.endpoint) == (2, "http://127.0.0.1:9") and "graph failed" in (s.failed_start or "")
    # `up` takes a failed start down itself and removes its record: nothing is left for `down` (issue 49: the
    # retry used to run `down` on the removed record and end the battery on "no seat named ...").
    assert downs == [] and "once more" in said[0]
    with pytest.raises(ArmStartError):  # a second failure: no verdict (exit 4), never DO_NOT_SHIP's 1
        sa.start("candidate")


# -- synthetic cells ---------------------------------------------------------------------------------------------

TRUE = {  # arm -> ratio to baseline of output tok/s by level, cold TTFT, kv pool
    "candidate": {"tok": {1: 2.5, 8: 1.4, 64: 0.5}, "ttft": 3.0, "kv": 0.65, "hit": 1.0},
    "hybrid": {"tok": {1: 2.0, 8: 1.3, 64: 0.97}, "ttft": 3.0, "kv": 0.65, "hit": 1.0},
    "control": {"tok": {1: 1.0, 8: 1.0, 64: 1.0}, "ttft": 1.0, "kv": 1.0, "hit": 1.0},
}
BASE_TOK = {1: 33.0, 8: 250.0, 64: 900.0}


def _fake_cell(slot: Slot, cell: str, rng: random.Random, drift: float) -> dict[str, Any]:
    t = TRUE.get(slot.arm)

    def noisy(x: float) -> float:
        return x * drift * math.exp(rng.gauss(0, 0.01))

    if cell == "engine":
        kv = 1_040_128 * (t["kv"] if t else 1.0)
        return {"info": {"kv_pool_tokens": int(kv), "max_running_requests": 8 if t and t["kv"] < 1 else 32,
                         "synthetic": True}, "up_s": 1.0, "cold": True, "bundles_before": []}
    if cell == "cold_ttft":
        return {"ok": True, "ttft_s": noisy(0.3 * (t["ttft"] if t else 1.0))}
    if cell == "greedy":
        return {"output_tok_s": noisy(33.0 * (t["tok"][1] if t else 1.0)), "texts": ["a b c", "d e f"]}
    if cell.startswith("sweep_c"):
        c = int(cell.removeprefix("sweep_c"))
        return {"output_tok_s": noisy(BASE_TOK[c] * (t["tok"][c] if t else 1.0)), "ttft_s_median": 0.05,
                "failed": 0, "counters": {"generated": 300.0,
                                          "verify_steps": 100.0 if t and t["kv"] < 1 else 0.0},
                "client": {"cpu_s_per_request": 0.001, "loop_lag_ms_p50": 0.1, "loop_lag_ms_max": 2.0}}
    if cell == "prefix":
        return {"hit_rate_cold": 0.0, "hit_rate_warm": 0.8, "hit_rate_all": 0.64}
    if cell == "hangs":
        return {"measured": True, "count": 0, "bundles": []}
    raise AssertionError(cell)


class _FakeArms:
    restarts = True

    def __init__(self) -> None:
        self.started: list[str] = []

    def start(self, arm: str) -> ArmSession:
        self.started.append(arm)
        return ArmSession(arm, "http://127.0.0.1:9", "m", True, None, 1.0)

    def stop(self, session: ArmSession) -> None:
        return None

    def close(self) -> None:
        return None

    def describe(self) -> dict[str, Any]:
        return {"kind": "fake"}


def _battery(tmp_path: Path, arms: list[str], monkeypatch: pytest.MonkeyPatch, *, seed: int = 1,
             fail_at: str | None = None) -> tuple[BatteryDir, list[str]]:
    battery = load_battery(quick=True).with_runs(3)
    bd = BatteryDir(tmp_path / "b") if (tmp_path / "b" / "battery.json").exists() else \
        start_battery(tmp_path / "b", battery, arms, {"kind": "fake"})
    rng = random.Random(seed)
    ran: list[str] = []

    def fake_run(self: Any, cell: str, engine_doc: Any) -> dict[str, Any]:
        key = f"{self.slot.key}/{cell}"
        if key == fail_at:
            raise KeyboardInterrupt
        ran.append(key)
        return _fake_cell(self.slot, cell, rng, drift=1.0 + 0.02 * self.slot.position)

    monkeypatch.setattr(gate_runner._SlotRun, "run", fake_run)
    return bd, ran


def test_cells_are_files_and_resume_repeats_none(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN a battery interrupted in its third slot WHEN it is resumed THEN only the missing cells run (the third
    slot's finished cells are not repeated; its engine cell is read again from the fresh start) and the report is
    complete."""
    arms = ["baseline", "candidate"]
    bd, ran = _battery(tmp_path, arms, monkeypatch, fail_at="r01-candidate/sweep_c8")
    with pytest.raises(KeyboardInterrupt):
        run_battery(bd, _FakeArms())
    first = set(ran)
    assert "r01-candidate/greedy" in first and "r01-candidate/sweep_c8" not in first
    assert not build_report(bd)["complete"]
    bd2, ran2 = _battery(tmp_path, arms, monkeypatch)
    fake = _FakeArms()
    run_battery(bd2, fake)
    again = first & set(ran2)  # only the restarted slot's engine cell (its fresh pool and bundle baseline)
    assert again == {"r01-candidate/engine"}, again
    assert "r01-candidate/sweep_c8" in ran2 and fake.started[0] == "candidate"
    names = cell_names(load_battery(quick=True).levels())
    assert len(first | set(ran2)) == len(schedule(arms, 3)) * len(names)
    assert len(first) + len(ran2) == len(schedule(arms, 3)) * len(names) + 1
    doc = json.loads((bd.root / "cells" / "r00-baseline" / "engine.json").read_text())
    assert doc["schema_version"].startswith("2.") and doc["arm"] == "baseline"
    assert build_report(bd2)["complete"]


def test_report_reproduces_the_known_shape(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN seeded cells where the draft is 2.5x single-stream and 0.5x at 64 (drift 2 % per slot, noise 1 %)
    WHEN the report is built THEN aggregate_at_64 FAILs, the verdict is DO_NOT_SHIP, single-stream is above 1 and not
    gated, the crossover lies between 8 and 64, the control (A/A) arm fails nothing, and the hybrid (0.97 at 64) is
    compared like the others. The text and HTML say SYNTHETIC."""
    bd, _ = _battery(tmp_path, ["baseline", "candidate", "hybrid", "control"], monkeypatch, seed=4)
    run_battery(bd, _FakeArms())
    rep = build_report(bd)
    gates = {g["name"]: g for g in rep["gates"]}
    assert gates["aggregate_at_64"]["outcome"] == "FAIL" and gates["aggregate_at_64"]["ci_high"] < 0.95
    assert gates["cold_ttft"]["outcome"] == "FAIL" and gates["kv_pool"]["outcome"] == "FAIL"
    assert gates["prefix_hit_rate"]["outcome"] == "PASS" and gates["hangs"]["outcome"] == "PASS"
    assert rep["verdict"] == "DO_NOT_SHIP"
    ss = rep["single_stream"]["candidate"]
    assert ss["ci_low"] > 1.5 and ss["gated"] is False
    assert 8 < rep["crossover_concurrency"] < 64
    assert all(g["outcome"] != "FAIL" for g in rep["comparisons"]["control"]["gates"])
    floor, aa64 = rep["noise_floor"]["sweep_output_tok_s@64"], rep["comparisons"]["control"]["sweep"][-1]
    assert (floor["ci_low"], floor["ci_high"]) == (aa64["ci_low"], aa64["ci_high"]) and floor["half_width"] > 0
    assert gates["aggregate_at_64"]["noise_floor"] == floor  # the floor is reported beside the gate
    hyb = {g["name"]: g["outcome"] for g in rep["comparisons"]["hybrid"]["gates"]}
    assert hyb["aggregate_at_64"] in ("PASS", "INCONCLUSIVE")
    assert rep["recommendation"]["bands"][0]["band"] == "on" and rep["recommendation"]["bands"][-1]["band"] == "off"
    assert rep["arms"]["candidate"]["0"]["accept_length"] == pytest.approx(3.0)
    text = render_text(rep)
    assert "SYNTHETIC" in text and "DO_NOT_SHIP" in text and "aggregate_at_64" in text
    page = render_html(rep)
    assert all(f'<svg id="{p}"' in page for p in PLOT_IDS) and "SYNTHETIC" in page
    assert "default-src 'none'" in page and page.count("<script>") == 1


def test_a_battery_without_a_candidate_is_the_hybrids(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN a battery of baseline, hybrid and control (a tuned seat's policy gated) WHEN reported THEN the verdict is
    the hybrid's own comparison's, not the A/A control's, and there is no crossover (it is the candidate's)."""
    bd, _ = _battery(tmp_path, ["baseline", "hybrid", "control"], monkeypatch, seed=4)
    run_battery(bd, _FakeArms())
    rep = build_report(bd)
    assert rep["verdict_of"] == "hybrid" and rep["verdict"] == rep["comparisons"]["hybrid"]["verdict"]
    assert rep["gates"] == rep["comparisons"]["hybrid"]["gates"] and rep["crossover"] is None


def test_the_operators_note_is_atop_the_report(tmp_path: Path) -> None:
    """GIVEN `gate --note` (e.g. that the model has random weights) WHEN the report is built and rendered THEN the
    note is in the JSON and at the top of the text and the HTML page."""
    bd = start_battery(tmp_path / "n", load_battery(quick=True), ["baseline", "control"], {"kind": "fake"},
                       note="RANDOM WEIGHTS: an 8B-shaped Llama")
    rep = build_report(bd)
    assert rep["note"] == "RANDOM WEIGHTS: an 8B-shaped Llama" and rep["schema_version"] == "1.2"
    assert render_text(rep).startswith("*** RANDOM WEIGHTS") and "RANDOM WEIGHTS" in render_html(rep)


def test_aa_battery_never_fails_over_seeds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN a candidate identical to the baseline (an A/A battery, synthetic noise 1 %, drift per slot) WHEN five
    seeded batteries are reported THEN no gate FAILs in any of them."""
    for seed in range(5):
        root = tmp_path / f"s{seed}"
        root.mkdir()
        monkeypatch.setitem(TRUE, "candidate", TRUE["control"])
        bd, _ = _battery(root, ["baseline", "candidate"], monkeypatch, seed=seed)
        run_battery(bd, _FakeArms())
        rep = build_report(bd)
        assert all(g["outcome"] != "FAIL" for g in rep["gates"]), (seed, rep["gates"])
        assert rep["verdict"] in ("SHIP", "INCONCLUSIVE")


def test_a_sweep_samples_as_users_are_served_only_when_its_workloads_say_so(tmp_path: Path) -> None:
    """Greedy with ignore_eos is every request's default (each arm runs each request to max_tokens); a sweep with
    ``temperature`` and ``ignore_eos: false`` sends those; a copying sweep's prompts repeat their words."""
    from sgl_seat.gate.client import GREEDY, Sampling, _body
    from sgl_seat.gate.workloads import load_battery, sweep_prompt

    greedy = _body("m", "p", 8)
    assert (greedy["temperature"], greedy["ignore_eos"]) == (0.0, True) and _body("m", "p", 8, GREEDY) == greedy
    sampled = _body("m", "p", 8, Sampling(0.7, False))
    assert (sampled["temperature"], sampled["ignore_eos"]) == (0.7, False)
    text = load_battery(quick=False).model_dump_json()
    assert '"temperature":0.0' in text and '"ignore_eos":true' in text  # the shipped battery stays greedy
    f = tmp_path / "w.yaml"
    f.write_text(_SAMPLED_WORKLOADS)
    b = load_battery(path=f)
    assert (b.sweep.temperature, b.sweep.ignore_eos, b.sweep.style) == (0.7, False, "copy")
    words = sweep_prompt("words", 1, 5, tag="t")
    copy = sweep_prompt("copy", 1, 5, tag="t")
    assert words in copy and copy.startswith("Repeat these words exactly")


def test_a_chatml_sweep_frames_users_requests_of_four_kinds_the_same_on_every_arm() -> None:
    """``style: chatml``: each prompt one user turn in ChatML, then the assistant's turn open; the four kinds of
    request appear over a sweep; a prompt is a pure function of (seed, tag), so every arm gets the same ones."""
    from sgl_seat.gate.workloads import sweep_prompt

    prompts = [sweep_prompt("chatml", 1, 6, tag=f"sweep1-{i}") for i in range(40)]
    assert prompts == [sweep_prompt("chatml", 1, 6, tag=f"sweep1-{i}") for i in range(40)]
    for p in prompts:
        assert p.startswith("<|im_start|>user\n") and p.endswith("<|im_end|>\n<|im_start|>assistant\n"), p
    kinds = {("list" if "Repeat this list" in p else "code" if "Python function" in p else
              "story" if "short story" in p else "question") for p in prompts}
    assert kinds == {"list", "code", "story", "question"}
    listed = next(p for p in prompts if "Repeat this list" in p)
    assert len(listed.split(": ", 1)[1].split("<|im_end|>")[0].split(", ")) == 6
    assert sweep_prompt("chatml", 2, 6, tag="sweep1-0") != sweep_prompt("chatml", 1, 6, tag="sweep1-0") or \
        sweep_prompt("chatml", 2, 6, tag="sweep1-1") != sweep_prompt("chatml", 1, 6, tag="sweep1-1")


_SAMPLED_WORKLOADS = """schema_version: 1
full:
  runs: 2
  greedy: {prompts: 1, max_tokens: 4}
  sweep: {levels: [1], requests_per_client: 1, prompt_tokens: 8, max_tokens: 8, style: copy, temperature: 0.7,
          ignore_eos: false}
  cold_ttft: {prompt_tokens: 16}
  prefix: {groups: 1, prompts_per_group: 1, system_tokens: 8, question_tokens: 4, max_tokens: 2, passes: 2,
           concurrency: 1}
  gates:
    - {name: single_stream, metric: sweep_output_tok_s, at: 1, threshold: 1.0, higher_is_better: true}
quick: {}
"""
