"""`sgl-seat gate` end to end on two running sim engines (draft off and draft on), taken by URL: a tiny battery.

Why running engines and not arms brought up per slot: CI time. Bringing an arm up costs a Ray placement and an
engine start per slot (tens of seconds on 2 cores), so the full battery with restarts runs in
bench/gate_acceptance.py; here two single-node sim engines start once (ports 30740-30799) and the battery runs
three arms (baseline, candidate, and the baseline's URL again as the control) for two runs of a tiny battery.
The sim's step floor is the profile's 30 ms (a smaller floor would be faster, but on a loaded 2-core box the host's
own per-step work then dominates the modelled step and flattens the draft's shape). Figures are synthetic.

What must hold: the report has the field report's shape (single-stream up, a loss at 64, DO_NOT_SHIP, a crossover),
cold gates are reported as not measured (running seats), the control is compared like the others, the JSON is the
CLI contract, ``--resume`` runs only a deleted cell again, and the HTML page renders in headless Chromium without
errors. A/A never failing and aggregate_at_64 FAILing are the acceptance bench's (bench/gate_acceptance.py): two
tiny runs beside bursty co-tenants can show neither reliably.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
import simutil
from simutil import HOST, SimNode, sim_env, wait_http
from typer.testing import CliRunner

from sgl_seat.cli.main import app
from sgl_seat.errors import TuneRefused
from sgl_seat.gate import EXIT_CODES

pytestmark = pytest.mark.integration

PORTS = range(30740, 30800)
CHROMIUM = next((p for p in ("/usr/bin/chromium", "/usr/bin/chromium-browser", shutil.which("chromium"))
                 if p and Path(p).exists()), None)
WORKLOADS = """schema_version: 1
full:
  runs: 2
  greedy: {prompts: 2, max_tokens: 24}
  sweep: {levels: [1, 8, 64], requests_per_client: 1, prompt_tokens: 32, max_tokens: 16}
  cold_ttft: {prompt_tokens: 1000, max_tokens: 2}
  prefix: {groups: 2, prompts_per_group: 2, system_tokens: 64, question_tokens: 8, max_tokens: 2, passes: 2,
           concurrency: 4}
  gates:
    - {name: aggregate_at_64, metric: sweep_output_tok_s, at: 64, threshold: 0.95, higher_is_better: true}
    - {name: cold_ttft, metric: cold_ttft_s, threshold: 1.10, higher_is_better: false}
    - {name: prefix_hit_rate, metric: prefix_hit_rate_warm, threshold: 0.97, higher_is_better: true}
    - {name: kv_pool, metric: kv_pool_tokens, threshold: 0.95, higher_is_better: true}
    - {name: hangs, metric: hangs, threshold: 0, higher_is_better: false}
"""


def _ports(n: int, taken: set[int]) -> int:
    """A port p of 30740-30799 with p..p+n-1 free (a sim node uses p and p + 2): simutil's search, our range."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(simutil, "PORT_LO", PORTS.start)
        mp.setattr(simutil, "PORT_HI", PORTS.stop - 1)
        p = simutil.free_port(span=n, avoid=taken)
    taken |= set(range(p, p + n))
    return p


def _engine(tmp: Path, draft: bool, taken: set[int], flags: list[str] | None = None) -> tuple[SimNode, str]:
    """A sim engine, draft off or on (``flags``: the draft's flags as a plan wrote them; default a static EAGLE)."""
    port, dist = _ports(3, taken), _ports(1, taken)
    argv = ["--model-path", "sim/dsv41-flash-class", "--served-model-name", "sim-dsv41", "--tp-size", "1",
            "--dist-init-addr", f"{HOST}:{dist}", "--enable-metrics", "--host", HOST, "--port", str(port),
            "--max-running-requests", "8" if draft else "32"]
    if draft:
        argv += flags or ["--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3",
                          "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"]
    env = sim_env(SGLSEAT_SIM_STEP_FLOOR_MS="30", SGLSEAT_SIM_KV_TOKENS="677888" if draft else "1040128")
    node = SimNode(argv, env, tmp / f"draft-{'on' if draft else 'off'}{'-plan' if flags else ''}.log").start()
    return node, f"http://{HOST}:{port}"


@pytest.fixture(scope="module")
def engines(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, str]]:
    tmp = tmp_path_factory.mktemp("gate-engines")
    taken: set[int] = set()
    nodes = []
    try:
        off, off_url = _engine(tmp, False, taken)
        nodes.append(off)
        on, on_url = _engine(tmp, True, taken)
        nodes.append(on)
        wait_http(f"{off_url}/health", timeout=120, node=off)
        wait_http(f"{on_url}/health", timeout=120, node=on)
        for n in nodes:
            n.children()
        yield {"baseline": off_url, "candidate": on_url}
    finally:
        for n in nodes:
            n.kill()
        left = [pid for n in nodes for pid in n.leftovers()]
        assert not left, f"processes left behind: {left}"


def _gate(args: list[str], env: dict[str, str]) -> tuple[int, str, str]:
    res = CliRunner().invoke(app, ["gate", *args], env=env)
    return res.exit_code, res.stdout, res.stderr if res.stderr_bytes is not None else ""


@pytest.fixture(scope="module")
def battery(engines: dict[str, str], tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict, str]:
    tmp = tmp_path_factory.mktemp("gate-battery")
    wl = tmp / "tiny.yaml"
    wl.write_text(WORKLOADS)
    env = {"SGLSEAT_HOME": str(tmp / "home"), "NO_COLOR": "1", "COLUMNS": "200"}
    out = tmp / "b"
    code, stdout, stderr = _gate(["--url", f"baseline={engines['baseline']}", "--url",
                                  f"candidate={engines['candidate']}", "--arms", "baseline,candidate,control",
                                  "--workloads", str(wl), "--out", str(out), "--json", "--html", str(tmp / "g.html")],
                                 env)
    rep = json.loads(stdout)
    assert code == EXIT_CODES[rep["verdict"]], stdout + stderr  # the exit status is the verdict's (DO_NOT_SHIP: 1)
    return out, rep, stderr


def test_battery_reproduces_the_report_shape(battery: tuple[Path, dict, str]) -> None:
    """GIVEN a draft-off and a draft-on sim engine WHEN a two-run battery compares them THEN single-stream is up
    (not gated), aggregate_at_64 is a loss, the verdict is DO_NOT_SHIP (kv_pool FAILs) with a crossover reported, the
    cold gates say not measured, the control is compared and gives the noise floor, and the JSON has the CLI
    contract's keys."""
    out, rep, stderr = battery
    assert rep["synthetic"] is True and "SYNTHETIC" in rep["synthetic_note"]
    assert rep["verdict"] == "DO_NOT_SHIP"
    gates = {g["name"]: g for g in rep["gates"]}
    assert set(gates) >= {"aggregate_at_64", "cold_ttft", "prefix_hit_rate", "kv_pool", "hangs"}
    for g in rep["gates"]:
        assert set(g) >= {"name", "ratio", "ci_low", "ci_high", "threshold", "outcome"}
    # The shape: a loss at 64 (the sim's true ratio is about 0.7). Two tiny runs leave the interval wide (t = 12.7),
    # so it may straddle 0.95 (INCONCLUSIVE); the FAIL itself is bench/gate_acceptance.py's, with more runs.
    agg = gates["aggregate_at_64"]
    assert agg["ratio"] < 0.95 and agg["outcome"] in ("FAIL", "INCONCLUSIVE"), agg
    assert gates["kv_pool"]["outcome"] == "FAIL" and gates["kv_pool"]["ratio"] == pytest.approx(677888 / 1040128)
    assert gates["cold_ttft"]["measured"] is False and gates["hangs"]["measured"] is False
    assert rep["single_stream"]["candidate"]["ratio"] > 1.2 and rep["single_stream"]["candidate"]["gated"] is False
    assert "crossover_concurrency" in rep and rep["crossover"] is not None
    assert rep["recommendation"]["bands"][-1]["concurrency"] == 64
    # The control is compared like any arm; whether A/A stays clear of FAIL is a property of the machine's noise
    # (bursty co-tenants break the drift model), checked over seeds in bench/gate_acceptance.py, not here.
    assert {g["name"] for g in rep["comparisons"]["control"]["gates"]} == set(gates)
    assert rep["noise_floor"] is not None and "sweep_output_tok_s@64" in rep["noise_floor"]
    assert rep["arms"]["candidate"]["0"]["accept_length"] > 2.0  # from counter deltas
    assert rep["client_overhead"]["loop_lag_ms_max"] is not None
    assert re.search(r"slot \d+/6 r01-", stderr), stderr[-500:]  # progress per slot and cell
    assert (out / "report.json").is_file() and rep["complete"]


def test_resume_runs_only_what_is_missing(battery: tuple[Path, dict, str], engines: dict[str, str]) -> None:
    """GIVEN a finished battery WHEN one cell file is deleted and the battery is resumed THEN that cell is the only one
    written again and the report is complete."""
    out, _, _ = battery
    victim = out / "cells" / "r01-candidate" / "sweep_c8.json"
    victim.unlink()
    before = {p: p.stat().st_mtime_ns for p in (out / "cells").glob("*/*.json")}
    env = {"SGLSEAT_HOME": str(out.parent / "home"), "NO_COLOR": "1"}
    code, stdout, stderr = _gate(["--url", f"baseline={engines['baseline']}", "--url",
                                  f"candidate={engines['candidate']}", "--resume", str(out), "--json"], env)
    assert code == EXIT_CODES[json.loads(stdout)["verdict"]], stdout + stderr
    assert victim.is_file() and json.loads(stdout)["complete"]
    changed = {p for p, t in before.items() if p.stat().st_mtime_ns != t}
    assert changed <= {out / "cells" / "r01-candidate" / "engine.json"}, changed


def test_aa_rehearsal_baseline_control_fails_no_gate(engines: dict[str, str], tmp_path: Path) -> None:
    """GIVEN the draft-off engine alone WHEN `gate --arms baseline,control --json` runs (the A/A rehearsal of issue
    24: the control is the baseline's URL again) THEN the CLI accepts it, the verdict is the control's, no gate FAILs
    on identical arms, and the exit status is the verdict's: INCONCLUSIVE (3), since cold_ttft is not measured on a
    running seat."""
    wl = tmp_path / "tiny.yaml"
    wl.write_text(WORKLOADS)
    env = {"SGLSEAT_HOME": str(tmp_path / "home"), "NO_COLOR": "1"}
    code, stdout, stderr = _gate(["--url", f"baseline={engines['baseline']}", "--arms", "baseline,control",
                                  "--workloads", str(wl), "--out", str(tmp_path / "aa"), "--json"], env)
    rep = json.loads(stdout)
    assert rep["verdict_of"] == "control" and rep["design"]["arms"] == ["baseline", "control"], stderr[-2000:]
    assert all(g["outcome"] != "FAIL" for g in rep["gates"]), rep["gates"]
    assert rep["verdict"] == "INCONCLUSIVE" and code == EXIT_CODES["INCONCLUSIVE"] == 3
    assert rep["noise_floor"] is not None and rep["complete"]


@pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (CI: apt-get install -y chromium)")
def test_html_renders_in_chromium(battery: tuple[Path, dict, str], tmp_path: Path) -> None:
    """GIVEN the battery's HTML page WHEN headless Chromium opens it THEN its script marks it rendered with every plot,
    it says SYNTHETIC, and the browser logs no console error, CSP violation or failed load."""
    out, _, _ = battery
    page = out.parent / "g.html"
    assert CHROMIUM is not None
    proc = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={tmp_path / 'prof'}",
         "--enable-logging=stderr", "--v=0", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=90, check=False, env={**os.environ, "HOME": str(tmp_path)})
    dom, log = proc.stdout, proc.stderr
    assert proc.returncode == 0, log[-2000:]
    assert 'data-gate-rendered="ok"' in dom and '<span id="render-status">rendered</span>' in dom
    assert dom.count("<svg") >= 5 and "SYNTHETIC" in dom
    bad = [ln for ln in log.splitlines()
           if re.search(r"CONSOLE|Uncaught|Refused to|Content Security Policy|ERR_FILE_NOT_FOUND|Failed to load", ln)]
    assert not bad, bad


def _tuned_seat(tmp: Path) -> Path:
    """A copy of the shipped seats beside their planning configs (tune edits a seat file, never a built-in)."""
    root = Path(__file__).resolve().parents[2] / "launch"
    shutil.copytree(root / "seats", tmp / "seats")
    shutil.copytree(root / "models", tmp / "models")
    return tmp / "seats" / "local-sim.yaml"


@pytest.mark.slow  # full tier only (README, "The tests")
def test_gate_tune_plan_then_gate_the_hybrid(battery: tuple[Path, dict, str], engines: dict[str, str],
                                             tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN the battery's report (draft on vs off, a crossover) WHEN `tune draft` writes the seat's policy, `plan
    --draft on` turns it into SGLang's adaptive flags and tier file, a sim engine runs exactly those, and `gate --arms
    baseline,hybrid,control` gates it THEN the policy is the crossover's lower bound rounded down, the hybrid drafts
    (accept length above 1) and keeps the draft's pool, and the second battery reaches a verdict (SYNTHETIC)."""
    out, _, _ = battery
    rep = json.loads((out / "report.json").read_text())  # as on disk now: the resume test may have rewritten it
    cross = rep["crossover"]
    print(f"crossover: {cross}; sweep: {rep['comparisons']['candidate']['sweep']}")
    seat = _tuned_seat(tmp_path)
    env = {"SGLSEAT_HOME": str(tmp_path / "home"), "NO_COLOR": "1", "COLUMNS": "200"}
    res = CliRunner().invoke(app, ["tune", "draft", str(out), "--seat", str(seat), "--json"], env=env)
    if res.exit_code != 0 and isinstance(res.exception, TuneRefused) and "did not surely pay" in str(res.exception):
        # Two runs give a t of 12.7: on a loaded CI host (a fresh-clone run of 2026-12-06: c=1 at 1.34 [0.003, 548],
        # c=8 at 1.71 [0.20, 14.7]) no level is surely a win, and refusing is what tune must do then. The hybrid
        # path runs on with more runs in bench/gate_acceptance.py; here it would need a crossover this run lacks.
        assert cross.get("ci_low") is None, (cross, res.output)
        pytest.skip(f"the battery's two runs gave no sure crossover on this host, and tune refused: {res.exception}")
    assert res.exit_code == 0, res.output
    tuned = json.loads(res.stdout)
    assert tuned["off_above"] == int(cross["ci_low"]) >= 1 and tuned["synthetic"] is True
    res = CliRunner().invoke(app, ["plan", "--seat", str(seat), "--draft", "on", "--json"], env=env)
    assert res.exit_code == 0, res.output
    plan = json.loads(res.stdout)
    n = tuned["off_above"]
    assert plan["draft_policy"]["speculates_up_to"] == n and plan["draft_policy"]["off_key"] == n + 1
    # The draft's slot cap (8 here) bounds the decode batch: a policy at or above it never turns off, and says so.
    assert (n >= plan["slots"]) == any("never turns speculation off" in w for w in plan["warnings"])
    cmd = plan["nodes"][0]["command"]
    flags = cmd[cmd.index("--speculative-algorithm"):cmd.index("--speculative-adaptive-config") + 2]
    tiers = tmp_path / "adaptive-config.json"
    tiers.write_text(plan["files"]["adaptive-config.json"])
    flags[-1] = str(tiers)  # ${seat_files}/adaptive-config.json, as the node agent writes it
    node, url = _engine(tmp_path, True, set(), flags=flags)  # free_port skips the running engines
    try:
        wait_http(f"{url}/health", timeout=120, node=node)
        wl = tmp_path / "tiny.yaml"
        wl.write_text(WORKLOADS)
        code, stdout, stderr = _gate(["--url", f"baseline={engines['baseline']}", "--url", f"hybrid={url}",
                                      "--arms", "baseline,hybrid,control", "--workloads", str(wl),
                                      "--out", str(tmp_path / "h"), "--json"], env)
    finally:
        node.kill()
    assert not node.leftovers()
    assert stdout.strip(), f"gate printed no report (exit {code}):\n{stderr[-3000:]}\n{node.log()[-3000:]}"
    hyb = json.loads(stdout)
    assert code == EXIT_CODES[hyb["verdict"]] and hyb["complete"], stdout + stderr[-2000:]
    assert hyb["verdict"] in ("SHIP", "DO_NOT_SHIP", "INCONCLUSIVE") and hyb["synthetic"] is True
    h = hyb["comparisons"]["hybrid"]
    assert h["verdict"] in ("SHIP", "DO_NOT_SHIP", "INCONCLUSIVE") and h["sweep"][-1]["concurrency"] == 64
    fig = hyb["arms"]["hybrid"]["0"]
    assert fig["speculative_adaptive"] is True and fig["accept_length"] > 1.0  # it drafts at low load
    assert fig["kv_pool_tokens"] == rep["arms"]["candidate"]["0"]["kv_pool_tokens"]  # nothing given back
    assert "tune draft" in rep["recommendation"]["action"]
    print(f"hybrid: {hyb['verdict']}; sweep {h['sweep']}; single {h['single_stream']}")
