"""`sgl-seat demo --quick --json`, for real: a copy of the local-sim seat (our ports, our SGLSEAT_HOME) goes up
with the draft on, gets traffic and a row-fetch stall injected on rank 3 through the sim's fault route; the
watchdog's bundle must exist and verify, the verdict name rank 3 on node 1, the HTML report exist, and every
process the demo started (seen while it ran, by pid and create time, and its engine process groups) be gone.

Ports 30600-30699, below the ephemeral range (``SGLSEAT_TEST_PORTS`` moves them); one seat uses http, +2,
+5, +10, +12, +15, +16.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import yaml
from launchutil import LOCAL_SIM, Proc, alive, cli_argv, cli_env, descendants, in_groups, run_cli, seat_processes

from sgl_seat.forensics import verify_bundle
from sgl_seat.netports import free_block, port_range

pytestmark = pytest.mark.integration

SEAT = "demo-it"
PORT_LO, PORT_HI = port_range((30600, 30699))
SEAT_PORT_OFFSETS = (0, 2, 5, 10, 12, 15, 16)  # http, sim admin, dist-init, node 1 and its admin, 2 exporters
#: A guard against a hung demo, not a speed claim: the whole demo takes about a minute on an idle 2-core machine
#: (`up` 20-40 s, 5 s of traffic, the bundle within 10 s, replay, `down`) and more than two beside the CI tier's
#: other streams, which is where this test runs.
DEMO_TIMEOUT_S = 300.0


def _ports() -> int:
    base = free_block(range(PORT_LO + 20, PORT_HI - 18, 20), SEAT_PORT_OFFSETS)  # PORT_LO's block: for runs by hand
    if base is None:
        raise RuntimeError(f"no free port block in {PORT_LO}-{PORT_HI}")
    return base


def _seat_file(tmp: Path) -> Path:
    doc: dict[str, Any] = yaml.safe_load(LOCAL_SIM.read_text())
    http = _ports()
    doc["name"] = SEAT
    doc["network"]["http_port"] = http
    doc["network"]["dist_init_port"] = http + 5
    if doc["model"].get("config"):  # relative to the profile's directory: make it absolute for the copy
        doc["model"]["config"] = str((LOCAL_SIM.parent / doc["model"]["config"]).resolve())
    path = tmp / f"{SEAT}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _watch(proc: subprocess.Popen[str], home: Path, seen: dict[int, Proc], pgids: set[int]) -> None:
    """Every process under the demo and under the local cluster's holder, and the engines' process groups."""
    for p in descendants(proc.pid):
        seen.setdefault(p.pid, p)
    cluster = home / "clusters" / f"{SEAT}.json"
    record = home / "seats" / f"{SEAT}.json"
    try:
        holder = int(json.loads(cluster.read_text())["pid"]) if cluster.is_file() else None
        nodes = json.loads(record.read_text()).get("nodes", []) if record.is_file() else []
    except (ValueError, KeyError, OSError):
        return  # written as we read: the next look gets it
    if holder is not None:
        for p in descendants(holder):
            seen.setdefault(p.pid, p)
    for p in seat_processes(SEAT):  # the engines and their hosts, outside Ray's process tree
        seen.setdefault(p.pid, p)
    pgids.update(int(n["pgid"]) for n in nodes if n.get("pgid"))


def test_demo_quick_captures_and_replays_the_rank3_stall(tmp_path: Path) -> None:
    home = tmp_path / "home"
    home.mkdir()
    spec = _seat_file(tmp_path)
    seen: dict[int, Proc] = {}
    pgids: set[int] = set()
    t0 = time.monotonic()
    proc = subprocess.Popen([*cli_argv(), "demo", "--seat", str(spec), "--quick", "--json"], env=cli_env(home),
                            cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        while proc.poll() is None and time.monotonic() - t0 < DEMO_TIMEOUT_S:
            _watch(proc, home, seen, pgids)
            time.sleep(0.3)
        if proc.poll() is None:
            proc.terminate()  # SIGTERM: the demo's cleanup does not run; `down` below takes the seat down
            proc.wait(30)
            run_cli(["down", SEAT], home, timeout=120)
            pytest.fail(f"demo did not finish within {DEMO_TIMEOUT_S:.0f} s")
        out, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(10)
    wall = time.monotonic() - t0
    print(f"demo --quick took {wall:.1f} s (this machine, beside whatever else runs)")
    assert proc.returncode == 0, err[-4000:]
    doc = json.loads(out)  # one JSON document alone on stdout
    assert "[4/6] wait for the watchdog's bundle" in err and "HTML report:" in err  # progress on stderr

    # the seat came up with the draft on, stalled, captured, replayed, went down: in that order, each timed
    assert [s["name"] for s in doc["stages"]] == ["up", "traffic", "inject", "bundle", "replay", "down"]
    assert all(s["seconds"] >= 0 for s in doc["stages"]) and doc["draft"] is True and doc["quick"] is True
    assert doc["synthetic"] is True and "synthetic" in doc["synthetic_note"]
    assert doc["traffic"]["requests_ok"] > 0
    assert doc["injection"]["fault"] == "rowfetch-stall:rank=3" and doc["injection"]["node"] == 1

    # the bundle the watchdog wrote exists and verifies (checksums, manifest), and is the stall's
    b = doc["bundle"]
    path = Path(b["path"])
    assert path.is_dir() and path.parent == home / "bundles" / SEAT
    m = verify_bundle(path)
    assert m.bundle_id == b["id"] and m.verdict is not None and (m.verdict.rank, m.verdict.node) == (3, 1)
    assert m.trigger_t >= doc["injection"]["armed_at"]  # captured after the injection, not before it
    assert 0 < b["detected_after_s"] <= b["written_after_s"] <= b["seen_after_s"] <= 30.0, b

    # the replay's verdict names rank 3, node 1, the row-fetch frame; the stalled bucket stands out
    v = doc["verdict"]
    assert (v["kind"], v["rank"], v["node"]) == ("row-fetch stall", 3, 1) and "fetch_rows" in v["frame"], v
    assert v["waiting_ranks"] == [0, 1, 2]
    hot = doc["exploding_bucket"]
    assert hot["max_ms"] >= 3000.0 and doc["other_buckets_max_ms"] < hot["max_ms"]
    html = Path(doc["html"])
    assert html.is_file() and "rank 3" in html.read_text(encoding="utf-8")

    # nothing left: every process seen while the demo ran, the engine groups, the probe rings, the record
    assert seen, "no process of the demo was seen while it ran"
    assert alive(seen.values()) == [], "processes left behind by the demo"
    assert pgids and in_groups(pgids) == []
    assert not (home / "seats" / f"{SEAT}.json").exists()
    assert not Path(f"/dev/shm/sgl-seat-{SEAT}").exists(), "probe rings left in /dev/shm"
    assert wall < DEMO_TIMEOUT_S
