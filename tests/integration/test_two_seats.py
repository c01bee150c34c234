"""Two local-sim seats on one host at once (issue 49): what a second user of a machine that already runs a seat does.

The seat is local-sim copied out of launch/seats as an operator would copy it (its planning config still named
``../models/deepseek-v4-flash``, which is not beside the copy: the built-in model is found by name), its ports moved
into the launch tests' range. It goes up in one ``SGLSEAT_HOME``; the same file goes up in a second home with
``--port-base`` (nothing edited); both are READY at once with their own endpoints. A third `up` of the same file on
the first seat's ports is refused in its first stage, "ports", before any local cluster starts (what makes it take
seconds: a cluster's start alone took 10 s and more, and the collision used to surface 50 s in, as a failed
rendezvous), naming the spec key and a free --port-base. Both go down and nothing either started is left (checked
by the pids and process groups recorded, never by name).
"""

from __future__ import annotations

import json
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from launchutil import (
    LOCAL_SIM,
    alive,
    descendants,
    engine_pgids,
    in_groups,
    ports,
    run_cli,
    seat_processes,
    status_json,
)

pytestmark = [pytest.mark.integration, pytest.mark.slow]  # full tier only (README, "The tests")

NAME = "two-seats"


def _copy(directory: Path) -> Path:
    doc: dict[str, Any] = yaml.safe_load(LOCAL_SIM.read_text())
    http, dist = ports(0)
    doc["name"] = NAME
    doc["network"]["http_port"], doc["network"]["dist_init_port"] = http, dist
    assert doc["model"]["config"] == "../models/deepseek-v4-flash"  # as shipped: relative to launch/seats
    directory.mkdir(parents=True)
    path = directory / "seat.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def test_two_local_sim_seats_up_at_once_and_a_colliding_one_refused_at_preflight(tmp_path: Path) -> None:
    """GIVEN a copied local-sim WHEN it goes up in home A, and with --port-base in home B THEN both are READY and
    serve on their own ports; a third `up` on A's ports is refused at the "ports" stage naming the key, with no
    cluster started; both `down`s leave nothing behind."""
    spec = _copy(tmp_path / "copied")
    base_b, _ = ports(1)
    home_a, home_b, home_c = tmp_path / "a", tmp_path / "b", tmp_path / "c"
    started: list[Any] = []
    pgids: list[int] = []
    try:
        with ThreadPoolExecutor(2) as pool:  # side by side: CI time, and two seats starting at once collide too
            ups = [pool.submit(run_cli, ["up", "--seat", str(spec), "--timeout", "240", *extra], home, timeout=300)
                   for home, extra in ((home_a, []), (home_b, ["--port-base", str(base_b)]))]
            for up in ups:
                assert up.result().returncode == 0, up.result().stdout + up.result().stderr
        for home in (home_a, home_b):
            holder = json.loads((home / "clusters" / f"{NAME}.json").read_text())["pid"]
            started += descendants(holder)
            st = status_json(NAME, home)
            assert st["state"] == "READY", st
            pgids += engine_pgids(st)
        started += seat_processes(NAME)
        ep_a, ep_b = status_json(NAME, home_a)["endpoint"], status_json(NAME, home_b)["endpoint"]
        assert ep_a.endswith(f":{yaml.safe_load(spec.read_text())['network']['http_port']}")
        assert ep_b == f"http://127.0.0.1:{base_b}"
        for ep in (ep_a, ep_b):
            assert httpx.get(f"{ep}/v1/models", timeout=30.0, trust_env=False).json()["data"][0]["id"] == "sim-dsv41"

        t0 = time.monotonic()
        up_c = run_cli(["up", "--seat", str(spec), "--timeout", "60"], home_c, timeout=120)
        print(f"the colliding `up` was refused in {time.monotonic() - t0:.1f} s (the CLI's start included)")
        out = up_c.stdout + up_c.stderr
        assert up_c.returncode == 1, out
        assert "FAIL ports" in out and "ok cluster" not in out and not (home_c / "clusters").exists()
        assert "ports-free" in out and "network.http_port" in out and "network.dist_init_port" in out
        assert "--port-base " in out and "free there now" in out
    finally:
        with ThreadPoolExecutor(2) as pool:
            downs = list(pool.map(lambda home: run_cli(["down", NAME], home, timeout=180),
                                  [h for h in (home_a, home_b) if (h / "seats" / f"{NAME}.json").exists()]))
    assert all(d.returncode == 0 for d in downs), [d.stdout + d.stderr for d in downs]
    assert len(downs) == 2
    assert alive(started) == [] and in_groups(pgids) == []
