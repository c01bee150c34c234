"""`up --draft on` -> streaming chat -> `status --json` -> `logs` -> `down` on a local cluster `up` starts itself.

This is the default profile's path (``cluster.address: local``): `up` starts the background holder of a
two-node simulated Ray cluster, and `down` must leave no engine process, no process of the engines'
groups and no Ray process that `up` started (checked by the pids and process groups recorded, never by
name: other suites run sim engines with the same titles on this host).
"""

from __future__ import annotations

import json
from pathlib import Path

import httpx
import pytest
from launchutil import (
    CLI_S,
    Proc,
    alive,
    descendants,
    endpoint_of,
    engine_pgids,
    in_groups,
    run_cli,
    seat_processes,
    status_json,
    write_spec,
)

# Full tier only (README, "The tests"): test_demo.py takes the same local-cluster path (address local) in the CI tier.
pytestmark = [pytest.mark.integration, pytest.mark.slow]


def _stream_chat(endpoint: str, model: str) -> tuple[str, int]:
    """A streaming /v1/chat/completions: (the text, the number of content chunks)."""
    text, chunks = "", 0
    body = {"model": model, "messages": [{"role": "user", "content": "Say hello to the seat."}],
            "max_tokens": 16, "stream": True}
    with httpx.stream("POST", f"{endpoint}/v1/chat/completions", json=body, timeout=60.0) as r:
        assert r.status_code == 200, r.read()
        done = False
        for line in r.iter_lines():
            if not line.startswith("data: "):
                continue
            data = line.removeprefix("data: ")
            if data.strip() == "[DONE]":
                done = True
                break
            delta = json.loads(data)["choices"][0].get("delta", {})
            if delta.get("content"):
                text += delta["content"]
                chunks += 1
        assert done, "the stream did not end with [DONE]"
    return text, chunks


def test_up_stream_status_logs_down_on_a_local_cluster(tmp_path: Path) -> None:
    """GIVEN the local-sim shape with address local WHEN `up --draft on` THEN READY with an endpoint that
    streams, 2 nodes and 4 live ranks in `status --json`; AND `down` leaves nothing `up` started."""
    home = tmp_path / "home"
    spec = write_spec(tmp_path, "lt-local", address="local", slot=0)

    up = run_cli(["up", "--seat", str(spec), "--draft", "on", "--timeout", "240"], home, timeout=300)
    assert up.returncode == 0, up.stdout + up.stderr
    for stage in ("cluster", "placement", "agents", "preflight", "engine-node0", "dist-init", "engines", "ready"):
        assert f"ok {stage}" in up.stdout, stage
    assert "READY" in up.stdout
    endpoint = endpoint_of(up.stdout)
    assert endpoint.startswith("http://127.0.0.1:")

    text, chunks = _stream_chat(endpoint, "sim-dsv41")
    assert chunks >= 2 and text.strip()

    st = status_json("lt-local", home)
    assert st["name"] == "lt-local" and st["state"] == "READY" and st["endpoint"] == endpoint
    assert [n["node_rank"] for n in st["nodes"]] == [0, 1]
    ranks = [r for n in st["nodes"] for r in n["ranks"]]
    assert len(ranks) == 4 and all(r["pid"] and r["alive"] for r in ranks)
    # The actual pool is read from node 0's `KV Cache is allocated ... #tokens: N` line; the sim sizes its pool
    # from the planner's figure, so the two agree.
    assert st["kv_pool"]["actual"] == st["kv_pool"]["predicted"] and st["draft"] is True

    logs = run_cli(["logs", "lt-local", "--node", "1", "--lines", "20"], home, timeout=CLI_S)
    assert logs.returncode == 0 and logs.stdout.strip(), logs.stderr

    # What `up` started, captured before `down`: the cluster holder and every process under it, and the engines
    # with their engine hosts (not under Ray: they outlive their agent's worker).
    cluster = json.loads((home / "clusters" / "lt-local.json").read_text())
    holder = cluster["pid"]
    engines = seat_processes("lt-local")
    started = descendants(holder) + engines
    assert any(p.title.startswith("sglang::scheduler") for p in engines)
    assert not any(p.title.startswith("sglang::") for p in descendants(holder))  # none is a Ray worker's child
    assert sum(p.title.startswith("engine host ") for p in engines) == 2  # one engine host per node
    pgids = engine_pgids(st)
    assert len(pgids) == 2

    down = run_cli(["down", "lt-local"], home, timeout=180)
    assert down.returncode == 0, down.stdout + down.stderr
    assert "no engine process remains" in down.stdout
    assert alive(started) == []                      # no Ray process, no engine, no sglang:: process
    assert in_groups(pgids) == []                    # nothing of the engines' process groups
    assert not (home / "seats" / "lt-local.json").exists()
    assert not (home / "clusters" / "lt-local.json").exists()
    assert alive([Proc(holder, cluster["create_time"], None, "holder")]) == []
