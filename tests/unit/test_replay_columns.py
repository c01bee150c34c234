"""Probe records as columns (issue 15.4): the column detectors and report give what the record forms gave.

Why: replay of a one-hour bundle built and scanned a million ProbeRecord objects; the detectors and the
row-fetch report now read numpy columns (``core.columns.ProbeColumns``), live and in replay. These tests hold
the column code to the record code it replaced, kept here verbatim as the oracle (``_ref_*``, from the
last commit before the change), over seeded generated cases with ties, in-flight fetches, GPU records and
unknown ranks; and they hold the live form (columns built from the sidecar's records) to the replay form
(columns decoded from a bundle) through the whole ``detect()``. Decoding stays as strict as before.
"""

from __future__ import annotations

import io
import math
import random
import time
from collections import defaultdict
from collections.abc import Callable
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest

from sgl_seat.core import detect as d
from sgl_seat.core.columns import ProbeColumns, ProbeGroup
from sgl_seat.core.detect import noprogress, waits, words
from sgl_seat.core.frames import python_frames, short_name
from sgl_seat.core.observation import Observation, in_flight, latest_by_pid, node_of, probe_targets, python_samples
from sgl_seat.core.records import (
    EngineProcess,
    Frame,
    ProbeRecord,
    StackSample,
    ThreadStack,
    Verdict,
    VerdictKind,
)
from sgl_seat.core.stats import gather_bucket, percentile
from sgl_seat.engines import words_for
from sgl_seat.errors import BundleError
from sgl_seat.forensics.format import codec
from sgl_seat.forensics.format.codec import decode_probe_records, decode_stack_samples, dumps_line, encode_probe_records
from sgl_seat.forensics.replay import analysis
from sgl_seat.spec import WatchdogSpec

T0 = 1_800_000_000.0
TARGETS = ("sglang.srt.layers.engram.host_table:gather_rows", "sgl_seat.sim.rowfetch:fetch_rows")
CASES = 200

WORDS = words_for("sglang")


# ---- the record forms this change replaced (verbatim but for names), the oracle ------------------------


def _ref_late_since(p: ProbeRecord, now: float, threshold: float) -> float | None:
    if in_flight(p, now) and now - p.start >= threshold:
        return p.start
    if p.gpu_in_flight(now) and p.gpu_start is not None and now - p.gpu_start >= threshold:
        return p.gpu_start
    return None


def _ref_rowfetch_stall(obs: Observation, th: WatchdogSpec, now: float) -> Verdict | None:
    recs = list(obs.probes)
    late = [(t, p) for p in recs if (t := _ref_late_since(p, now, th.rowfetch_inflight_s)) is not None]
    if not late:
        return None
    late.sort(key=lambda tp: (tp[0], tp[1].rank, tp[1].pid, tp[1].seq))
    since, worst = late[0]
    on_gpu = not in_flight(worst, now)
    rank = worst.rank if worst.rank >= 0 else waits.rank_of_pid(obs, worst.pid)
    node = worst.node if worst.node >= 0 else node_of(obs, rank)
    func = worst.target.rsplit(":", 1)[-1].rsplit(".", 1)[-1]
    frame_label = f"{func} ({worst.target})"
    last = latest_by_pid([s for s in python_samples(obs, now) if s.pid == worst.pid]).get(worst.pid)
    if last is not None:
        for f in python_frames(last.main_thread()) + [f for t in last.threads for f in python_frames(t)]:
            if short_name(f) == func:
                frame_label = f.label
                break
    done = [p.duration(now) for p in recs if p.pid == worst.pid and p.end is not None
            and now - d.EVIDENCE_WINDOW_S <= p.end <= now and p.target == worst.target]
    where = "on the GPU (CUDA events: started on the stream, not finished; the call itself returned)" \
        if on_gpu else "in flight"
    ev = [f"{worst.target} {where} for {words.fmt_s(now - since)} on rank {rank} (pid {worst.pid}, "
          f"thread {worst.thread}, gather size {worst.gather_size}); threshold {words.fmt_s(th.rowfetch_inflight_s)}"]
    if on_gpu:
        frame_label = f"{func} ({worst.target}) [GPU record]"
    if done:
        ev.append(f"its fetches in the last {d.EVIDENCE_WINDOW_S:.0f}s: {len(done)}, "
                  f"p50 {percentile(done, 50) * 1e3:.2f} ms, p99 {percentile(done, 99) * 1e3:.2f} ms")
    others = sorted({p.rank for _, p in late[1:]} - {rank})
    if others:
        ev.append(f"also late: ranks {others}")
    return Verdict(kind=VerdictKind.ROWFETCH_STALL, rank=rank, node=node, frame=frame_label, t=now,
                   evidence=tuple(ev))


def _ref_attribute_fetch(obs: Observation, now: float) -> tuple[Any, ...] | None:
    """The probe half of ``detect._attribute``: who has the oldest fetch in flight."""
    infl = sorted(((p.start if in_flight(p, now) else p.gpu_start or p.start, p) for p in obs.probes
                   if in_flight(p, now) or p.gpu_in_flight(now)), key=lambda tp: (tp[0], tp[1].rank, tp[1].pid))
    if not infl:
        return None
    since, p = infl[0]
    rank = p.rank if p.rank >= 0 else waits.rank_of_pid(obs, p.pid)
    where = "in flight" if in_flight(p, now) else "in flight on the GPU"
    return (rank, node_of(obs, rank, p.node if p.node >= 0 else None),
            f"{p.target.rsplit(':', 1)[-1].rsplit('.', 1)[-1]} ({p.target})",
            f"rank {rank} has a row fetch {where} for {words.fmt_s(now - since)}")


def _call_order(recs: list[ProbeRecord]) -> Callable[[int], tuple[int, float, float, int, int]]:
    """A process's calls in call-number order (the generated cases repeat call numbers: ties by the call itself)."""
    return lambda i: (recs[i].seq, recs[i].start, math.inf if recs[i].end is None else recs[i].end,
                      recs[i].gather_size, recs[i].rank)


def _ref_buckets(recs: list[ProbeRecord], now: float, stall_s: float) -> dict[str, Any]:
    """The report's row-fetch section as the per-record loop computed it (in-flight list left out)."""
    def stats(vals: list[float]) -> dict[str, float | int]:
        if not vals:
            return {"count": 0, "p50_ms": 0.0, "p99_ms": 0.0, "max_ms": 0.0}
        return {"count": len(vals), "p50_ms": round(percentile(vals, 50), 3),
                "p99_ms": round(percentile(vals, 99), 3), "max_ms": round(max(vals), 3)}

    # Warm-up calls (a process's first WARMUP_CALLS calls of each target and graph shape, where its call 1 is here)
    # that completed are left out of the statistics and counted per bucket.
    first_seq: dict[int, int] = {}
    for r in recs:
        first_seq[r.pid] = min(first_seq.get(r.pid, r.seq), r.seq)
    per_key: dict[tuple[int, str, int | None], list[int]] = defaultdict(list)
    for i, r in enumerate(recs):
        if first_seq[r.pid] == 1:
            per_key[(r.pid, r.target, r.graph_key)].append(i)
    warm = {i for rows in per_key.values() for i in sorted(rows, key=_call_order(recs))[:analysis.WARMUP_CALLS]
            if recs[i].end is not None}
    by_bucket: dict[int, list[float]] = defaultdict(list)
    infl: dict[int, int] = defaultdict(int)
    warmups: dict[int, int] = defaultdict(int)
    by_rank: dict[int, list[float]] = defaultdict(list)
    for i, r in enumerate(recs):
        key = r.gather_size.bit_length() if r.gather_size >= 0 else -1
        dms = ((now if r.end is None else r.end) - r.start) * 1000.0
        by_bucket.setdefault(key, [])
        if i in warm:
            warmups[key] += 1
            continue
        infl[key] += r.end is None
        by_bucket[key].append(0.0 if dms < 0.0 else dms)
        by_rank[r.rank].append(0.0 if dms < 0.0 else dms)
    buckets = []
    for b in sorted(by_bucket):
        lo, hi = gather_bucket(-1 if b < 0 else 0 if b == 0 else 1 << (b - 1))
        st = stats(by_bucket[b])
        buckets.append({"gather_size_min": lo, "gather_size_max": hi, **st, "in_flight": infl[b],
                        "stalled": st["max_ms"] >= stall_s * 1000.0 and infl[b] > 0, "warmup": warmups[b]})
    return {"buckets": buckets, "by_rank": [{"rank": r, **stats(v)} for r, v in sorted(by_rank.items())],
            "in_flight": sum(infl.values()), "records": len(recs)}


# ---- generated cases ------------------------------------------------------------------------------


def _records(rng: random.Random, now: float, threshold: float) -> list[ProbeRecord]:
    """Fetches on a few ranks, with exact ties in start, in-flight and late ones (some exactly at the threshold,
    some starting after ``now``), GPU records, unknown ranks."""
    out: list[ProbeRecord] = []
    starts = [now - rng.choice((0.5, 2.0, 5.0, 30.0, 90.0)) * rng.random() for _ in range(4)]
    starts += [now - threshold, now + 0.25]  # exactly at the threshold (now and it are exact in binary); future
    for _ in range(rng.randrange(0, 60)):
        rank = rng.choice((0, 1, 2, 3, -1))
        pid = 100 + (rank if rank >= 0 else rng.randrange(4))
        start = rng.choice(starts) if rng.random() < 0.3 else now - 120.0 * rng.random() + rng.choice((0.0, 1.0))
        dur = rng.choice((0.0005, 0.002, 0.05, 4.0, 12.0))
        end = None if rng.random() < 0.15 else start + dur
        gpu = rng.random() < 0.3
        gs = start + rng.choice((0.0, 0.001, 0.5)) if gpu and rng.random() < 0.8 else None
        ge = None if gs is None or rng.random() < 0.4 else gs + rng.choice((0.001, 3.0, 20.0))
        out.append(ProbeRecord(node=max(rank, 0) // 2, rank=rank, pid=pid, thread=rng.choice((1, 2)),
                               seq=rng.randrange(5), target=rng.choice(TARGETS), start=start, end=end,
                               gather_size=rng.choice((-1, 0, 1, 7, 64, 100, 384, 4096)), gpu=gpu,
                               gpu_start=gs if gpu else None, gpu_end=ge if gpu else None))
    return out


def _context(rng: random.Random, now: float) -> dict[str, Any]:
    """Samples (one rank sampled inside its fetch) and processes, for the frame and the rank of an unknown pid."""
    inside = ThreadStack(1, "MainThread", True, True, (Frame("gather_rows", "/sglang/host_table.py", 212),
                                                       Frame("forward", "/sglang/model.py", 10)))
    samples = [StackSample(now - k, r // 2, 100 + r, f"sglang::scheduler_TP{r}", r, False, (inside,))
               for r in range(4) for k in range(3) if rng.random() < 0.5]
    procs = [EngineProcess(r // 2, 100 + r, f"sglang::scheduler_TP{r}", r, True) for r in range(4)
             if rng.random() < 0.7]
    return {"samples": samples, "processes": procs, "rank_nodes": {0: 0, 1: 0} if rng.random() < 0.5 else {}}


def _cases() -> list[tuple[list[ProbeRecord], dict[str, Any], float, WatchdogSpec]]:
    rng = random.Random(1504)
    out = []
    for _ in range(CASES):
        now = T0 + rng.randrange(4000) * 0.25
        th = WatchdogSpec(rowfetch_inflight_s=rng.choice((0.5, 3.0, 10.0)))
        out.append((_records(rng, now, th.rowfetch_inflight_s), _context(rng, now), now, th))
    return out


CASE_LIST = _cases()


def _replayed(recs: list[ProbeRecord]) -> ProbeColumns:
    """The records as replay reads them: written into a bundle's probe file and decoded (once per case)."""
    key = id(recs)
    if key not in _DECODED:
        _DECODED[key] = decode_probe_records(io.BytesIO(encode_probe_records(recs)), "probe.jsonl")
    return _DECODED[key]


_DECODED: dict[int, ProbeColumns] = {}  # by the identity of a case's record list (CASE_LIST keeps them alive)


def test_generated_cases_exercise_every_branch() -> None:
    """The generator is worth its cases: stalls on the host and on the GPU, ties, unknown ranks all occur."""
    kinds: set[str] = set()
    for recs, ctx, now, th in CASE_LIST:
        v = _ref_rowfetch_stall(Observation.of(words=WORDS, probes=recs, **ctx), th, now)
        if v is not None:
            kinds.add("gpu" if "[GPU record]" in (v.frame or "") else "host")
            kinds.add("also late" if any("also late" in e for e in v.evidence) else "alone")
        starts = [r.start for r in recs]
        if len(starts) != len(set(starts)):
            kinds.add("ties")
        if any(r.rank < 0 for r in recs):
            kinds.add("unknown rank")
        if any(r.end is None and now - r.start == th.rowfetch_inflight_s for r in recs):
            kinds.add("in flight exactly at the threshold")
        if any(r.end is None and r.start > now for r in recs):
            kinds.add("starts after now")
    assert kinds >= {"gpu", "host", "also late", "alone", "ties", "unknown rank", "in flight exactly at the threshold",
                     "starts after now"}, kinds


def test_rowfetch_stall_over_columns_is_the_record_verdict() -> None:
    for i, (recs, ctx, now, th) in enumerate(CASE_LIST):
        obs = Observation.of(words=WORDS, probes=recs, **ctx)
        assert d.detect_rowfetch_stall(obs, th, now) == _ref_rowfetch_stall(obs, th, now), f"case {i}"


def test_attribution_over_columns_is_the_record_one() -> None:
    for i, (recs, ctx, now, _th) in enumerate(CASE_LIST):
        obs = Observation.of(words=WORDS, probes=recs, **ctx)
        want = _ref_attribute_fetch(obs, now)
        got = noprogress._attribute(obs, now)
        if want is not None:
            assert got == want, f"case {i}"
        else:
            assert got[3] is None or "has a row fetch" not in got[3], f"case {i}"


def test_live_and_replay_forms_reach_the_same_verdict() -> None:
    """Columns from the sidecar's records (live) and from a bundle's probe file (replay): same order, same detect()
    (half the cases: the whole detect() is the slow part, and each detector's probe logic is held above)."""
    for i, (recs, ctx, now, th) in enumerate(CASE_LIST[::2]):
        live = Observation.of(words=WORDS, probes=recs, **ctx)
        replay = Observation.of(words=WORDS, probes=_replayed(recs), **ctx)
        canonical = sorted(recs, key=lambda p: (p.start, p.node, p.pid, p.seq))
        assert [(p.start, p.node, p.pid, p.seq) for p in replay.probes] == \
            [(p.start, p.node, p.pid, p.seq) for p in canonical], f"case {i}"
        assert list(live.probes) == canonical, f"case {i}"
        assert d.detect(live, th, now) == d.detect(replay, th, now), f"case {i}"


def test_rowfetch_report_over_columns_is_the_record_report() -> None:
    for i, (recs, _ctx, now, th) in enumerate(CASE_LIST):
        got = analysis.rowfetch_buckets(SimpleNamespace(probes=_replayed(recs)),  # type: ignore[arg-type]
                                        now, stall_s=th.rowfetch_inflight_s)
        want = _ref_buckets(recs, now, th.rowfetch_inflight_s)
        assert {k: got[k] for k in want} == want, f"case {i}"
        assert len(got["in_flight_fetches"]) == min(50, want["in_flight"]), f"case {i}"


def test_one_hour_shaped_columns_detect_fast() -> None:
    """200,000 records (a fifth of the bench's hour): the stall detector over columns answers in well under a
    second where the record form took seconds (the bench has the full figure)."""
    rng = np.random.default_rng(7)
    n = 200_000
    start = T0 + np.sort(rng.random(n)) * 3600.0
    end = start + 0.001
    end[-1] = math.nan
    cols = ProbeColumns([ProbeGroup(0, 3, 103, 1, TARGETS[0])], np.zeros(n, np.int64), np.arange(n),
                        start, end, np.full(n, 64))
    obs = Observation.of(words=WORDS, probes=cols)
    t = time.perf_counter()
    v = d.detect_rowfetch_stall(obs, WatchdogSpec(rowfetch_inflight_s=0.5), float(start[-1]) + 2.0)
    assert time.perf_counter() - t < 1.0
    assert v is not None and v.rank == 3 and "its fetches in the last 60s" in v.evidence[1]


# ---- the columns themselves ---------------------------------------------------------------------


def test_columns_keep_live_records_and_rebuild_decoded_ones() -> None:
    recs, _ctx, _now, _th = next(c for c in CASE_LIST if len(c[0]) > 20)
    live = ProbeColumns.from_records(recs)
    assert list(live) == recs and all(a is b for a, b in zip(live, recs, strict=True))  # kept, not rebuilt
    replay = _replayed(recs)
    assert sorted(replay, key=repr) == sorted(recs, key=repr)
    assert replay[-1] == replay.record(len(replay) - 1) and replay[1:3] == [replay[1], replay[2]]
    with pytest.raises(IndexError):
        replay[len(replay)]
    both = ProbeColumns.concat([live, replay])
    assert len(both) == 2 * len(recs) and sorted(both, key=repr) == sorted(recs + recs, key=repr)
    assert both.targets() == sorted({r.target for r in recs})
    half = both.take(np.arange(len(both)) % 2 == 0)
    assert list(half) == [both[i] for i in range(0, len(both), 2)]
    assert live.in_flight() == [r for r in recs if r.end is None]
    merged = Observation.of(words=WORDS, probes=recs[::2]).merged(Observation.of(words=WORDS, probes=recs[1::2]))
    assert list(merged.probes) == list(Observation.of(words=WORDS, probes=recs).probes)
    with pytest.raises(ValueError, match="differ in length"):
        ProbeColumns(live.groups, live.group, live.seq[:-1], live.start, live.end, live.gather_size)


# ---- decoding stays strict ----------------------------------------------------------------------


def _block(**over: Any) -> bytes:
    blk = {"node": 0, "rank": 1, "pid": 5, "thread": 1, "target": "a:b", "seq": [1, 2], "start": [1.0, 2.0],
           "end": [1.5, None], "gather_size": [4, 8], **over}
    return (dumps_line({"probe_block": blk}) + "\n").encode()


@pytest.mark.parametrize(("over", "msg"), [
    ({"seq": [1, True]}, "list of integers"),
    ({"seq": [1, 2.0]}, "list of integers"),
    ({"gather_size": [4, 2 ** 70]}, "integer"),
    ({"start": [1.0, None]}, "only numbers"),
    ({"start": [1.0, "2"]}, "only numbers"),
    ({"end": [1.5, False]}, "only numbers or null"),
    ({"end": [1.5]}, "differ in length"),
    ({"gpu": [0, 2], "gpu_start": [None, None], "gpu_end": [None, None]}, "only 0 or 1"),
    ({"rank": True}, "rank"),
])
def test_bad_probe_columns_are_refused(over: dict[str, Any], msg: str) -> None:
    with pytest.raises(BundleError, match=msg):
        decode_probe_records(io.BytesIO(_block(**over)), "probe.jsonl")


def test_orjson_and_the_standard_decoder_read_the_same(monkeypatch: pytest.MonkeyPatch) -> None:
    """With or without orjson (an optional speed-up), the same columns; what orjson refuses (a float past the
    double range) the standard decoder still reads as before."""
    data = encode_probe_records(CASE_LIST[3][0] + CASE_LIST[7][0]) + _block(start=[1.0, 2.0], seq=[8, 9])
    huge = b'{"probe_block":{"node":0,"rank":1,"pid":5,"thread":1,"target":"a:b","seq":[1],"start":[1e400],' \
           b'"end":[null],"gather_size":[4]}}\n'
    fast = decode_probe_records(io.BytesIO(data + huge), "p")
    monkeypatch.setattr(codec, "_FAST_LOADS", None)
    slow = decode_probe_records(io.BytesIO(data + huge), "p")
    assert list(fast) == list(slow) and math.isinf(fast[-1].start)


def test_stack_repeats_are_checked_with_their_types() -> None:
    """A repeated thread stack or sample head is recognised only with the same field types: 1, 1.0 and True
    are equal dict keys in Python, and a bool thread id or a float pid must still be refused."""
    def line(sample: dict[str, Any]) -> str:
        return dumps_line({"sample": sample})

    frame = dumps_line({"frame_id": 0, "frame": Frame("f", "/x.py", 1).to_json()})
    head = {"t": 1.0, "node": 0, "pid": 7, "title": "sglang::scheduler_TP0", "rank": 0, "native": False,
            "error": None}
    th = {"thread_id": 1, "name": "MainThread", "active": True, "owns_gil": False, "frames": [0]}
    ok = [frame, line({**head, "threads": [th]}), line({**head, "t": 2, "threads": [th]})]
    got = decode_stack_samples(io.BytesIO("\n".join(ok).encode()), "stacks.jsonl")
    assert [s.t for s in got] == [1.0, 2.0] and got[0].threads[0] is got[1].threads[0]
    for bad in ({**head, "threads": [{**th, "thread_id": True}]}, {**head, "pid": 7.0, "threads": [th]},
                {**head, "threads": [{**th, "active": 1}]}, {**head, "t": True, "threads": [th]},
                {**head, "native": 0, "threads": [th]}):
        with pytest.raises(BundleError, match=r"stacks\.jsonl:4"):
            decode_stack_samples(io.BytesIO("\n".join([*ok, line(bad)]).encode()), "stacks.jsonl")


def test_probe_targets_come_from_rows_present() -> None:
    recs = CASE_LIST[5][0] + CASE_LIST[6][0]
    obs = Observation.of(words=WORDS, probes=recs)
    assert probe_targets(obs) == sorted({r.target for r in recs})
    none = obs.probes.take(np.zeros(len(obs.probes), np.bool_))
    assert Observation.of(words=WORDS, probes=none).probes.targets() == []


HOSTILE = ['plain', 'quote " inside', 'back\\slash\\', '\\"', ',"threads":[1],"error":null}}', '],"error":"x"}}',
           'ünïcødé ✓', 'tab\tnew\nline', '{"sample":{"t":1}}', '']


def _hostile_samples(rng: random.Random) -> list[StackSample]:
    frames = [Frame(rng.choice(HOSTILE) or "f", f"/x{i}.py", i) for i in range(4)]
    out = []
    for i in range(60):
        th = ThreadStack(rng.choice((1, 2)), rng.choice((*HOSTILE, None)), rng.random() < 0.5, rng.random() < 0.5,
                         tuple(rng.sample(frames, rng.randrange(0, 4))))
        out.append(StackSample(float(i) if i % 3 else i * 1e-3, rng.randrange(3), 100 + rng.randrange(3),
                               rng.choice(HOSTILE), rng.choice((None, 0, 5)), rng.random() < 0.2,
                               (th,) * rng.randrange(0, 3), rng.choice((None, *HOSTILE))))
    return out


def _decode_both(data: bytes, monkeypatch: pytest.MonkeyPatch) -> tuple[Any, Any]:
    """(the decoder's result or error, the same with the writer-shape fast path turned off)."""
    def run() -> Any:
        try:
            return decode_stack_samples(io.BytesIO(data), "stacks.jsonl")
        except BundleError as exc:
            return f"BundleError: {exc}"

    fast = run()
    with monkeypatch.context() as m:
        m.setattr(codec._StackDecoder, "sample_line", lambda self, raw, lineno: None)
        general = run()
    return fast, general


def test_sample_lines_in_the_writer_shape_decode_as_whole_lines_do(monkeypatch: pytest.MonkeyPatch) -> None:
    """The fast path for the writer's own sample lines gives what parsing each line whole gives, for titles,
    names and errors made of the very text the regular expression splits on, and for damaged lines the same
    error (an invalid escape, a raw control character, bad UTF-8, a lone surrogate in a title)."""
    rng = random.Random(154)
    samples = _hostile_samples(rng)
    data = codec.encode_stack_samples(samples)
    fast, general = _decode_both(data, monkeypatch)
    assert fast == general == samples
    lines = data.split(b"\n")
    last = lines[-2]
    assert last.startswith(b'{"sample":') and codec._SAMPLE_LINE.fullmatch(last + b"\n")
    head = b'{"sample":{"t":%s,"node":0,"pid":1,"title":%s,"rank":null,"native":false,"threads":[],"error":null}}'
    for t, title in ((b"1e400", b'"x"'), (b"-0", b'"x"'), (b"1", b'"bad \\q escape"'), (b"1", b'"raw \x01 byte"'),
                     (b"1", b'"\xff\xfe"'), (b"1", b'"\\ud800"'), (b"01", b'"x"'), (b"1", b'"x\\""')):
        got = _decode_both(b"\n".join([*lines[:-1], head % (t, title)]), monkeypatch)
        assert got[0] == got[1], (t, title, got)


def test_stack_detector_without_metrics_reads_probe_ends_as_the_record_form() -> None:
    """No metrics: a rank's unchanged stack counts only if its node's fetches were busy just before the window
    and quiet in it. The column form of that check gives the verdict the record form's predicate says."""
    rng = random.Random(77)
    th = WatchdogSpec()
    k, period = th.stack_unchanged_samples, 1.0 / th.sample_hz
    stack = ThreadStack(1, "MainThread", True, True, (Frame("forward", "/sglang/model.py", 10),))
    seen = set()
    for i in range(120):
        t0 = T0 + 100.0
        samples = [StackSample(t0 + j * period, 0, 100, "sglang::scheduler_TP0", 0, False, (stack,)) for j in range(k)]
        t1, now = samples[-1].t, samples[-1].t + 0.5
        recs = [ProbeRecord(rng.choice((0, 1)), 0, rng.choice((100, 200)), 1, s, TARGETS[1], e - 0.001,
                            None if rng.random() < 0.1 else e, 64)
                for s in range(rng.randrange(0, 4))
                for e in [t0 + rng.choice((-5.0, -4.0, -3.0, -1.0, 0.0, 0.5, t1 - t0, t1 - t0 + 0.5))]]
        mine = [p for p in recs if p.node == 0 or p.pid == 100]
        busy = any(p.end is not None and t0 - 2.0 * period - 2.0 <= p.end <= t0 for p in mine)
        quiet = not any(p.end is not None and t0 < p.end <= t1 for p in mine)
        # and the rank's own probed calls: one begun or ended between its samples means it was not stuck
        moved = any(p.pid == 100 and (t0 < p.start <= t1 or (p.end is not None and t0 < p.end <= t1)) for p in recs)
        v = d.detect_stack_unchanged(Observation.of(words=WORDS, samples=samples, probes=recs), th, now)
        assert (v is not None) == (busy and quiet and not moved), f"case {i}: {recs}"
        seen.add(busy and quiet and not moved)
    assert seen == {True, False}


def _ref_raw_lines(stream: io.BytesIO, name: str, limit: int) -> list[Any]:
    """Line cutting as ``readline(limit + 1)`` did it before the chunked reader (the oracle)."""
    out: list[Any] = []
    lineno = 0
    while raw := stream.readline(limit + 1):
        lineno += 1
        if len(raw) > limit:
            return [*out, f"{name}:{lineno}: line longer than {limit} bytes"]
        if raw.strip():
            out.append((lineno, raw))
    return out


def test_chunked_line_reader_cuts_lines_as_readline_did(monkeypatch: pytest.MonkeyPatch) -> None:
    """Lines, line numbers, blank lines and the over-long line's error, at chunk sizes that split lines anywhere."""
    rng = random.Random(5)
    for case in range(2000):
        limit, chunk = rng.choice((5, 10, 1000)), rng.choice((1, 2, 3, 7, 64))
        monkeypatch.setattr(codec, "MAX_LINE_BYTES", limit)
        monkeypatch.setattr(codec, "_READ_CHUNK", chunk)
        data = bytes(rng.choice(b"ab \n\r\t") for _ in range(rng.randrange(0, 60)))
        got: list[Any] = []
        try:
            got.extend(codec._raw_lines(io.BytesIO(data), "f"))
        except BundleError as exc:
            got.append(str(exc))
        assert got == _ref_raw_lines(io.BytesIO(data), "f", limit), f"case {case}: {data!r}"


def test_a_repeated_sample_line_with_a_new_t_decodes_as_whole_lines_do(monkeypatch: pytest.MonkeyPatch) -> None:
    """A line whose text after ``t`` repeats an earlier line's skips the regular expression: its ``t`` alone decides,
    as parsing the line whole decides (odd numbers, non-numbers, text that moves where ``,"node":`` is)."""
    data = codec.encode_stack_samples([StackSample(T0, 0, 7, "sglang::scheduler_TP0", 0, False, (
        ThreadStack(1, "MainThread", True, True, (Frame("forward", "/sglang/model.py", 10),)),))])
    frame, line = data.rstrip(b"\n").split(b"\n")
    prefix, rest = line[:len(codec._SAMPLE_PREFIX)], line[line.index(b',"node":'):]
    assert prefix == codec._SAMPLE_PREFIX
    for t in (b"1800000001.25", b"-0", b"1e400", b"1E-3", b"01", b"1.", b"+1", b".5", b"nan", b"", b'"1"', b"true",
              b"[1]", b'1,"node":0', b"1 ", b"-"):
        fast, general = _decode_both(b"\n".join((frame, line, prefix + t + rest, b"")), monkeypatch)
        assert fast == general, (t, fast, general)
        assert isinstance(fast, str) or len(fast) == 2


def test_absent_gpu_columns_stay_one_value_through_take() -> None:
    """A bundle without GPU timing decodes its three GPU columns as one value repeated (no memory for a million
    rows), canonical order keeps them so, and the records read back as they were written."""
    recs = [ProbeRecord(0, r, 100 + r, 1, s, TARGETS[0], T0 + (s * 7 + r) % 5, None if s == 3 else T0 + 9.0, 64)
            for r in range(2) for s in range(4)]
    cols = decode_probe_records(io.BytesIO(encode_probe_records(recs)), "probe.jsonl")
    canon = cols.canonical()
    for c in (cols, canon):
        assert c.gpu.strides == c.gpu_start.strides == c.gpu_end.strides == (0,)
        assert not c.gpu.any() and np.isnan(c.gpu_start).all() and len(c.gpu_end) == len(recs)
    assert sorted(canon, key=lambda p: (p.start, p.node, p.pid, p.seq)) == list(canon)
    assert sorted(map(repr, canon)) == sorted(map(repr, recs))
    gpu = [*recs, ProbeRecord(0, 0, 100, 1, 9, TARGETS[0], T0, T0 + 1, 64, True, T0 + 0.5, None)]
    mixed = decode_probe_records(io.BytesIO(encode_probe_records(gpu)), "probe.jsonl").canonical()
    assert mixed.gpu.strides != (0,) and sorted(map(repr, mixed)) == sorted(map(repr, gpu))


def test_canonical_order_sorts_only_tied_starts_as_the_full_key_does() -> None:
    """Many equal starts (runs of 2..many rows, equal node/pid/seq inside a run too): the rows come out in the order
    of a stable lexsort over (start, node, pid, seq), which the tie-only sort replaced; NaN starts take the full
    sort."""
    rng = np.random.default_rng(11)
    groups = [ProbeGroup(node, rank, pid, 1, TARGETS[0]) for node, rank, pid in ((1, 0, 300), (0, 1, 200), (0, 2, 100),
                                                                                 (1, 3, 100))]
    for case in range(60):
        n = int(rng.integers(2, 400))
        start = T0 + rng.integers(0, max(2, n // int(rng.integers(1, 8))), n).astype(np.float64) * 0.5
        if case % 10 == 9:
            start[rng.integers(0, n, 3)] = math.nan
        cols = ProbeColumns(groups, rng.integers(0, len(groups), n), rng.integers(0, 4, n), start,
                            np.arange(n, dtype=np.float64), np.full(n, 64))
        want = np.lexsort((cols.seq, cols.pid, cols.node, cols.start))
        got = cols.canonical()
        assert np.array_equal(got.end, cols.end[want]), f"case {case}"  # ``end`` numbers the rows


@pytest.mark.parametrize("enabled", [True, False])
def test_reading_a_bundle_leaves_the_garbage_collector_as_it_found_it(tmp_path: Any, enabled: bool) -> None:
    """The collector is paused while a bundle decodes (bulk allocation, no cycles) and restored after, also when
    reading fails."""
    import gc
    import shutil
    from pathlib import Path

    from sgl_seat.forensics.format.bundle import read_bundle

    src = next(p for p in sorted((Path(__file__).parent.parent / "fixtures" / "bundles").iterdir()) if p.is_dir())
    bad = Path(shutil.copytree(src, tmp_path / src.name))
    (bad / "probe.jsonl").write_bytes(b"{}\n")
    seen: list[bool] = []
    real = codec.decode_probe_records

    def spy(stream: Any, name: str) -> Any:
        seen.append(gc.isenabled())
        return real(stream, name)

    was = gc.isenabled()
    try:
        (gc.enable if enabled else gc.disable)()
        with pytest.MonkeyPatch.context() as m:
            m.setattr("sgl_seat.forensics.format.bundle.decode_probe_records", spy)
            assert len(read_bundle(src).probes) > 0 and gc.isenabled() is enabled
            with pytest.raises(BundleError):
                read_bundle(bad)
            assert gc.isenabled() is enabled
        assert seen and not any(seen)
    finally:
        (gc.enable if was else gc.disable)()
