"""The ring's writer: this process's ring, the wrappers that time calls into it, and the state they share.

The ring is created on the first wrapped call (:func:`_ensure_ring`), from the environment: ``SGLSEAT_PROBE_DIR``
(default :func:`.ring.default_dir`), ``SGLSEAT_PROBE_SLOTS`` (a power of two, default 4096), the rank and node
from ``SGLSEAT_RANK`` / ``SGLSEAT_NODE_RANK`` or the process title. Each wrapper writes one slot per call as
:mod:`.ring` lays it out. Which writer writes is decided once per process, before its first ring
(:func:`_native`): the C one (:mod:`.native` builds ``probe_native.c``) wherever it builds, else the Python
wrappers here (a wrapper generated with the function's own signature, or a generic one).

Why every piece of mutable state the hot path reads lives here, and only here: the Python wrappers read it as
module globals (``LOAD_GLOBAL``, cheap; the generated ones through this module's dict, given to ``exec``), and
the C writer reads ``_GPU`` from the same dict on every call. It is rebound on ring creation, on
:func:`reset` and in a forked child; a copy of a binding in another module (``from .writer import _MM``) would
go stale, so the other modules read it as ``writer._MM``.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import inspect
import itertools
import mmap
import os
import re
import struct
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

# What the wrappers use on every call, or format into a generated wrapper's code, is bound from .ring here; the
# rest of the layout is read as ``ring.X`` where a ring is created (once per process).
from . import native, ring
from .guard import check_private_dir, warn_once
from .ring import _END_BITS, _END_MASK, _LAP_MASK, _SLOT, _W_END, GPU_NONE, GPU_QUEUED, HEADER_BYTES, SLOT_BYTES
from .targets import _MODES, TargetSpec, _size_position


class _GpuTimer(Protocol):
    """What the writer asks of the GPU timer (:class:`gpu.GpuTimer`): gpu imports this module, never the reverse."""

    def end(self, b: int, c: int) -> None: ...

    def stop(self) -> None: ...


ENV_DIR = "SGLSEAT_PROBE_DIR"
ENV_SLOTS = "SGLSEAT_PROBE_SLOTS"
ENV_RANK = "SGLSEAT_RANK"
ENV_NODE = "SGLSEAT_NODE_RANK"
#: The title of the engine's process that runs a rank, as it is at one rank (no ``_TP`` suffix): set by the node
#: agent from the engine backend's words, so this module names no engine.
ENV_RANK_TITLE = "SGLSEAT_PROBE_RANK_TITLE"

_TITLE_RANK = re.compile(r"_TP(\d+)(?:_|$)")

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
_GPU: _GpuTimer | None = None
#: What starts GPU timing once a ring exists (``gpu._maybe_enable_gpu(gpu_off, nslots)``): set by :mod:`gpu` when
#: the package imports it, so that this module needs no import of gpu (it would be a circle: gpu reads this state).
_ON_RING: Callable[[int, int], None] | None = None
_NATIVE: Any = None  # the C writer (probe_native.c) once loaded
_NATIVE_DECIDED = False
_NATIVE_WHY = "not decided yet"



def _own_rank() -> int:
    env = os.environ.get(ENV_RANK)
    if env is not None and env.lstrip("-").isdigit():
        return int(env)
    try:
        with open("/proc/self/cmdline", "rb") as fh:
            title = fh.read().split(b"\0", 1)[0].decode("utf-8", "replace")
    except OSError:
        return -1
    return rank_of_title(title)


def rank_of_title(title: str, sole: str | None = None) -> int:
    """The TP rank a process title names (``..._TP1``, ``..._TP3_EP3``), -1 where none. A title equal to ``sole``
    (default ``$SGLSEAT_PROBE_RANK_TITLE``: the rank process's title at one rank, which has no TP suffix) is rank 0."""
    m = _TITLE_RANK.search(title)
    if m:
        return int(m.group(1))
    sole = os.environ.get(ENV_RANK_TITLE) if sole is None else sole
    return 0 if sole and title.strip() == sole else -1


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
            nslots = int(os.environ.get(ENV_SLOTS, ring.DEFAULT_SLOTS))
            if nslots < 2 or nslots & (nslots - 1):
                raise ValueError(f"{ENV_SLOTS}={nslots} must be a power of two >= 2")
            directory = os.environ.get(ENV_DIR) or ring.default_dir()
            os.makedirs(directory, mode=0o700, exist_ok=True)
            check_private_dir(directory)
            path = ring.ring_path(directory, os.getpid())
            gpu_off = HEADER_BYTES + nslots * SLOT_BYTES
            size = gpu_off + nslots * ring.GPU_SLOT_BYTES
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
            ring._HDR.pack_into(mm, 0, b"\0" * 8, ring.RING_VERSION, ring.SLOT_WORDS, nslots, os.getpid(),
                                _own_rank(), _own_node(), time.time(), len(_TARGET_NAMES))
            ring._GPU_OFF.pack_into(mm, ring._GPU_OFF_AT, gpu_off)
            mm[0:8] = ring.MAGIC
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
            if _ON_RING is not None:
                _ON_RING(gpu_off, nslots)
            return True
        except Exception as exc:
            _RING_FAILED = True
            warn_once("ring", f"cannot create the probe ring ({exc}); calls run untimed")
            return False


def _unlink_ring(path: str, pid: int) -> None:
    """At a normal exit the ring goes (a killed process leaves it for the sidecar's post-mortem)."""
    if os.getpid() == pid:
        with contextlib.suppress(OSError):
            os.unlink(path)



def _write_target_name(mm: mmap.mmap, index: int, name: str) -> None:
    raw = name.encode("utf-8")[:ring.TARGET_NAME_BYTES].ljust(ring.TARGET_NAME_BYTES, b"\0")
    off = ring._TARGETS_OFF + index * ring.TARGET_NAME_BYTES
    mm[off:off + ring.TARGET_NAME_BYTES] = raw


def _register_target(name: str) -> int:
    """A process-wide target index (the ring's target table); names past the table share the last slot."""
    if name in _TARGET_NAMES:
        return _TARGET_NAMES.index(name)
    if len(_TARGET_NAMES) >= ring.MAX_TARGETS:
        return ring.MAX_TARGETS - 1
    _TARGET_NAMES.append(name)
    idx = len(_TARGET_NAMES) - 1
    mm = _MM
    if mm is not None:
        _write_target_name(mm, idx, name)
        struct.pack_into("<I", mm, ring._HDR.size - 4, len(_TARGET_NAMES))
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
    """The C writer (``probe_native.c``, built by :func:`.native.load` once per interpreter and source into a private
    cache directory with the interpreter's own compiler); None where it is off or cannot be had (the Python
    writer does the same job, slower). Decided once per process, before its first ring."""
    global _NATIVE, _NATIVE_DECIDED, _NATIVE_WHY
    if _NATIVE_DECIDED:
        return _NATIVE
    with _RING_LOCK:
        if _NATIVE_DECIDED:
            return _NATIVE
        if os.environ.get(native.ENV_NATIVE, "auto").strip().lower() in ("0", "off", "no", "false"):
            _NATIVE_WHY = f"{native.ENV_NATIVE}=0"
        else:
            try:
                _NATIVE = native.load()
                _NATIVE_WHY = "loaded"
            except Exception as exc:
                _NATIVE_WHY = f"C writer unavailable: {type(exc).__name__}: {exc}"[:300]
                warn_once("native", f"{_NATIVE_WHY}; the Python writer times calls instead")
        _NATIVE_DECIDED = True
        return _NATIVE



if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)



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


def write_beat(tidx: int) -> None:
    """One instant record of target ``tidx``: start = end = now, no gather size (a heartbeat, :mod:`.beat`)."""
    q = _Q
    if q is None:
        if not _ensure_ring():
            return
        q = _Q
        assert q is not None
    c = _NEXT()
    b = ((c & _MASK) + HEADER_BYTES // SLOT_BYTES) << 3
    t = time.time_ns()
    try:
        _PACK(_MM, b << 3, 2 * c + 1, c, t, 0, -1, threading.get_ident(), tidx, GPU_NONE)  # type: ignore[arg-type]
        q[b] = 2 * c + 2
        q[b + _W_END] = ((c >> _SHIFT & _LAP_MASK) << _END_BITS) | (t & _END_MASK)
    except Exception:  # a ring gone: no beat
        return


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
        warn_once(f"exact:{getattr(fn, '__qualname__', fn)}",
                  f"generic wrapper for {fn!r} ({type(exc).__name__}: {exc})")
        return None
    return functools.update_wrapper(wrapper, fn)




def ring_file() -> str | None:
    """This process's ring path once created."""
    return ring.ring_path(os.environ.get(ENV_DIR) or ring.default_dir(), os.getpid()) if _MM is not None else None
