"""`down --local` (issue 24, item 3): without Ray, the engines of the seat's nodes on this host are stopped from the
record's pids and process groups; a node recorded at another host's address is left alone, and `down` names an
unreachable node with its pids instead of waiting on it.

The engines are real processes (each in its own session, as the node agent starts them); no Ray is started.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from pathlib import Path

import psutil
import pytest

from sgl_seat.errors import SeatError
from sgl_seat.launch.seatrecord.home import host_id
from sgl_seat.launch.seatrecord.record import NodeRecord, SeatRecord, load_record, save_record
from sgl_seat.launch.seatrecord.state import SeatState
from sgl_seat.launch.teardown import down_local, same_host, unreachable_line

SEAT = "local-down"
ELSEWHERE = "198.18.250.7"  # an address of no interface here: another host (a network namespace, a machine)


def _engine() -> tuple[subprocess.Popen[bytes], dict[str, object]]:
    """A stand-in engine group: a shell in its own session with a child, as an engine with its schedulers."""
    proc = subprocess.Popen(["sh", "-c", "sleep 300 & wait"], start_new_session=True)
    p = psutil.Process(proc.pid)
    deadline = time.monotonic() + 10  # the shell forks its sleep a moment after it starts
    while len(_members(proc.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.02)
    return proc, {"pid": proc.pid, "create_time": p.create_time(), "ppid": os.getpid(), "pgid": proc.pid,
                  "title": "sh"}


def _node(rank: int, proc: subprocess.Popen[bytes], entry: dict[str, object], ip: str) -> NodeRecord:
    return NodeRecord(node_rank=rank, agent=f"a{rank}", ip=ip, host_id=host_id(), engine_pid=proc.pid,
                      pgid=proc.pid, pids=[proc.pid], processes=[entry])


def _members(pgid: int) -> list[int]:
    out = []
    for p in psutil.process_iter(["pid"]):
        try:
            if os.getpgid(p.pid) == pgid and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p.pid)
        except (ProcessLookupError, psutil.Error):
            continue
    return out


def test_same_host_needs_the_kernel_and_one_of_its_addresses() -> None:
    assert same_host(NodeRecord(node_rank=0, agent="a", ip="127.0.0.1", host_id=host_id()))
    assert same_host(NodeRecord(node_rank=0, agent="a", ip=None, host_id=host_id()))
    assert not same_host(NodeRecord(node_rank=0, agent="a", ip=ELSEWHERE, host_id=host_id()))
    assert not same_host(NodeRecord(node_rank=0, agent="a", ip="127.0.0.1", host_id="other/boot"))


def test_down_local_stops_this_hosts_node_only_and_keeps_the_record(tmp_path: Path,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SGLSEAT_HOME", str(tmp_path))
    here, here_entry = _engine()
    there, there_entry = _engine()
    try:
        save_record(SeatRecord(name=SEAT, state=SeatState.NODE_LOST, engine="sim", draft=False,
                               cluster_address="auto", namespace="ns", pg_name="pg",
                               nodes=[_node(0, here, here_entry, "127.0.0.1"),
                                      _node(1, there, there_entry, ELSEWHERE)]))
        group = _members(here.pid)
        assert len(group) == 2  # the shell and its sleep
        done = down_local(SEAT)
        assert done.nodes == (0,) and done.survivors == [] and done.saved
        assert sorted(done.stopped[0]) == sorted(group)
        assert _members(here.pid) == []
        assert len(_members(there.pid)) == 2  # node 1 is another host's: untouched
        rec = load_record(SEAT)
        assert rec.state is SeatState.FAILED and "`down --local` stopped node(s) 0" in (rec.reason or "")
        assert rec.nodes[0].pgid is None and rec.nodes[0].processes == [] and rec.nodes[0].pids == []
        assert rec.nodes[1].pgid == there.pid  # kept for `down` (or `down --local` on node 1's host)
        again = down_local(SEAT)  # nothing left of node 0: says so, stops nothing
        assert again.stopped == {0: []} and again.survivors == []
        line = unreachable_line(rec, rec.nodes[1], "no answer in 3 s: ActorUnavailableError")
        assert f"node 1 ({ELSEWHERE}) unreachable (no answer in 3 s" in line
        assert f"pids {there.pid}" in line and f"sgl-seat down --local {SEAT}" in line
    finally:
        for p in (here, there):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(p.pid, 9)
            p.wait(timeout=10)
    # A SIGKILLed member is gone once the kernel has run it to its end: under load, a moment after its shell was
    # reaped, the sleep of node 1's group can still be listed.
    deadline = time.monotonic() + 10
    while _members(there.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert _members(there.pid) == []


def test_down_local_on_a_host_without_a_node_of_the_seat_says_where_they_are(tmp_path: Path,
                                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SGLSEAT_HOME", str(tmp_path))
    save_record(SeatRecord(name=SEAT, state=SeatState.NODE_LOST, engine="sim", draft=False, cluster_address="auto",
                           namespace="ns", pg_name="pg",
                           nodes=[NodeRecord(node_rank=0, agent="a0", ip=ELSEWHERE, host_id=host_id(), host="b")]))
    with pytest.raises(SeatError) as exc:
        down_local(SEAT)
    assert f"node 0: {ELSEWHERE} (host b)" in exc.value.message
    assert json.loads((tmp_path / "seats" / f"{SEAT}.json").read_text())["state"] == "NODE-LOST"
