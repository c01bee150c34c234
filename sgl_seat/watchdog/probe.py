"""The in-engine probe: times configured calls (row fetches) into a lock-free shared-memory ring.

Loaded into every engine process through the plan's environment (``SGL_SEAT_PROBE`` names the
targets, ``SGL_SEAT_PROBE_DIR`` the ring directory; see :mod:`sgl_seat.watchdog.boot` for engines
that have no hook of ours). Each wrapped call writes one 64-byte slot: start time, end time (0 while
the call is in flight, so a fetch that never returns is visible with its age), gather size, thread
and target. The ring is one mmap'd file per process, ``<dir>/probe-<pid>.ring``; the sidecar reads it
with :func:`read_ring`.

Target syntax (comma-separated in ``SGL_SEAT_PROBE``)::

    module:function[@arg[:mode]]        e.g. sgl_seat.sim.rowfetch:fetch_rows@ids
    module:Class.method[@arg[:mode]]    e.g. sglang.srt.layers.engram:EngramEmbedding.forward@indices:numel
    module.function[@arg[:mode]]        (dotted: the module is everything before the last dot)

``arg`` is a parameter name or a 0-based position (``self`` counts); ``mode`` is ``len`` (default),
``numel`` (``obj.numel()``), ``dim0`` (``obj.shape[0]``) or ``none``. Without ``@``, the first
parameter named ``ids``, ``indices``, ``hash_ids`` or ``input_ids`` is measured with ``len``.

GPU stream (``SGL_SEAT_PROBE_GPU``: ``auto`` (default: on when the process has initialised CUDA by its
first wrapped call), ``1``, ``0``): on a GPU a wrapped call mostly *enqueues* work, and a stalled host read
(SGLang's Engram table read over UVA) stalls a kernel, not the call. So each call also records one CUDA
event on the current stream after it (pooled, no synchronisation on the hot path; skipped while a CUDA graph
is captured; calls within ``SGL_SEAT_PROBE_GPU_COALESCE_US`` (1000) of their stream's last event share the
next one; ``SGL_SEAT_PROBE_GPU_PATH`` picks how events are recorded, see :func:`cuda_paths`). A reader
thread in the engine process (``sgl-seat-probe-gpu``) resolves them every
``SGL_SEAT_PROBE_GPU_POLL_S`` (0.02 s; less often while nothing is queued) and publishes into the same ring:
the slot's last word says none / queued / started / done, and a side area after the slots holds the GPU
start and end (wall clock). The end is when the reader saw the event complete; the start is a bound, not an
event: the later of the host call's start and the previous probed end on the same stream (see
:class:`GpuTimer`). The oldest unfinished call of a stream is "in flight on the GPU", with its age; later
ones are queued behind it. Calls replayed inside a CUDA graph run no Python and are not seen.

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

This module uses the standard library only and never raises into the engine: a probe that cannot
install or write warns once on stderr and gets out of the way. Its hot path has a C twin,
``probe_native.c`` beside it (the same slot writes; 0.13 us around an empty function against 0.9 us, and
0.4-0.9 us around the sim's real fetch against 1.4-3.1 us, bench/watchdog_overhead.py): built on first use with
the engine interpreter's own compiler into a private cache (``SGL_SEAT_PROBE_NATIVE_CACHE``, default
``~/.cache/sgl-seat``), used wherever it builds (``SGL_SEAT_PROBE_NATIVE=0``: never), the Python writer
otherwise. It is one file of about 1,300 lines on
purpose: ``watchdog/boot/sitecustomize.py`` loads it by path into engine interpreters that may not have
sgl-seat installed, so the writer, the import hook and the ring reader must travel as this one module.
"""

from __future__ import annotations

import atexit
import collections
import contextlib
import functools
import importlib
import importlib.abc
import importlib.machinery
import inspect
import itertools
import mmap
import os
import re
import stat
import struct
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from sgl_seat.core.records import ProbeRecord

ENV_TARGETS = "SGL_SEAT_PROBE"
ENV_DIR = "SGL_SEAT_PROBE_DIR"
ENV_SLOTS = "SGL_SEAT_PROBE_SLOTS"
ENV_RANK = "SGL_SEAT_RANK"
ENV_NODE = "SGL_SEAT_NODE_RANK"
ENV_GPU = "SGL_SEAT_PROBE_GPU"
ENV_GPU_POLL = "SGL_SEAT_PROBE_GPU_POLL_S"
ENV_GPU_PATH = "SGL_SEAT_PROBE_GPU_PATH"  # base | ctypes | method (see cuda_paths)
DEFAULT_GPU_PATH = "base"
ENV_GPU_COALESCE = "SGL_SEAT_PROBE_GPU_COALESCE_US"  # see GpuTimer; 0: an event after every call
DEFAULT_COALESCE_US = 1000.0
ENV_GPU_TIMING = "SGL_SEAT_PROBE_GPU_TIMING"  # 1 (default): timing events, completion times to microseconds
ENV_NATIVE = "SGL_SEAT_PROBE_NATIVE"  # auto (default): the C writer where it builds; 0: the Python one
ENV_NATIVE_CACHE = "SGL_SEAT_PROBE_NATIVE_CACHE"  # where the C writer is built (default ~/.cache/sgl-seat)
PREFILL_EVENTS = 1024  # events made when GPU timing starts (GpuTimer.prefill): ~10 ms once, none on the hot path

MAGIC = b"SGLPRB01"
RING_VERSION = 2  # 2: integer ns times, lap-tagged end word (1: float seconds, checked end store)
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
_W_CALL, _W_START, _W_END, _W_GPU = 1, 2, 3, 7
#: The slot's last word: what the engine's event reader knows of the call's GPU work.
GPU_NONE, GPU_QUEUED, GPU_STARTED, GPU_DONE = 0, 1, 2, 3
#: Header word (at byte 48, inside the header's reserved space) holding the GPU side area's offset; 0: none.
_GPU_OFF_AT = 48
_GPU_OFF = struct.Struct("<Q")
GPU_SLOT_BYTES = 16  # gpu_start, gpu_end (doubles)
_GPU_PAIR = struct.Struct("<dd")

_TITLE_RANK = re.compile(r"_TP(\d+)(?:_|$)")
_SIZE_PARAMS = ("ids", "indices", "hash_ids", "input_ids")
_MODES = ("len", "numel", "dim0", "none")


def default_dir() -> str:
    """Where rings go when ``SGL_SEAT_PROBE_DIR`` is unset: /dev/shm if present, else the temp dir."""
    base = "/dev/shm" if os.path.isdir("/dev/shm") else tempfile.gettempdir()  # noqa: S108
    return os.path.join(base, f"sgl-seat-probe-{os.getuid()}")


def ring_path(directory: str, pid: int) -> str:
    return os.path.join(directory, f"probe-{pid}.ring")


# --------------------------------------------------------------------------------------------------
# Writer state: module globals so the hot path reads them with LOAD_GLOBAL (cheap); rebound on
# ring creation and reset in a forked child (which must not write its parent's ring).

_MM: mmap.mmap | None = None
_Q: memoryview[int] | None = None
_D: memoryview[float] | None = None  # the same mapping as doubles: the GPU side area (reader thread only)
_MASK = 0
_SHIFT = 0  # log2(nslots): call number >> _SHIFT is the call's lap
_COUNTER: Any = itertools.count(1)
_NEXT: Callable[[], int] = _COUNTER.__next__
_PACK = _SLOT.pack_into
_RING_FAILED = False
_RING_LOCK = threading.Lock()  # only ring creation takes it (once per process), never the hot path
_TARGET_NAMES: list[str] = []
_WARNED: set[str] = set()
_INSTALLED: dict[str, str] = {}  # target spec -> "installed" | "pending" | "failed: ..."
_PENDING: dict[str, list[TargetSpec]] = {}
_FINDER: _ProbeFinder | None = None
_GPU: GpuTimer | None = None
_NATIVE: Any = None  # the C writer (probe_native.c) once loaded
_NATIVE_DECIDED = False
_NATIVE_WHY = "not decided yet"


def _warn(key: str, msg: str) -> None:
    if key in _WARNED:
        return
    _WARNED.add(key)
    with contextlib.suppress(Exception):  # stderr may be closed; the engine must not notice
        sys.stderr.write(f"sgl-seat probe (pid {os.getpid()}): {msg}\n")


def _own_rank() -> int:
    env = os.environ.get(ENV_RANK)
    if env is not None and env.lstrip("-").isdigit():
        return int(env)
    try:
        with open("/proc/self/cmdline", "rb") as fh:
            title = fh.read().split(b"\0", 1)[0].decode("utf-8", "replace")
    except OSError:
        return -1
    m = _TITLE_RANK.search(title)
    return int(m.group(1)) if m else -1


def _own_node() -> int:
    env = os.environ.get(ENV_NODE, "")
    return int(env) if env.isdigit() else -1


def _ensure_ring() -> bool:
    """Create this process's ring on the first wrapped call. False when it cannot (warned once)."""
    global _MM, _Q, _D, _MASK, _SHIFT, _COUNTER, _NEXT, _RING_FAILED
    if _MM is not None:
        return True
    if _RING_FAILED:
        return False
    _native()  # decided before the first ring: every wrapper of a process writes one way, on one counter
    with _RING_LOCK:
        if _MM is not None:
            return True
        try:
            nslots = int(os.environ.get(ENV_SLOTS, DEFAULT_SLOTS))
            if nslots < 2 or nslots & (nslots - 1):
                raise ValueError(f"{ENV_SLOTS}={nslots} must be a power of two >= 2")
            directory = os.environ.get(ENV_DIR) or default_dir()
            os.makedirs(directory, mode=0o700, exist_ok=True)
            _check_private_dir(directory)
            path = ring_path(directory, os.getpid())
            gpu_off = HEADER_BYTES + nslots * SLOT_BYTES
            size = gpu_off + nslots * GPU_SLOT_BYTES
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path)  # a dead process's ring with a recycled pid (or a planted link)
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
            try:
                os.ftruncate(fd, size)
                mm = mmap.mmap(fd, size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
            finally:
                os.close(fd)
            for i, name in enumerate(_TARGET_NAMES):
                _write_target_name(mm, i, name)
            # The magic goes last: a reader never sees a half-written header as valid.
            _HDR.pack_into(mm, 0, b"\0" * 8, RING_VERSION, SLOT_WORDS, nslots, os.getpid(), _own_rank(),
                           _own_node(), time.time(), len(_TARGET_NAMES))
            _GPU_OFF.pack_into(mm, _GPU_OFF_AT, gpu_off)
            mm[0:8] = MAGIC
            atexit.register(_unlink_ring, path, os.getpid())
            _Q = memoryview(mm).cast("q")
            _D = memoryview(mm).cast("d")
            _MASK = nslots - 1
            _SHIFT = nslots.bit_length() - 1
            nat = _native()
            if nat is not None:  # one counter for every wrapper of the process: the C writer's
                nat.set_ring(mm, nslots - 1, _SHIFT, HEADER_BYTES // SLOT_BYTES)
                _NEXT = nat.next_call
            else:
                _COUNTER = itertools.count(1)
                _NEXT = _COUNTER.__next__
            _MM = mm
            _maybe_enable_gpu(gpu_off, nslots)
            return True
        except Exception as exc:
            _RING_FAILED = True
            _warn("ring", f"cannot create the probe ring ({exc}); calls run untimed")
            return False


def _unlink_ring(path: str, pid: int) -> None:
    """At a normal exit the ring goes (a killed process leaves it for the sidecar's post-mortem)."""
    if os.getpid() == pid:
        with contextlib.suppress(OSError):
            os.unlink(path)


def _check_private_dir(directory: str) -> None:
    """Refuse a ring directory that is a link, or that someone else owns or may write into."""
    st = os.lstat(directory)
    if not stat.S_ISDIR(st.st_mode):
        raise OSError(f"{directory} is not a directory")
    if st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise OSError(f"{directory} is not private to uid {os.getuid()} (owner {st.st_uid}, mode {st.st_mode:o})")


def _write_target_name(mm: mmap.mmap, index: int, name: str) -> None:
    raw = name.encode("utf-8")[:TARGET_NAME_BYTES].ljust(TARGET_NAME_BYTES, b"\0")
    off = _TARGETS_OFF + index * TARGET_NAME_BYTES
    mm[off:off + TARGET_NAME_BYTES] = raw


def _register_target(name: str) -> int:
    """A process-wide target index (the ring's target table); names past the table share the last slot."""
    if name in _TARGET_NAMES:
        return _TARGET_NAMES.index(name)
    if len(_TARGET_NAMES) >= MAX_TARGETS:
        return MAX_TARGETS - 1
    _TARGET_NAMES.append(name)
    idx = len(_TARGET_NAMES) - 1
    mm = _MM
    if mm is not None:
        _write_target_name(mm, idx, name)
        struct.pack_into("<I", mm, _HDR.size - 4, len(_TARGET_NAMES))
    return idx


def _after_fork_in_child() -> None:
    global _MM, _Q, _D, _RING_FAILED, _RING_LOCK, _GPU
    _MM = _Q = _D = None
    _GPU = None  # the parent's event reader thread does not exist here
    _RING_FAILED = False
    _RING_LOCK = threading.Lock()
    if _NATIVE is not None:
        _NATIVE.clear_ring()  # the parent's mapping: this process writes its own ring
        _NATIVE.gpu_clear(None)  # and the parent's GPU timer's calls are not this process's


def reset() -> None:
    """Forget this process's ring (the next wrapped call creates a new one from the environment); tests."""
    global _MM, _Q, _D, _RING_FAILED, _GPU
    with _RING_LOCK:
        _MM = _Q = _D = None
        _RING_FAILED = False
        if _NATIVE is not None:
            _NATIVE.clear_ring()
        if _GPU is not None:
            _GPU.stop()
        _GPU = None


def native_state() -> str:
    """How this process's wrappers write: "native (<path>)" or "python (<why>)"; for the bench and tests."""
    nat = _native()
    return f"native ({nat.__file__})" if nat is not None else f"python ({_NATIVE_WHY})"


def _native() -> Any:
    """The C writer (``probe_native.c`` beside this file), built once per interpreter and source into a private
    cache directory with the interpreter's own compiler; None where it is off or cannot be had (the Python
    writer does the same job, slower). Decided once per process, before its first ring."""
    global _NATIVE, _NATIVE_DECIDED, _NATIVE_WHY
    if _NATIVE_DECIDED:
        return _NATIVE
    with _RING_LOCK:
        if _NATIVE_DECIDED:
            return _NATIVE
        if os.environ.get(ENV_NATIVE, "auto").strip().lower() in ("0", "off", "no", "false"):
            _NATIVE_WHY = f"{ENV_NATIVE}=0"
        else:
            try:
                _NATIVE = _load_native()
                _NATIVE_WHY = "loaded"
            except Exception as exc:
                _NATIVE_WHY = f"C writer unavailable: {type(exc).__name__}: {exc}"[:300]
                _warn("native", f"{_NATIVE_WHY}; the Python writer times calls instead")
        _NATIVE_DECIDED = True
        return _NATIVE


def _load_native() -> ModuleType:
    import hashlib
    import importlib.util
    import shlex
    import subprocess
    import sysconfig

    src = os.path.join(os.path.dirname(os.path.abspath(__file__)), "probe_native.c")
    with open(src, "rb") as fh:
        code = fh.read()
    key = hashlib.sha256(code + sys.version.encode() + sys.platform.encode()).hexdigest()[:16]
    suffix = sysconfig.get_config_var("EXT_SUFFIX") or ".so"
    cache = os.environ.get(ENV_NATIVE_CACHE) or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache"), "sgl-seat")
    cache = os.path.join(cache, "probe-native")
    os.makedirs(cache, mode=0o700, exist_ok=True)
    _check_private_dir(cache)  # a shared object is code: never one that someone else could have put there
    so = os.path.join(cache, f"probe_native-{sys.implementation.cache_tag}-{key}{suffix}")
    if not os.path.exists(so):
        cc = shlex.split(sysconfig.get_config_var("CC") or "cc")
        tmp = f"{so}.{os.getpid()}.tmp"
        cmd = [*cc, "-O2", "-shared", "-fPIC", "-I", sysconfig.get_paths()["include"], src, "-o", tmp]
        try:
            res = subprocess.run(cmd, capture_output=True, text=True, timeout=120, check=False)
            if res.returncode != 0:
                raise OSError(f"{' '.join(cmd[:1])} exited {res.returncode}: {res.stderr.strip()[-300:]}")
            os.replace(tmp, so)  # atomic: ranks that build at once each put a whole file in place
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
    st = os.lstat(so)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise OSError(f"{so} is not a private file of uid {os.getuid()}")
    spec = importlib.util.spec_from_file_location("probe_native", so)
    if spec is None or spec.loader is None:
        raise ImportError(f"cannot load {so}")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


# --------------------------------------------------------------------------------------------------
# GPU stream timing: one CUDA event after each call, resolved by a reader thread in this process


#: (captures, key_fn, key_arg, record_addr, exact_arg): see GpuTimer._fast.
FastPath = tuple[list[int], Callable[[Any], Any], Any, int, Any]


class _Stream:
    """One stream's unresolved calls: groups closed by an event, and the calls since its last event."""

    __slots__ = ("groups", "last_rec_ns", "open", "seen")

    def __init__(self) -> None:
        # (event, calls) in record order; the event was recorded after the last of its calls (slot word, call number).
        self.groups: collections.deque[tuple[Any, list[tuple[int, int]]]] = collections.deque()
        self.open: list[tuple[int, int]] = []  # calls after the last event, waiting for the next one
        self.last_rec_ns = 0  # perf_counter_ns of the last event recorded on this stream
        self.seen: float | None = None  # when the reader saw this stream's last probed work complete


class GpuTimer:
    """Records one CUDA event after wrapped calls, on the current stream, and resolves them off the hot path.

    Why one event, not a pair around the call: recording an event from Python costs 0.8-2 us on the H200 hosts
    measured (more right after a host-to-device copy; ``bench/gpu/event_cost.py``, ``record_after_copy.py``), and
    the probe's budget for GPU timing is 2 us per call. The call's *end* event says when its work finished on the
    stream; its *start* is bounded by the previous probed work on the same stream (the stream runs in order: once
    that completed, this call's work could start) and by the host call's own start (the work did not exist
    before it was enqueued). So the reader publishes, for the oldest unfinished call of each stream,
    ``gpu_start = max(host start, when the reader saw the previous probed work complete)`` and state *started*;
    later calls on the stream stay *queued* (their work waits behind it). What a second event would have told
    apart, and this does not: unprobed work between two probed calls (a matmul, an all-reduce) counts into the
    next call's in-flight age. A rank whose host runs ahead while its stream waits in a collective thus shows its
    next probed call "in flight" too; the stalled rank's call is older by the GPU work between two probed calls
    (the rest of a step), and the detectors name the oldest; where that work is shorter than the readers' poll
    jitter (``poll_s`` each) either rank can come out oldest.

    Coalescing (``coalesce_us``, ``SGL_SEAT_PROBE_GPU_COALESCE_US``, default 1000; 0: an event every call): a call
    that comes less than that after the last event recorded on its stream, while that stream still has
    unresolved calls, records none; it completes with the next event recorded on the stream (stream order), or,
    when no later call records one, when the stream is seen idle (``stream_idle``). Such calls cost the stream
    lookup and a list append, not the runtime call. A stall inside one is still seen: the last event before it
    completed, the next one (or the stream's idleness) never comes, so its group's first call is in flight.

    ``event_factory`` makes one event (a ``torch.cuda.Event``, or a fake in tests). ``stream_key()`` names the
    current stream (the raw handle in CUDA); ``record(event, key)`` records the event on it (``event.record()`` by
    default); ``query(event)`` says whether it completed (``event.query()`` by default); ``stream_idle(key)``
    whether all work on the stream completed (None: not known); ``capturing()`` whether a CUDA graph is being
    captured (an event recorded then would belong to the graph). The hot path (:meth:`end`) takes a pooled event,
    records it and queues it: no synchronisation, no query, no allocation once the pool is warm. :meth:`poll`
    (the reader thread, or a test directly) resolves each stream's queue.
    """

    def __init__(self, event_factory: Callable[[], Any], capturing: Callable[[], bool], *, gpu_off: int,
                 nslots: int, poll_s: float = 0.02, clock: Callable[[], float] = time.time,
                 stream_key: Callable[[], Any] | None = None, record: Callable[[Any, Any], Any] | None = None,
                 query: Callable[[Any], bool] | None = None, stream_idle: Callable[[Any], bool | None] | None = None,
                 thread_init: Callable[[], None] | None = None, coalesce_us: float = 0.0,
                 event_time: Callable[[Any], float | None] | None = None) -> None:
        self._factory = event_factory
        self._event_time = event_time
        self._stream_key: Callable[[], Any] = stream_key if stream_key is not None else _no_stream
        self._record: Callable[[Any, Any], Any] = record if record is not None else _record_method
        self._query: Callable[[Any], bool] = query if query is not None else _query_method
        self._stream_idle = stream_idle
        self._capturing = capturing
        self._thread_init = thread_init
        self._coalesce_ns = int(max(0.0, coalesce_us) * 1000)
        self._gpu_word = gpu_off // 8  # first double of the side area, in 8-byte words
        self._base = HEADER_BYTES // SLOT_BYTES
        self._limit = nslots
        self.poll_s = poll_s
        #: How long the reader sleeps while nothing is queued (a call seen late is still timed from its own start).
        self.idle_poll_s = max(poll_s, 0.2)
        self._clock = clock
        self._free: list[Any] = []
        self._streams: dict[Any, _Stream] = {}
        self._queued = 0  # calls queued and not yet resolved, all streams (the hot path's bound)
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.errors = 0
        self.queries = 0  # event and stream queries the reader made (the bench reports it)
        self.recorded = 0  # events recorded (calls - recorded: calls that rode on a later event)
        self._nat: Any = None  # the C writer, while it takes this timer's hot path (see _fast)
        self._fast_cfg: FastPath | None = None

    # -- the C writer's share ------------------------------------------------------------------------
    @property
    def _fast(self) -> FastPath | None:
        """For the C writer (``probe_native.c``, ``gpu_setup``): ``(captures, key_fn, key_arg, record_addr,
        exact_arg)`` lets it do :meth:`end`'s work itself on the streams this timer knows, keeping the calls that
        ride on a later event in a buffer of its own until :meth:`_drain` moves them here: the stream key is
        ``key_fn(key_arg)`` (``key_arg()`` first where it is callable), ``captures[0]`` the count of graph captures
        in progress (the capture hooks' list), ``record_addr`` the address of the CUDA runtime's
        ``cudaEventRecord`` (0: recording stays here), and ``exact_arg`` (None: none) the argument whose key a
        call that records must match (else it comes here). None: every call goes through :meth:`end`. Set only
        where it means what ``stream_key``, ``capturing`` and ``record`` mean (:func:`_fast_path`); setting it
        registers the timer with the C writer where this process has one."""
        return self._fast_cfg

    @_fast.setter
    def _fast(self, cfg: FastPath | None) -> None:
        if self._nat is not None:
            self._drain()
            self._nat.gpu_clear(self)
            self._nat = None
        self._fast_cfg = cfg
        nat = _NATIVE
        if cfg is not None and nat is not None:
            captures, key_fn, key_arg, record_addr, exact_arg = cfg
            nat.gpu_setup(self, captures, key_fn, key_arg, int(record_addr), exact_arg, self._coalesce_ns,
                          self._limit)
            nat.gpu_set_queued(self._queued)
            self._nat = nat

    def _drain(self) -> None:
        """Bring the calls the C writer queued in its own buffer into their streams' lists (before this timer
        reads or changes that state; under the GIL, so none is in flight meanwhile)."""
        nat = self._nat
        if nat is not None:
            self._queued += nat.gpu_drain(self, self._streams)

    # -- hot path ------------------------------------------------------------------------------------
    def end(self, b: int, c: int) -> None:
        """After the call in slot word ``b`` (call ``c``): queue it on its stream, recording an event unless a
        recent one on that stream will cover it; or mark the slot untimed.

        The wrapper wrote the slot with state *queued*; where the call is not queued (a CUDA graph being
        captured, too many unresolved calls, an error) the state goes back to *none*.
        """
        q = _Q
        try:
            if self._nat is not None:
                self._drain()
            if self._queued < self._limit and not self._capturing():
                key = self._stream_key()
                s = self._streams.get(key)
                if s is None:
                    s = self._streams[key] = _Stream()
                now = _perf_ns()
                if s.groups and now - s.last_rec_ns < self._coalesce_ns:
                    s.open.append((b, c))
                else:
                    ev = self._free.pop() if self._free else self._factory()
                    self._record(ev, key)
                    # One statement, no call inside: the reader thread never sees these calls both waiting and
                    # in the new group (CPython switches threads only at calls and backward jumps).
                    calls, s.open = s.open, []
                    calls.append((b, c))
                    s.groups.append((ev, calls))
                    s.last_rec_ns = now
                    self.recorded += 1
                    if self._nat is not None:
                        self._nat.gpu_arm(key, now)
                self._queued += 1
                return
        except Exception as exc:
            self.errors += 1
            _warn("gpu-record", f"cannot record a CUDA event ({type(exc).__name__}: {exc})")
        if q is not None:
            q[b + _W_GPU] = GPU_NONE

    # -- reader ----------------------------------------------------------------------------------------
    def poll(self, now: float | None = None) -> int:
        """Publish what completed since the last poll; returns how many calls are still unresolved.

        Per stream: events complete in record order, so the completed groups are a prefix of the queue, found
        with at most ~log2(n) + 2 queries (the newest first: when it completed, all did). Completed calls get
        state *done* (``gpu_end`` = now: the poll's resolution); the oldest unfinished one *started*.
        """
        q, d = _Q, _D
        t = self._clock() if now is None else now
        nat = self._nat
        if nat is not None:
            self._drain()
        left = 0
        for key, s in list(self._streams.items()):
            if not s.groups and not s.open:
                continue
            try:
                k = self._done_prefix(s.groups) if s.groups else 0
                tail_done = (k == len(s.groups) and bool(s.open) and self._stream_idle is not None
                             and bool(self._stream_idle(key)))
                if tail_done:
                    self.queries += 1
            except Exception as exc:  # a query that fails (an event captured into a graph after all): drop them
                self.errors += 1
                _warn("gpu-query", f"cannot query a CUDA event ({type(exc).__name__}: {exc}); those calls untimed")
                self._drop(key, s, q)
                continue
            seen = t
            if k and self._event_time is not None:
                # When the last completed event completed, on the wall clock (timing events): the next call's
                # start bound, to microseconds instead of the poll's period. Read before the event is pooled.
                with contextlib.suppress(Exception):
                    at = self._event_time(s.groups[k - 1][0])
                    if at is not None:
                        seen = min(t, at if s.seen is None else max(at, s.seen))
            prev = s.seen
            done: list[tuple[int, int]] = []
            for _ in range(k):
                ev, calls = s.groups.popleft()
                self._free.append(ev)
                done.extend(calls)
            if k and not s.groups and nat is not None:
                nat.gpu_disarm(key)  # the next call on this stream records its own event
            if tail_done:
                tail, s.open = s.open, []  # one statement: see end()
                done.extend(tail)
            if done:
                self._queued -= len(done)
                s.seen = seen
                if q is not None and d is not None:
                    for b, c in done:
                        if q[b + _W_CALL] != c:
                            continue  # the slot was reused: nothing to publish
                        g = self._gpu_word + 2 * ((b >> 3) - self._base)
                        if q[b + _W_GPU] != GPU_STARTED:
                            d[g] = self._start_bound(q, b, prev)
                        d[g + 1] = t
                        q[b + _W_GPU] = GPU_DONE
                        prev = seen
                prev = seen  # the head's predecessor completed with the last of these
            head = s.groups[0][1][0] if s.groups else (s.open[0] if s.open else None)
            if head is not None and q is not None and d is not None:
                b, c = head
                if q[b + _W_CALL] == c and q[b + _W_GPU] == GPU_QUEUED:
                    d[self._gpu_word + 2 * ((b >> 3) - self._base)] = self._start_bound(q, b, prev)
                    q[b + _W_GPU] = GPU_STARTED
            left += sum(len(calls) for _ev, calls in s.groups) + len(s.open)
        # Recounted, not only decremented: a call appended to a waiting list just as the reader took it is never
        # published (its slot stays queued: never "in flight"), and its count must not hold the bound forever.
        self._queued = left
        if nat is not None:
            nat.gpu_set_queued(left)
        return left

    def _done_prefix(self, groups: collections.deque[tuple[Any, list[tuple[int, int]]]]) -> int:
        """How many groups at the front of one stream's queue have completed."""
        query = self._query
        n = len(groups)
        self.queries += 1
        if query(groups[-1][0]):
            return n
        if n == 1:
            return 0
        self.queries += 1
        if not query(groups[0][0]):
            return 0
        lo, hi = 0, n - 1  # groups[lo] completed, groups[hi] did not
        while hi - lo > 1:
            mid = (lo + hi) // 2
            self.queries += 1
            if query(groups[mid][0]):
                lo = mid
            else:
                hi = mid
        return lo + 1

    @staticmethod
    def _start_bound(q: memoryview[int], b: int, prev: float | None) -> float:
        """When the call's GPU work could have started: not before its host call, nor before the previous probed
        work on its stream was seen complete."""
        host = q[b + _W_START] / 1e9
        return host if prev is None or prev < host else prev

    def _drop(self, key: Any, s: _Stream, q: memoryview[int] | None) -> None:
        if self._nat is not None:
            self._nat.gpu_disarm(key)
        calls = [bc for _ev, group in s.groups for bc in group] + s.open
        self._free.extend(ev for ev, _group in s.groups)
        s.groups.clear()
        s.open = []
        self._queued -= len(calls)
        if q is not None:
            for b, c in calls:
                if q[b + _W_CALL] == c:
                    q[b + _W_GPU] = GPU_NONE

    def prefill(self, n: int) -> None:
        """Make ``n`` events now, off the hot path. Why: an empty pool makes the hot path create its event
        (``torch.cuda.Event()`` and a first record: 6-12 us on the H200 hosts measured), and the pool only refills
        as the reader resolves calls; a fast caller (tens of thousands of calls a second) between two polls drains
        a cold pool. Measured around the sim's CUDA fetch with a cold pool: +4-10 us per call instead of ~2 us."""
        for _ in range(max(0, n)):
            self._free.append(self._factory())

    def start(self) -> None:
        """Start the reader thread (once)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="sgl-seat-probe-gpu", daemon=True)
            self._thread.start()

    def _run(self) -> None:
        if self._thread_init is not None:
            with contextlib.suppress(Exception):
                self._thread_init()
        wait = self.poll_s
        while not self._stop.wait(wait):
            # Calls queued since the last poll (it left none unresolved, or it left some): keep the short period.
            # Testing the queue *after* the poll instead would back off whenever a poll resolves everything, as it
            # does on a fast stream, and the event pool would drain between polls (measured: +7-10 us a call).
            nat = self._nat
            busy = self._queued > 0 or (nat is not None and nat.gpu_pending() > 0)
            with contextlib.suppress(Exception):  # never raise into the engine
                self.poll()
            wait = self.poll_s if busy or self._queued else self.idle_poll_s

    def stop(self) -> None:
        self._stop.set()
        if self._nat is not None:
            self._drain()
            self._nat.gpu_clear(self)  # the wrapper goes back to end(), which a stopped timer still serves
            self._nat = None


_perf_ns = time.perf_counter_ns


def _no_stream() -> Any:
    return None


def _record_method(ev: Any, key: Any) -> Any:
    return ev.record()


def _query_method(ev: Any) -> bool:
    return bool(ev.query())


# While a CUDA graph is captured through torch's CUDAGraph (torch.cuda.graph, make_graphed_callables, SGLang's
# graph runners), wrapped calls record no event: see _graph_capture_hooks. One-element list: the count of captures
# in progress, shared with every copy of this module in the process (the boot loads it by path; an engine may
# import it too) through the wrapped method's attribute.
_CAPTURES: list[int] = [0]


def _graph_capturing() -> bool:
    return _CAPTURES[0] > 0


def _graph_capture_hooks(torch: Any) -> Callable[[], bool] | None:
    """A capture test that costs a list read, not a runtime call per wrapped call (``torch.cuda.
    is_current_stream_capturing()`` measured 0.28-0.30 us on an H200 host: a seventh of the budget).

    Wraps ``torch.cuda.CUDAGraph.capture_begin``/``capture_end`` to count captures in progress, any thread (an
    event recorded on a stream that another thread captures is no concern of the capture, but a count is
    simpler and errs towards skipping). None where the class has no such methods (the caller then asks torch per
    call). A capture begun before the hooks went in is seen by one direct test here.
    """
    global _CAPTURES
    graph_cls = getattr(getattr(torch.cuda, "graphs", None), "CUDAGraph", None)
    begin = getattr(graph_cls, "capture_begin", None)
    finish = getattr(graph_cls, "capture_end", None)
    if graph_cls is None or begin is None or finish is None:
        return None
    shared = getattr(begin, "__sgl_seat_captures__", None)
    if isinstance(shared, list):
        _CAPTURES = shared
    else:
        count: list[int] = [0]

        @functools.wraps(begin)
        def capture_begin(self: Any, *args: Any, **kwargs: Any) -> Any:
            count[0] += 1
            try:
                return begin(self, *args, **kwargs)
            except BaseException:
                count[0] = max(0, count[0] - 1)
                raise

        @functools.wraps(finish)
        def capture_end(self: Any, *args: Any, **kwargs: Any) -> Any:
            try:
                return finish(self, *args, **kwargs)
            finally:
                count[0] = max(0, count[0] - 1)

        capture_begin.__sgl_seat_captures__ = count  # type: ignore[attr-defined]
        graph_cls.capture_begin = capture_begin
        graph_cls.capture_end = capture_end
        _CAPTURES = count
    with contextlib.suppress(Exception):
        if torch.cuda.is_current_stream_capturing():
            _CAPTURES[0] = max(_CAPTURES[0], 1)
    return _graph_capturing


@dataclass(frozen=True)
class CudaPaths:
    """How the timer names streams, makes, records and queries events in a CUDA process (see :func:`cuda_paths`)."""

    factory: Callable[[], Any]
    stream_key: Callable[[], Any]
    record: Callable[[Any, Any], Any]
    query: Callable[[Any], bool]
    stream_idle: Callable[[Any], bool | None] | None
    thread_init: Callable[[], None] | None
    how: str
    event_time: Callable[[Any], float | None] | None = None
    #: For the C writer: the stream key as ``fast_key[0](fast_key[1])`` (a builtin and its argument, or a callable
    #: giving it) with ``fast_key[2]`` the argument that gives the exact key (the thread's current device), and the
    #: address of ``cudaEventRecord`` where the pool's events can be recorded through it (0: not).
    fast_key: tuple[Callable[[Any], Any], Any, Any] | None = None
    record_addr: int = 0


def cuda_paths(torch: Any, how: str = "base", timing: bool = True) -> CudaPaths:
    """Event paths that skip ``torch.cuda.Event.record()``'s per-call ``Stream`` object (5.8-11 us per call).

    The stream key is the current raw stream handle (``torch._C._cuda_getCurrentRawStream``). ``how``: ``base``
    records through ``torch._C._CudaEventBase.record(event, stream)`` with the stream's ``Stream`` object cached by
    its handle; ``ctypes`` calls the runtime's ``cudaEventRecord`` on the raw handle; ``method`` is
    ``Event.record()`` (the slow reference). Measured on H200 hosts, ns per record of a plain event with the
    stream lookup: ctypes 976-1051, base 1150-1169, method 5938-6319 (``bench/gpu/event_cost.py``). Events are
    made without timing (``cudaEventDisableTiming``: half the cost of a timing event's record, 0.8 against 1.8 us;
    nothing here needs elapsed times). ``stream_idle`` is the runtime's ``cudaStreamQuery``. ``thread_init`` puts
    the reader thread in relaxed stream-capture mode: a query from another thread while one captures a graph in
    torch's default (global) mode invalidates that capture (``bench/gpu/capture_check.py``). Raises where a path is
    not available.

    ``timing`` (``SGL_SEAT_PROBE_GPU_TIMING``, default on): timing events, and ``event_time`` giving the wall-clock
    moment an event completed (a reference event recorded on a private idle stream and synchronised, its wall time
    the midpoint of that wait; then ``elapsed_time``; re-anchored every 30 s). Why: the next call's start bound is
    when the previous event completed; seen by the reader's poll it is late by up to the poll period (20 ms), and
    with the host a step ahead that jitter decided which rank looked stalled longer (``bench/gpu/runahead_check.py``:
    the wrong rank named once in two at 1 ms steps). A timing event costs ~1 us more to record (1.8 against 0.8 us).
    """
    import ctypes

    raw_stream = torch._C._cuda_getCurrentRawStream
    get_device = torch._C._cuda_getDevice
    lib = None
    for name in ("libcudart.so.13", "libcudart.so.12", "libcudart.so.11.0", "libcudart.so"):
        try:
            lib = ctypes.CDLL(name)
            break
        except OSError:
            continue

    # The current device's stream: -1 asks torch for the current device itself (one binding call instead of two);
    # where a torch does not give the same handle that way, the device is asked first.
    current_by_minus_one = False
    with contextlib.suppress(Exception):
        current_by_minus_one = raw_stream(-1) == raw_stream(get_device())
    key_arg: Any = -1 if current_by_minus_one else get_device

    if current_by_minus_one:
        def stream_key() -> Any:
            return raw_stream(-1)
    else:
        def stream_key() -> Any:
            return raw_stream(get_device())

    def factory() -> Any:
        ev = torch.cuda.Event(enable_timing=timing)
        ev.record()  # creates the CUDA event (torch creates it lazily, on the first record)
        return ev

    def query(ev: Any) -> bool:
        return bool(ev.query())

    record: Callable[[Any, Any], Any]
    paths_factory: Callable[[], Any]
    query_fn: Callable[[Any], bool]
    if how == "ctypes":
        if lib is None:
            raise OSError("no libcudart found")
        rec = lib.cudaEventRecord
        rec.argtypes = [ctypes.c_void_p, ctypes.c_void_p]
        rec.restype = ctypes.c_int

        def factory_ct() -> Any:
            ev = factory()
            return (ev, ev.cuda_event)

        def record_ct(item: Any, key: Any) -> None:
            err = rec(item[1], key)
            if err:
                raise RuntimeError(f"cudaEventRecord returned {err}")

        def query_ct(item: Any) -> bool:
            return bool(item[0].query())

        paths_factory, record, query_fn = factory_ct, record_ct, query_ct
    elif how == "base":
        base_record = torch._C._CudaEventBase.record
        current_stream = torch.cuda.current_stream
        cache: dict[int, Any] = {}

        def record_base(ev: Any, key: Any) -> None:
            obj = cache.get(key)
            if obj is None:
                if len(cache) > 64:
                    cache.clear()
                obj = cache[key] = current_stream()
            base_record(ev, obj)

        paths_factory, record, query_fn = factory, record_base, query
    elif how == "method":
        def record_method(ev: Any, key: Any) -> None:
            ev.record()

        paths_factory, record, query_fn = factory, record_method, query
    else:
        raise ValueError(f"unknown event path {how!r}")
    thread_init = None
    stream_idle = None
    if lib is not None and hasattr(lib, "cudaThreadExchangeStreamCaptureMode"):
        exchange = lib.cudaThreadExchangeStreamCaptureMode

        def thread_init() -> None:
            mode = ctypes.c_int(2)  # cudaStreamCaptureModeRelaxed
            exchange(ctypes.byref(mode))

    if lib is not None and hasattr(lib, "cudaStreamQuery"):
        squery = lib.cudaStreamQuery
        squery.argtypes = [ctypes.c_void_p]
        squery.restype = ctypes.c_int

        def stream_idle(key: Any) -> bool | None:
            rc = squery(key)
            return True if rc == 0 else False if rc == 600 else None  # 600: cudaErrorNotReady

    event_time = _wall_clock_of_events(torch, how) if timing else None
    # One round trip, so a path that does not work with torch's context fails here, not on the hot path.
    probe_ev = paths_factory()
    record(probe_ev, stream_key())
    torch.cuda.synchronize()
    if not query_fn(probe_ev):
        raise RuntimeError("a recorded event did not complete after a synchronize")
    if event_time is not None and event_time(probe_ev) is None:
        event_time = None
    record_addr = _native_record_addr(ctypes, lib, paths_factory, stream_key, query_fn, torch) if how == "base" else 0
    # The C writer's coalesced calls key the stream by the device current now (the process's: an SGLang scheduler
    # or a sim rank runs on one), not by asking the runtime each call (~270 ns after a 32-row gather on an H200
    # host, bench/gpu/writer_cost.py --lookups); a call that records checks the exact key first.
    fixed = get_device() if current_by_minus_one else get_device
    return CudaPaths(paths_factory, stream_key, record, query_fn, stream_idle, thread_init, how, event_time,
                     (raw_stream, fixed, key_arg), record_addr)


def _native_record_addr(ctypes: Any, lib: Any, factory: Callable[[], Any], stream_key: Callable[[], Any],
                        query: Callable[[Any], bool], torch: Any) -> int:
    """The address of the runtime's ``cudaEventRecord`` for the C writer, once one of the pool's events recorded
    through it completed after a synchronize (the same runtime as torch's); 0 where that cannot be had."""
    if lib is None or not hasattr(lib, "cudaEventRecord"):
        return 0
    try:
        addr = int(ctypes.cast(lib.cudaEventRecord, ctypes.c_void_p).value or 0)
        ev = factory()
        proto = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.c_void_p)(addr)
        if proto(ev.cuda_event, stream_key()) != 0:
            return 0
        torch.cuda.synchronize()
        return addr if query(ev) else 0
    except Exception:
        return 0


def _fast_path(timer: GpuTimer, paths: CudaPaths, capturing: Callable[[], bool]) -> None:
    """Let the C writer do ``end``'s work itself where the capture test is the hooks' count (a list it can read) and
    the stream key the paths' builtin; it records through ``cudaEventRecord`` where the paths found it working.
    Elsewhere every call goes through ``end``."""
    if capturing is _graph_capturing and paths.fast_key is not None:
        timer._fast = (_CAPTURES, paths.fast_key[0], paths.fast_key[1], paths.record_addr, paths.fast_key[2])


def _wall_clock_of_events(torch: Any, how: str) -> Callable[[Any], float | None]:
    """``event -> wall time it completed`` for timing events of this process's current device (see cuda_paths)."""
    stream = torch.cuda.Stream()  # private: nothing else runs on it, so its event completes at once
    anchor: list[Any] = [None, 0.0, 0.0]  # reference event, its wall time, when it was taken (monotonic)

    def reanchor() -> None:
        ev = torch.cuda.Event(enable_timing=True)
        t0 = time.time()
        ev.record(stream)
        ev.synchronize()
        t1 = time.time()
        anchor[:] = [ev, (t0 + t1) / 2, time.monotonic()]

    reanchor()

    def event_time(item: Any) -> float | None:
        ev = item[0] if how == "ctypes" else item
        if time.monotonic() - anchor[2] > 30.0:
            reanchor()
        return float(anchor[1] + anchor[0].elapsed_time(ev) / 1e3)

    return event_time


def enable_gpu(event_factory: Callable[[], Any], capturing: Callable[[], bool] = lambda: False, *,
               poll_s: float | None = None, start_thread: bool = True, stream_key: Callable[[], Any] | None = None,
               record: Callable[[Any, Any], Any] | None = None, query: Callable[[Any], bool] | None = None,
               stream_idle: Callable[[Any], bool | None] | None = None,
               thread_init: Callable[[], None] | None = None, coalesce_us: float | None = None,
               event_time: Callable[[Any], float | None] | None = None) -> GpuTimer | None:
    """Time wrapped calls on the GPU stream too (the ring must exist; created if need be). Tests pass fakes.

    ``start_thread=False`` leaves resolving to explicit :meth:`GpuTimer.poll` calls (deterministic tests);
    ``coalesce_us`` None: ``SGL_SEAT_PROBE_GPU_COALESCE_US`` (default 1000).
    """
    global _GPU
    if not _ensure_ring() or _MM is None:
        return None
    gpu_off = _GPU_OFF.unpack_from(_MM, _GPU_OFF_AT)[0]
    nslots = _MASK + 1
    if _GPU is not None:
        _GPU.stop()
    timer = GpuTimer(event_factory, capturing, gpu_off=gpu_off, nslots=nslots,
                     poll_s=poll_s if poll_s is not None else _gpu_poll_s(), stream_key=stream_key, record=record,
                     query=query, stream_idle=stream_idle, thread_init=thread_init,
                     coalesce_us=_gpu_coalesce_us() if coalesce_us is None else coalesce_us, event_time=event_time)
    if start_thread:
        timer.start()
    _GPU = timer
    return timer


def enable_gpu_cuda(torch: Any, how: str = DEFAULT_GPU_PATH, *, start_thread: bool = True,
                    coalesce_us: float | None = None, timing: bool | None = None) -> GpuTimer | None:
    """:func:`enable_gpu` with the real CUDA paths (:func:`cuda_paths`) and the graph-capture hooks."""
    paths = cuda_paths(torch, how, _gpu_timing() if timing is None else timing)
    capturing = _graph_capture_hooks(torch) or torch.cuda.is_current_stream_capturing
    timer = enable_gpu(paths.factory, capturing, start_thread=False, stream_key=paths.stream_key,
                       record=paths.record, query=paths.query, stream_idle=paths.stream_idle,
                       thread_init=paths.thread_init, coalesce_us=coalesce_us, event_time=paths.event_time)
    if timer is not None:
        _fast_path(timer, paths, capturing)
        timer.prefill(PREFILL_EVENTS)
        if start_thread:
            timer.start()
    return timer


def disable_gpu() -> None:
    global _GPU
    if _GPU is not None:
        _GPU.stop()
    _GPU = None


def gpu_timer() -> GpuTimer | None:
    return _GPU


def _gpu_poll_s() -> float:
    try:
        val = float(os.environ.get(ENV_GPU_POLL, "0.02"))
    except ValueError:
        return 0.02
    return val if 0.001 <= val <= 5.0 else 0.02


def _gpu_timing() -> bool:
    return os.environ.get(ENV_GPU_TIMING, "1").strip().lower() not in ("0", "off", "false", "no")


def _gpu_coalesce_us() -> float:
    try:
        val = float(os.environ.get(ENV_GPU_COALESCE, DEFAULT_COALESCE_US))
    except ValueError:
        return DEFAULT_COALESCE_US
    return val if 0.0 <= val <= 1e6 else DEFAULT_COALESCE_US


def _maybe_enable_gpu(gpu_off: int, nslots: int) -> None:
    """At ring creation: turn GPU timing on per ``SGL_SEAT_PROBE_GPU`` (auto: CUDA initialised here)."""
    global _GPU
    mode = os.environ.get(ENV_GPU, "auto").strip().lower()
    if mode in ("0", "off", "false", "no"):
        return
    torch = sys.modules.get("torch")
    try:
        if torch is None:
            if mode in ("1", "on", "true", "yes"):
                torch = importlib.import_module("torch")
            else:
                return
        cuda = torch.cuda
        if not (cuda.is_initialized() if mode == "auto" else cuda.is_available()):
            return
        how = os.environ.get(ENV_GPU_PATH, "").strip() or DEFAULT_GPU_PATH
        try:
            paths = cuda_paths(torch, how, _gpu_timing())
        except Exception as exc:
            _warn("gpu-path", f"event path {how!r} unavailable ({type(exc).__name__}: {exc}); using Event.record()")
            paths = cuda_paths(torch, "method", _gpu_timing())
        capturing = _graph_capture_hooks(torch) or cuda.is_current_stream_capturing
        timer = GpuTimer(paths.factory, capturing, gpu_off=gpu_off, nslots=nslots, poll_s=_gpu_poll_s(),
                         stream_key=paths.stream_key, record=paths.record, query=paths.query,
                         stream_idle=paths.stream_idle, thread_init=paths.thread_init, coalesce_us=_gpu_coalesce_us(),
                         event_time=paths.event_time)
        _fast_path(timer, paths, capturing)
        timer.prefill(min(PREFILL_EVENTS, nslots))
        timer.start()
        _GPU = timer
    except Exception as exc:
        _warn("gpu", f"GPU stream timing not enabled ({type(exc).__name__}: {exc}); calls are timed on the host")


# --------------------------------------------------------------------------------------------------
# Target specs and wrapping


@dataclass(frozen=True)
class TargetSpec:
    """One parsed target: where it lives and how to size its gather."""

    raw: str
    module: str
    qualname: str
    size_arg: str | int | None
    mode: str

    @property
    def name(self) -> str:
        """What the ring's target table and the records carry: ``module:qualname``."""
        return f"{self.module}:{self.qualname}"


def parse_target(raw: str) -> TargetSpec:
    """Parse one target; ValueError with the reason when it is malformed."""
    text = raw.strip()
    path, at, size = text.partition("@")
    if ":" in path:
        module, _, qual = path.partition(":")
    else:
        module, _, qual = path.rpartition(".")
    ident = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
    if not module or not qual or not ident.match(module) or not ident.match(qual):
        raise ValueError(f"probe target {raw!r}: expected module:function or module.function")
    size_arg: str | int | None = None
    mode = "len"
    if size:
        arg, _, m = size.partition(":")
        if m:
            if m not in _MODES:
                raise ValueError(f"probe target {raw!r}: size mode {m!r} is not one of {_MODES}")
            mode = m
        if arg.isdigit():
            size_arg = int(arg)
        elif re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", arg):
            size_arg = arg
        elif arg:
            raise ValueError(f"probe target {raw!r}: {arg!r} is neither a parameter name nor a position")
    elif at:
        mode = "none"  # "target@": time it, no gather size
    return TargetSpec(raw=text, module=module, qualname=qual, size_arg=size_arg, mode=mode)


def parse_targets(value: str) -> list[TargetSpec]:
    return [parse_target(p) for p in value.split(",") if p.strip()]


def _size_position(fn: Callable[..., Any], spec: TargetSpec) -> tuple[int, str | None]:
    """(position, keyword name) of the sized argument; (-1, None) when there is none."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        params = []
    names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if spec.mode == "none":
        return -1, None
    if isinstance(spec.size_arg, int):
        return spec.size_arg, names[spec.size_arg] if spec.size_arg < len(names) else None
    if isinstance(spec.size_arg, str):
        pos = names.index(spec.size_arg) if spec.size_arg in names else 1 << 30
        return pos, spec.size_arg
    for cand in _SIZE_PARAMS:
        if cand in names:
            return names.index(cand), cand
    kw_only = [p.name for p in params if p.kind == p.KEYWORD_ONLY]
    for cand in _SIZE_PARAMS:
        if cand in kw_only:
            return 1 << 30, cand
    return -1, None


def make_wrapper(fn: Callable[..., Any], spec: TargetSpec, *, python: bool = False) -> Callable[..., Any]:
    """Wrap ``fn`` so each call is timed into this process's ring. Public for the bench and tests.

    Where the C writer is had (:func:`_native`: ``probe_native.c``, the same ring writes without the interpreter;
    the Python wrappers below added 1.3-3.0 us around a real fetch, whose gather evicts the interpreter's own
    objects from cache), the wrapper is its ``Wrapper``. Otherwise, where ``fn``'s parameters are plain (no
    ``*args``/``**kwargs``, no positional-only ones), the wrapper is
    generated with ``fn``'s own signature (:func:`_exact_wrapper`): no argument tuple and dict to pack and
    unpack, and the sized argument is a local. Measured on an H200 host's CPU that saved 0.1-0.35 us per
    call; the probe's budget is 1 us around a real fetch. Otherwise a generic ``*args, **kwargs`` wrapper.
    """
    tidx = _register_target(spec.name)
    pos, kw = _size_position(fn, spec)
    mode = 0 if pos < 0 else _MODES.index(spec.mode) + 1  # 0 none, 1 len, 2 numel, 3 dim0, 4 none
    nat = None if python else _native()  # python: the Python writer even where the C one is (the bench's arm)
    wrapper: Callable[..., Any]
    if nat is not None:
        wrapper = functools.update_wrapper(nat.Wrapper(fn, tidx, pos, kw, mode, globals(), _ensure_ring), fn)
    else:
        exact = _exact_wrapper(fn, tidx, kw if pos >= 0 else None, _MODES[mode - 1] if mode else "none")
        wrapper = exact if exact is not None else _generic_wrapper(fn, tidx, pos, kw, mode)
    wrapper.__sgl_seat_probe__ = spec.name  # type: ignore[attr-defined]
    return wrapper


def _generic_wrapper(fn: Callable[..., Any], tidx: int, pos: int, kw: str | None, mode: int) -> Callable[..., Any]:
    now = time.time_ns
    ident = threading.get_ident
    base = HEADER_BYTES // SLOT_BYTES
    lap_mask, end_bits, end_mask = _LAP_MASK, _END_BITS, _END_MASK

    @functools.wraps(fn)
    def probe_wrapper(*args: Any, **kwargs: Any) -> Any:
        q = _Q
        if q is None:
            if not _ensure_ring():
                return fn(*args, **kwargs)
            q = _Q
            assert q is not None
        c = _NEXT()
        b = ((c & _MASK) + base) << 3  # the slot's first 8-byte word
        lap = (c >> _SHIFT & lap_mask) << end_bits
        try:
            if mode == 2:
                gs = (args[pos] if len(args) > pos else kwargs[kw]).numel()  # type: ignore[index]
            elif mode == 1:
                gs = len(args[pos] if len(args) > pos else kwargs[kw])  # type: ignore[index]
            elif mode == 3:
                gs = (args[pos] if len(args) > pos else kwargs[kw]).shape[0]  # type: ignore[index]
            else:
                gs = -1
        except Exception:
            gs = -1
        g = _GPU
        try:
            _PACK(_MM, b << 3, 2 * c + 1, c, now(), 0, gs, ident(), tidx,  # type: ignore[arg-type]
                  GPU_NONE if g is None else GPU_QUEUED)
            q[b] = 2 * c + 2
        except Exception:  # a size that is not an int, a ring gone: the call runs untimed
            return fn(*args, **kwargs)
        try:
            return fn(*args, **kwargs)
        finally:
            if g is not None:
                g.end(b, c)  # the call's end event (or the slot's GPU state back to none)
            q[b + _W_END] = lap | (now() & end_mask)  # blind: no read of the (evicted) slot line

    return probe_wrapper


# The generated wrapper: the generic one's body with ``fn``'s own parameters. Its locals start with ``_p_`` and
# it reads the module globals below; a function with a parameter of either kind of name gets the generic one.
_EXACT_GLOBALS = frozenset({"_Q", "_NEXT", "_MASK", "_SHIFT", "_GPU", "_PACK", "_MM", "_ensure_ring", "Exception"})
_EXACT_SRC = """
def _p_make(_p_fn, _p_tidx, _p_defaults, _p_kwdefaults):
    _p_now = time.time_ns
    _p_ident = threading.get_ident
    {unpack}
    def probe_wrapper({params}):
        _p_q = _Q
        if _p_q is None:
            if not _ensure_ring():
                return _p_fn({call})
            _p_q = _Q
        _p_c = _NEXT()
        _p_b = ((_p_c & _MASK) + {base}) << 3
        _p_lap = (_p_c >> _SHIFT & {lap_mask}) << {end_bits}
        {size}
        _p_g = _GPU
        try:
            _PACK(_MM, _p_b << 3, 2 * _p_c + 1, _p_c, _p_now(), 0, _p_gs, _p_ident(), _p_tidx,
                  0 if _p_g is None else {queued})
            _p_q[_p_b] = 2 * _p_c + 2
        except Exception:
            return _p_fn({call})
        try:
            return _p_fn({call})
        finally:
            if _p_g is not None:
                _p_g.end(_p_b, _p_c)
            _p_q[_p_b + {w_end}] = _p_lap | (_p_now() & {end_mask})
    return probe_wrapper
"""
_SIZE_EXPR = {"numel": "{}.numel()", "len": "len({})", "dim0": "{}.shape[0]"}


def _exact_wrapper(fn: Callable[..., Any], tidx: int, size_name: str | None, mode: str) -> Callable[..., Any] | None:
    """A wrapper with ``fn``'s own signature, or None where its parameters are not plain (see make_wrapper)."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    plain = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    names = [p.name for p in params]
    if any(p.kind not in plain or p.name.startswith("_p_") or p.name in _EXACT_GLOBALS for p in params) or \
            (size_name and size_name not in names):
        return None
    decl, call, unpack = [], [], []
    defaults: list[Any] = []
    kwdefaults: list[Any] = []
    star = False
    for p in params:
        if p.kind is inspect.Parameter.KEYWORD_ONLY:
            if not star:
                decl.append("*")
                star = True
            call.append(f"{p.name}={p.name}")
        else:
            call.append(p.name)
        if p.default is inspect.Parameter.empty:
            decl.append(p.name)
            continue
        pool, tag = (kwdefaults, "k") if p.kind is inspect.Parameter.KEYWORD_ONLY else (defaults, "d")
        unpack.append(f"_p_{tag}{len(pool)} = _p_{'kwdefaults' if tag == 'k' else 'defaults'}[{len(pool)}]")
        decl.append(f"{p.name}=_p_{tag}{len(pool)}")
        pool.append(p.default)
    if size_name and mode in _SIZE_EXPR:
        size = (f"try:\n            _p_gs = {_SIZE_EXPR[mode].format(size_name)}\n"
                "        except Exception:\n            _p_gs = -1")
    else:
        size = "_p_gs = -1"
    src = _EXACT_SRC.format(params=", ".join(decl), call=", ".join(call), unpack="; ".join(unpack) or "pass",
                            size=size, base=HEADER_BYTES // SLOT_BYTES, lap_mask=_LAP_MASK, end_bits=_END_BITS,
                            end_mask=_END_MASK, queued=GPU_QUEUED, w_end=_W_END)
    scope: dict[str, Any] = {}
    try:
        exec(compile(src, f"<sgl-seat probe wrapper of {getattr(fn, '__qualname__', fn)!r}>", "exec"),  # noqa: S102
             globals(), scope)
        wrapper = scope["_p_make"](fn, tidx, tuple(defaults), tuple(kwdefaults))
    except Exception as exc:  # never stop the engine over a wrapper: the generic one does the same job
        _warn(f"exact:{getattr(fn, '__qualname__', fn)}", f"generic wrapper for {fn!r} ({type(exc).__name__}: {exc})")
        return None
    return functools.update_wrapper(wrapper, fn)


def _resolve_owner(module: ModuleType, qualname: str) -> tuple[Any, str]:
    owner: Any = module
    parts = qualname.split(".")
    for part in parts[:-1]:
        owner = getattr(owner, part)
    return owner, parts[-1]


def _wrap_in(module: ModuleType, spec: TargetSpec) -> str:
    """Replace the target attribute in its owner; returns the install state string."""
    try:
        owner, attr = _resolve_owner(module, spec.qualname)
        raw = owner.__dict__.get(attr) if isinstance(owner, type) else getattr(owner, attr)
        if raw is None:
            raw = getattr(owner, attr)
        if isinstance(raw, staticmethod):
            fn = raw.__func__
            if getattr(fn, "__sgl_seat_probe__", None):
                return "installed"
            setattr(owner, attr, staticmethod(make_wrapper(fn, spec)))
        elif isinstance(raw, classmethod):
            fn = raw.__func__
            if getattr(fn, "__sgl_seat_probe__", None):
                return "installed"
            setattr(owner, attr, classmethod(make_wrapper(fn, spec)))
        else:
            if not callable(raw):
                return f"failed: {spec.name} is not callable"
            if getattr(raw, "__sgl_seat_probe__", None):
                return "installed"
            setattr(owner, attr, make_wrapper(raw, spec))
        return "installed"
    except Exception as exc:
        return f"failed: {type(exc).__name__}: {exc}"


class _ProbeFinder(importlib.abc.MetaPathFinder):
    """Wraps targets of a module the moment it finishes executing (modules not imported yet)."""

    def find_spec(self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None,
                  ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in _PENDING:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        loader = spec.loader
        exec_module = getattr(loader, "exec_module", None)
        if loader is None or exec_module is None:
            return spec

        def exec_and_wrap(module: ModuleType) -> None:
            exec_module(module)
            for t in _PENDING.pop(fullname, []):
                state = _wrap_in(module, t)
                _INSTALLED[t.raw] = state
                if state.startswith("failed"):
                    _warn(t.raw, f"cannot wrap {t.raw}: {state}")

        try:
            loader.exec_module = exec_and_wrap  # type: ignore[method-assign]
        except Exception as exc:
            _warn(fullname, f"cannot hook the import of {fullname}: {exc}")
        return spec


def install(targets: Sequence[str | TargetSpec]) -> dict[str, str]:
    """Wrap each target now (module already imported) or when its module is imported. Idempotent."""
    global _FINDER
    for item in targets:
        try:
            spec = item if isinstance(item, TargetSpec) else parse_target(item)
        except ValueError as exc:
            _INSTALLED[str(item)] = f"failed: {exc}"
            _warn(str(item), str(exc))
            continue
        if _INSTALLED.get(spec.raw) == "installed":
            continue
        module = sys.modules.get(spec.module)
        if module is not None:
            state = _wrap_in(module, spec)
            _INSTALLED[spec.raw] = state
            if state.startswith("failed"):
                _warn(spec.raw, f"cannot wrap {spec.raw}: {state}")
            continue
        waiting = _PENDING.setdefault(spec.module, [])
        if all(w.raw != spec.raw for w in waiting):
            waiting.append(spec)
        _INSTALLED[spec.raw] = "pending"
        if _FINDER is None:
            _FINDER = _ProbeFinder()
            sys.meta_path.insert(0, _FINDER)
    return dict(_INSTALLED)


def install_from_env() -> dict[str, str]:
    """Install the targets named in ``SGL_SEAT_PROBE`` (no-op when unset). Never raises."""
    value = os.environ.get(ENV_TARGETS, "")
    if not value.strip():
        return {}
    try:
        return install([p for p in value.split(",") if p.strip()])
    except Exception as exc:
        _warn("install", f"probe not installed: {exc}")
        return dict(_INSTALLED)


def installed() -> dict[str, str]:
    """Target spec -> install state, for tests and diagnostics."""
    return dict(_INSTALLED)


def ring_file() -> str | None:
    """This process's ring path once created."""
    return ring_path(os.environ.get(ENV_DIR) or default_dir(), os.getpid()) if _MM is not None else None


# --------------------------------------------------------------------------------------------------
# Reader (the sidecar)


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


def read_ring(path: str, *, node: int | None = None, rank: int | None = None) -> list[ProbeRecord]:
    """Every stable slot of a ring as :class:`ProbeRecord` (in-flight ones have ``end=None``), by call order.

    ``node``/``rank`` override the header's (the sidecar knows them from the process title). A torn
    slot (being written while read) is skipped, never returned half-updated.
    """
    return RingReader(path).read(node=node, rank=rank)


class RingReader:
    """Reads one ring repeatedly, decoding only slots that changed (or were in flight) since the last read.

    The sidecar polls every ring a few times a second; decoding all 4096 slots each time would cost more
    than everything else it does. Sequence words are copied, then the slots, then the sequence words again:
    a slot whose word is odd or changed between the copies is torn and is looked at again next time.
    """

    def __init__(self, path: str) -> None:
        self.path = path
        self._seq: list[int] = []
        self._open: set[int] = set()  # slots in flight (or torn) at the last read

    def read(self, *, node: int | None = None, rank: int | None = None) -> list[ProbeRecord]:
        """Records of slots that are new or changed since the last read (every stable one the first time)."""
        from sgl_seat.core.records import ProbeRecord

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
        out: list[ProbeRecord] = []
        still_open: set[int] = set()
        for i in todo:
            s0 = seq_before[i]
            if s0 == 0:
                continue
            if s0 & 1 or s0 != seq_after[i]:
                still_open.add(i)
                continue
            _seq, call, start_ns, end_word, gs, thread, tidx, gstate = _SLOT.unpack_from(body, i * SLOT_BYTES)
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
            out.append(ProbeRecord(node=use_node, rank=use_rank, pid=hdr.pid, thread=thread, seq=call,
                                   target=target, start=start_ns / 1e9, end=fin, gather_size=gs,
                                   gpu=bool(gpu_area) and gstate != GPU_NONE, gpu_start=gpu_start,
                                   gpu_end=gpu_end))
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
