"""Bad input to the sim engine gets one clear error, never a hang or a traceback, and leaves nothing behind.

Covers the issue's list: a broken argv, an unreachable dist-init address (bounded by --dist-timeout), a port
in use, malformed HTTP requests; plus the admin route's own errors and binding, and an injected crash that
tears the tree down the way SGLang does.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import psutil
import pytest
from simutil import HOST, SimNode, free_port, hdelete, hget, hpost, sim_env, wait_http

from sgl_seat.netports import held

pytestmark = pytest.mark.integration

MODULE = [sys.executable, "-m", "sgl_seat.sim.launch_server"]


def _run(argv: list[str], env: dict[str, str] | None = None, timeout: float = 30) -> subprocess.CompletedProcess[str]:
    return subprocess.run([*MODULE, *argv], capture_output=True, text=True, timeout=timeout,
                          env=env or sim_env(), stdin=subprocess.DEVNULL)


@pytest.mark.parametrize(
    ("argv", "env", "needle"),
    [
        (["--model-path", "m", "--tp-size", "2", "--bogus-flag", "1"], {}, "unrecognized arguments: --bogus-flag 1"),
        (["--tp-size", "2"], {}, "the following arguments are required: --model-path"),
        (["--model-path", "m", "--tp-size", "two"], {}, "argument --tp-size"),
        (["--model-path", "m", "--nnodes", "2", "--tp-size", "2"], {}, "--dist-init-addr is required"),
        (["--model-path", "m"], {"SGLSEAT_SIM_FAULTS": "explode:rank=0"}, "unknown kind 'explode'"),
        (["--model-path", "m"], {"SGLSEAT_SIM_KV_TOKENS": "many"}, "SGLSEAT_SIM_KV_TOKENS='many'"),
    ],
)
def test_broken_argv_exits_2_with_one_clear_line(argv: list[str], env: dict[str, str], needle: str) -> None:
    res = _run(argv, sim_env(**env))
    assert res.returncode == 2, res.stderr
    assert needle in res.stderr
    assert "usage:" in res.stderr
    assert "Traceback" not in res.stderr + res.stdout


def test_unreachable_dist_init_times_out_within_dist_timeout(tmp_path: Path) -> None:
    dead = free_port()  # nothing listens here: node 0 "never came up"
    port = free_port(span=3, avoid={dead})
    node = SimNode(
        ["--model-path", "m", "--tp-size", "2", "--nnodes", "2", "--node-rank", "1", "--dist-init-addr",
         f"{HOST}:{dead}", "--dist-timeout", "3", "--host", HOST, "--port", str(port)],
        sim_env(), tmp_path / "node1.log",
    )
    t0 = time.monotonic()
    node.start()
    try:
        rc = node.wait_exit(timeout=60)
        elapsed = time.monotonic() - t0
        assert rc == 1, node.log()
        log = node.log()
        assert f"rendezvous failed: could not reach the dist-init address {HOST}:{dead} within --dist-timeout 3" \
            in log
        assert "sim engine failed to start on node_rank 1" in log
        assert "Traceback" not in log and "frame #" not in log
        assert 3 <= elapsed < 3 + 40  # the rendezvous budget, plus start-up (imports) on a busy box
    finally:
        node.kill()
    assert not node.leftovers()


def test_port_in_use_fails_fast_before_starting_anything(tmp_path: Path) -> None:
    port = free_port(span=3)
    with held(port, HOST, listen=True):
        t0 = time.monotonic()
        res = _run(["--model-path", "m", "--host", HOST, "--port", str(port)], timeout=30)
        assert res.returncode == 1
        assert time.monotonic() - t0 < 15
        assert f"cannot bind the HTTP server to {HOST}:{port}" in res.stderr
        assert "the port is in use" in res.stderr
        assert "Traceback" not in res.stderr


# --- one small live seat for the HTTP checks --------------------------------------------------------------------
class One:
    def __init__(self, tmp: Path) -> None:
        self.port = free_port(span=3)
        self.node = SimNode(["--model-path", "m", "--served-model-name", "one", "--host", HOST,
                             "--port", str(self.port), "--context-length", "64"], sim_env(), tmp / "one.log")
        self.url = f"http://{HOST}:{self.port}"
        self.admin = f"http://{HOST}:{self.port + 2}"


@pytest.fixture(scope="module")
def one(tmp_path_factory: pytest.TempPathFactory) -> Iterator[One]:
    s = One(tmp_path_factory.mktemp("sim-one"))
    s.node.start()
    try:
        wait_http(f"{s.url}/health", timeout=90, node=s.node)
        s.node.children()
        yield s
    finally:
        s.node.kill()
        assert not s.node.leftovers()


def _openai_error(r: httpx.Response, status: int, needle: str) -> None:
    assert r.status_code == status, r.text
    body = r.json()
    assert body["object"] == "error" and body["code"] == status
    assert needle in body["message"], body


@pytest.mark.parametrize(
    ("path", "body", "status", "needle"),
    [
        ("/v1/chat/completions", b"{not json", 400, "not valid JSON"),
        ("/v1/chat/completions", b"", 400, "body is empty"),
        ("/v1/chat/completions", b"[1, 2]", 400, "must be a JSON object"),
        ("/v1/chat/completions", b'{"model": "one"}', 400, "Missing required field 'messages'"),
        ("/v1/chat/completions", b'{"messages": []}', 400, "non-empty list"),
        ("/v1/chat/completions", b'{"messages": [{"content": "hi"}]}', 400, "string 'role'"),
        ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "max_tokens": -5}', 400,
         "max_tokens must be at least 0, got -5"),
        ("/v1/chat/completions", b'{"messages": [{"role": "user", "content": "hi"}], "n": 2}', 400, "n=2"),
        ("/v1/completions", b'{"max_tokens": 4}', 400, "Missing required field 'prompt'"),
        ("/v1/completions", b'{"prompt": "hi", "max_tokens": "lots"}', 400, "max_tokens must be an integer"),
        ("/v1/completions", b'{"prompt": "hi", "max_tokens": 100}', 400, "maximum context length of 64 tokens"),
        ("/v1/completions", b'{"prompt": "hi", "stream": "yes"}', 400, "stream must be true or false"),
    ],
)
def test_malformed_openai_requests_get_clear_400s(one: One, path: str, body: bytes, status: int,
                                                  needle: str) -> None:
    r = hpost(one.url + path, content=body, headers={"content-type": "application/json"}, timeout=15)
    _openai_error(r, status, needle)


def test_wrong_content_type_unknown_route_wrong_method(one: One) -> None:
    r = hpost(f"{one.url}/v1/completions", content=b'{"prompt": "hi"}', headers={"content-type": "text/plain"},
                   timeout=15)
    _openai_error(r, 400, "Only 'application/json' is allowed")
    _openai_error(hget(f"{one.url}/v2/nothing", timeout=15), 404, "no route GET /v2/nothing")
    _openai_error(hdelete(f"{one.url}/generate", timeout=15), 405, "Method Not Allowed")
    # /metrics exists only with --enable-metrics (as in SGLang); this seat has none.
    _openai_error(hget(f"{one.url}/metrics", timeout=15), 404, "no route")


@pytest.mark.parametrize(
    ("body", "needle"),
    [
        (b"{oops", "not valid JSON"),
        (b'{"sampling_params": {"max_new_tokens": 4}}', "Either text or input_ids"),
        (b'{"text": "hi", "sampling_params": {"max_new_tokens": -1}}',
         "sampling_params.max_new_tokens must be at least 0, got -1"),
        (b'{"text": "hi", "input_ids": [1]}', "Either text or input_ids"),
        (b'{"input_ids": ["a"]}', "input_ids must be a list of integers"),
    ],
)
def test_malformed_generate_requests(one: One, body: bytes, needle: str) -> None:
    r = hpost(f"{one.url}/generate", content=body, timeout=15)
    assert r.status_code == 400, r.text
    assert needle in r.json()["error"]["message"]


def test_still_serving_after_bad_requests_and_zero_tokens(one: One) -> None:
    r = hpost(f"{one.url}/v1/completions", json={"prompt": "a b", "max_tokens": 0}, timeout=30)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 0
    r = hpost(f"{one.url}/v1/chat/completions", json={"messages": [{"role": "user", "content": "hi"}],
                                                           "max_tokens": 3}, timeout=30)
    assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 3
    assert hget(f"{one.url}/health", timeout=30).status_code == 200
    assert hpost(f"{one.url}/flush_cache", timeout=30).status_code == 200


def test_admin_route_errors_and_loopback_binding(one: One) -> None:
    r = hpost(f"{one.admin}/sim/faults", json={"fault": "explode:rank=0"}, timeout=15)
    assert r.status_code == 400 and "unknown kind 'explode'" in r.json()["error"]["message"]
    r = hpost(f"{one.admin}/sim/faults", json={"fault": "crash:rank=5"}, timeout=15)
    assert r.status_code == 400 and "ranks 0..0" in r.json()["error"]["message"]
    r = hpost(f"{one.admin}/sim/faults", content=b"nope", timeout=15)
    assert r.status_code == 400
    r = hpost(f"{one.admin}/sim/faults", json={"fault": "slow:rank=0,ms=1,for_s=0.5"}, timeout=15)
    assert r.status_code == 200 and r.json()["armed"] == "slow:rank=0,ms=1,for_s=0.5"
    assert hget(f"{one.admin}/sim/faults", timeout=15).json()["faults"]["0"] == ["slow:rank=0,ms=1,for_s=0.5"]
    assert hdelete(f"{one.admin}/sim/faults", timeout=15).status_code == 200
    assert hget(f"{one.admin}/sim/faults", timeout=15).json()["faults"]["0"] == []
    assert hget(f"{one.admin}/sim/nothing", timeout=15).status_code == 404
    listening = {(c.laddr.ip, c.laddr.port) for c in psutil.Process(one.node.pid).net_connections("tcp")
                 if c.status == psutil.CONN_LISTEN}
    assert listening == {(HOST, one.port), ("127.0.0.1", one.port + 2)}


def test_injected_crash_tears_the_tree_down(tmp_path: Path) -> None:
    port = free_port(span=3)
    node = SimNode(["--model-path", "m", "--tp-size", "2", "--host", HOST, "--port", str(port)],
                   sim_env(SGLSEAT_SIM_FAULTS="crash:rank=1,after_steps=3"), tmp_path / "crash.log")
    node.start()
    try:
        wait_http(f"http://{HOST}:{port}/health", timeout=90, node=node)
        node.children()
        with pytest.raises(httpx.HTTPError):
            hpost(f"http://{HOST}:{port}/generate",
                       json={"text": "x", "sampling_params": {"max_new_tokens": 1000}}, timeout=30)
        assert node.wait_exit(timeout=30) is not None
        log = node.log()
        assert "sim fault: crashing rank 1 now (crash:rank=1,after_steps=3)" in log
        assert "crashed with exit code -9" in log or "Scheduler hit an exception" in log
    finally:
        node.kill()
    assert not node.leftovers()


def test_sigterm_stops_cleanly_and_children_die_with_their_parent(tmp_path: Path) -> None:
    """SIGTERM on node 0: drain, stop every rank, exit 0. SIGKILL of a main process: PR_SET_PDEATHSIG
    takes its children with it (nobody else cleans up)."""
    ports: list[int] = []
    nodes: list[SimNode] = []
    for i in range(2):
        ports.append(free_port(span=3, avoid={q for p in ports for q in range(p, p + 3)}))
        nodes.append(SimNode(["--model-path", "m", "--tp-size", "2", "--host", HOST, "--port", str(ports[i])],
                             sim_env(), tmp_path / f"n{i}.log").start())
    try:
        for port, n in zip(ports, nodes, strict=True):
            wait_http(f"http://{HOST}:{port}/health", timeout=90, node=n)
            assert len(n.children()) == 3
        graceful, orphaned = nodes
        assert graceful.proc is not None and orphaned.proc is not None
        graceful.proc.send_signal(signal.SIGTERM)
        assert graceful.wait_exit(timeout=30) == 0, graceful.log()
        assert "Draining requests and shutting down" in graceful.log()
        kids = orphaned.children()
        orphaned.proc.kill()  # the main process only, not its group
        orphaned.wait_exit(timeout=10)
        _, alive = psutil.wait_procs(kids, timeout=10)
        assert not alive, f"children outlived their parent: {[p.pid for p in alive]}"
    finally:
        for n in nodes:
            n.kill()
    assert not any(n.leftovers() for n in nodes)
