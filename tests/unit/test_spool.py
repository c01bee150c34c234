"""The sample spool (``watchdog/spool.py``): what the sidecar writes as it samples is what its keeper reads back,
oldest first, within twice the rotation size, a torn last line skipped; a spool that cannot be written gives up
without stopping the sampler that feeds it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sgl_seat.core.records import StackSample, ThreadStack
from sgl_seat.errors import FormatVersionError
from sgl_seat.watchdog.spool import CURRENT, HEADER, PREVIOUS, SPOOL_SCHEMA_VERSION, SampleSpool


def _sample(t: float, pid: int = 7) -> StackSample:
    th = ThreadStack.from_json({"name": "MainThread", "thread_id": 1, "frames": [
        {"name": "event_loop_normal", "filename": "scheduler.py", "line": int(t)}]})
    return StackSample(t=t, node=1, pid=pid, title="sglang::scheduler_TP2", rank=2, native=False, threads=(th,),
                       state="S")


def test_what_is_appended_reads_back_oldest_first_since_a_time(tmp_path: Path) -> None:
    spool = SampleSpool(tmp_path)
    for t in (3.0, 1.0, 2.0):
        spool.append(_sample(t))
    got = spool.read()
    assert [s.t for s in got] == [1.0, 2.0, 3.0]
    assert got[0] == _sample(1.0)  # the whole record, stacks included
    assert [s.t for s in spool.read(since=2.0)] == [2.0, 3.0]


def test_it_rotates_into_two_files_and_keeps_the_newest(tmp_path: Path) -> None:
    one = SampleSpool(tmp_path / "x")
    (tmp_path / "x").mkdir()
    one.append(_sample(0.0))
    size = (tmp_path / "x" / CURRENT).stat().st_size
    spool = SampleSpool(tmp_path, max_bytes=3 * size + 1)  # three samples a file
    for t in range(10):
        spool.append(_sample(float(t)))
    assert (tmp_path / PREVIOUS).exists()
    assert (tmp_path / CURRENT).stat().st_size <= 3 * size + 1
    ts = [s.t for s in spool.read()]
    assert ts == sorted(ts) and ts[-1] == 9.0 and 3 <= len(ts) <= 6 and 0.0 not in ts, ts


def test_a_torn_last_line_is_skipped(tmp_path: Path) -> None:
    spool = SampleSpool(tmp_path)
    spool.append(_sample(1.0))
    spool.append(_sample(2.0))
    data = (tmp_path / CURRENT).read_bytes()
    (tmp_path / CURRENT).write_bytes(data[: len(data) - 40])  # the writer killed in the middle of its last line
    assert [s.t for s in spool.read()] == [1.0]


def test_a_spool_that_cannot_be_written_gives_up_quietly(tmp_path: Path) -> None:
    spool = SampleSpool(tmp_path / "gone")  # its directory does not exist
    spool.append(_sample(1.0))
    spool.append(_sample(2.0))
    assert spool.read() == [] and not (tmp_path / "gone").exists()


def test_the_sidecar_spools_every_sample_its_sampler_takes(tmp_path: Path) -> None:
    """The sidecar's sample hook (what its sampler calls for each sample) appends to its spool: the keeper's
    history is what the sidecar took, sample for sample."""
    from sgl_seat.watchdog.config import SidecarConfig
    from sgl_seat.watchdog.sampler import Sampler
    from sgl_seat.watchdog.sidecar import Sidecar

    cfg = SidecarConfig(seat="s", node=1, nnodes=2, thresholds={}, bundle_dir=str(tmp_path / "b"))
    sampler = Sampler(node=1, discover=lambda: [], pyspy=False)
    sc = Sidecar(cfg, sampler=sampler, spool=SampleSpool(tmp_path))
    taken = [_sample(1.0), _sample(2.0, pid=8)]
    sampler.add_samples(taken)  # what the sampler's loop does with each dump: into its ring, then the hook
    assert SampleSpool(tmp_path).read() == taken
    assert sc.exporter.registry.get_sample_value("sgl_seat_watchdog_samples_total", {"node": "1"}) == 2.0


def test_the_first_append_writes_the_spools_version_and_its_lines_stay_samples(tmp_path: Path) -> None:
    spool = SampleSpool(tmp_path, max_bytes=1)  # every append rotates: the header is not a sample file
    spool.append(_sample(1.0))
    spool.append(_sample(2.0))
    assert json.loads((tmp_path / HEADER).read_text()) == {"schema_version": SPOOL_SCHEMA_VERSION}
    assert SPOOL_SCHEMA_VERSION == 1
    assert StackSample.from_json(json.loads((tmp_path / CURRENT).read_text())) == _sample(2.0)
    assert [s.t for s in spool.read()] == [1.0, 2.0]


def test_a_spool_without_a_header_is_version_1_and_read(tmp_path: Path) -> None:
    """The release before wrote no header: a keeper of this one reads such a spool."""
    spool = SampleSpool(tmp_path)
    spool.append(_sample(1.0))
    (tmp_path / HEADER).unlink()
    assert [s.t for s in SampleSpool(tmp_path).read()] == [1.0]


@pytest.mark.parametrize(("header", "found"), [('{"schema_version": 2}', "2"), ('{"schema_version": "1"}', "'1'"),
                                               ('{"schema_version": true}', "True"), ("[1]", "'[1]'")])
def test_a_spool_of_another_version_is_refused_in_words(tmp_path: Path, header: str, found: str) -> None:
    spool = SampleSpool(tmp_path)
    spool.append(_sample(1.0))
    (tmp_path / HEADER).write_text(header)
    with pytest.raises(FormatVersionError) as err:
        spool.read()
    text = str(err.value)
    assert f"{tmp_path / HEADER}: schema_version {found} is not one this sgl-seat reads (it reads 1;" in text
    assert "fix: " in text and "one sgl-seat version" in text
