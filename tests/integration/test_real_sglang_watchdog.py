"""The CI tier's real SGLang 0.5.23 seat: brought up, served, watched, faulted and taken down (stream ``sglang``).

One rehearsal seat (the ``local-sglang`` profile as shipped, with ``--sleep-on-idle``: SGLang's own server on its
CPU engine, two nodes with one TP rank each, gloo between them, the trained SmolLM2-135M-Instruct in float32, started
through the local Ray cluster and the node agents exactly as a GPU seat is) serves the module, in file order:

1. READY with real scheduler pids; a greedy answer naming Paris; a streamed answer; node 1's real log and its
   constant /health;
2. idle over the idle window (3 minutes in the full tier): no bundle (rank 0 in its idle sleep, rank 1 idle in the
   gloo broadcast); then (full tier only) a burst past the slot cap beside a long prompt: no bundle either;
3. the probe inside every real scheduler, its records in the sidecar with the gather size of each forward;
4. a probe stall on rank 1 (`sgl-seat fault probe-stall:rank=1`): real SGLang code blocked in its embedding
   lookup, rank 0 waiting in the real all-reduce -> a bundle naming rank 1 at the embedding, within 10 s;
5. SIGSTOP of rank 1 during a decode -> a bundle naming rank 1 as stopped, within 10 s, while `status` shows it
   stopped and node 1's /health still says 200;
6. the detokenizer stopped -> a verdict naming the detokenizer;
7. SIGKILL of rank 1 -> "process exited" naming rank 1, and `status` no longer READY naming it (the seat is gone
   after it: last).

Each bundle is replayed offline (`sgl-seat replay --json`) and must reproduce its live verdict. Between faults
the seat recovers (SIGCONT, the stall cleared) and the sidecars unlatch once progress resumes. One seat for all of
it: a real seat's start is the CI tier's costliest step (1-3 minutes of both cores), so the seat without
``--sleep-on-idle`` (spinning idle schedulers) is test_real_sglang_seat's, in the full tier. Processes are checked
by the pids and process groups the seat reported, never by a name pattern. Ports 24200-24299 (no other module uses
them). Under ``CI=true`` a missing engine environment FAILS the module; elsewhere it skips with the reason.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import httpx
import psutil
import pytest
from launchutil import CLI_S, descendants, run_cli, wait_until
from realseat import (
    MODEL,
    RealSeat,
    brought_up,
    idle_window_s,
    require_engine,
    scheduler_pids,
    seat_bundles,
    watch_once,
    write_spec,
)

from sgl_seat.forensics.format.store import wait_for_bundle
from sgl_seat.forensics.recording.loadgen import Load, posting, request_body
from sgl_seat.probe import ring as probe_ring
from sgl_seat.watchdog.sources import parse_metrics_text

pytestmark = pytest.mark.integration

HTTP_PORT, DIST_PORT = 24200, 24205
NODE1_PORT = HTTP_PORT + 10  # SGLangBackend.colocated_argv: node 1 of a one-host seat moves up one step
NAME = "rw-watch"
#: The acceptance bound from fault to complete bundle on the real engine.
BUNDLE_WITHIN_S = 10.0
EMBEDDING = "VocabParallelEmbedding.forward"


def _traffic(endpoint: str, *, n: int = 2, max_tokens: int = 16) -> Load:
    """Completions in the background (``n`` at a time) until the ``with`` block ends; counts answers and failures.
    Short answers: the seat decodes through each fault all the same, and a loaded CI box answers them in time."""
    return Load(posting(endpoint, "/v1/completions", lambda i, k: request_body(
        "/v1/completions", f"client {i} request {k}: tell the seat a story", model=MODEL, max_tokens=max_tokens,
        sampling={"ignore_eos": True})), concurrency=n, timeout=120.0)


def _wait_bundle(seat: RealSeat, before: set[Path], timeout: float) -> tuple[Path, float] | None:
    return wait_for_bundle(seat.home / "bundles" / seat.name, before, timeout)


def _fault(seat: RealSeat, action: str) -> dict[str, Any]:
    res = run_cli(["fault", action, "--name", seat.name, "--json"], seat.home, timeout=90)
    assert res.returncode == 0, f"`fault {action}` failed:\n{res.stdout}\n{res.stderr}"
    doc: dict[str, Any] = json.loads(res.stdout)
    return doc


def _manifest(bundle: Path) -> dict[str, Any]:
    doc: dict[str, Any] = json.loads((bundle / "manifest.json").read_text())
    return doc


def _replay(seat: RealSeat, bundle: Path) -> dict[str, Any]:
    res = run_cli(["replay", str(bundle), "--json"], seat.home, timeout=180)
    assert res.returncode == 0, f"replay failed:\n{res.stdout}\n{res.stderr}"
    doc: dict[str, Any] = json.loads(res.stdout)
    return doc


def _unlatched(seat: RealSeat, timeout: float = 90.0) -> None:
    """Every sidecar has let go of the last bundle's latch (progress resumed and detectors quiet)."""
    def free() -> bool:
        return not any(n.get("latched") for n in watch_once(seat)["nodes"])

    assert wait_until(free, timeout, interval=2.0), f"the sidecars stayed latched: {watch_once(seat)}"


def _same_verdict(replayed: dict[str, Any] | None, live: dict[str, Any]) -> bool:
    return replayed is not None and all(replayed.get(k) == live.get(k) for k in ("kind", "rank", "node"))


@pytest.fixture(scope="module")
def seat(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RealSeat]:
    require_engine()
    base = tmp_path_factory.mktemp("real-watch")
    spec = write_spec(base, NAME, http_port=HTTP_PORT, dist_port=DIST_PORT)
    rs = RealSeat(base / "home", spec, NAME, HTTP_PORT)
    with brought_up(rs):
        yield rs


def test_up_reaches_ready_with_real_scheduler_pids(seat: RealSeat) -> None:
    """GIVEN the local-sglang profile WHEN `up` THEN READY with 2 nodes and 2 ranks whose pids are real
    ``sglang::scheduler_TP0`` / ``TP1`` processes, each on its own node's engine tree, in `status --json`."""
    st = seat.remember()
    assert st["state"] == "READY", st
    assert f"READY seat {NAME}" in seat.up_stdout
    assert [n["node_rank"] for n in st["nodes"]] == [0, 1]
    for n in st["nodes"]:
        (rank,) = n["ranks"]
        assert rank["title"] == f"sglang::scheduler_TP{n['node_rank']}"
        assert rank["alive"] and rank["state"] in ("running", "sleeping"), rank
        proc = psutil.Process(rank["pid"])
        assert proc.cmdline()[0] == rank["title"]  # SGLang's own setproctitle
        assert rank["pid"] in {p.pid for p in descendants(n["engine_pid"])}
        assert n["engine_pid"] == n["pgid"]


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
    res = run_cli(["logs", seat.name, "--node", "1", "--lines", "400"], seat.home, timeout=CLI_S)
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


def test_an_idle_seat_sleeping_on_idle_gives_no_bundle_over_the_idle_window(seat: RealSeat) -> None:
    """GIVEN the READY seat with --sleep-on-idle (the profile's default) and no traffic THEN its schedulers sleep
    (rank 0 in its idle sleep, rank 1 blocked in the gloo broadcast: a few % of a core each) and over the idle
    window (realseat.idle_window_s: six times the longest detector look-back in the CI tier, 3 minutes in the full
    tier) the watchdog writes no bundle and reaches no verdict. The spinning seat (without it) is
    test_real_sglang_seat's.
    """
    pids = [n["ranks"][0]["pid"] for n in seat.remember()["nodes"]]
    procs = [psutil.Process(p) for p in pids]
    for p in procs:
        p.cpu_percent(None)
    bundles = seat.home / "bundles" / seat.name
    before = sorted(bundles.iterdir()) if bundles.is_dir() else []
    idle_s = idle_window_s()
    t_end = time.monotonic() + idle_s
    verdicts = []
    while time.monotonic() < t_end:
        time.sleep(min(idle_s / 3, max(0.0, t_end - time.monotonic())))
        res = run_cli(["watch", seat.name, "--once", "--json"], seat.home, timeout=CLI_S)
        assert res.returncode == 0, res.stderr
        verdicts += [n["verdict"] for n in json.loads(res.stdout)["nodes"] if n.get("verdict")]
    busy = [p.cpu_percent(None) for p in procs]
    print(f"idle schedulers' mean CPU over {idle_s:.0f} s: {busy}")
    assert max(busy) < 40.0, f"an idle scheduler spun (CPU {busy}): is --sleep-on-idle on?"
    after = sorted(bundles.iterdir()) if bundles.is_dir() else []
    assert after == before, f"bundles written on an idle seat: {after}"
    assert not verdicts, verdicts


def _queued(seat: RealSeat) -> float:
    """SGLang's own ``sglang:num_queue_reqs`` on node 0 (requests waiting for a slot), parsed as the sidecar does."""
    text = httpx.get(f"{seat.endpoint}/metrics", timeout=10.0, trust_env=False).text
    return parse_metrics_text(text, "sglang:").get("sglang:num_queue_reqs", 0.0)


@pytest.mark.slow  # full tier only (README, "The tests")
def test_a_burst_past_the_slot_cap_beside_a_long_prompt_gives_no_bundle(seat: RealSeat) -> None:
    """GIVEN 16 clients (twice the seat's 8 slots, so requests queue: SGLang's own num_queue_reqs says so) and,
    beside them, a prompt of over a thousand tokens (a long prefill) for 30 s THEN every request is answered and the
    watchdog writes no bundle and reaches no verdict: the full tier's sample of the real soak (bench/watchdog_soak.py
    --seat local-sglang, which adds idle gaps and both --sleep-on-idle settings over 30 minutes)."""
    before = seat_bundles(seat)
    verdicts: list[Any] = []
    queued = 0.0
    # ~1,400 tokens (250 "wordN" were 890 of the trained model's tokens): long for a 4,096-token context, and it fits
    long_body = {"model": MODEL, "prompt": " ".join(f"word{j}" for j in range(400)), "max_tokens": 16}
    with _traffic(seat.endpoint, n=16, max_tokens=16) as tr:
        assert tr.wait_ok(1, 120.0), "the burst got no answer"
        r = httpx.post(f"{seat.endpoint}/v1/completions", json=long_body, timeout=180.0, trust_env=False)
        assert r.status_code == 200, r.text
        long_tokens = r.json()["usage"]["prompt_tokens"]
        t_end = time.monotonic() + 30.0  # six times the longest detector look-back (5 s) at least
        while time.monotonic() < t_end:
            queued = max(queued, _queued(seat))
            verdicts += [n["verdict"] for n in watch_once(seat)["nodes"] if n.get("verdict")]
            time.sleep(2.0)
    print(f"burst: {tr.ok} answers, {tr.failed} failures; long prompt {long_tokens} tokens; "
          f"most queued {queued:.0f}")
    assert tr.failed == 0 and tr.ok >= 16, (tr.ok, tr.failed)
    assert long_tokens > 1000, long_tokens
    assert queued > 0, "no request ever queued: the burst did not pass the slot cap"
    time.sleep(5.0)  # a bundle the last samples triggered would be complete by now
    assert seat_bundles(seat) == before, f"bundles written under healthy load: {sorted(seat_bundles(seat) - before)}"
    assert not verdicts, verdicts


def test_the_probe_times_the_embedding_lookup_in_every_real_scheduler(seat: RealSeat) -> None:
    """GIVEN the seat's plan (SGLSEAT_PROBE through the sitecustomize boot path) WHEN a completion of a known
    prompt length runs THEN every scheduler process has its ring, whose records of VocabParallelEmbedding.forward
    carry the gather size of each forward: the prompt's token count for the prefill, 1 per decode step, beside the
    decoder layers' heartbeats; and the sidecars count the calls."""
    pids = scheduler_pids(seat)
    body = {"model": MODEL, "prompt": "the quick brown fox jumps over the lazy dog " * 3, "max_tokens": 8,
            "ignore_eos": True}
    t0 = time.time()
    r = httpx.post(f"{seat.endpoint}/v1/completions", json=body, timeout=120.0, trust_env=False)
    assert r.status_code == 200, r.text
    prompt_tokens = r.json()["usage"]["prompt_tokens"]
    for rank, pid in pids.items():
        node = rank  # one rank per node
        path = Path(probe_ring.ring_path(f"/dev/shm/sgl-seat-{seat.name}/node{node}", pid))
        assert path.is_file(), f"rank {rank} (pid {pid}) has no probe ring at {path}"
        every = [x for x in probe_ring.read_ring(str(path)) if x.start >= t0 - 1.0]
        # The decoder layers' heartbeats (instants named ...@beat) beside the timed embedding calls.
        beats = [x for x in every if x.target == "sglang.srt.models.llama:LlamaDecoderLayer.forward@beat"]
        assert beats and all(x.end == x.start and x.gather_size == -1 for x in beats), beats[:3]
        recs = [x for x in every if x not in beats]
        assert recs and all(EMBEDDING in x.target for x in recs), recs[:3]
        sizes = [x.gather_size for x in recs]
        # The prefill's gather is the prompt, less what the radix cache already held (nothing: a new prompt).
        assert prompt_tokens in sizes, (prompt_tokens, sizes[:20])
        assert sizes.count(1) >= 6, sizes[:20]  # the decode steps
    fetches = {rk["rank"]: rk["fetches"] for n in watch_once(seat)["nodes"] for rk in n["ranks"]}
    assert set(fetches) == set(pids) and all(v > 0 for v in fetches.values()), fetches


def test_a_probe_stall_on_rank_1_is_named_at_the_embedding_within_10_s(seat: RealSeat) -> None:
    """GIVEN traffic WHEN rank 1's embedding lookup stalls (the probe's rehearsal gate, inside real SGLang)
    THEN a bundle names rank 1 at VocabParallelEmbedding.forward with rank 0 waiting in the all-reduce, complete
    within 10 s of the stall; replay reproduces it; the seat serves again once the stall is cleared."""
    before = seat_bundles(seat)
    with _traffic(seat.endpoint) as load:
        assert load.wait_ok(2, 120), "no answers before the fault"
        res = _fault(seat, "probe-stall:rank=1,for_s=60")
        got = _wait_bundle(seat, before, 60)
        cleared = _fault(seat, "clear")
        assert got is not None, "no bundle within 60 s of the probe stall"
        bundle, seen = got
        m = _manifest(bundle)
        v = m["verdict"]
        took = m["created"] - res["applied_t"]
        print(f"probe stall -> bundle {bundle.name} in {took:.2f} s (seen {seen - res['applied_t']:.2f} s): {v}")
        assert v["kind"] == "row-fetch stall" and v["rank"] == 1 and v["node"] == 1, v
        assert EMBEDDING in (v["frame"] or "") or any(EMBEDDING in e for e in v["evidence"]), v
        assert 0 in v["waiting_ranks"], v
        assert took <= BUNDLE_WITHIN_S, f"bundle {took:.1f} s after the stall (bound {BUNDLE_WITHIN_S} s)"
        assert cleared["fault_id"]
        assert load.wait_ok(3, 120), "the seat did not serve again after the stall was cleared"
    rep = _replay(seat, bundle)
    assert _same_verdict(rep["verdict"], v), (rep["verdict"], v)
    assert rep["rowfetch"], "replay shows no row-fetch table"
    _unlatched(seat)


def _stopped(seat: RealSeat, what: str, while_stopped: Callable[[], None] | None = None,
             ) -> tuple[Path, dict[str, Any], float]:
    """Under traffic, SIGSTOP ``what`` (``rank=1``, ``detokenizer``) until a bundle comes (at most 60 s), then
    ``while_stopped`` (still stopped), then SIGCONT; the seat must serve again. The bundle, its verdict, and
    seconds from the SIGSTOP to it."""
    before = seat_bundles(seat)
    with _traffic(seat.endpoint) as load:
        assert load.wait_ok(2, 120)
        res = _fault(seat, f"sigstop:{what}")
        try:
            got = _wait_bundle(seat, before, 60)
            if while_stopped is not None:
                while_stopped()
        finally:
            _fault(seat, f"sigcont:{what}")
        assert got is not None, f"no bundle within 60 s of SIGSTOP of {what}"
        bundle, _ = got
        m = _manifest(bundle)
        took = m["created"] - res["applied_t"]
        print(f"SIGSTOP {what} -> bundle {bundle.name} in {took:.2f} s: {m['verdict']}")
        assert load.wait_ok(3, 120), "the seat did not serve again after SIGCONT"
    return bundle, m["verdict"], took


def test_sigstop_of_rank_1_during_decode_names_rank_1_stopped_within_10_s(seat: RealSeat) -> None:
    """GIVEN traffic WHEN rank 1's scheduler is SIGSTOPped mid-decode THEN a bundle names rank 1 as a stopped
    process (from the process table), complete within 10 s; while it is stopped `status --json` shows rank 1 alive
    but ``stopped`` and node 1's /health still answers 200 (why liveness comes from processes, never that
    /health); replay reproduces the verdict; SIGCONT recovers the seat."""
    shown: list[dict[str, Any]] = []

    def status_while_stopped() -> None:
        shown.append(next(n["ranks"][0] for n in seat.status()["nodes"] if n["node_rank"] == 1))
        shown.append({"health": httpx.get(f"http://127.0.0.1:{NODE1_PORT}/health", timeout=10.0,
                                          trust_env=False).status_code})

    bundle, v, took = _stopped(seat, "rank=1", status_while_stopped)
    rank1, health = shown
    assert rank1["alive"] and rank1["state"] == "stopped", rank1
    assert health == {"health": 200}, health
    assert v["kind"] == "process stopped" and v["rank"] == 1 and v["node"] == 1, v
    assert took <= BUNDLE_WITHIN_S, f"bundle {took:.1f} s after SIGSTOP (bound {BUNDLE_WITHIN_S} s)"
    rep = _replay(seat, bundle)
    assert _same_verdict(rep["verdict"], v), (rep["verdict"], v)
    _unlatched(seat)


def test_a_stopped_detokenizer_is_its_own_verdict(seat: RealSeat) -> None:
    """GIVEN traffic WHEN node 0's detokenizer is SIGSTOPped (a hang outside the schedulers) THEN the bundle's
    verdict names the detokenizer, not a scheduler rank; SIGCONT recovers the seat."""
    bundle, v, _ = _stopped(seat, "detokenizer")
    assert v["kind"] == "process stopped" and v["rank"] is None and v["node"] == 0, v
    assert any("detokenizer" in e for e in v["evidence"]), v
    rep = _replay(seat, bundle)
    assert _same_verdict(rep["verdict"], v), (rep["verdict"], v)
    _unlatched(seat)


def test_sigkill_of_rank_1_is_process_exited_naming_rank_1(seat: RealSeat) -> None:
    """GIVEN traffic WHEN rank 1's scheduler is SIGKILLed THEN a bundle says "process exited" naming rank 1
    (SGLang then takes the rest of the seat down by itself); replay reproduces it; `status` no longer says READY
    and its reason names rank 1's scheduler first, which `status`'s table shows not running."""
    st = seat.remember()
    pid = next(n["ranks"][0]["pid"] for n in st["nodes"] if n["node_rank"] == 1)
    before = seat_bundles(seat)
    with _traffic(seat.endpoint) as load:
        assert load.wait_ok(2, 120)
        res = _fault(seat, "sigkill:rank=1")
        got = _wait_bundle(seat, before, 60)
    assert got is not None, "no bundle within 60 s of SIGKILL"
    bundle, _ = got
    m = _manifest(bundle)
    v = m["verdict"]
    print(f"SIGKILL -> bundle {bundle.name} in {m['created'] - res['applied_t']:.2f} s: {v}")
    assert v["kind"] == "process exited" and v["rank"] == 1 and v["node"] == 1, v
    assert wait_until(lambda: seat.status()["state"] != "READY", 60, interval=1.0), \
        "status still READY 60 s after rank 1 was killed"
    st = seat.status()
    print(f"status after the kill: {st['state']}: {st['reason']}")
    assert st["state"] in ("FAILED", "DEGRADED"), st
    assert st["reason"].startswith(f"node 1: scheduler process gone: sglang::scheduler_TP1 (pid {pid})"), st["reason"]
    assert not next(n["ranks"][0] for n in st["nodes"] if n["node_rank"] == 1)["alive"]
    text = run_cli(["status", seat.name], seat.home, timeout=CLI_S).stdout
    assert "sglang::scheduler_TP1" in text and "not running" in text
    rep = _replay(seat, bundle)
    assert _same_verdict(rep["verdict"], v), (rep["verdict"], v)
