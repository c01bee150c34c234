"""Real SGLang 0.5.23 seats that `up` must refuse, and the seat whose idle schedulers spin (``local-sglang``).

The CI tier's real SGLang seat, brought up, served, watched, faulted and taken down, is
test_real_sglang_watchdog's (one seat: each real seat's start costs 1-3 minutes of both cores). Here:

* `up` without the engine environment fails in preflight, before any cluster starts (CI tier: seconds);
* full tier: a flag SGLang itself refuses, quoted from its own error;
* full tier: a seat without ``--sleep-on-idle`` (its idle schedulers spin in their poll loop, most of a core each:
  the watchdog must not take that for a hang) idle over the idle window with no bundle.

The seats that must fail to start run first (never beside the spinning one: one local Ray cluster at a time).
Processes are checked by the pids and process groups the seat reported, and by the seat's name that every engine
process carries in its environment (SGLSEAT_NAME), never by a name pattern. Under ``CI=true`` a missing engine
environment FAILS the module (`scripts/setup.sh --engine sglang` makes it); elsewhere it skips with the reason.
Stream ``sglang`` (tests/integration/conftest.py); ports 24100-24199.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from launchutil import CLI_S, run_cli
from realseat import (
    LOCAL_SGLANG,
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
    assert run_cli(["status", "rs-noenv", "--json"], home, timeout=CLI_S).returncode != 0


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
    # not take for a hang.
    spec = _write_spec(base, "rs-real", **{"cpu.sleep_on_idle": False})
    rs = RealSeat(base / "home", spec, "rs-real", HTTP_PORT)
    with brought_up(rs):
        yield rs


@pytest.mark.slow  # full tier only (README, "The tests")
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
