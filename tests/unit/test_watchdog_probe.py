"""The probe: target parsing, wrapping (now and on import), the lock-free ring and its reader."""

from __future__ import annotations

import struct
import sys
import textwrap
import threading
import time
import types
from pathlib import Path

import pytest

from sgl_seat import probe
from sgl_seat.core.records import ProbeRecord
from tests.unit.conftest import probe_writer


@pytest.fixture(params=["native", "python"])
def ring_dir(request: pytest.FixtureRequest, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A ring directory, once with each writer: every ring test holds for both."""
    d = tmp_path / "rings"
    monkeypatch.setenv(probe.ENV_DIR, str(d))
    monkeypatch.setenv(probe.ENV_SLOTS, "64")
    monkeypatch.setenv(probe.ENV_RANK, "3")
    # Host timing only: on a GPU machine an earlier test leaves CUDA initialised, and the auto mode would then
    # time these calls on the GPU too (their records change as the reader resolves them).
    monkeypatch.setenv(probe.ENV_GPU, "0")
    probe_writer(request.param, monkeypatch)
    probe.reset()
    yield d
    probe.reset()


def test_native_writer_builds_here() -> None:
    """Where a C compiler and the interpreter's headers are (CI has both), the C writer builds and loads: a C
    source that stopped compiling would otherwise pass every test on the Python writer."""
    import shutil
    import sysconfig

    headers = Path(sysconfig.get_paths()["include"]) / "Python.h"
    if (shutil.which("cc") is None and shutil.which("gcc") is None) or not headers.exists():
        pytest.skip("no C compiler or no Python.h here: the Python writer is used")
    assert probe.writer._native() is not None, probe.native_state()
    assert probe.native_state().startswith("native (")


def _module(name: str, src: str) -> types.ModuleType:
    mod = types.ModuleType(name)
    exec(compile(textwrap.dedent(src), f"<{name}>", "exec"), mod.__dict__)
    sys.modules[name] = mod
    return mod


def _records(ring_dir: Path) -> list[ProbeRecord]:
    path = probe.ring_file()
    assert path is not None and Path(path).parent == ring_dir
    return probe.read_ring(path, node=1, record=ProbeRecord)


def test_the_rings_own_record_has_the_fields_of_the_cores_probe_record() -> None:
    """The probe (standard library only) cannot name the core's ProbeRecord, so its reader makes a RingRecord of the
    same fields, or a ProbeRecord where the sidecar passes ``record=ProbeRecord``: the two lists must stay one."""
    import dataclasses

    assert [(f.name, f.default) for f in dataclasses.fields(probe.RingRecord)] == \
        [(f.name, f.default) for f in dataclasses.fields(ProbeRecord)]


def test_parse_target_forms() -> None:
    t = probe.parse_target("sgl_seat.sim.rowfetch:fetch_rows@ids")
    assert (t.module, t.qualname, t.size_arg, t.mode) == ("sgl_seat.sim.rowfetch", "fetch_rows", "ids", "len")
    t = probe.parse_target("sglang.srt.layers.engram:EngramEmbedding.forward@indices:numel")
    assert (t.qualname, t.size_arg, t.mode) == ("EngramEmbedding.forward", "indices", "numel")
    t = probe.parse_target("pkg.mod.func@2:dim0")
    assert (t.module, t.qualname, t.size_arg, t.mode) == ("pkg.mod", "func", 2, "dim0")
    assert probe.parse_target("a.b:c@").mode == "none"
    assert probe.parse_target("a.b:c").size_arg is None
    t = probe.parse_target("a.b:C.forward@:beat")
    assert (t.mode, t.size_arg, t.beat, t.name) == ("beat", None, True, "a.b:C.forward@beat")
    for bad in ("nodots", "a.b:c@x:bogus", "a b:c", ":c", "a.b:c@1x", "a.b:c@x:beat"):
        with pytest.raises(ValueError):
            probe.parse_target(bad)


def test_wrapped_calls_land_in_the_ring(ring_dir: Path) -> None:
    mod = _module("probe_t1", """
        def fetch_rows(table, ids):
            return list(ids)
    """)
    state = probe.install(["probe_t1:fetch_rows@ids"])
    assert state["probe_t1:fetch_rows@ids"] == "installed"
    assert getattr(mod.fetch_rows, "__sgl_seat_probe__", None) == "probe_t1:fetch_rows"
    t0 = time.time()
    assert mod.fetch_rows(None, [1, 2, 3]) == [1, 2, 3]
    assert mod.fetch_rows(None, ids=range(5)) == [0, 1, 2, 3, 4]
    recs = [r for r in _records(ring_dir) if r.target == "probe_t1:fetch_rows"]
    assert [r.gather_size for r in recs] == [3, 5]
    assert all(r.rank == 3 and r.node == 1 and r.end is not None and t0 <= r.start <= r.end for r in recs)
    assert recs[0].thread == threading.get_ident()
    assert recs[0].seq < recs[1].seq
    # installing again is a no-op, not a double wrap
    probe.install(["probe_t1:fetch_rows@ids"])
    assert not hasattr(mod.fetch_rows.__wrapped__, "__sgl_seat_probe__")


def test_a_heartbeat_writes_instant_records_at_most_every_tenth_of_a_second_and_is_never_gated(
        ring_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A ``beat`` target's calls write instants (start = end, no gather size, the name ``...@beat``), throttled per
    process; a rehearsal fault aimed at every target neither stalls a beat nor counts it (``after_calls``)."""
    from sgl_seat.probe import beat

    monkeypatch.setenv(probe.ENV_REHEARSAL, "1")
    monkeypatch.setenv(probe.ENV_FAULTS, "probe-stall:for_s=30")  # any target, the next call
    monkeypatch.setattr(beat, "_last_ns", 0)
    mod = _module("probe_beat1", """
        class Layer:
            def forward(self, x):
                return x + 1
    """)
    assert probe.install(["probe_beat1:Layer.forward@:beat"])["probe_beat1:Layer.forward@:beat"] == "installed"
    layer = mod.Layer()
    t0 = time.time()
    for i in range(200):  # a burst well within 0.1 s: one beat
        assert layer.forward(i) == i + 1
    assert time.time() - t0 < 10.0  # not stalled by the armed fault (it would hold the first call 30 s)
    time.sleep(beat.BEAT_EVERY_S + 0.02)
    assert layer.forward(0) == 1  # the next beat
    recs = [r for r in _records(ring_dir) if r.target.endswith("@beat")]
    assert [r.target for r in recs] == ["probe_beat1:Layer.forward@beat"] * 2
    assert all(r.end == r.start and r.gather_size == -1 and r.start >= t0 for r in recs)
    assert recs[1].start - recs[0].start >= beat.BEAT_EVERY_S


def test_in_flight_call_is_visible_with_its_age(ring_dir: Path) -> None:
    mod = _module("probe_t2", """
        import threading
        gate = threading.Event()
        def fetch_rows(ids):
            gate.wait(10)
            return len(ids)
    """)
    probe.install(["probe_t2:fetch_rows"])
    th = threading.Thread(target=mod.fetch_rows, args=([0] * 96,))
    th.start()
    try:
        deadline = time.time() + 5
        infl: list[ProbeRecord] = []
        while time.time() < deadline and not infl:
            time.sleep(0.02)
            if probe.ring_file():
                infl = [r for r in _records(ring_dir) if r.target == "probe_t2:fetch_rows" and r.end is None]
        assert len(infl) == 1 and infl[0].gather_size == 96 and infl[0].thread == th.ident
        time.sleep(0.1)
        assert infl[0].duration(time.time()) >= 0.1
    finally:
        mod.gate.set()
        th.join()
    done = [r for r in _records(ring_dir) if r.target == "probe_t2:fetch_rows"]
    assert len(done) == 1 and done[0].end is not None


def test_exception_still_records_end_and_propagates(ring_dir: Path) -> None:
    mod = _module("probe_t3", """
        def fetch_rows(ids):
            raise KeyError("boom")
    """)
    probe.install(["probe_t3:fetch_rows"])
    with pytest.raises(KeyError):
        mod.fetch_rows([1])
    (rec,) = [r for r in _records(ring_dir) if r.target == "probe_t3:fetch_rows"]
    assert rec.end is not None


def test_import_hook_wraps_a_module_imported_later(ring_dir: Path, tmp_path: Path,
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    pkg = tmp_path / "src" / "probe_pkg_late"
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "rows.py").write_text(textwrap.dedent("""
        class Table:
            def gather(self, indices):
                return len(indices)
            @staticmethod
            def helper(ids):
                return 7
            @classmethod
            def make(cls, ids):
                return cls
    """))
    monkeypatch.syspath_prepend(str(tmp_path / "src"))
    state = probe.install(["probe_pkg_late.rows:Table.gather@indices", "probe_pkg_late.rows:Table.helper",
                           "probe_pkg_late.rows:Table.make@ids"])
    assert set(state.values()) >= {"pending"}
    import probe_pkg_late.rows as rows

    assert probe.installed()["probe_pkg_late.rows:Table.gather@indices"] == "installed"
    assert rows.Table().gather([1, 2]) == 2 and rows.Table.helper([1]) == 7
    assert rows.Table.make([1, 2, 3]) is rows.Table and rows.Table().make([4]) is rows.Table
    sizes = {(r.target.rsplit(".", 1)[1], r.gather_size) for r in _records(ring_dir)}
    assert sizes == {("gather", 2), ("helper", 1), ("make", 3), ("make", 1)}  # bound like the functions they wrap
    for m in ("probe_pkg_late.rows", "probe_pkg_late"):
        sys.modules.pop(m, None)


def test_missing_attribute_and_bad_spec_fail_softly(ring_dir: Path) -> None:
    _module("probe_t4", "x = 1\n")
    state = probe.install(["probe_t4:nope", "probe_t4:x", "not a target"])
    assert state["probe_t4:nope"].startswith("failed")
    assert state["probe_t4:x"].startswith("failed")
    assert state["not a target"].startswith("failed")


def test_unwritable_ring_dir_leaves_calls_untouched(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    monkeypatch.setenv(probe.ENV_DIR, str(blocker / "sub"))
    probe.reset()
    mod = _module("probe_t5", "def f(ids):\n    return sum(ids)\n")
    probe.install(["probe_t5:f"])
    assert mod.f([1, 2]) == 3 and mod.f([3]) == 3
    assert "cannot create the probe ring" in capsys.readouterr().err
    probe.reset()


def test_ring_wraps_and_keeps_the_newest(ring_dir: Path) -> None:
    mod = _module("probe_t6", "def f(ids):\n    return 0\n")
    probe.install(["probe_t6:f"])
    for i in range(200):
        mod.f([0] * i)
    recs = [r for r in _records(ring_dir) if r.target == "probe_t6:f"]
    assert len(recs) <= 64
    assert recs[-1].gather_size == 199
    sizes = [r.gather_size for r in recs]
    assert sizes == sorted(sizes)


def test_reader_skips_a_torn_slot(ring_dir: Path) -> None:
    mod = _module("probe_t7", "def f(ids):\n    return 0\n")
    probe.install(["probe_t7:f"])
    mod.f([1])
    mod.f([1, 2])
    path = probe.ring_file()
    assert path is not None
    before = probe.read_ring(path)
    last = before[-1]
    slot = (last.seq & 63) + probe.HEADER_BYTES // probe.SLOT_BYTES
    with open(path, "r+b") as fh:  # a writer caught mid-update: odd sequence word
        fh.seek(slot * probe.SLOT_BYTES)
        fh.write(struct.pack("<q", 2 * last.seq + 1))
    after = probe.read_ring(path)
    assert last.seq not in {r.seq for r in after}
    assert len(after) == len(before) - 1


def test_reader_refuses_other_files(tmp_path: Path) -> None:
    bad = tmp_path / "x.ring"
    bad.write_bytes(b"\0" * 8192)
    with pytest.raises(probe.RingError):
        probe.read_ring(str(bad))
    short = tmp_path / "y.ring"
    short.write_bytes(b"SGLPRB01")
    with pytest.raises(probe.RingError):
        probe.read_ring(str(short))


def test_list_rings(tmp_path: Path) -> None:
    (tmp_path / "probe-12.ring").write_bytes(b"")
    (tmp_path / "probe-x.ring").write_bytes(b"")
    (tmp_path / "other").write_bytes(b"")
    assert probe.list_rings(str(tmp_path)) == {12: str(tmp_path / "probe-12.ring")}
    assert probe.list_rings(str(tmp_path / "missing")) == {}


def test_install_from_env(ring_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    mod = _module("probe_t8", "def fetch_rows(table, ids):\n    return 1\n")
    monkeypatch.setenv(probe.ENV_TARGETS, "probe_t8:fetch_rows@ids , ")
    assert probe.install_from_env()["probe_t8:fetch_rows@ids"] == "installed"
    mod.fetch_rows(None, [1, 2, 3, 4])
    monkeypatch.delenv(probe.ENV_TARGETS)
    assert probe.install_from_env() == {}


def test_ring_reader_decodes_only_what_changed(ring_dir: Path) -> None:
    mod = _module("probe_t9", """
        import threading
        gate = threading.Event()
        def f(ids, wait=False):
            if wait:
                gate.wait(10)
    """)
    probe.install(["probe_t9:f"])
    mod.f([1])
    mod.f([1, 2])
    path = probe.ring_file()
    assert path is not None
    reader = probe.RingReader(path)
    first = [r for r in reader.read() if r.target == "probe_t9:f"]
    assert [r.gather_size for r in first] == [1, 2]
    assert reader.read() == []  # nothing changed
    th = threading.Thread(target=mod.f, args=([0] * 5, True))
    th.start()
    try:
        deadline = time.time() + 5
        new: list[ProbeRecord] = []
        while time.time() < deadline and not new:
            new = reader.read()
        assert [(r.gather_size, r.end) for r in new] == [(5, None)]
        assert [r.end for r in reader.read()] == [None]  # an open slot is looked at every time
    finally:
        mod.gate.set()
        th.join()
    (done,) = reader.read()
    assert done.gather_size == 5 and done.end is not None
    assert reader.read() == []


def test_a_late_end_in_a_reused_slot_is_neither_an_end_nor_in_flight(ring_dir: Path) -> None:
    """The end store is blind (no read of the evicted slot line): a call that outlives a whole lap of the ring
    writes its end into the slot of the newer call there. The lap tag keeps that from closing or hiding it."""
    mod = _module("probe_t10", """
        def inner(ids):
            return len(ids)
        def outer(ids, n):
            for _ in range(n):
                inner([0] * 7)  # the wrapped module attribute, looked up at call time
            return len(ids)
    """)
    probe.install(["probe_t10:inner", "probe_t10:outer"])
    mod.outer([0] * 3, 62)  # 1 + 62 calls: no lap, every call is recorded with its own end
    recs = [r for r in _records(ring_dir) if r.target.startswith("probe_t10")]
    assert len(recs) == 63 and all(r.end is not None and r.end >= r.start for r in recs)
    # 64 slots: outer's call c is followed by 64 inner calls, the last one reuses c's slot, then outer ends
    mod.outer([0] * 3, 64)
    recs = [r for r in _records(ring_dir) if r.target.startswith("probe_t10")]
    seqs = sorted(r.seq for r in recs)
    # 63 of the last lap's 64 slots hold finished calls; the one holding the last inner call is skipped (its end
    # word is outer's late end), outer's own record is gone with its slot, and nothing reads as in flight
    assert len(seqs) == 63 and seqs == list(range(seqs[0], seqs[0] + 63))
    assert all(r.end is not None for r in recs)
    assert all(r.target.endswith("inner") for r in recs)
    mod.inner([0] * 7)  # the ring moves on; a later lap in that slot ends normally
    for _ in range(63):
        mod.inner([1])
    assert all(r.end is not None for r in _records(ring_dir) if r.target.startswith("probe_t10"))


def test_wrapper_keeps_the_signature_defaults_and_keywords(ring_dir: Path) -> None:
    """The generated wrapper has the target's own signature; targets it cannot mirror get the generic one."""
    import inspect

    mod = _module("probe_t11", """
        def gather(weight, ids, out=None, block=64, *, sort_ids=False):
            return (weight, list(ids), out, block, sort_ids)
        def varargs(*ids):
            return len(ids)
        def shadow(_Q, ids):
            return _Q
    """)
    sig = inspect.signature(mod.gather)
    probe.install(["probe_t11:gather@ids", "probe_t11:varargs@0:none", "probe_t11:shadow@ids"])
    assert inspect.signature(mod.gather) == sig
    native = probe.writer._NATIVE is not None
    if native:  # one C wrapper for every signature
        assert all(type(f).__name__ == "Wrapper" for f in (mod.gather, mod.varargs, mod.shadow))
    else:
        assert mod.gather.__code__.co_filename.startswith("<sgl-seat probe wrapper")  # generated
        assert not mod.varargs.__code__.co_filename.startswith("<sgl-seat probe wrapper")  # generic
        assert not mod.shadow.__code__.co_filename.startswith("<sgl-seat probe wrapper")
    assert mod.gather("w", [1, 2]) == ("w", [1, 2], None, 64, False)
    assert mod.gather("w", ids=range(3), sort_ids=True, block=8) == ("w", [0, 1, 2], None, 8, True)
    assert mod.varargs(1, 2, 3) == 3
    assert mod.shadow("q", [5]) == "q"
    with pytest.raises(TypeError):
        mod.gather("w")  # a missing argument fails as the target itself would
    recs = [r for r in _records(ring_dir) if r.target.startswith("probe_t11")]
    # the C wrapper times the failing call too (its TypeError comes from the target); the generated one fails
    # before it writes, as the target's own signature
    assert [(r.target.split(":")[1], r.gather_size) for r in recs] == [
        ("gather", 2), ("gather", 3), ("varargs", -1), ("shadow", 1)] + ([("gather", -1)] if native else [])
    assert all(r.end is not None for r in recs)


def test_a_process_title_names_its_tp_rank_and_a_tp1_scheduler_is_rank_0() -> None:
    """The rehearsal gate's rank= trigger reads the rank from the title; at TP1 SGLang (0.5.17 on the H200) names
    its one scheduler without a TP suffix, and a probe-stall:rank=0 aimed at it never fired."""
    from sgl_seat.probe.writer import rank_of_title

    assert rank_of_title("sglang::scheduler_TP3_EP3") == 3
    assert rank_of_title("sglang::scheduler_TP1") == 1
    sole = "sglang::scheduler"  # the agent's SGLSEAT_PROBE_RANK_TITLE, from the backend's words
    assert rank_of_title("sglang::scheduler", sole) == 0
    assert rank_of_title("sglang::detokenizer", sole) == -1
    assert rank_of_title("python3 -m sglang.launch_server", sole) == -1
    assert rank_of_title("sglang::scheduler", "") == -1  # no title given: no rank guessed
