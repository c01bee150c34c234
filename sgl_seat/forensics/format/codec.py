"""JSON-lines encoding of the shared watchdog records, and strict streaming decoding of untrusted lines.

Why not one ``to_json()`` dict per line for everything: a one-hour bundle holds ~30,000 stack samples
that repeat the same few hundred frames, and ~1,000,000 probe records. Spelled out per line that is
hundreds of megabytes and tens of seconds to load. So two files use compact encodings that are still
plain JSON lines, still validated by ``records.py``'s ``from_json``:

- stacks: a *stack table*. ``{"frame_id": N, "frame": {Frame}}`` defines frame N (ids count up from 0,
  each defined before first use); ``{"sample": {StackSample}}`` is a sample whose threads' ``frames``
  are lists of frame ids (an inline frame object is accepted too). A plain ``StackSample.to_json()`` line
  is also accepted, so a bundle written by hand or by an older writer still loads.
- probe records: *column blocks*, one line per run of records sharing (node, rank, pid, thread,
  target): ``{"probe_block": {"node":..,"rank":..,"pid":..,"thread":..,"target":..,"seq":[..],
  "start":[..],"end":[.. or null],"gather_size":[..]}}``; a plain ``ProbeRecord.to_json()`` line is also
  accepted. They load straight into numpy columns (:class:`~sgl_seat.core.columns.ProbeColumns`, also named
  :data:`ProbeTable` here), the form the detectors and the report read; a record is built only when one is
  asked for. A one-hour bundle's million records decode in well under a second, not into a million objects.

Every other record file is one ``to_json()`` dict per line. Decoding is strict (unknown shapes, NaN,
over-long lines, deep nesting): any problem is one :class:`BundleError` naming the file and line. Record
files parse with orjson where it is installed (~4x the standard library's speed on number-heavy lines),
falling back to the standard decoder line by line.

One module of about 440 lines on purpose: it is the bundle's record encoding, and the three encodings share
the one strict line reader that every untrusted byte of a bundle goes through.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass
from typing import IO, Any, Protocol, TypeVar

import numpy as np
import numpy.typing as npt

from sgl_seat.core.columns import F64, I64, ProbeColumns, ProbeGroup
from sgl_seat.core.records import Frame, LogLine, ProbeRecord, RecordError, StackSample, ThreadStack
from sgl_seat.errors import BundleError
from sgl_seat.forensics.format.layout import MAX_LINE_BYTES
from sgl_seat.forensics.format.scrub import scrub_env, scrub_json, scrub_lines

__all__ = [
    "ProbeTable",
    "decode_probe_records",
    "decode_records",
    "decode_stack_samples",
    "dumps_line",
    "encode_env",
    "encode_json",
    "encode_logs",
    "encode_probe_records",
    "encode_records",
    "encode_stack_samples",
    "encode_text",
    "iter_json_lines",
    "loads_document",
    "records_from_parsed",
]

T = TypeVar("T")

#: Rows per probe column block: big enough to amortise the keys, small enough to keep lines short.
PROBE_BLOCK_ROWS = 65_536
#: Types a strict column check allows (``set(map(type, column)) <= ...`` runs in C; bool is not int here).
_INT = frozenset({int})
_NUM_T = frozenset({int, float})
_NUM_OR_NULL = frozenset({int, float, type(None)})
_COLUMNS = frozenset({"seq", "start", "end", "gather_size", "gpu", "gpu_start", "gpu_end"})


class _ToJson(Protocol):
    def to_json(self) -> dict[str, Any]: ...


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed in a bundle")


_DECODER = json.JSONDecoder(parse_constant=_reject_constant)


def dumps_line(obj: Any) -> str:
    """Compact, NaN-free JSON for one line (a NaN would not load back strictly)."""
    return json.dumps(obj, separators=(",", ":"), ensure_ascii=False, allow_nan=False)


def _loads(text: str | bytes, where: str) -> Any:
    try:
        s = text.decode("utf-8") if isinstance(text, bytes) else text
        return _DECODER.decode(s)
    except UnicodeDecodeError as exc:
        raise BundleError(f"{where}: not UTF-8 ({exc.reason})") from None
    except json.JSONDecodeError as exc:
        raise BundleError(f"{where}: not JSON ({exc.msg} at column {exc.colno})") from None
    except RecursionError:
        raise BundleError(f"{where}: JSON nested too deeply") from None
    except ValueError as exc:  # NaN/Infinity, or an integer too long to convert
        raise BundleError(f"{where}: {exc}") from None


def loads_document(data: bytes, name: str) -> Any:
    """Parse one whole JSON document (manifest.json, env.json) strictly."""
    return _loads(data, name)


def _fast_loads() -> Callable[[bytes], Any] | None:
    try:
        import orjson
    except ImportError:  # optional: the standard library's decoder reads the same lines, ~4x slower
        return None
    return orjson.loads


_FAST_LOADS = _fast_loads()


def _loads_fast(raw: bytes, where: str) -> Any:
    """:func:`_loads` through orjson (strict RFC 8259: no NaN, no lone surrogates) where it is installed.

    Whatever orjson refuses goes to the standard library's decoder, which gives the same value or the same
    error as without orjson. One difference remains: orjson reads an integer beyond 64 bits as a float, which
    the record checks then refuse (no field of a probe or stack record holds such a number legitimately).
    """
    if _FAST_LOADS is not None:
        try:
            return _FAST_LOADS(raw)
        except ValueError:  # orjson.JSONDecodeError
            pass
    return _loads(raw, where)


def iter_json_lines(stream: IO[bytes], name: str, *, fast: bool = False) -> Iterator[tuple[int, Any]]:
    """Yield (line number, parsed value) for each non-blank line, refusing lines over MAX_LINE_BYTES.

    ``fast``: parse with orjson where installed (the record files; a one-hour bundle's run to tens of MB).
    """
    fast_loads = _FAST_LOADS if fast else None
    for lineno, raw in _raw_lines(stream, name):
        if fast_loads is None:
            obj = _loads(raw, f"{name}:{lineno}")
        else:  # as _loads_fast, without formatting the line's name unless it is needed
            try:
                obj = fast_loads(raw)
            except ValueError:  # orjson.JSONDecodeError: the standard decoder gives the value or the error
                obj = _loads(raw, f"{name}:{lineno}")
        yield lineno, obj


#: Bytes read at a time by :func:`_raw_lines` (lines are cut from these chunks).
_READ_CHUNK = 1 << 24


def _raw_lines(stream: IO[bytes], name: str) -> Iterator[tuple[int, bytes]]:
    """(line number, bytes with its newline) of each non-blank line, refusing lines over MAX_LINE_BYTES.

    Reads 16 MB chunks and cuts the lines out of them: ``readline`` spent ~50 ms growing its buffer over a
    one-hour bundle's probe file (47 MB in lines of ~3 MB), and testing each line with ``strip()`` copied it.
    The lines, their numbers and the error for an over-long line are what ``readline(MAX_LINE_BYTES + 1)`` gave.
    """
    lineno = 0
    tail = b""
    while True:
        chunk = stream.read(_READ_CHUNK)
        data = tail + chunk if tail else chunk
        end = data.rfind(b"\n") + 1 if chunk else len(data)  # at the end of the file the last line has no newline
        pos = 0
        while pos < end:
            nl = data.find(b"\n", pos, end)
            stop = end if nl < 0 else nl + 1
            lineno += 1
            if stop - pos > MAX_LINE_BYTES:
                raise BundleError(f"{name}:{lineno}: line longer than {MAX_LINE_BYTES} bytes")
            raw = data[pos:stop]
            if not raw.isspace():  # the same test as ``raw.strip()`` being empty, without the copy
                yield lineno, raw
            pos = stop
        tail = data[end:]
        if len(tail) > MAX_LINE_BYTES:  # the line being read is already too long
            raise BundleError(f"{name}:{lineno + 1}: line longer than {MAX_LINE_BYTES} bytes")
        if not chunk:
            return


def _fail(name: str, lineno: int, msg: str) -> BundleError:
    return BundleError(f"{name}:{lineno}: {msg}")


# ---- plain record files -------------------------------------------------------------------------


def encode_records(records: Iterable[_ToJson]) -> bytes:
    """One ``to_json()`` object per line (metrics, processes, logs, requests)."""
    try:
        return "".join(dumps_line(r.to_json()) + "\n" for r in records).encode("utf-8")
    except ValueError as exc:
        raise BundleError(f"a record cannot be written as JSON: {exc}") from None


def decode_records(stream: IO[bytes], from_json: Callable[[dict[str, Any]], T], name: str) -> list[T]:
    """Decode one record per line with the record type's strict ``from_json``."""
    return records_from_parsed(iter_json_lines(stream, name, fast=True), from_json, name)


def records_from_parsed(parsed: Iterable[tuple[int, Any]], from_json: Callable[[dict[str, Any]], T],
                        name: str) -> list[T]:
    """Records of (line number, parsed line) pairs, each through ``from_json``; errors name the file and line."""
    out: list[T] = []
    for lineno, obj in parsed:
        if not isinstance(obj, dict):
            raise _fail(name, lineno, "expected a JSON object")
        try:
            out.append(from_json(obj))
        except (RecordError, ValueError, TypeError, KeyError, AttributeError) as exc:
            raise _fail(name, lineno, str(exc)) from None
    return out


def encode_logs(lines: Iterable[LogLine]) -> bytes:
    """LogLine records with secrets scrubbed from their text (log lines quote argv, URLs and headers)."""
    lines = list(lines)
    texts = scrub_lines([ln.text for ln in lines])
    return encode_records(LogLine(t=ln.t, node=ln.node, text=x) for ln, x in zip(lines, texts, strict=True))


def encode_env(envs: Mapping[int, Mapping[str, str]]) -> bytes:
    """``env.json``: each node's engine environment, secrets scrubbed by name and by value."""
    doc = {str(node): scrub_env(env) for node, env in sorted(envs.items())}
    return (json.dumps(doc, indent=1, sort_keys=True, ensure_ascii=False) + "\n").encode("utf-8")


def encode_text(text: str) -> bytes:
    """A text file (log tail, nvidia-smi output) with secret-looking substrings scrubbed, line by line."""
    return "".join(scrub_lines(text.splitlines(keepends=True))).encode("utf-8", "replace")


def encode_json(doc: Any) -> bytes:
    """A free-form JSON document (psutil state) with secret-named keys and secret-looking strings scrubbed."""
    try:
        return (json.dumps(scrub_json(doc), indent=1, ensure_ascii=False, allow_nan=False) + "\n").encode("utf-8")
    except (TypeError, ValueError) as exc:
        raise BundleError(f"a document cannot be written as JSON: {exc}") from None


# ---- stack samples: the stack table -------------------------------------------------------------


def encode_stack_samples(samples: Iterable[StackSample]) -> bytes:
    """Stack-table JSON lines: each distinct frame once, samples refer to frames by id."""
    ids: dict[Frame, int] = {}
    out: list[str] = []
    for s in samples:
        threads = []
        for th in s.threads:
            refs = []
            for f in th.frames:
                fid = ids.get(f)
                if fid is None:
                    fid = ids[f] = len(ids)
                    out.append(dumps_line({"frame_id": fid, "frame": f.to_json()}))
                refs.append(fid)
            threads.append({"thread_id": th.thread_id, "name": th.name, "active": th.active,
                            "owns_gil": th.owns_gil, "frames": refs})
        d = s.to_json()
        d["threads"] = threads
        try:
            out.append(dumps_line({"sample": d}))
        except ValueError as exc:
            raise BundleError(f"a stack sample cannot be written as JSON: {exc}") from None
    return ("\n".join(out) + "\n").encode("utf-8") if out else b""


_JSON_STR = rb'"(?:[^"\\]|\\.)*"'
_JSON_INT = rb"-?(?:0|[1-9][0-9]*)"
_JSON_NUMBER = re.compile(_JSON_INT + rb"(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?")
#: How :func:`encode_stack_samples` begins a sample line; ``t`` follows, then the fields from ``,"node":`` on.
_SAMPLE_PREFIX = b'{"sample":{"t":'
#: A stack-sample line exactly as :func:`encode_stack_samples` writes it (compact, keys in ``to_json`` order):
#: t, node, pid, title, rank, native, the threads' JSON text, error, and the process state where it is set.
_SAMPLE_LINE = re.compile(
    rb'\{"sample":\{"t":(' + _JSON_NUMBER.pattern + rb")"
    + rb',"node":(' + _JSON_INT + rb'),"pid":(' + _JSON_INT + rb'),"title":(' + _JSON_STR
    + rb'),"rank":(' + _JSON_INT + rb'|null),"native":(true|false),"threads":(\[.*\]),"error":(null|' + _JSON_STR
    + rb')(?:,"state":(' + _JSON_STR + rb"))?\}\}[ \t\r\n]*", re.DOTALL)


def _hashable(key: tuple[Any, ...]) -> tuple[Any, ...] | None:
    """``key``, or None where a list or object sits where a scalar belongs (``from_json`` will refuse it)."""
    try:
        hash(key)
    except TypeError:
        return None
    return key


class _StackDecoder:
    """Decoding state: the frame table, the interned thread stacks (hung processes repeat them) and the
    validated sample heads (a process's samples differ only in time and stacks).

    Each distinct thread stack and sample head goes through ``from_json`` once; a repeat is recognised by a
    key of its fields (with the types of the numeric and boolean ones: 1, 1.0 and True are equal keys in
    Python), so it is exactly what was checked. A one-hour bundle's 28,800 samples
    decode in a fraction of the time that checking each field of each sample took.
    """

    def __init__(self, name: str) -> None:
        self.name = name
        self.frames: list[Frame] = []
        self.threads: dict[tuple[Any, ...], ThreadStack] = {}
        self.heads: dict[tuple[Any, ...], StackSample] = {}
        self.raw_heads: dict[tuple[bytes, ...], StackSample] = {}
        self.raw_threads: dict[bytes, tuple[ThreadStack, ...]] = {}
        #: Everything of a checked sample line after ``t`` -> its head and threads (see :meth:`sample_line`).
        self.raw_rests: dict[bytes, tuple[StackSample, tuple[ThreadStack, ...]]] = {}

    def frame(self, ref: Any, lineno: int) -> Frame:
        if type(ref) is int:
            if 0 <= ref < len(self.frames):
                return self.frames[ref]
            raise _fail(self.name, lineno, f"frame id {ref} is not defined")
        if isinstance(ref, dict):
            return Frame.from_json(ref)
        raise _fail(self.name, lineno, "a frame must be a frame id or an object")

    def thread(self, d: Any, lineno: int) -> ThreadStack:
        if not isinstance(d, dict):
            raise _fail(self.name, lineno, "a thread must be an object")
        refs = d.get("frames")
        if not isinstance(refs, list):
            raise _fail(self.name, lineno, "thread field 'frames' must be a list")
        key = None
        if set(map(type, refs)) <= _INT:  # frame ids only (no inline frame objects): the stack can be interned
            tid, active, gil = d.get("thread_id"), d.get("active"), d.get("owns_gil")
            key = _hashable((type(tid), tid, type(active), active, type(gil), gil, d.get("name"), *refs))
            hit = self.threads.get(key) if key is not None else None
            if hit is not None:
                return hit
        frames = tuple(self.frame(r, lineno) for r in refs)
        head = ThreadStack.from_json({**d, "frames": []})
        ts = ThreadStack(head.thread_id, head.name, head.active, head.owns_gil, frames)
        if key is not None:
            self.threads[key] = ts
        return ts

    def sample(self, d: Any, lineno: int) -> StackSample:
        if not isinstance(d, dict):
            raise _fail(self.name, lineno, "a sample must be an object")
        threads = d.get("threads")
        if not isinstance(threads, list):
            raise _fail(self.name, lineno, "sample field 'threads' must be a list")
        t: Any = d.get("t")
        node, pid, rank, native = d.get("node"), d.get("pid"), d.get("rank"), d.get("native")
        key = _hashable((type(node), node, type(pid), pid, type(rank), rank, type(native), native, d.get("title"),
                         d.get("error"), d.get("state")))
        head = self.heads.get(key) if key is not None and type(t) in _NUM_T else None
        if head is None:
            head = StackSample.from_json({**d, "threads": []})  # checks every field, t included
            if key is not None:
                self.heads[key] = head
        return StackSample(float(t), head.node, head.pid, head.title, head.rank, head.native,
                           tuple(self.thread(x, lineno) for x in threads), head.error, head.state)

    def sample_line(self, raw: bytes, lineno: int) -> StackSample | None:
        """A sample line in the writer's own shape, taken apart by :data:`_SAMPLE_LINE` without parsing it
        whole; None for any other line (and for any doubt: the general path then parses it and says what is
        wrong). Its head fields and its threads are parsed and checked once per distinct text: a process's
        samples repeat both, only ``t`` differs, and building 1.3 million JSON objects for 28,800 samples
        was most of the decoding time. The regular expression pins every field but the threads to a JSON
        scalar, so the line is valid JSON exactly when its threads text is, and the values are the same as a
        whole-line parse gives. A line whose text after ``t`` is that of a line already taken apart skips the
        regular expression (~3x its cost): it is valid exactly when its ``t`` is a JSON number."""
        if raw.startswith(_SAMPLE_PREFIX):  # the rest of the line seen and checked before: only ``t`` is new
            cut = raw.find(b',"node":', len(_SAMPLE_PREFIX))
            seen = self.raw_rests.get(raw[cut:]) if cut > 0 else None
            if seen is not None and _JSON_NUMBER.fullmatch(raw, len(_SAMPLE_PREFIX), cut):
                h, stack = seen
                return StackSample(float(_loads_fast(raw[len(_SAMPLE_PREFIX):cut], "")), h.node, h.pid, h.title,
                                   h.rank, h.native, stack, h.error, h.state)
        m = _SAMPLE_LINE.fullmatch(raw)
        if m is None:
            return None
        t, node, pid, title, rank, native, threads, error, state = m.groups()
        hkey = (node, pid, title, rank, native, error, state)
        head = self.raw_heads.get(hkey)
        if head is None:
            try:
                head = StackSample.from_json(_loads_fast(
                    b'{"t":0,"node":%s,"pid":%s,"title":%s,"rank":%s,"native":%s,"threads":[],"error":%s,"state":%s}'
                    % (node, pid, title, rank, native, error, state or b"null"), ""))
            except (BundleError, RecordError):
                return None
            self.raw_heads[hkey] = head
        ts = self.raw_threads.get(threads)
        if ts is None:
            try:
                parsed = _loads_fast(threads, "")
            except BundleError:
                return None
            if not isinstance(parsed, list):
                return None
            ts = self.raw_threads[threads] = tuple(self.thread(x, lineno) for x in parsed)
        self.raw_rests[raw[m.end(1):]] = (head, ts)
        return StackSample(float(_loads_fast(t, "")), head.node, head.pid, head.title, head.rank, head.native, ts,
                           head.error, head.state)

    def line(self, obj: Any, lineno: int) -> StackSample | None:
        if not isinstance(obj, dict):
            raise _fail(self.name, lineno, "expected a JSON object")
        if "frame_id" in obj:
            fid = obj["frame_id"]
            if type(fid) is not int or fid != len(self.frames):
                raise _fail(self.name, lineno, f"frame_id must be {len(self.frames)} (ids count up from 0)")
            self.frames.append(Frame.from_json(obj.get("frame")))  # type: ignore[arg-type]  # from_json checks
            return None
        if "sample" in obj:
            return self.sample(obj["sample"], lineno)
        if "threads" in obj:  # a plain StackSample.to_json() line
            return self.sample(obj, lineno)
        raise _fail(self.name, lineno, "expected a 'frame_id', 'sample' or stack-sample object")


def decode_stack_samples(stream: IO[bytes], name: str) -> list[StackSample]:
    """Decode a stack-table file into StackSamples (frames and identical thread stacks shared)."""
    dec = _StackDecoder(name)
    out: list[StackSample] = []
    for lineno, raw in _raw_lines(stream, name):
        try:
            s = dec.sample_line(raw, lineno)
            if s is None:
                s = dec.line(_loads_fast(raw, f"{name}:{lineno}"), lineno)
        except RecordError as exc:
            raise _fail(name, lineno, str(exc)) from None
        if s is not None:
            out.append(s)
    return out


# ---- probe records: column blocks ---------------------------------------------------------------


#: Probe records decoded from a bundle: the core's columns (kept under this name for the bundle's readers).
ProbeTable = ProbeColumns


def _column_groups(pc: ProbeColumns) -> dict[ProbeGroup, dict[str, list[Any]]]:
    """What :func:`encode_probe_records` builds, read from columns directly (no record objects): a capture's
    merged probes are columns, and making a record of each row only to take it apart again cost it ~0.1 s."""
    groups: dict[ProbeGroup, dict[str, list[Any]]] = {}
    if not len(pc):
        return groups
    order = np.argsort(pc.group, kind="stable")
    gid = pc.group[order]
    cuts = np.flatnonzero(np.diff(gid)) + 1
    firsts = [int(order[0]), *(int(order[c]) for c in cuts.tolist())]
    for idx, first in sorted(zip(np.split(order, cuts), firsts, strict=True), key=lambda x: x[1]):
        g = pc.groups[int(pc.group[first])]
        end = pc.end[idx]
        cols: dict[str, list[Any]] = {
            "seq": pc.seq[idx].tolist(), "start": pc.start[idx].tolist(),
            "end": [None if math.isnan(x) else x for x in end.tolist()], "gather_size": pc.gather_size[idx].tolist()}
        gpu = pc.gpu[idx]
        if bool(gpu.any()):
            cols["gpu"] = [1 if x else 0 for x in gpu.tolist()]
            cols["gpu_start"] = [None if math.isnan(x) else x for x in pc.gpu_start[idx].tolist()]
            cols["gpu_end"] = [None if math.isnan(x) else x for x in pc.gpu_end[idx].tolist()]
        key = ProbeGroup(g.node, g.rank, g.pid, g.thread, g.target, g.graph_key)
        had = groups.get(key)  # the same group under two indices (columns concatenated): one group, as records
        if had is None:
            groups[key] = cols
            continue
        n_had, n_new = len(had["seq"]), len(cols["seq"])
        for k in ("gpu", "gpu_start", "gpu_end"):
            if (k in had) != (k in cols):
                (cols if k in had else had)[k] = [0 if k == "gpu" else None] * (n_new if k in had else n_had)
        for k, v in cols.items():
            had[k].extend(v)
    return groups


def encode_probe_records(records: Iterable[ProbeRecord] | ProbeColumns) -> bytes:
    """Column blocks: records grouped by (node, rank, pid, thread, target, graph key), up to 65,536 rows a line.

    Groups keep the order in which they first appear and rows keep their order within a group; the
    interleaving across groups is not kept (a reader sorts by ``start`` where order matters).
    """
    groups: dict[ProbeGroup, dict[str, list[Any]]] = {}
    if isinstance(records, ProbeColumns):
        groups = _column_groups(records)
        records = ()
    for r in records:
        g = ProbeGroup(r.node, r.rank, r.pid, r.thread, r.target, r.graph_key)
        cols = groups.get(g)
        if cols is None:
            cols = groups[g] = {"seq": [], "start": [], "end": [], "gather_size": []}
        cols["seq"].append(r.seq)
        cols["start"].append(r.start)
        cols["end"].append(r.end)
        cols["gather_size"].append(r.gather_size)
        if r.gpu and "gpu" not in cols:  # GPU columns only in groups that have GPU timing (older readers skip them)
            n = len(cols["seq"]) - 1
            cols.update(gpu=[0] * n, gpu_start=[None] * n, gpu_end=[None] * n)
        if "gpu" in cols:
            cols["gpu"].append(1 if r.gpu else 0)
            cols["gpu_start"].append(r.gpu_start)
            cols["gpu_end"].append(r.gpu_end)
    out: list[str] = []
    for g, cols in groups.items():
        for i in range(0, len(cols["seq"]), PROBE_BLOCK_ROWS):
            blk = {"node": g.node, "rank": g.rank, "pid": g.pid, "thread": g.thread, "target": g.target,
                   **({} if g.graph_key is None else {"graph_key": g.graph_key}),  # format 1.3: graph replays
                   **{k: v[i:i + PROBE_BLOCK_ROWS] for k, v in cols.items()}}
            try:
                out.append(dumps_line({"probe_block": blk}))
            except ValueError as exc:
                raise BundleError(f"a probe record cannot be written as JSON: {exc}") from None
    return ("\n".join(out) + "\n").encode("utf-8") if out else b""




def _int_col(v: Any, what: str) -> I64:
    if not isinstance(v, list) or not set(map(type, v)) <= _INT:
        raise RecordError(f"probe_block {what!r} must be a list of integers")
    try:
        return np.array(v, dtype=np.int64)
    except OverflowError:
        raise RecordError(f"probe_block {what!r} has an integer out of range") from None


def _float_col(v: Any, what: str, *, nullable: bool = False) -> F64:
    if not isinstance(v, list) or not set(map(type, v)) <= (_NUM_OR_NULL if nullable else _NUM_T):
        raise RecordError(f"probe_block {what!r} must hold only numbers{' or null' if nullable else ''}")
    return np.array(v, dtype=np.float64)  # None -> NaN (in flight); an int too large for a float: OverflowError


@dataclass(frozen=True, slots=True)
class _Block:
    group: ProbeGroup
    seq: I64
    start: F64
    end: F64
    gather: I64
    gpu: tuple[I64, F64, F64] | None


def _block(d: Any) -> _Block:
    if not isinstance(d, dict):
        raise RecordError("probe_block must be an object")
    # The shared fields go through ProbeRecord's own validation.
    head = ProbeRecord.from_json({**{k: v for k, v in d.items() if k not in _COLUMNS},
                                  "seq": 0, "start": 0.0, "end": None, "gather_size": 0})
    seq = _int_col(d.get("seq"), "seq")
    start = _float_col(d.get("start"), "start")
    end = _float_col(d.get("end"), "end", nullable=True)
    gather = _int_col(d.get("gather_size"), "gather_size")
    if not len(seq) == len(start) == len(end) == len(gather):
        raise RecordError("probe_block columns differ in length")
    gpu: tuple[I64, F64, F64] | None = None
    if "gpu" in d:
        flags = _int_col(d.get("gpu"), "gpu")
        if not bool(np.all((flags == 0) | (flags == 1))):
            raise RecordError("probe_block 'gpu' must hold only 0 or 1")
        gpu = (flags, _float_col(d.get("gpu_start"), "gpu_start", nullable=True),
               _float_col(d.get("gpu_end"), "gpu_end", nullable=True))
        if not len(gpu[0]) == len(gpu[1]) == len(gpu[2]) == len(seq):
            raise RecordError("probe_block columns differ in length")
    return _Block(ProbeGroup(head.node, head.rank, head.pid, head.thread, head.target, head.graph_key), seq, start,
                  end, gather, gpu)


def _record_block(r: ProbeRecord) -> _Block:
    """A plain ProbeRecord line as a one-row block."""
    def f(v: float | None) -> F64:
        return np.array([math.nan if v is None else v])

    return _Block(ProbeGroup(r.node, r.rank, r.pid, r.thread, r.target, r.graph_key), np.array([r.seq], np.int64),
                  f(r.start),
                  f(r.end), np.array([r.gather_size], np.int64),
                  (np.array([int(r.gpu)], np.int64), f(r.gpu_start), f(r.gpu_end)))


def _table(blocks: list[_Block]) -> ProbeColumns:
    """One set of columns from the decoded blocks (each column concatenated once: no growing arrays)."""
    index: dict[ProbeGroup, int] = {}
    gi = [np.full(len(b.seq), index.setdefault(b.group, len(index)), np.int64) for b in blocks]

    def cat(parts: list[npt.NDArray[Any]], dtype: type[np.generic]) -> npt.NDArray[Any]:
        return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)

    def nan(n: int) -> F64:
        return np.full(n, math.nan)

    has_gpu = any(b.gpu for b in blocks)  # none: the columns' own absent-GPU form (no three columns of a million)
    return ProbeColumns(
        list(index), cat(gi, np.int64), cat([b.seq for b in blocks], np.int64),
        cat([b.start for b in blocks], np.float64), cat([b.end for b in blocks], np.float64),
        cat([b.gather for b in blocks], np.int64),
        cat([b.gpu[0] if b.gpu else np.zeros(len(b.seq), np.int64) for b in blocks], np.bool_) if has_gpu else None,
        cat([b.gpu[1] if b.gpu else nan(len(b.seq)) for b in blocks], np.float64) if has_gpu else None,
        cat([b.gpu[2] if b.gpu else nan(len(b.seq)) for b in blocks], np.float64) if has_gpu else None)


def decode_probe_records(stream: IO[bytes], name: str) -> ProbeColumns:
    """Decode column blocks and/or plain ProbeRecord lines into one set of columns (numpy, no record objects)."""
    blocks: list[_Block] = []
    for lineno, obj in iter_json_lines(stream, name, fast=True):
        try:
            if isinstance(obj, dict) and "probe_block" in obj:
                blocks.append(_block(obj["probe_block"]))
            elif isinstance(obj, dict):
                blocks.append(_record_block(ProbeRecord.from_json(obj)))
            else:
                raise RecordError("expected a JSON object")
        except (RecordError, OverflowError) as exc:
            raise _fail(name, lineno, str(exc)) from None
    return _table(blocks)
