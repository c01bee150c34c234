"""Rehearsal faults through the probe ("probe-stall"): a probed call of a test seat stalls on purpose.

A rehearsal seat (a test or bench seat, never production) proves that the watchdog catches a rank stuck inside
real engine code: the probed call (say ``VocabParallelEmbedding.forward``) blocks in :func:`rehearsal_stall`, its
TP peers wait in the real all-reduce, and the probe's record of the call stays in flight for the sidecar to see.
Nothing here is simulated: the engine, its collectives and the watchdog all run their real code.

Fault grammar (``KIND:key=value,...``, every key optional, all the triggers given must hold; none: the next call)::

    probe-stall:rank=1,after_calls=20,for_s=30

- ``rank`` (int): only the process of this TP rank (:func:`.writer._own_rank`); omitted: every rank;
- ``node`` (int): only on this node (:func:`.writer._own_node`);
- ``after_calls`` (int >= 0): the call after N calls of probed targets of this process counted since the fault
  was armed (0: the next call);
- ``gather_ge`` (int >= 0): the call's gather size (sized as the probe sizes it, the target's ``@arg:mode``) is
  at least K; for a graph-replay target (``@shape_key:graph``), the replay's token count as the ring records it
  (:func:`.graph.replay_shape`: the shape key's size times the runner's tokens per request);
- ``for_s`` (float > 0): how long the stall lasts; omitted: until cleared (a file-armed fault) or until the
  process dies (a launch-time one);
- ``target`` (text): a substring of the target's name (``module:qualname``); omitted: any probed target.

Graph-replay targets are gated like the others: a stalled replay is in flight in the ring on the host (its record
written before the replay, its end after the stall), and the replay itself is only launched after it. ``link``
targets (a backend's constructor, :data:`.targets.LINK_MODE`) are not gated and not counted by ``after_calls``.

Where faults come from, only when ``SGLSEAT_PROBE_REHEARSAL=1`` (:data:`ENV_REHEARSAL`; any other value, or
unset, is production: the installer adds no gate at all, so the production hot path is untouched):

- launch time: ``SGLSEAT_PROBE_FAULTS`` (:data:`ENV_FAULTS`, fault texts joined by ``;``), armed when the first
  target is gated (the process's start), each firing once;
- run time: the control file ``rehearsal-fault.json`` (:data:`CONTROL_FILE`) in the probe directory
  (``SGLSEAT_PROBE_DIR``, default :func:`.ring.default_dir`), ``{"schema_version": 1, "id": "...",
  "fault": "probe-stall:..."}``, written by :func:`write_control`. Its fault is armed while the file holds it;
  a new id re-arms, each id fires at most once per process; removing the file (or writing another id) disarms
  it and ends a stall it started. A malformed file is warned about once per version and ignored (what was armed
  stays armed).

Why the gate is a wrapper of its own, inside the probe's (``probe_wrapper(gate(fn))``): the probe's record of
the stalled call is then written before the stall and ended after it, in flight all along, exactly what a real
hang looks like to the sidecar; and neither ring writer (the C one, the generated wrappers) learns of faults.

Why the cost stays small in a rehearsal: with nothing armed for this process a call costs a counter step, one
``time.monotonic()`` and a compare (~100 ns; with the gate's own frame, ~190 ns over a bare call where the gate is
generated with the target's parameters, ~400 ns where it forwards ``*args, **kwargs``); the control file is looked
at at most every 0.2 s, by ``stat`` (mtime, size, inode) before any read. Nothing of this module's machinery
raises into the engine: a failure is warned about once (:func:`.guard.warn_once`) and the call proceeds.

Standard library only (loaded by path into engines without sgl-seat, like the rest of the package).
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import json
import math
import os
import re
import stat
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import ring, writer
from .graph import replay_shape
from .guard import check_private_dir, warn_once
from .targets import TargetSpec, _size_position

KIND = "probe-stall"
KEYS = ("rank", "node", "after_calls", "gather_ge", "for_s", "target")
EXAMPLE = "probe-stall:rank=1,after_calls=20,for_s=30"
ENV_REHEARSAL = "SGLSEAT_PROBE_REHEARSAL"
ENV_FAULTS = "SGLSEAT_PROBE_FAULTS"
CONTROL_FILE = "rehearsal-fault.json"
CONTROL_SCHEMA = 1
#: How often a process looks at the control file (on calls, and while a file-armed stall lasts).
CHECK_EVERY_S = 0.2
#: The stall sleeps in steps this short, so that its end (for_s, a cleared file) is seen promptly.
STALL_STEP_S = 0.05

_INT = re.compile(r"^[0-9]+$")
_INT_KEYS = ("rank", "node", "after_calls", "gather_ge")


@dataclass(frozen=True)
class ProbeFault:
    """One parsed ``probe-stall`` fault; None fields are triggers not given (they always hold)."""

    rank: int | None = None
    node: int | None = None
    after_calls: int | None = None
    gather_ge: int | None = None
    for_s: float | None = None
    target: str | None = None

    def __post_init__(self) -> None:
        """A fault built directly holds what the grammar can say, so that :meth:`spec` always parses back."""
        for key in _INT_KEYS:
            value = getattr(self, key)
            if value is not None and (type(value) is not int or value < 0):
                raise _bad(f"{key}={value!r}", f"{key} must be a whole number >= 0")
        if self.for_s is not None and (not isinstance(self.for_s, (int, float)) or isinstance(self.for_s, bool)
                                       or not math.isfinite(self.for_s) or self.for_s <= 0):
            raise _bad(f"for_s={self.for_s!r}", "for_s must be a finite number > 0")
        if self.target is not None and (not isinstance(self.target, str) or not self.target
                                        or self.target != self.target.strip() or any(c in self.target for c in ",;")):
            raise _bad(f"target={self.target!r}", "target must be non-empty text without ',' or ';' or outer spaces")

    def spec(self) -> str:
        """Canonical text (keys in :data:`KEYS` order), which :func:`parse_probe_fault` reads back to an equal value."""
        parts = []
        for key in KEYS:
            value = getattr(self, key)
            if value is not None:
                parts.append(f"{key}={_fmt_seconds(value) if key == 'for_s' else value}")
        return f"{KIND}:{','.join(parts)}" if parts else KIND


def _fmt_seconds(value: float) -> str:
    return str(int(value)) if value.is_integer() and abs(value) < 1e15 else repr(value)


def _bad(text: str, why: str) -> ValueError:
    return ValueError(f"fault {text!r}: {why} (expected {KIND}:key=value,... with keys {', '.join(KEYS)}; "
                      f"e.g. {EXAMPLE})")


def parse_probe_fault(text: str) -> ProbeFault:
    """Parse one fault text; ValueError saying what is wrong (and showing an example) when it is malformed."""
    if not isinstance(text, str):
        raise _bad(repr(text), "not a string")
    raw = text.strip()
    kind, colon, rest = raw.partition(":")
    if kind.strip() != KIND:
        raise _bad(text, f"kind {kind.strip()!r} is not {KIND!r}")
    values: dict[str, Any] = {}
    if colon and rest.strip():
        for item in rest.split(","):
            key, eq, value = (s.strip() for s in item.partition("="))
            if not key and not eq:
                raise _bad(text, "an empty item (two commas, or a trailing one)")
            if key not in KEYS:
                raise _bad(text, f"unknown key {key!r}")
            if not eq or not value:
                raise _bad(text, f"key {key!r} has no value")
            if key in values:
                raise _bad(text, f"key {key!r} given twice")
            if key in _INT_KEYS:
                if not _INT.match(value):
                    raise _bad(text, f"{key}={value!r} is not a whole number >= 0")
                values[key] = int(value)
            elif key == "for_s":
                try:
                    seconds = float(value)
                except ValueError:
                    raise _bad(text, f"for_s={value!r} is not a number of seconds") from None
                if not math.isfinite(seconds) or seconds <= 0:
                    raise _bad(text, f"for_s={value!r} must be a finite number > 0")
                values[key] = seconds
            else:  # target
                if ";" in value:
                    raise _bad(text, f"target={value!r} may not hold ';' (it joins faults in {ENV_FAULTS})")
                values[key] = value
    return ProbeFault(**values)


def enabled() -> bool:
    """Whether this process is a rehearsal (``SGLSEAT_PROBE_REHEARSAL=1``); only then does the installer gate."""
    return os.environ.get(ENV_REHEARSAL, "").strip() == "1"


def control_path(directory: str | os.PathLike[str] | None = None) -> Path:
    """The control file of a probe directory (this process's, from ``SGLSEAT_PROBE_DIR``, when None)."""
    base = directory if directory is not None else (os.environ.get(writer.ENV_DIR) or ring.default_dir())
    return Path(base) / CONTROL_FILE


def write_control(directory: str | os.PathLike[str], fault_text: str | None, *, fault_id: str) -> Path | None:
    """Arm ``fault_text`` for every rehearsal process of ``directory`` under ``fault_id`` (atomically: a temporary
    file, mode 0600, then ``os.replace``), or with None remove the file (which ends stalls it started). Returns the
    path written, None when removed. The text is validated first (ValueError), so a seat never writes a fault its
    processes would only warn about."""
    path = control_path(directory)
    if fault_text is None:
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return None
    fault = parse_probe_fault(fault_text)
    if not isinstance(fault_id, str) or not fault_id.strip():
        raise ValueError(f"fault id {fault_id!r}: a non-empty string is needed (a new id re-arms the fault)")
    os.makedirs(path.parent, mode=0o700, exist_ok=True)
    check_private_dir(str(path.parent))  # the processes would refuse the file of a directory others may write
    body = json.dumps({"schema_version": CONTROL_SCHEMA, "id": fault_id, "fault": fault.spec()}) + "\n"
    tmp = path.with_name(f".{CONTROL_FILE}.{os.getpid()}.{threading.get_ident()}.tmp")
    with contextlib.suppress(FileNotFoundError):
        tmp.unlink()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_NOFOLLOW", 0), 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            fh.write(body)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    return path


# ---------------------------------------------------------------------------------------------------------------
# Process state. The gate's hot path reads ``_LIVE``, ``_NEXT_CHECK`` and ``_NEXT`` as module globals; everything
# else is read and changed under ``_LOCK`` (ticks every 0.2 s, arming, firing), never on a call with nothing armed.


@dataclass
class _Armed:
    """A fault armed in this process: its id (``env:<i>`` for launch-time ones, the control file's otherwise)."""

    fault: ProbeFault
    fault_id: str
    source: str  # "env" | "file"
    base: int  # calls counted when it was armed (after_calls counts from there)


_COUNT: Any = itertools.count(1)
_NEXT: Callable[[], int] = _COUNT.__next__
_monotonic = time.monotonic
_LOCK = threading.Lock()
_ARMED: list[_Armed] = []  # armed, not fired (any rank)
_LIVE: tuple[_Armed, ...] = ()  # those of _ARMED whose rank and node are this process's: what the hot path reads
_FIRED: list[str] = []  # ids fired in this process, in order
_HISTORY: list[dict[str, Any]] = []  # what each firing saw (call number, target, gather, rank, node)
_STALLING: dict[str, float] = {}  # id -> monotonic start, while its stall lasts
_ENV_DONE = False
_NEXT_CHECK = -math.inf
_RANK = -1
_NODE = -1
_FILE_KEY: tuple[int, int, int] | None = None  # (mtime_ns, size, inode) of the control file last read
_FILE_ID: str | None = None  # the id the control file holds (None: absent); unchanged by a malformed file
_FILE_PATH: str | None = None


def _calls() -> int:
    """Calls counted so far (the counter's next number less one), read without taking a number."""
    m = re.fullmatch(r"count\((\d+)\)", repr(_COUNT))
    return int(m.group(1)) - 1 if m else 0


def _relive() -> None:
    """Recompute the faults that may fire here (rank and node match), under _LOCK."""
    global _LIVE
    _LIVE = tuple(a for a in _ARMED if (a.fault.rank is None or a.fault.rank == _RANK)
                  and (a.fault.node is None or a.fault.node == _NODE))


def _arm(fault: ProbeFault, fault_id: str, source: str, call: int | None = None) -> None:
    """Arm ``fault`` (under _LOCK); armed inside call number ``call``, that call is the first one counted after it."""
    _ARMED.append(_Armed(fault, fault_id, source, call - 1 if call is not None else _calls()))
    _relive()


def _arm_from_env() -> None:
    """Arm the launch-time faults once per process (under _LOCK)."""
    global _ENV_DONE
    if _ENV_DONE:
        return
    _ENV_DONE = True
    for i, text in enumerate(t for t in os.environ.get(ENV_FAULTS, "").split(";") if t.strip()):
        try:
            _arm(parse_probe_fault(text), f"env:{i}", "env")
        except ValueError as exc:
            warn_once(f"rehearsal-env:{text}", f"rehearsal fault not armed: {exc}")


def _parse_control(path: str) -> tuple[str, ProbeFault]:
    """(id, fault) of the control file; ValueError/OSError for one that is malformed or not trusted."""
    st = os.stat(path, follow_symlinks=False)
    if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
        raise OSError(f"not a regular file private to uid {os.getuid()}")
    check_private_dir(os.path.dirname(path))
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
    with os.fdopen(fd, "rb") as fh:
        data = json.loads(fh.read(65536).decode("utf-8"))
    if not isinstance(data, dict) or data.get("schema_version") != CONTROL_SCHEMA:
        raise ValueError(f"not a JSON object with schema_version {CONTROL_SCHEMA}")
    fault_id = data.get("id")
    if not isinstance(fault_id, str) or not fault_id:
        raise ValueError("no id (a non-empty string)")
    text = data.get("fault")
    if not isinstance(text, str):
        raise ValueError("no fault text (a string)")
    return fault_id, parse_probe_fault(text)


def _tick(now: float, call: int | None = None) -> None:
    """At most every CHECK_EVERY_S: this process's rank and node (the title may change after start) and the
    control file, read only when its (mtime_ns, size, inode) changed: a new id is armed, a removed file or another
    id disarms the file's fault (and ends its stall, see :func:`rehearsal_stall`); a malformed one is warned about
    once per version and ignored. Under _LOCK; never raises."""
    global _NEXT_CHECK, _RANK, _NODE, _FILE_KEY, _FILE_ID, _FILE_PATH
    _NEXT_CHECK = now + CHECK_EVERY_S
    _arm_from_env()
    try:
        _RANK, _NODE = writer._own_rank(), writer._own_node()
    except Exception as exc:
        warn_once("rehearsal-rank", f"rehearsal: cannot tell this process's rank ({exc})")
    try:
        path = str(control_path())
        if path != _FILE_PATH:  # another directory (tests change it): its file is read afresh
            _FILE_PATH, _FILE_KEY = path, None
        try:
            st = os.stat(path, follow_symlinks=False)
        except FileNotFoundError:  # absent: nothing armed from the file
            _FILE_KEY = _FILE_ID = None
            _ARMED[:] = [a for a in _ARMED if a.source != "file"]
            return
        key = (st.st_mtime_ns, st.st_size, st.st_ino)
        if key == _FILE_KEY:
            return
        _FILE_KEY = key
        try:
            fault_id, fault = _parse_control(path)
        except (OSError, ValueError, UnicodeDecodeError) as exc:
            warn_once(f"rehearsal-file:{path}:{key}", f"rehearsal control file {path} ignored: {exc}")
            return
        if fault_id != _FILE_ID:
            _FILE_ID = fault_id
            _ARMED[:] = [a for a in _ARMED if a.source != "file"]
            if fault_id not in _FIRED:
                _arm(fault, fault_id, "file", call)
    except Exception as exc:
        warn_once("rehearsal-tick", f"rehearsal control file not read ({type(exc).__name__}: {exc})")
    finally:
        _relive()


def _sizer(fn: Callable[..., Any], spec: TargetSpec) -> Callable[[tuple[Any, ...], dict[str, Any]], int]:
    """The call's gather size as the probe computes it (the target's ``@arg:mode``; a graph replay's token count,
    which needs the backend, ``args[0]``, for its runner's width); -1 when it has none."""
    pos, kw = _size_position(fn, spec)
    mode = spec.mode
    graph_replay = spec.graph_replay
    if graph_replay and spec.size_arg is None:  # the replay wrapper's default key: the argument after self
        pos, kw = 1, "shape_key"

    def size(args: tuple[Any, ...], kwargs: dict[str, Any]) -> int:
        if pos < 0:
            return -1
        try:
            if len(args) > pos:
                obj = args[pos]
            elif kw is not None and kw in kwargs:
                obj = kwargs[kw]
            else:
                return -1
            if graph_replay:
                return replay_shape(args[0] if args else None, obj)[0]
            if mode == "numel":
                return int(obj.numel())
            if mode == "len":
                return len(obj)
            if mode == "dim0":
                return int(obj.shape[0])
        except Exception:
            return -1
        return -1

    return size


def _consider(n: int, name: str, size: Callable[[tuple[Any, ...], dict[str, Any]], int],
              args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """Call number ``n`` (1-based) of this process, on a tick or with faults live: tick, then fire the first live
    fault whose triggers all hold (it is disarmed first: a fault fires once)."""
    now = _monotonic()
    hit: _Armed | None = None
    gather = -2  # not computed yet
    with _LOCK:
        if now >= _NEXT_CHECK:
            _tick(now, n)
        for a in _LIVE:
            f = a.fault
            if f.target is not None and f.target not in name:
                continue
            if f.after_calls is not None and n - 1 - a.base < f.after_calls:
                continue
            if f.gather_ge is not None:
                if gather == -2:
                    gather = size(args, kwargs)
                if gather < f.gather_ge:
                    continue
            hit = a
            break
        if hit is None:
            return
        _ARMED.remove(hit)
        _relive()
        _FIRED.append(hit.fault_id)
        _STALLING[hit.fault_id] = now
        rank, node = _RANK, _NODE
    try:
        if gather == -2:
            gather = size(args, kwargs)
        f = hit.fault
        how = f"for {_fmt_seconds(f.for_s)} s" if f.for_s is not None else "until cleared"
        with _LOCK:
            _HISTORY.append({"id": hit.fault_id, "fault": f.spec(), "call": n, "target": name, "gather": gather,
                             "rank": rank, "node": node})
        with contextlib.suppress(Exception):
            sys.stderr.write(f"sgl-seat rehearsal: {KIND} on rank {rank} (node {node}) in {name}, "
                             f"gather {gather}, {how}\n")
            sys.stderr.flush()
        rehearsal_stall(hit, now)
    finally:
        with _LOCK:
            _STALLING.pop(hit.fault_id, None)


def rehearsal_stall(armed: _Armed, start: float) -> None:
    """The stall itself, named so in a stack dump (py-spy, faulthandler) of the stuck rank: sleeps in short steps
    until ``for_s`` has passed or, for a fault armed by the control file, the file is removed or holds another id
    (looked at every CHECK_EVERY_S)."""
    for_s = armed.fault.for_s
    deadline = start + for_s if for_s is not None else math.inf
    next_check = start + CHECK_EVERY_S
    while True:
        now = _monotonic()
        if now >= deadline:
            return
        if armed.source == "file" and now >= next_check:
            next_check = now + CHECK_EVERY_S
            with _LOCK:
                _tick(now)
                cleared = armed.fault_id != _FILE_ID
            if cleared:
                return
        time.sleep(min(STALL_STEP_S, deadline - now))


def _check(n: int, name: str, size: Callable[[tuple[Any, ...], dict[str, Any]], int],
           args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """The gate's slow path (a tick is due or a fault is live); the gate's own failure is warned once, never raised."""
    try:
        _consider(n, name, size, args, kwargs)
    except Exception as exc:
        warn_once(f"rehearsal-gate:{type(exc).__name__}", f"rehearsal gate failed ({exc}); call proceeds")


def gate(fn: Callable[..., Any], spec: TargetSpec) -> Callable[..., Any]:
    """``fn`` behind the rehearsal gate: a call a live fault's triggers all hold for stalls, then runs ``fn``.

    The installer puts it inside the probe wrapper (``probe_wrapper(gate(fn))``) and only when :func:`enabled`.
    The gate counts every call (the ``after_calls`` trigger); with nothing live it costs a counter step, a
    monotonic clock read and a compare, about 100 ns. Like the writer's (:func:`.writer._exact_wrapper`), the gate
    has ``fn``'s own parameters where they are plain: forwarding ``*args, **kwargs`` cost about 200 ns more per call
    (measured on this project's dev host). Arms the launch-time faults on the first gate of the process."""
    name = spec.name
    size = _sizer(fn, spec)
    with _LOCK:
        _arm_from_env()
    exact = _exact_gate(fn, name, size)
    if exact is not None:
        return exact

    @functools.wraps(fn)
    def rehearsal_gate(*args: Any, **kwargs: Any) -> Any:
        n = _NEXT()
        if _LIVE or _monotonic() >= _NEXT_CHECK:
            _check(n, name, size, args, kwargs)
        return fn(*args, **kwargs)

    return rehearsal_gate


# The generated gate: the generic one's body with ``fn``'s own parameters (positional ones passed to the slow path
# as the tuple a call would have, keyword-only ones as its dict, so the probe's sizing applies unchanged). Its
# locals start with ``_g_``; a function with a parameter of such a name, or of a global below, gets the generic one.
_GATE_GLOBALS = frozenset({"_NEXT", "_LIVE", "_monotonic", "_NEXT_CHECK", "_check"})
_GATE_SRC = """
def _g_make(_g_fn, _g_name, _g_size, _g_defaults, _g_kwdefaults):
    {unpack}
    def rehearsal_gate({params}):
        _g_n = _NEXT()
        if _LIVE or _monotonic() >= _NEXT_CHECK:
            _check(_g_n, _g_name, _g_size, ({args}), {{{kwargs}}})
        return _g_fn({call})
    return rehearsal_gate
"""


def _exact_gate(fn: Callable[..., Any], name: str,
                size: Callable[[tuple[Any, ...], dict[str, Any]], int]) -> Callable[..., Any] | None:
    """A gate with ``fn``'s own signature, or None where its parameters are not plain (no ``*args``/``**kwargs``,
    no positional-only ones) or the generated code fails (the generic gate does the same job)."""
    import inspect

    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        return None
    plain = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    if any(p.kind not in plain or p.name.startswith("_g_") or p.name in _GATE_GLOBALS for p in params):
        return None
    decl: list[str] = []
    call: list[str] = []
    unpack: list[str] = []
    positional: list[str] = []
    keyword: list[str] = []
    defaults: list[Any] = []
    kwdefaults: list[Any] = []
    for p in params:
        kw_only = p.kind is inspect.Parameter.KEYWORD_ONLY
        if kw_only:
            if "*" not in decl:
                decl.append("*")
            call.append(f"{p.name}={p.name}")
            keyword.append(f"{p.name!r}: {p.name}")
        else:
            call.append(p.name)
            positional.append(p.name)
        if p.default is inspect.Parameter.empty:
            decl.append(p.name)
            continue
        pool, tag, src = (kwdefaults, "k", "_g_kwdefaults") if kw_only else (defaults, "d", "_g_defaults")
        unpack.append(f"_g_{tag}{len(pool)} = {src}[{len(pool)}]")
        decl.append(f"{p.name}=_g_{tag}{len(pool)}")
        pool.append(p.default)
    src = _GATE_SRC.format(params=", ".join(decl), call=", ".join(call), unpack="; ".join(unpack) or "pass",
                           args="".join(f"{a}, " for a in positional), kwargs=", ".join(keyword))
    scope: dict[str, Any] = {}
    try:
        exec(compile(src, f"<sgl-seat rehearsal gate of {getattr(fn, '__qualname__', fn)!r}>", "exec"),  # noqa: S102
             globals(), scope)
        made = scope["_g_make"](fn, name, size, tuple(defaults), tuple(kwdefaults))
    except Exception as exc:
        warn_once(f"rehearsal-exact:{name}", f"generic rehearsal gate for {name} ({type(exc).__name__}: {exc})")
        return None
    return functools.update_wrapper(made, fn)


def state() -> dict[str, Any]:
    """This process's rehearsal state, for tests and diagnostics."""
    with _LOCK:
        return {
            "enabled": enabled(),
            "calls": _calls(),
            "rank": _RANK,
            "node": _NODE,
            "armed": [{"id": a.fault_id, "fault": a.fault.spec(), "source": a.source, "base": a.base,
                       "live": a in _LIVE} for a in _ARMED],
            "fired": list(_FIRED),
            "history": [dict(h) for h in _HISTORY],
            "stalling": sorted(_STALLING),
            "control": {"path": _FILE_PATH, "id": _FILE_ID},
        }


def reset() -> None:
    """Forget every armed and fired fault and the calls counted (the next gate re-arms from the environment);
    tests, and a forked child (a process of its own: its faults fire in it once more)."""
    global _COUNT, _NEXT, _LOCK, _ENV_DONE, _NEXT_CHECK, _FILE_KEY, _FILE_ID, _FILE_PATH, _LIVE
    _LOCK = threading.Lock()
    _COUNT = itertools.count(1)
    _NEXT = _COUNT.__next__
    _ARMED.clear()
    _LIVE = ()
    _FIRED.clear()
    _HISTORY.clear()
    _STALLING.clear()
    _ENV_DONE = False
    _NEXT_CHECK = -math.inf
    _FILE_KEY = _FILE_ID = _FILE_PATH = None


def _after_fork_in_child() -> None:
    reset()
    if enabled():
        _arm_from_env()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)
