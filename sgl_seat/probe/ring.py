"""The ring: the on-disk format every probe writer (Python and C) writes and the sidecar's reader of it.

One mmap'd file per engine process, ``<dir>/probe-<pid>.ring``: a 4096-byte header (magic, version, slot
count, pid, rank, node, creation time, the target table), ``nslots`` 64-byte slots, then a side area of two
doubles per slot (the GPU start and end). Each wrapped call writes one slot: sequence word, call number, start
time, end word (0 while the call is in flight, so a fetch that never returns is visible with its age), gather
size, thread, target index and GPU state.

Writer protocol (no locks): a call claims slot ``c mod N`` from a process-wide counter, writes the
slot's sequence word odd, the fields, then the sequence word even; the end is one aligned 8-byte store.
A reader copies sequence words, fields, then sequence words again and keeps slots whose sequence is even
and unchanged.

Times are integers (``time.time_ns()``). The end word is stored *blind*, without first reading the slot:
the gather a row fetch does (hundreds of KB) evicts the slot's cache line, and reading it back to check
that the slot still holds call ``c`` cost a cache miss per call (the probe measured 1.3-2.1 us around the
sim's real fetch against 0.7-0.8 us around an empty function). Instead the end word carries its call's
*lap* (``c // N``, 15 bits) above the low 48 bits of the end time; the reader takes an end only when its
lap matches the slot's call. A late end of a call whose slot was reused (``N`` calls started while it ran)
lands on the newer call's slot with an older lap: the reader neither takes it as the newer call's end nor
reports that call in flight (its true end was overwritten), it skips the slot until its own end arrives.
The end time is recovered from the start (full precision) and the 48 low bits, exact for calls shorter
than 78 hours.

The target word (the slot's seventh) holds the target's index in its low 16 bits; a CUDA graph replay
(:mod:`.graph`) also sets bit 16 and puts the replayed graph's shape key in bits 32-62 (version 3). The C writer
and the eager Python wrappers write the bare index, so their slots read as eager calls.

Why a module of its own: the layout is the contract between the writers (:mod:`.writer`, ``probe_native.c``,
:mod:`.gpu`'s event reader) and the sidecar, which needs only this module's reader, never the writers.
"""

from __future__ import annotations

import mmap
import os
import re
import struct
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

MAGIC = b"SGLPRB01"
RING_VERSION = 3  # 3: graph replays in the target word; 2: integer ns times, lap-tagged end word; 1: float seconds
HEADER_BYTES = 4096
SLOT_WORDS = 8
SLOT_BYTES = SLOT_WORDS * 8
DEFAULT_SLOTS = 4096
MAX_TARGETS = 30
TARGET_NAME_BYTES = 120
_TARGETS_OFF = 256

# Header: magic, version, slot_words, nslots, pid, rank, node, created, ntargets.
_HDR = struct.Struct("<8sIIIIiidI")
# Slot: seq, call number, start (ns), end word (lap << 48 | end ns mod 2**48; 0 in flight), gather size, thread,
# target index, GPU state (GPU_NONE..GPU_DONE).
_SLOT = struct.Struct("<qqqqqqqq")
_END_BITS = 48
_END_MASK = (1 << _END_BITS) - 1
_LAP_MASK = 0x7FFF  # 15 bits: the end word stays a positive int64
_W_CALL, _W_START, _W_END, _W_TARGET, _W_GPU = 1, 2, 3, 6, 7
#: Target word: index in the low bits; a graph replay sets the flag and its shape key above bit 32.
TARGET_INDEX_MASK = 0xFFFF
GRAPH_FLAG = 1 << 16
GRAPH_KEY_SHIFT = 32
GRAPH_KEY_MAX = (1 << 31) - 1


def target_word(tidx: int, graph_key: int | None = None) -> int:
    """The slot's target word: ``tidx`` alone for an eager call, with the graph flag and ``graph_key`` (clamped to
    0 .. 2**31 - 1) for a graph replay."""
    if graph_key is None:
        return tidx
    return tidx | GRAPH_FLAG | (min(max(graph_key, 0), GRAPH_KEY_MAX) << GRAPH_KEY_SHIFT)


def split_target_word(word: int) -> tuple[int, int | None]:
    """(target index, graph key or None) of a slot's target word."""
    return word & TARGET_INDEX_MASK, (word >> GRAPH_KEY_SHIFT) if word & GRAPH_FLAG else None
#: The slot's last word: what the engine's event reader knows of the call's GPU work.
GPU_NONE, GPU_QUEUED, GPU_STARTED, GPU_DONE = 0, 1, 2, 3
#: Header word (at byte 48, inside the header's reserved space) holding the GPU side area's offset; 0: none.
_GPU_OFF_AT = 48
_GPU_OFF = struct.Struct("<Q")
GPU_SLOT_BYTES = 16  # gpu_start, gpu_end (doubles)
_GPU_PAIR = struct.Struct("<dd")


def default_dir() -> str:
    """Where rings go when ``SGLSEAT_PROBE_DIR`` is unset: /dev/shm if present, else the temp dir."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()  # noqa: S108
    return os.path.join(base, f"sgl-seat-probe-{os.getuid()}")


def ring_path(directory: str, pid: int) -> str:
    return os.path.join(directory, f"probe-{pid}.ring")



@dataclass(frozen=True)
class RingHeader:
    pid: int
    rank: int
    node: int
    nslots: int
    created: float
    targets: tuple[str, ...]


class RingError(ValueError):
    """A file that is not a probe ring of a version this reader knows."""


class RingNotReady(RingError):
    """A ring its process is still creating: shorter than a header, or its magic not written yet (it goes last)."""


def read_header(buf: bytes | mmap.mmap) -> RingHeader:
    if len(buf) < HEADER_BYTES or bytes(buf[0:8]) != MAGIC:
        raise RingError("not a probe ring (bad magic)")
    _magic, version, slot_words, nslots, pid, rank, node, created, ntargets = _HDR.unpack_from(buf, 0)
    if version != RING_VERSION or slot_words != SLOT_WORDS:
        raise RingError(f"probe ring version {version} (slot words {slot_words}) is not {RING_VERSION}")
    names = []
    for i in range(min(ntargets, MAX_TARGETS)):
        off = _TARGETS_OFF + i * TARGET_NAME_BYTES
        names.append(bytes(buf[off:off + TARGET_NAME_BYTES]).rstrip(b"\0").decode("utf-8", "replace"))
    return RingHeader(pid=pid, rank=rank, node=node, nslots=nslots, created=created, targets=tuple(names))


@dataclass(frozen=True, slots=True)
class RingRecord:
    """One slot as read: the fields of the watchdog's ``ProbeRecord`` (``sgl_seat.core.records``), which a reader
    makes instead where it passes ``record=ProbeRecord`` (the sidecar does). Why a type of its own: this package
    imports nothing of sgl-seat (it loads by path into engines that lack it), so it cannot name the core's."""

    node: int
    rank: int
    pid: int
    thread: int
    seq: int
    target: str
    start: float
    end: float | None
    gather_size: int
    gpu: bool = False
    gpu_start: float | None = None
    gpu_end: float | None = None
    graph_key: int | None = None


def read_ring(path: str, *, node: int | None = None, rank: int | None = None,
              record: Callable[..., Any] = RingRecord) -> list[Any]:
    """Every stable slot of a ring as ``record`` (:class:`RingRecord` unless given; in-flight ones have
    ``end=None``), by call order.

    ``node``/``rank`` override the header's (the sidecar knows them from the process title). A torn
    slot (being written while read) is skipped, never returned half-updated.
    """
    return RingReader(path, record=record).read(node=node, rank=rank)


class RingReader:
    """Reads one ring repeatedly, decoding only slots that changed (or were in flight) since the last read.

    The sidecar polls every ring a few times a second; decoding all 4096 slots each time would cost more
    than everything else it does. Sequence words are copied, then the slots, then the sequence words again:
    a slot whose word is odd or changed between the copies is torn and is looked at again next time.
    """

    def __init__(self, path: str, *, record: Callable[..., Any] = RingRecord) -> None:
        self.path = path
        self._record = record  # what each slot becomes: RingRecord, or the core's ProbeRecord (same fields)
        self._seq: list[int] = []
        self._open: set[int] = set()  # slots in flight (or torn) at the last read

    def read(self, *, node: int | None = None, rank: int | None = None) -> list[Any]:
        """Records of slots that are new or changed since the last read (every stable one the first time)."""
        make = self._record

        with open(self.path, "rb") as fh:
            size = os.fstat(fh.fileno()).st_size
            if size < HEADER_BYTES:
                raise RingNotReady(f"{self.path}: shorter than a header (being created)")
            mm = mmap.mmap(fh.fileno(), size, mmap.MAP_SHARED, mmap.PROT_READ)
        try:
            if bytes(mm[0:8]) == bytes(8):
                raise RingNotReady(f"{self.path}: no magic yet (being created)")
            hdr = read_header(mm)
            end = HEADER_BYTES + hdr.nslots * SLOT_BYTES
            if size < end:
                raise RingError(f"{self.path}: truncated ({size} bytes, header says {end})")
            qv = memoryview(mm).cast("q")
            first = HEADER_BYTES // 8
            seq_before = qv[first:end // 8:SLOT_WORDS].tolist()
            body = bytes(mm[HEADER_BYTES:end])
            gpu_off = _GPU_OFF.unpack_from(mm, _GPU_OFF_AT)[0]
            gpu_end_at = gpu_off + hdr.nslots * GPU_SLOT_BYTES
            # Copied after the slots: the event reader writes a time before the state word that announces it.
            gpu_area = bytes(mm[gpu_off:gpu_end_at]) if gpu_off >= end and size >= gpu_end_at else b""
            seq_after = qv[first:end // 8:SLOT_WORDS].tolist()
            qv.release()
        finally:
            mm.close()
        use_rank = hdr.rank if rank is None else rank
        use_node = (hdr.node if hdr.node >= 0 else -1) if node is None else node
        last = self._seq if len(self._seq) == hdr.nslots else [0] * hdr.nslots
        shift = hdr.nslots.bit_length() - 1
        todo = {i for i in range(hdr.nslots) if seq_before[i] != last[i]} | self._open
        out: list[Any] = []
        still_open: set[int] = set()
        for i in todo:
            s0 = seq_before[i]
            if s0 == 0:
                continue
            if s0 & 1 or s0 != seq_after[i]:
                still_open.add(i)
                continue
            _seq, call, start_ns, end_word, gs, thread, tword, gstate = _SLOT.unpack_from(body, i * SLOT_BYTES)
            tidx, graph_key = split_target_word(tword)
            fin = _end_seconds(call, start_ns, end_word, shift)
            if fin is None or gstate in (GPU_QUEUED, GPU_STARTED):
                still_open.add(i)
            if fin == _CLOBBERED:
                continue
            gpu_start = gpu_end = None
            if gpu_area and gstate in (GPU_STARTED, GPU_DONE):
                g0, g1 = _GPU_PAIR.unpack_from(gpu_area, i * GPU_SLOT_BYTES)
                gpu_start = g0
                gpu_end = g1 if gstate == GPU_DONE else None
            target = hdr.targets[tidx] if 0 <= tidx < len(hdr.targets) else f"target#{tidx}"
            out.append(make(node=use_node, rank=use_rank, pid=hdr.pid, thread=thread, seq=call,
                            target=target, start=start_ns / 1e9, end=fin, gather_size=gs,
                            gpu=bool(gpu_area) and gstate != GPU_NONE, gpu_start=gpu_start,
                            gpu_end=gpu_end, graph_key=graph_key))
        self._seq = seq_before
        self._open = still_open
        out.sort(key=lambda r: r.seq)
        return out


_CLOBBERED = -1.0


def _end_seconds(call: int, start_ns: int, end_word: int, shift: int) -> float | None:
    """The call's end (seconds); None while it is in flight; ``_CLOBBERED`` when the end word is a late end
    of an earlier call in the same slot (this call's own end, if it came, was overwritten)."""
    if end_word == 0:
        return None
    if (end_word >> _END_BITS) != (call >> shift) & _LAP_MASK:
        return _CLOBBERED
    return (start_ns + ((end_word - start_ns) & _END_MASK)) / 1e9


def list_rings(directory: str) -> dict[int, str]:
    """pid -> ring path for every ring file in ``directory``."""
    found: dict[int, str] = {}
    try:
        names = os.listdir(directory)
    except OSError:
        return found
    for name in names:
        m = re.fullmatch(r"probe-(\d+)\.ring", name)
        if m:
            found[int(m.group(1))] = os.path.join(directory, name)
    return found
