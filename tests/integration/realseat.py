"""Helpers for the modules that bring real SGLang 0.5.23 up through `sgl-seat` (stream ``sglang``).

The engine is SGLang's own server on its CPU engine (the ``local-sglang`` profile: two nodes, one TP rank each,
gloo, the trained SmolLM2-135M-Instruct in float32: ``sgl_seat/engines/trainedmodel.py``). Under ``CI=true`` a
missing engine environment FAILS a module (`scripts/setup.sh --engine sglang` makes it); elsewhere it skips.
Processes are found by the pids and process groups the seat reported and by the seat's name that every engine process
carries in its environment (SGLSEAT_NAME), never by a name pattern.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import psutil
import pytest
import yaml
from launchutil import (
    CLI_S,
    REPO,
    Proc,
    alive,
    descendants,
    engine_pgids,
    in_groups,
    run_cli,
    seat_processes,
    status_json,
)

from sgl_seat.engines.base import engine_venv
from sgl_seat.forensics.format.store import complete_bundles
from sgl_seat.spec import WatchdogSpec
from tests.tiers import by_tier

LOCAL_SGLANG = REPO / "launch" / "seats" / "local-sglang.yaml"
#: The served model's name, as the profile says it (requests name it).
MODEL: str = yaml.safe_load(LOCAL_SGLANG.read_text())["model"]["served_name"]
UP_TIMEOUT_S = 600


def longest_lookback_s(wd: WatchdogSpec | None = None) -> float:
    """The longest stretch any detector looks back over before it fires, at the seat's thresholds (the defaults:
    the stack and no-progress detectors' 5 s)."""
    wd = wd or WatchdogSpec()
    return max(wd.no_progress_s, wd.stack_unchanged_samples / wd.sample_hz, wd.rowfetch_inflight_s, wd.stopped_s)


def idle_window_s() -> float:
    """How long an idle seat is watched for a false bundle: six times the longest detector look-back in the CI tier
    (every detector has seen that window whole several times over), 3 minutes in the full tier."""
    return by_tier(6 * longest_lookback_s(), 180.0)


def engine_ready() -> str | None:
    """None when the engine's environment is installed, else why not."""
    venv = Path(engine_venv())
    if not (venv / "bin" / "python").is_file() or not (venv / ".sgl-seat-stamp").is_file():
        return f"the engine environment {venv} is not installed (bash scripts/setup.sh --engine sglang)"
    return None


def require_engine() -> None:
    why = engine_ready()
    if why is None:
        return
    if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
        pytest.fail(f"CI=true and {why}: the real-engine tests must run in CI")
    pytest.skip(why)


def write_spec(directory: Path, name: str, *, http_port: int, dist_port: int, **over: Any) -> Path:
    """The local-sglang profile as ``name`` on the given ports; ``over`` replaces top-level keys, and a key
    ``a.b`` one key of a section."""
    doc: dict[str, Any] = yaml.safe_load(LOCAL_SGLANG.read_text())
    doc["name"] = name
    doc["network"]["http_port"], doc["network"]["dist_init_port"] = http_port, dist_port
    for key, value in over.items():
        section, _, sub = key.partition(".")
        if sub:
            doc.setdefault(section, {})[sub] = value
        else:
            doc[key] = value
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def engine_processes(seat: str) -> list[Proc]:
    """Every process on this host that belongs to ``seat``'s engine (``launchutil.seat_processes``)."""
    return seat_processes(seat)


class RealSeat:
    """A module's seat: its home, its `up` output, and every process it was seen with."""

    def __init__(self, home: Path, spec: Path, name: str, http_port: int) -> None:
        self.home, self.spec, self.name, self.http_port = home, spec, name, http_port
        self.up_stdout = ""
        self.seen: list[Proc] = []
        self.pgids: list[int] = []

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    def status(self) -> dict[str, Any]:
        return status_json(self.name, self.home)

    def remember(self) -> dict[str, Any]:
        st = self.status()
        self.pgids = sorted(set(self.pgids) | set(engine_pgids(st)))
        for n in st["nodes"]:
            if n.get("engine_pid"):
                self.seen += descendants(n["engine_pid"])
        self.seen += in_groups(self.pgids)
        return st


def scheduler_pids(seat: RealSeat) -> dict[int, int]:
    """Each TP rank's scheduler pid, as `status` reports it."""
    return {n["ranks"][0]["tp_rank"]: n["ranks"][0]["pid"] for n in seat.remember()["nodes"]}


def seat_bundles(seat: RealSeat) -> set[Path]:
    """The seat's complete bundles on disk."""
    return complete_bundles(seat.home / "bundles" / seat.name)


def watch_once(seat: RealSeat) -> dict[str, Any]:
    """`sgl-seat watch --once --json` of the seat."""
    res = run_cli(["watch", seat.name, "--once", "--json"], seat.home, timeout=CLI_S)
    assert res.returncode == 0, res.stderr
    doc: dict[str, Any] = json.loads(res.stdout)
    return doc


@contextlib.contextmanager
def brought_up(rs: RealSeat, *up_args: str) -> Iterator[RealSeat]:
    """`up` the seat (``up_args`` added: ``--draft on``; failing the module if it does not reach READY), yield it,
    and always `down` it: a process left stopped is resumed first (it must drain), and every process it was seen with
    must be gone after."""
    try:
        # Inside the try: a run interrupted during `up` (Ctrl-C, a stream stopped) still takes the seat down.
        up = run_cli(["up", "--seat", str(rs.spec), *up_args, "--timeout", str(UP_TIMEOUT_S)], rs.home,
                     timeout=UP_TIMEOUT_S + 60)
        rs.up_stdout = up.stdout
        print(up.stdout)
        assert up.returncode == 0, f"`up` failed:\n{up.stdout}\n{up.stderr}"
        rs.remember()
        yield rs
    finally:
        for p in engine_processes(rs.name):
            with contextlib.suppress(psutil.Error):
                psutil.Process(p.pid).resume()
        down = run_cli(["down", rs.name], rs.home, timeout=240)
        print(down.stdout, down.stderr)
        left = alive(rs.seen) + in_groups(rs.pgids) + engine_processes(rs.name)
        assert not left, f"`down` left processes of the real engine behind: {left}"
