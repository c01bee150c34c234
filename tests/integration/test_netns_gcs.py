"""The GCS killed (issue 24, item 3) on the two-host cluster of ``test_netns_cluster.py``: a cluster of its own
(this test ends its head), node 0 on host a (the head's host), node 1 on host b, traffic through host a.

What an operator meets when the head's GCS dies, as measured here:

- host b's raylet outlives it, and node 1's sidecar goes on answering and sampling (its samples need no GCS)
  until its engines are gone;
- on host a, `ray start --block` (how this cluster runs Ray, as many on-prem heads do) ends every Ray process of
  its host when one of them dies, the raylet too; node 0's sidecar dies with it, and its keeper (outside Ray)
  writes host a's own bundle, node-isolated, "its Ray raylet is gone"; node 0's engines go with its node agent,
  and node 1's follow them (their collectives fail);
- `down` cannot connect to the cluster any more: it stops what this host holds (node 0, by the record's pids) and
  names node 1 with its pids; `down --local` on host b stops the rest. Nothing is left.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from netnsutil import (
    NetnsCluster,
    engine_pids,
    fetch_in,
    raylet_pid,
    running,
    seat_bundles,
    seat_spec,
    under_traffic,
)

# Left out of CI (`-m "not slow"`): in both fresh-clone CI runs of 2026-12-02 this module's own cluster did not
# start (host b's `ray start` "timed out during startup", twice, while the real-engine and Ray streams loaded both
# cores); run here it passed (89-97 s). Run it with `pytest tests/integration/test_netns_gcs.py`.
pytestmark = [pytest.mark.integration, pytest.mark.slow]

HTTP_PORT = 31510
WATCH_S = 8.0


@pytest.fixture(scope="module")
def cluster() -> Iterator[NetnsCluster]:
    with running("sq") as cl:
        yield cl


def _samples(cl: NetnsCluster, node: int) -> float | None:
    """Node ``node``'s sidecar's stack samples so far, from its exporter on its own host's loopback; None when
    nothing answers there any more."""
    ns = cl.ns_a if node == 0 else cl.ns_b
    try:
        text = fetch_in(ns, f"http://127.0.0.1:{HTTP_PORT + 15 + node}/metrics", timeout=5.0)
    except AssertionError:
        return None
    m = re.search(rf'^sgl_seat_watchdog_samples_total\{{node="{node}"\}} (\S+)$', text, re.M)
    assert m, text[:1500]
    return float(m.group(1))


def test_gcs_killed_sidecars_keep_sampling_and_down_stops_what_it_reaches(cluster: NetnsCluster,
                                                                          tmp_path: Path) -> None:
    cl = cluster
    home = tmp_path / "home"
    spec = seat_spec(cl, tmp_path / "gcs.yaml", pin_node0="a", http_port=HTTP_PORT)
    up = cl.run_cli(["up", "--seat", str(spec), "--timeout", "180"], home, timeout=240)
    assert up.returncode == 0, up.stdout + up.stderr
    rec = json.loads((home / "seats" / "netns-sim.json").read_text())
    assert {int(n["node_rank"]): n["host"] for n in rec["nodes"]} == {0: "a", 1: "b"}
    recorded = [p for n in rec["nodes"] for p in n["pids"]]
    try:
        bundles = Path(rec["bundles_dir"])
        with under_traffic(cl, "a", HTTP_PORT):
            before = {n: _samples(cl, n) for n in (0, 1)}
            assert None not in before.values(), before
            os.kill(raylet_pid(cl, cl.ns_a, "gcs_server"), signal.SIGKILL)
            t0 = time.monotonic()
            seen: list[tuple[float, float | None]] = [(0.0, before[1])]
            while time.monotonic() - t0 < WATCH_S:
                time.sleep(1.0)
                seen.append((time.monotonic() - t0, _samples(cl, 1)))
            node0_after = _samples(cl, 0)
        # Host b's raylet outlives the GCS: its sidecar answers throughout. Its samples stop once its engines are
        # gone (they follow node 0's: see below), so this is no "no gap" check of a seat that keeps serving.
        print("node 1 samples after the GCS died:", [(round(t, 1), v) for t, v in seen])
        assert all(v is not None for _, v in seen), seen
        assert float(seen[1][1] or 0) > float(before[1] or 0), seen  # still sampling right after the GCS went
        # Host a: `ray start --block` ends every Ray process of its host when one dies (the GCS here), the raylet
        # too, and node 0's sidecar with it; its keeper (outside Ray) wrote host a's own bundle.
        print("node 0's exporter after the GCS died:", node0_after)
        mine = [b for b in seat_bundles(bundles) if b["nodes"] == [0]]
        deadline = time.monotonic() + 20
        while not mine and time.monotonic() < deadline:
            time.sleep(0.2)
            mine = [b for b in seat_bundles(bundles) if b["nodes"] == [0]]
        print("host a's bundles:", [(b["bundle_id"], b["verdict"]["kind"], b["verdict"]["evidence"][0]) for b in mine])
        if node0_after is None:
            assert any(b["verdict"]["kind"] == "node-isolated" and "Ray raylet (pid " in b["verdict"]["evidence"][0]
                       for b in mine), mine
        # down: the GCS does not answer; what this host holds (node 0) is stopped by pid, node 1 is named.
        t1 = time.monotonic()
        res = cl.run_cli(["down", "netns-sim", "--json"], home, timeout=180)
        print(f"down with the GCS dead: {time.monotonic() - t1:.1f} s, exit {res.returncode}")
        assert res.returncode != 0, res.stdout
        doc = json.loads(res.stdout)
        print("down said:", doc["survivors"])
        assert any(s.startswith("node 1 ") and "down --local netns-sim" in s for s in doc["survivors"]), doc
        assert [p for ns, p, _ in engine_pids(cl) if ns == cl.ns_a] == []
        local = cl.run_cli(["down", "--local", "netns-sim", "--json"], home, timeout=120, ns=cl.ns_b)
        assert local.returncode == 0, local.stdout + local.stderr
        ldoc = json.loads(local.stdout)
        print("down --local on host b:", ldoc)
        # Node 1's sidecar is out of reach (no GCS), its raylet alive: its keeper waits, and `down --local` stops it.
        assert len(ldoc["keepers_stopped"]) == 1, ldoc
        keepers = [p for p in cl.pids()[cl.ns_b] if psutil.pid_exists(p)
                   and "sgl_seat.watchdog.keeper" in " ".join(psutil.Process(p).cmdline())]
        assert keepers == [], keepers
        assert list(engine_pids(cl)) == []
        assert [p for p in recorded if psutil.pid_exists(p)] == []
    finally:
        print("engine processes left for the cluster's removal:", list(engine_pids(cl)))
