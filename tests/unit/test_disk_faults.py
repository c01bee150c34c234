"""Disk and home-directory faults (issue 24, item 4): ``$SGLSEAT_HOME`` full during a capture and read-only at `up`.

The full disk is a real one: a 1 MiB tmpfs mounted as ``$SGLSEAT_HOME`` (these tests run as root in CI; where
``mount`` is not permitted they skip and say so), filled by the watchdog sidecar's own capture path (its
``_capture`` with a recorded node part: no engine, no py-spy, no Ray) until the disk refuses a bundle. What must
hold then: nothing under the bundles directory looks complete unless it is (every non-dot directory verifies), the
cut-short capture stays as ``.incomplete-<id>`` with what is missing, and the sidecar's snapshot (what `status`
and `watch` read) and its exporter say so. The read-only home is a ``mount -o ro`` tmpfs, refused by `up` before
a cluster is started or contacted.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import subprocess
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from sgl_seat.errors import HomeError
from sgl_seat.forensics.format import layout
from sgl_seat.forensics.format.bundle import verify_bundle
from sgl_seat.forensics.format.store import list_bundles
from sgl_seat.launch.seatrecord.home import ensure_writable
from sgl_seat.watchdog import capture as cap
from sgl_seat.watchdog.config import SidecarConfig
from sgl_seat.watchdog.sampler import Sampler
from sgl_seat.watchdog.sidecar import Sidecar
from tests.cli_runner import run_cli

SEAT = "disk-seat"
#: Words for a log tail that neither compresses nor looks like a secret to the scrubber (no long hex/base64 runs).
WORDS = ("scheduler", "prefill", "decode", "batch", "tokens", "running", "queue", "cache", "hit", "rank")


@contextlib.contextmanager
def tmpfs(where: Path, options: str) -> Iterator[Path]:
    """A tmpfs mounted at ``where`` for the test's duration (unmounted in any case); skips where mount is refused."""
    where.mkdir(parents=True, exist_ok=True)
    try:
        res = subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(where)], capture_output=True,
                             text=True, timeout=30, check=False)
    except OSError as exc:
        pytest.skip(f"cannot run mount ({exc})")
    if res.returncode != 0:
        pytest.skip(f"mount -t tmpfs is not permitted here (needs root): {res.stderr.strip()[:200]}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True, timeout=30, check=False)


def _log_tail(n_bytes: int, seed: int) -> str:
    rnd = random.Random(seed)
    lines = []
    size = 0
    while size < n_bytes:
        ln = f"[{seed}:{len(lines)}] " + " ".join(rnd.choice(WORDS) + str(rnd.randrange(10_000)) for _ in range(12))
        lines.append(ln)
        size += len(ln) + 1
    return "\n".join(lines) + "\n"


def _sidecar(bundles: Path, log_bytes: int) -> Sidecar:
    """A node-0 sidecar of a one-node seat whose captures carry a recorded part with a large log tail."""
    cfg = SidecarConfig(seat=SEAT, node=0, nnodes=1, thresholds={}, bundle_dir=str(bundles), quota_mb=2048,
                        gpu=False)
    sc = Sidecar(cfg, sampler=Sampler(node=0, discover=lambda: [], pyspy=False))
    calls = {"n": 0}

    def part(capture_id: str, t: float, *, dump_timeout_s: float | None = None) -> dict[str, Any]:
        calls["n"] += 1
        return cap.node_part(node=0, procs=[], pyspy=None, samples=[], probes=[], metrics=[], logs=[], processes=[],
                             log_text=_log_tail(log_bytes, calls["n"]), env={}, gpu=False)

    sc.part = part  # type: ignore[method-assign]  # the recorded input: the seam between sampling and writing
    return sc


def _capture(sc: Sidecar, t: float) -> dict[str, Any]:
    sc.latched_at = sc.latched_by = None  # each capture its own hang: the test drives them one after another
    return sc.coordinate({"t": t, "source": "manual", "node": 0})


def _value(sc: Sidecar, name: str, **labels: str) -> float | None:
    v = sc.exporter.registry.get_sample_value(name, {"node": "0", **labels})
    return None if v is None else float(v)


def _fill(path: Path) -> None:
    """Take every free byte of the filesystem at ``path`` (a file written until ENOSPC)."""
    with open(path, "wb", buffering=0) as f:
        for chunk in (1 << 16, 4096, 1):
            with contextlib.suppress(OSError):
                while True:
                    f.write(b"\0" * chunk)


def test_a_full_home_during_capture_leaves_no_bundle_that_claims_to_be_complete(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN $SGLSEAT_HOME on a 1 MiB tmpfs and a sidecar whose captures are ~300 KB each
    WHEN it captures until the disk refuses a bundle
    THEN every bundle under its own name verifies whole, the refused one is only a `.incomplete-<id>` directory
    whose INCOMPLETE.json lists the missing files, `bundle ls` shows only complete bundles, and the snapshot and
    the exporter report a disk-full failure; WHEN the disk then has no byte left at all THEN the next capture is
    still reported, its dot directory named, with no room for a marker."""
    with tmpfs(tmp_path / "home", "size=1m") as home:
        monkeypatch.setenv("SGLSEAT_HOME", str(home))
        bundles = layout.seat_bundles_dir(SEAT)
        sc = _sidecar(bundles, 300_000)
        try:
            results = []
            for i in range(8):
                results.append(_capture(sc, 1000.0 + i))
                if results[-1]["status"] == "error":
                    break
            ok = [r for r in results if r["status"] == "ok"]
            failed = results[-1]
            assert ok and failed["status"] == "error", results  # some fit, then the disk was full
            assert failed["reason"] == "disk-full", failed
            inc = failed["incomplete"]
            assert inc["missing"] and layout.MANIFEST in inc["missing"], inc
            names = sorted(os.listdir(bundles))
            complete = [n for n in names if not n.startswith(".")]
            assert sorted(complete) == sorted(r["bundle_id"] for r in ok), names
            for n in complete:
                verify_bundle(bundles / n)  # each one under its own name is whole
            left = Path(inc["path"])
            assert left.name == f"{layout.INCOMPLETE_PREFIX}{failed['bundle_id']}" and left.parent == bundles
            assert not (left / layout.MANIFEST).exists()
            assert not (bundles / failed["bundle_id"]).exists()
            assert inc["marker"] is True
            marker = json.loads((left / layout.INCOMPLETE).read_text())
            assert marker["state"] == "failed" and marker["reason"] == "disk-full" and marker["errno"] == "ENOSPC"
            assert marker["missing"] == inc["missing"] and marker["written"] == inc["written"]
            listed = list_bundles()
            assert {s.bundle_id for s in listed} == set(complete) and all(s.error is None for s in listed)

            snap = sc.snapshot()
            (f,) = snap["capture_failures"]
            assert (f["bundle_id"], f["reason"], f["path"]) == (failed["bundle_id"], "disk-full", str(left))
            assert f["missing"] == inc["missing"]
            assert _value(sc, "sgl_seat_watchdog_capture_failures_total", reason="disk-full") == 1.0
            assert _value(sc, "sgl_seat_watchdog_capture_failures_total", reason="read-only") == 0.0
            assert _value(sc, "sgl_seat_watchdog_last_capture_failed") == 1.0
            assert _value(sc, "sgl_seat_watchdog_captures_total", result="error") == 1.0

            # Not a byte left: even the marker has no room; the dot directory stays, and is reported.
            _fill(home / "filler")
            again = _capture(sc, 2000.0)
            assert again["status"] == "error" and again["reason"] == "disk-full"
            where = Path(again["incomplete"]["path"])
            assert where.parent == bundles and where.name.startswith(".") and where.is_dir()
            assert again["incomplete"]["marker"] is False and not (where / layout.INCOMPLETE).exists()
            assert not (bundles / again["bundle_id"]).exists()
            assert len(sc.snapshot()["capture_failures"]) == 2
            assert _value(sc, "sgl_seat_watchdog_capture_failures_total", reason="disk-full") == 2.0
            assert sorted(n for n in os.listdir(bundles) if not n.startswith(".")) == sorted(complete)
        finally:
            sc.exporter.close()


def test_a_capture_that_fits_again_clears_the_failure_gauge(tmp_path: Path) -> None:
    """GIVEN a sidecar whose last capture failed WHEN the next one is written THEN last_capture_failed is 0 while
    the failure counter keeps its count (an alert on the gauge clears; a rate over the counter still shows it)."""
    sc = _sidecar(tmp_path / "bundles", 1000)
    try:
        sc.exporter.capture_done("disk-full")
        assert _value(sc, "sgl_seat_watchdog_last_capture_failed") == 1.0
        assert _capture(sc, 10.0)["status"] == "ok"
        assert _value(sc, "sgl_seat_watchdog_last_capture_failed") == 0.0
        assert _value(sc, "sgl_seat_watchdog_capture_failures_total", reason="disk-full") == 1.0
        assert sc.snapshot()["capture_failures"] == []
    finally:
        sc.exporter.close()


def test_a_read_only_home_is_a_clear_error(tmp_path: Path) -> None:
    """GIVEN a home on a read-only mount (root ignores mode bits, a mount it cannot) THEN HomeError naming the
    path and SGLSEAT_HOME; a missing home is created; a home that is a file is refused too."""
    with tmpfs(tmp_path / "ro", "ro,size=1m") as ro:
        with pytest.raises(HomeError) as err:
            ensure_writable(ro)
        assert str(ro) in err.value.message and "read-only" in err.value.message
        assert err.value.fix is not None and "SGLSEAT_HOME" in err.value.fix
        with pytest.raises(HomeError):
            ensure_writable(ro / "sub")  # cannot even be created
    fresh = tmp_path / "new" / "home"
    assert ensure_writable(fresh) == fresh and fresh.is_dir() and list(fresh.iterdir()) == []
    (tmp_path / "afile").write_text("x")
    with pytest.raises(HomeError):
        ensure_writable(tmp_path / "afile")


def test_up_on_a_read_only_home_stops_before_any_cluster_work(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """GIVEN $SGLSEAT_HOME on a read-only mount WHEN `sgl-seat up` THEN exit 1 with the path and what to do, and
    neither a local cluster was started nor any cluster contacted (both seams stubbed to record calls)."""
    from sgl_seat.launch import cluster, placement
    from sgl_seat.launch.host import localcluster

    called: list[str] = []

    def stub(name: str) -> Any:
        def f(*a: Any, **k: Any) -> Any:
            called.append(name)
            raise AssertionError(f"{name} called on a read-only home")
        return f

    monkeypatch.setattr(localcluster, "start_local_cluster", stub("start_local_cluster"))
    monkeypatch.setattr(cluster, "connect", stub("connect"))
    monkeypatch.setattr(placement, "create_group", stub("create_group"))
    with tmpfs(tmp_path / "ro", "ro,size=1m") as ro:
        monkeypatch.setenv("SGLSEAT_HOME", str(ro))
        monkeypatch.chdir(tmp_path)
        code = run_cli(["up", "--seat", "local-sim"], monkeypatch)
        err = capsys.readouterr().err
    assert code == 1, err
    assert called == []
    assert "read-only" in err and str(ro) in err and "SGLSEAT_HOME" in err
    assert "Traceback" not in err


def _recorded_seat_with_a_process(home: Path) -> subprocess.Popen[bytes]:
    """A seat record (no Ray: never connected) whose node 0 engine group is a real process this test started."""
    from sgl_seat.launch.seatrecord.home import host_id
    from sgl_seat.launch.seatrecord.record import NodeRecord, SeatRecord, save_record
    from sgl_seat.launch.seatrecord.state import SeatState

    proc = subprocess.Popen(["sleep", "120"], start_new_session=True)
    import psutil

    ctime = psutil.Process(proc.pid).create_time()
    rec = SeatRecord(name=SEAT, state=SeatState.READY, engine="sim", draft=False, cluster_address="local",
                     namespace="ns", pg_name="pg", nodes=[NodeRecord(
                         node_rank=0, agent="a0", host_id=host_id(), engine_pid=proc.pid, pgid=proc.pid,
                         processes=[{"pid": proc.pid, "create_time": ctime, "ppid": 1, "pgid": proc.pid,
                                     "title": "sleep"}])])
    os.environ["SGLSEAT_HOME"] = str(home)
    save_record(rec)
    return proc


@pytest.mark.parametrize("fault", ["read-only", "full"])
def test_down_on_a_home_that_takes_no_write_still_stops_the_seat_and_says_what_is_left(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str],
        caplog: pytest.LogCaptureFixture, fault: str) -> None:
    """GIVEN a recorded seat with a live engine process group, then its home made read-only (remounted) or full
    WHEN `sgl-seat down` THEN the process group is gone in both cases; on a full home the record is removed (an
    unlink needs no space) and `down` succeeds, saying the STOPPING state could not be saved; on a read-only home
    `down` exits 1 saying the seat is down but its record could not be removed, and how to finish; no traceback.
    Then `status` on the read-only home still answers (shown, not saved)."""
    with tmpfs(tmp_path / "home", "size=1m") as home:
        monkeypatch.setenv("SGLSEAT_HOME", str(home))
        monkeypatch.chdir(tmp_path)
        proc = _recorded_seat_with_a_process(home)
        try:
            if fault == "read-only":
                subprocess.run(["mount", "-o", "remount,ro", str(home)], check=True, timeout=30)
            else:
                with contextlib.suppress(OSError), (home / "filler").open("wb") as fh:
                    while True:
                        fh.write(b"\0" * 65536)
            code = run_cli(["down", SEAT], monkeypatch)
            err = capsys.readouterr().err
            assert proc.wait(timeout=30) is not None, "the engine group survived `down`"
            assert "Traceback" not in err, err
            record = home / "seats" / f"{SEAT}.json"
            if fault == "full":
                assert code == 0, err
                assert not record.exists()
            else:
                assert code == 1, err
                assert "is down" in err and "read-only" in err and "could not be removed" in err, err
                assert record.exists()
                code = run_cli(["status", SEAT, "--json"], monkeypatch)
                out = capsys.readouterr()
                assert code == 0, out.err
                assert json.loads(out.out)["name"] == SEAT
                # the warning, on stderr from the CLI (logging's last resort; pytest captures it as a record)
                assert any("not saved" in r.getMessage() and "read-only" in r.getMessage() for r in caplog.records)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
            proc.wait(timeout=10)
