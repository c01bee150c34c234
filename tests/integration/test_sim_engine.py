"""A two-node sim seat (TP4/EP4, draft on) as two process trees on 127.0.0.1: traffic, then a row-fetch hang.

The first test checks what sgl-seat reads from a live seat: streaming chat and completions with their usage
counts, ``/server_info``, ``/metrics``, process titles and log lines. The second injects a row-fetch stall on
rank 3 and checks the shape of the real hang: every rank stops, ranks 0-2 wait inside the collective and
rank 3 inside ``fetch_rows`` (py-spy), then SGLang's watchdog line and the teardown of both trees after
``--watchdog-timeout``, with no process left behind.
"""

from __future__ import annotations

import ipaddress
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from simutil import (
    HOST,
    SimNode,
    free_port,
    hget,
    hpost,
    hstream,
    main_thread_top,
    pyspy_dump,
    sim_env,
    sse_events,
    wait_http,
)

from sgl_seat.sim import contract
from sgl_seat.sim.step import tokens

pytestmark = pytest.mark.integration

KV = 260_352
SLOTS = 8
WATCHDOG_S = 10


class Seat:
    def __init__(self, tmp: Path) -> None:
        self.p0 = free_port(span=3)
        self.p1 = free_port(span=3, avoid=set(range(self.p0, self.p0 + 3)))
        self.dist = free_port(avoid=set(range(self.p0, self.p0 + 3)) | set(range(self.p1, self.p1 + 3)))
        common = [
            "--model-path", "sim/dsv41-flash-class", "--served-model-name", "sim-dsv41",
            "--tp-size", "4", "--ep-size", "4", "--nnodes", "2", "--dist-init-addr", f"{HOST}:{self.dist}",
            "--mem-fraction-static", "0.85", "--max-running-requests", str(SLOTS), "--context-length", "409600",
            "--watchdog-timeout", str(WATCHDOG_S), "--enable-metrics", "--host", HOST, "--port", str(self.p0),
            "--speculative-algorithm", "EAGLE", "--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
            "--speculative-num-draft-tokens", "4", "--decode-log-interval", "10",
        ]
        env = sim_env(SGLSEAT_SIM_KV_TOKENS=str(KV))
        self.n0 = SimNode([*common, "--node-rank", "0"], env, tmp / "node0.log")
        # Both simulated nodes share this host, so node 1 listens on its own port (SGLang uses --port).
        self.n1 = SimNode([*common, "--node-rank", "1"], {**env, "SGLSEAT_SIM_NODE_PORT": str(self.p1)},
                          tmp / "node1.log")
        self.url0 = f"http://{HOST}:{self.p0}"
        self.url1 = f"http://{HOST}:{self.p1}"
        self.admin0 = f"http://{HOST}:{self.p0 + 2}"
        self.admin1 = f"http://{HOST}:{self.p1 + 2}"


@pytest.fixture(scope="module")
def seat(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Seat]:
    s = Seat(tmp_path_factory.mktemp("sim-seat"))
    s.n0.start()
    s.n1.start()
    try:
        wait_http(f"{s.url0}/health", timeout=120, node=s.n0)
        wait_http(f"{s.url1}/health", timeout=30, node=s.n1)
        s.n0.children()
        s.n1.children()
        yield s
    finally:
        for n in (s.n0, s.n1):
            n.kill()
        left = s.n0.leftovers() + s.n1.leftovers()
        assert not left, f"processes left behind: {left}"


def _stream(url: str, body: dict[str, Any]) -> list[dict[str, Any] | str]:
    with hstream("POST", url, json=body, timeout=60) as r:
        assert r.status_code == 200, r.read()
        assert r.headers["content-type"].startswith("text/event-stream")
        return list(sse_events(r))


def test_traffic_info_metrics_titles_and_logs(seat: Seat) -> None:
    # --- streaming chat, with usage -------------------------------------------------------------------------
    messages = [{"role": "system", "content": "be brief"}, {"role": "user", "content": "name three rivers"}]
    events = _stream(f"{seat.url0}/v1/chat/completions", {
        "model": "sim-dsv41", "messages": messages, "max_tokens": 16, "stream": True,
        "stream_options": {"include_usage": True},
    })
    assert events[-1] == "[DONE]"
    chunks = [e for e in events if isinstance(e, dict)]
    assert all(c["object"] == "chat.completion.chunk" for c in chunks)
    assert chunks[0]["choices"][0]["delta"]["role"] == "assistant"
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    finals = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert finals == ["length"]
    usage = chunks[-1]["usage"]
    want_prompt = len(tokens.chat_ids([(m["role"], m["content"]) for m in messages]))
    assert usage == {**usage, "prompt_tokens": want_prompt, "completion_tokens": 16, "total_tokens": want_prompt + 16}
    assert len(text.split()) == 16 and all(w in tokens.WORDS for w in text.split())

    # --- streaming completion; the same prompt again is identical (greedy) and hits the prefix cache ----------
    prompt = "the sim engine speaks the wire contract of sglang " * 4
    events = _stream(f"{seat.url0}/v1/completions", {
        "prompt": prompt, "max_tokens": 24, "stream": True, "stream_options": {"include_usage": True},
    })
    chunks = [e for e in events if isinstance(e, dict)]
    assert all(c["object"] == "text_completion" for c in chunks)
    streamed = "".join(c["choices"][0]["text"] for c in chunks if c["choices"])
    assert chunks[-1]["usage"]["completion_tokens"] == 24
    assert chunks[-1]["usage"]["prompt_tokens"] == len(tokens.encode(prompt))
    r = hpost(f"{seat.url0}/v1/completions", json={"prompt": prompt, "max_tokens": 24}, timeout=60)
    assert r.status_code == 200 and r.json()["choices"][0]["text"] == streamed
    r = hpost(f"{seat.url0}/generate", json={"text": prompt, "sampling_params": {"max_new_tokens": 24}},
                   timeout=60)
    meta = r.json()["meta_info"]
    assert r.json()["text"] == streamed and meta["completion_tokens"] == 24
    assert meta["cached_tokens"] == len(tokens.encode(prompt)) - 1
    assert meta["finish_reason"] == {"type": "length", "length": 24}
    assert meta["spec_verify_ct"] >= 1 and 1.0 <= meta["spec_accept_length"] <= 4.0
    # Enough decode steps for a few "Decode batch" lines.
    r = hpost(f"{seat.url0}/generate", json={"text": "long", "sampling_params": {"max_new_tokens": 200}},
                   timeout=60)
    assert r.json()["meta_info"]["completion_tokens"] == 200

    # --- /server_info, /model_info, /v1/models ----------------------------------------------------------------
    info = hget(f"{seat.url0}/server_info", timeout=10).json()
    for key in (*contract.SERVER_INFO_FIELDS, *contract.SERVER_ARGS_FIELDS):
        assert key in info, key
    assert info["max_total_num_tokens"] == KV and info["max_running_requests"] == SLOTS
    assert info["speculative_algorithm"] == "EAGLE" and info["speculative_num_draft_tokens"] == 4
    assert info["tp_size"] == 4 and info["nnodes"] == 2 and info["version"] == contract.SGLANG_VERSION
    state = info["internal_states"][0]
    assert state["effective_max_running_requests_per_dp"] == SLOTS
    assert 2.0 < state["avg_spec_accept_length"] < 4.0
    assert state["memory_usage"]["token_capacity"] == KV
    assert info[contract.SIM_ONLY_SERVER_INFO_KEY]["synthetic"] is True
    assert hget(f"{seat.url0}/get_server_info", timeout=10).json()["max_total_num_tokens"] == KV
    assert hget(f"{seat.url0}/model_info", timeout=10).json()["served_model_name"] == "sim-dsv41"
    models = hget(f"{seat.url0}/v1/models", timeout=10).json()
    assert models["data"][0]["id"] == "sim-dsv41" and models["data"][0]["max_model_len"] == 409600
    assert hget(f"{seat.url0}/ready", timeout=10).status_code == 200
    assert hget(f"{seat.url1}/ping", timeout=10).status_code == 200
    assert hget(f"{seat.url1}/health_generate", timeout=10).status_code == 200

    # --- /metrics (rank 0 pushes its gauges every 0.5 s) ---------------------------------------------------------
    time.sleep(0.7)
    text = hget(f"{seat.url0}/metrics", timeout=10).text
    for name in contract.METRIC_NAMES:
        assert name in text, name
    assert f'sglang:max_total_num_tokens{{engine_type="unified",model_name="sim-dsv41",moe_ep_rank="0",' \
           f'pp_rank="0",tp_rank="0"}} {float(KV)}' in text
    assert 'sglang:generation_tokens_total{engine_type="unified",is_streaming="true",model_name="sim-dsv41"} 40.0' \
        in text
    assert 'cache_source="device"' in text and "sgl_seat_sim_synthetic" in text
    assert "sglang:" not in "".join(ln for ln in hget(f"{seat.url1}/metrics", timeout=10).text.splitlines()
                                    if not ln.startswith("#"))

    # --- titles ---------------------------------------------------------------------------------------------------
    titles0 = sorted(p.cmdline()[0] for p in seat.n0.children())
    titles1 = sorted(p.cmdline()[0] for p in seat.n1.children())
    assert titles0 == ["sglang::detokenizer", "sglang::scheduler_TP0_EP0", "sglang::scheduler_TP1_EP1"]
    assert titles1 == ["sglang::scheduler_TP2_EP2", "sglang::scheduler_TP3_EP3"]

    # --- log lines ------------------------------------------------------------------------------------------------
    log0, log1 = seat.n0.log(), seat.n1.log()
    for r, log in ((0, log0), (1, log0), (2, log1), (3, log1)):
        assert f" TP{r} EP{r}] KV Cache is allocated. dtype: torch.bfloat16, #tokens: {KV}, KV size: " in log
    assert f"TP0 EP0] max_total_num_tokens={KV}, chunked_prefill_size=" in log0
    assert f"max_running_requests={SLOTS}, context_len=409600, available_gpu_mem=" in log0
    assert "TP0 EP0] Decode batch, #running-req: 1, #token: " in log0 and "accept len: " in log0
    assert "The server is fired up and ready to roll!" in log0
    assert "SYNTHETIC" in log0 and "SYNTHETIC" in log1
    assert "Traceback" not in log0 + log1


def test_every_listening_socket_is_on_loopback(seat: Seat) -> None:
    """Rank 0's rendezvous store listens on the --dist-init-addr host only (torch's ``tcp://`` init would bind
    ``::``), and gloo's own listeners follow GLOO_SOCKET_IFNAME=lo: nothing of the seat on 0.0.0.0 or ::."""
    socks = seat.n0.listening() + seat.n1.listening()
    assert (HOST, seat.dist) in {(ip, port) for _, ip, port in socks}, socks
    schedulers = {k.pid for n in (seat.n0, seat.n1) for k in n.children() if "scheduler" in k.name()}
    assert len(schedulers) == 4 and schedulers <= {pid for pid, _, _ in socks}, socks  # gloo listens per rank
    outward = [s for s in socks if not ipaddress.ip_address(s[1]).is_loopback]
    assert outward == [], f"listening beyond loopback: {outward}"


def test_rowfetch_stall_on_rank3_hangs_every_rank_then_watchdog_tears_down(seat: Seat) -> None:
    pids = {p.cmdline()[0]: p.pid for n in (seat.n0, seat.n1) for p in n.children()}
    sched = {r: pids[contract.scheduler_title(r, r, 4, 4)] for r in range(4)}

    # A long stream keeps a batch running; record when each token batch arrives.
    arrivals: list[float] = []

    def reader() -> None:
        try:
            with hstream("POST", f"{seat.url0}/generate", timeout=120, json={
                "text": "keep going", "sampling_params": {"max_new_tokens": 100_000}, "stream": True,
            }) as r:
                for _ in sse_events(r):
                    arrivals.append(time.monotonic())
        except httpx.HTTPError:
            pass  # the server goes away at the end

    t = threading.Thread(target=reader, daemon=True)
    t.start()
    deadline = time.monotonic() + 30
    while len(arrivals) < 20:
        assert time.monotonic() < deadline, "the stream never got going"
        time.sleep(0.05)

    # A fault for rank 3 is refused on node 0 (wrong node), accepted on node 1.
    r = hpost(f"{seat.admin0}/sim/faults", json={"fault": "rowfetch-stall:rank=3"}, timeout=10)
    assert r.status_code == 400 and "node_rank 1" in r.json()["error"]["message"]
    r = hpost(f"{seat.admin1}/sim/faults", json={"fault": "rowfetch-stall:rank=3"}, timeout=10)
    assert r.status_code == 200, r.text
    t_stall = time.monotonic()

    # Every rank stops making progress while a batch is running.
    time.sleep(1.0)

    def forward_cts() -> dict[int, dict[str, Any]]:
        out = {}
        for admin in (seat.admin0, seat.admin1):
            for rk in hget(f"{admin}/sim/ranks", timeout=10).json()["ranks"]:
                out[rk["tp_rank"]] = rk
        return out

    before = forward_cts()
    n_arrived = len(arrivals)
    time.sleep(1.5)
    after = forward_cts()
    assert sorted(after) == [0, 1, 2, 3]
    for r in range(4):
        assert after[r]["forward_ct"] == before[r]["forward_ct"], (r, before[r], after[r])
        assert after[r]["active"] and after[r]["num_running_reqs"] >= 1
    assert after[3]["rowfetch_stalled"] and not any(after[r]["rowfetch_stalled"] for r in range(3))
    assert len({after[r]["forward_ct"] for r in range(4)}) == 1
    assert len(arrivals) == n_arrived, "tokens kept arriving during the stall"

    # Where each rank waits: 0-2 inside the collective, 3 inside the row fetch.
    for r in range(4):
        dump = pyspy_dump(sched[r])
        top = main_thread_top(dump)
        if r == 3:
            assert top.startswith("fetch_rows (sgl_seat/sim/rowfetch.py"), dump
        else:
            assert top.startswith("all_reduce (torch/distributed/distributed_c10d.py"), dump
    assert time.monotonic() - t_stall < WATCHDOG_S, "the checks above took longer than the watchdog"

    # SGLang's watchdog fires after --watchdog-timeout and both trees are torn down.
    rc0 = seat.n0.wait_exit(timeout=60)
    rc1 = seat.n1.wait_exit(timeout=30)
    elapsed = time.monotonic() - t_stall
    assert rc0 is not None and rc1 is not None, "a node outlived its watchdog"
    assert elapsed >= WATCHDOG_S
    log0, log1 = seat.n0.log(), seat.n1.log()
    line = f"Scheduler watchdog timeout (self.watchdog_timeout={float(WATCHDOG_S)!r}, self.soft=False)"
    # The first watchdog to fire takes its tree down, and the other node's ranks lose their peer: under load the
    # two watchdogs fire far enough apart that the second node goes down by that cascade first (on a loaded host
    # node 0 logged only "Received sigquit from a child process"), as two real SGLang nodes would.
    fired = [n for n, log in ((0, log0), (1, log1)) if line in log]
    assert fired, (log0[-2000:], log1[-2000:])
    cascade = ("SIGQUIT received. signum=3, frame=None. It usually means one child failed.",
               "Received sigquit from a child process. It usually means the child failed.")
    assert all(line in log or any(c in log for c in cascade) for log in (log0, log1)), (log0[-2000:], log1[-2000:])
    assert "TP3 EP3] sim fault: row fetch on rank 3 stalls until the process dies" in log1
    t.join(timeout=30)
    deadline = time.monotonic() + 15
    while (seat.n0.leftovers() or seat.n1.leftovers()) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not seat.n0.leftovers() and not seat.n1.leftovers(), "processes left behind after teardown"
