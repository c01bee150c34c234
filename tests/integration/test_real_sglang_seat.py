"""Real SGLang 0.5.23 brought up, watched and taken down by `sgl-seat` (the ``local-sglang`` profile).

The engine is SGLang's own server on its CPU engine (two nodes, one TP rank each, gloo between them, the trained
SmolLM2-135M-Instruct in float32), started through the local Ray cluster and the node agents exactly as a GPU seat
is. One seat serves the whole module (its start-up costs 1-3 minutes on 2 cores), without ``--sleep-on-idle``
(its idle schedulers spin: the watchdog must not take that for a hang); the tests that break it run last, in
file order, and the two seats that must fail to start run first (never beside it: one local Ray cluster at a
time). Processes are checked by the pids and process groups the seat reported, and by the
seat's name that every engine process carries in its environment (SGLSEAT_NAME), never by a name pattern.

Under ``CI=true`` a missing engine environment FAILS the module (`scripts/setup.sh --engine sglang` makes it);
elsewhere it skips with the reason. Runs in its own integration stream, ``sglang`` (tests/integration/conftest.py).
"""

from __future__ import annotations

import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
import yaml
from launchutil import descendants, run_cli, wait_until
from realseat import (
    LOCAL_SGLANG,
    MODEL,
    RealSeat,
    brought_up,
    engine_processes,
    idle_window_s,
    require_engine,
    scheduler_pids,
    seat_bundles,
    watch_once,
    write_spec,
)

from sgl_seat.engines.base import engine_venv

pytestmark = pytest.mark.integration

#: This module's ports (below Linux's ephemeral range; no other module uses 24100-24199).
HTTP_PORT, DIST_PORT = 24100, 24105
NODE1_PORT = HTTP_PORT + 10  # SGLangBackend.colocated_argv: node 1 of a one-host seat moves up one step


def _write_spec(directory: Path, name: str, **over: Any) -> Path:
    return write_spec(directory, name, http_port=HTTP_PORT, dist_port=DIST_PORT, **over)


def test_up_without_the_engine_environment_fails_in_preflight_and_leaves_nothing(tmp_path: Path) -> None:
    """GIVEN an engine environment that does not exist WHEN `up` THEN it fails in preflight within seconds,
    naming the interpreter and the install command, and no process of the seat is left."""
    require_engine()
    home = tmp_path / "home"
    spec = _write_spec(tmp_path, "rs-noenv")
    env_before = os.environ.get("SGLSEAT_ENGINE_VENV")
    os.environ["SGLSEAT_ENGINE_VENV"] = str(tmp_path / "no-such-venv")
    try:
        t0 = time.monotonic()
        up = run_cli(["up", "--seat", str(spec), "--timeout", "180"], home, timeout=240)
        took = time.monotonic() - t0
    finally:
        if env_before is None:
            os.environ.pop("SGLSEAT_ENGINE_VENV", None)
        else:
            os.environ["SGLSEAT_ENGINE_VENV"] = env_before
    out = up.stdout + up.stderr
    assert up.returncode != 0, out
    assert "engine-python" in out and "no-such-venv/bin/python does not exist" in out, out
    assert "scripts/setup.sh --engine sglang" in out
    print(f"`up` refused in {took:.1f} s")
    assert not engine_processes("rs-noenv")
    assert run_cli(["status", "rs-noenv", "--json"], home, timeout=60).returncode != 0


@pytest.mark.slow  # full tier only (README, "The tests")
def test_up_with_a_flag_sglang_refuses_fails_quoting_sglangs_own_error(tmp_path: Path) -> None:
    """GIVEN a seat whose context length the model cannot take WHEN `up` THEN SGLang itself refuses at
    start-up; `up` fails within its timeout quoting SGLang's own error line, and leaves no process behind."""
    require_engine()
    home = tmp_path / "home"
    doc = yaml.safe_load(LOCAL_SGLANG.read_text())
    cfg = Path(doc["model"]["path"].replace("${engine_venv}", engine_venv())) / "config.json"
    longest = int(json.loads(cfg.read_text())["max_position_embeddings"])
    model = {**doc["model"], "context_length": 8 * longest}
    spec = _write_spec(tmp_path, "rs-badflag", model=model)
    up = run_cli(["up", "--seat", str(spec), "--timeout", "400"], home, timeout=460)
    out = up.stdout + up.stderr
    print(out[-3000:])
    assert up.returncode != 0, out
    assert "context_length" in out and str(longest) in out, out  # SGLang's own ValueError, from the node log
    assert not engine_processes("rs-badflag")


@pytest.fixture(scope="module")
def seat(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealSeat]:
    require_engine()
    base = tmp_path_factory.mktemp("real-sglang")
    # Without --sleep-on-idle: an idle scheduler spins in its poll loop (most of a core), the shape a watchdog must
    # not take for a hang. This seat's life is short (its last test kills it), so the spin costs CI little.
    spec = _write_spec(base, "rs-real", **{"cpu.sleep_on_idle": False})
    rs = RealSeat(base / "home", spec, "rs-real", HTTP_PORT)
    with brought_up(rs):
        yield rs


def test_up_reaches_ready_with_real_scheduler_pids(seat: RealSeat) -> None:
    """GIVEN the local-sglang profile WHEN `up` THEN READY with 2 nodes and 2 ranks whose pids are real
    ``sglang::scheduler_TP0`` / ``TP1`` processes, each on its own node's engine tree, in `status --json`."""
    st = seat.remember()
    assert st["state"] == "READY", st
    assert "READY seat rs-real" in seat.up_stdout
    assert [n["node_rank"] for n in st["nodes"]] == [0, 1]
    for n in st["nodes"]:
        (rank,) = n["ranks"]
        assert rank["title"] == f"sglang::scheduler_TP{n['node_rank']}"
        assert rank["alive"] and rank["state"] in ("running", "sleeping"), rank
        proc = psutil.Process(rank["pid"])
        assert proc.cmdline()[0] == rank["title"]  # SGLang's own setproctitle
        assert rank["pid"] in {p.pid for p in descendants(n["engine_pid"])}
        assert n["engine_pid"] == n["pgid"]


def test_an_idle_seat_spinning_without_sleep_on_idle_gives_no_bundle_over_the_idle_window(seat: RealSeat) -> None:
    """GIVEN the READY seat without --sleep-on-idle and no traffic THEN its schedulers spin (each uses most of a
    core: the poll loop) and over the idle window (realseat.idle_window_s) the watchdog writes no bundle and reaches
    no verdict. The seat sleeping on idle is test_real_sglang_watchdog's."""
    pids = scheduler_pids(seat)
    procs = [psutil.Process(p) for p in pids.values()]
    for p in procs:
        p.cpu_percent(None)
    time.sleep(5.0)
    busy = [p.cpu_percent(None) for p in procs]
    print(f"idle schedulers' CPU: {busy}")
    # Spinning, a scheduler takes most of a free core, and about a third of one while the other streams load both
    # cores; sleeping on idle it takes about 1.5 % (sglang-cpu.md; test_real_sglang_watchdog's sleeping seat asserts
    # < 40). 15 % still tells the two apart by a factor of ten.
    assert min(busy) > 15.0, f"no idle scheduler spins (CPU {busy}): is --sleep-on-idle off?"
    plan = json.loads((seat.home / "seats" / f"{seat.name}.json").read_text())["plan"]
    argvs = [n["command"] for n in plan["nodes"]]  # what `up` launched on each node
    assert all("--device" in argv and "--sleep-on-idle" not in argv for argv in argvs), argvs
    before = seat_bundles(seat)
    idle_s = idle_window_s()
    t_end = time.monotonic() + idle_s
    verdicts = []
    while time.monotonic() < t_end:
        time.sleep(min(idle_s / 3, max(0.0, t_end - time.monotonic())))
        verdicts += [n["verdict"] for n in watch_once(seat)["nodes"] if n.get("verdict")]
    assert seat_bundles(seat) == before, f"bundles written on an idle seat: {sorted(seat_bundles(seat) - before)}"
    assert not verdicts, verdicts


def test_a_greedy_chat_answer_names_paris(seat: RealSeat) -> None:
    """GIVEN the READY real seat (the trained model, float32) WHEN asked greedily "What is the capital of France?"
    THEN the answer names Paris: the model's own answer, through both ranks (TP2), not noise."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "What is the capital of France?"}],
            "temperature": 0, "max_tokens": 32}
    r = httpx.post(f"{seat.endpoint}/v1/chat/completions", json=body, timeout=120.0, trust_env=False)
    assert r.status_code == 200, r.text
    answer = r.json()["choices"][0]["message"]["content"]
    assert "Paris" in answer, answer


def test_a_streamed_chat_completion_comes_back_through_the_endpoint(seat: RealSeat) -> None:
    """GIVEN the READY real seat WHEN a streamed /v1/chat/completions is sent to its endpoint THEN chunks come
    back and the stream ends with [DONE]."""
    body = {"model": MODEL, "messages": [{"role": "user", "content": "Say hello to the seat."}],
            "max_tokens": 12, "stream": True}
    chunks, done = 0, False
    with httpx.stream("POST", f"{seat.endpoint}/v1/chat/completions", json=body, timeout=120.0,
                      trust_env=False) as r:
        assert r.status_code == 200, r.read()
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line.removeprefix("data: ").strip()
            if data == "[DONE]":
                done = True
                break
            doc = json.loads(data)
            assert doc["object"] == "chat.completion.chunk"
            chunks += 1
    assert done and chunks >= 2, (done, chunks)


def test_logs_of_node_1_are_the_real_engine_log(seat: RealSeat) -> None:
    """GIVEN the READY seat WHEN `logs --node 1` THEN it shows SGLang's own node-1 log: its TP1 scheduler's lines
    and the dummy health server a node of rank >= 1 starts."""
    res = run_cli(["logs", seat.name, "--node", "1", "--lines", "400"], seat.home, timeout=60)
    assert res.returncode == 0, res.stderr
    assert " TP1] " in res.stdout
    assert f"Dummy health check server started in background thread at 127.0.0.1:{NODE1_PORT}" in res.stdout
    # SGLang rewrites every SGL_* variable to SGLANG_* with a warning: none of this project's may reach its log.
    warned = [ln for ln in res.stdout.splitlines() if "is deprecated, please use SGLANG_" in ln and "SEAT" in ln]
    assert not warned, warned


def test_node_1_health_is_a_constant_200_that_says_nothing(seat: RealSeat) -> None:
    """GIVEN the READY seat THEN node 1's /health answers 200 from SGLang's dummy server and node 1 serves no
    API (``/get_server_info`` 404): which is why its liveness comes from its processes, never its /health."""
    with httpx.Client(timeout=10.0, trust_env=False) as c:
        assert c.get(f"http://127.0.0.1:{NODE1_PORT}/health").status_code == 200
        assert c.get(f"http://127.0.0.1:{NODE1_PORT}/get_server_info").status_code == 404
        assert c.get(f"{seat.endpoint}/get_server_info").status_code == 200


def test_a_stopped_rank_1_is_shown_stopped_while_node_1_health_says_200(seat: RealSeat) -> None:
    """GIVEN the READY seat WHEN rank 1's scheduler is SIGSTOPped THEN `status --json` shows rank 1 alive but
    ``stopped`` while node 1's /health still answers 200; SIGCONT brings it back to running or sleeping."""
    pid = next(n["ranks"][0]["pid"] for n in seat.status()["nodes"] if n["node_rank"] == 1)
    os.kill(pid, signal.SIGSTOP)
    try:
        rank1 = next(n["ranks"][0] for n in seat.status()["nodes"] if n["node_rank"] == 1)
        assert rank1["alive"] and rank1["state"] == "stopped", rank1
        assert httpx.get(f"http://127.0.0.1:{NODE1_PORT}/health", timeout=10.0, trust_env=False).status_code == 200
    finally:
        os.kill(pid, signal.SIGCONT)
    assert wait_until(lambda: psutil.Process(pid).status() != psutil.STATUS_STOPPED, 10)


def test_rank_1_sigkilled_status_is_not_ready_and_names_rank_1(seat: RealSeat) -> None:
    """GIVEN the READY seat WHEN rank 1's scheduler is SIGKILLed THEN `status` no longer says READY and its
    reason names rank 1's scheduler first (SGLang then takes node 1's launcher and node 0 down by itself)."""
    st = seat.remember()
    pid = next(n["ranks"][0]["pid"] for n in st["nodes"] if n["node_rank"] == 1)
    health_before = httpx.get(f"http://127.0.0.1:{NODE1_PORT}/health", timeout=10.0, trust_env=False).status_code
    os.kill(pid, signal.SIGKILL)
    t0 = time.monotonic()

    def not_ready() -> bool:
        return seat.status()["state"] != "READY"

    assert wait_until(not_ready, 60, interval=1.0), "status still READY 60 s after rank 1 was killed"
    st = seat.status()
    print(f"not READY after {time.monotonic() - t0:.1f} s: {st['state']}: {st['reason']}")
    assert health_before == 200
    assert st["state"] in ("FAILED", "DEGRADED"), st
    assert st["reason"].startswith(f"node 1: scheduler process gone: sglang::scheduler_TP1 (pid {pid})"), st["reason"]
    rank1 = next(n["ranks"][0] for n in st["nodes"] if n["node_rank"] == 1)
    assert not rank1["alive"]
    text = run_cli(["status", seat.name], seat.home, timeout=60).stdout
    assert "sglang::scheduler_TP1" in text and "not running" in text
