"""Frame helpers: which frame of a stack to name, and whether a thread waits in a collective.

Pure functions over :class:`~sgl_seat.core.records.ThreadStack`; the detectors, ``watch``'s rank view and
the offline analysis all read stacks through these, so a frame is named the same way live and in replay.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

from sgl_seat.core.records import Frame, ThreadStack

#: Frame names (last dotted part) of collectives and device syncs: a rank whose stack is in one is
#: waiting for its peers.
_COLLECTIVE = re.compile(
    r"^(all_reduce\w*|allreduce\w*|all_gather\w*|allgather\w*|reduce_scatter\w*|broadcast\w*|barrier|"
    r"monitored_barrier|all_to_all\w*|alltoall\w*|gather|scatter|reduce|wait|synchronize|recv|irecv|send|isend|"
    r"tensor_model_parallel_all_reduce|inplace_all_reduce)$"
)
_NATIVE_COLLECTIVE = re.compile(r"nccl|cuCtxSynchronize|cudaDeviceSynchronize|cudaStreamSynchronize|"
                                r"cudaEventSynchronize|gloo", re.I)
#: Generic synchronisation in the standard library: a ``wait`` there is not a collective.
_STDLIB_SYNC = re.compile(r"(^|/)(threading|queue|selectors|subprocess|socket|ssl)\.py$|/asyncio/|"
                          r"/concurrent/futures/|/multiprocessing/")
_STDLIB = re.compile(r"/lib/python3\.\d+/(?!site-packages/|dist-packages/)|^<frozen ")


#: An engine's idle wait, by qualified frame name (innermost engine frames): SGLang 0.5.23's scheduler polling
#: its input while nothing runs (``Scheduler._poll_timeout_aborts``, spinning without ``--sleep-on-idle``), or
#: asleep in ``IdleSleeper.maybe_sleep``'s zmq poll (``--sleep-on-idle``, rank 0; scheduler.py:5328 ->
#: idle_sleeper.py:37), and a zmq receive or poll anywhere (a process waiting for its input; a zmq *send* is
#: work: a busy rank 0 is seen in ``Socket.send`` handing its outputs to the detokenizer).
_IDLE_WAIT = re.compile(r"(^|\.)(_poll_timeout_aborts|maybe_sleep_on_idle|maybe_sleep|on_idle)$")
_ZMQ_WAIT = re.compile(r"/zmq/sugar/(poll|socket)\.py$")
_ZMQ_WAIT_NAME = re.compile(r"(^|\.)(poll|recv\w*)$")


def idle_frame(thread: ThreadStack | None, *, depth: int = 4) -> Frame | None:
    """The frame of an engine's idle wait the thread sits in (innermost ``depth`` Python frames), if any.

    Why: an idle scheduler is in engine code, not the standard library (a zmq poll in site-packages, or its own
    polling loop), so "innermost engine frame" read it as running work; it says nothing about a hang.
    """
    for f in python_frames(thread)[:depth]:
        if (_ZMQ_WAIT.search(f.filename.replace("\\", "/")) and _ZMQ_WAIT_NAME.search(f.name)) \
                or _IDLE_WAIT.search(f.name):
            return f
    return None


def python_frames(thread: ThreadStack | None) -> list[Frame]:
    return [f for f in thread.frames if not f.native] if thread is not None else []


def is_stdlib(frame: Frame) -> bool:
    return bool(_STDLIB.search(frame.filename)) or frame.filename.startswith("<")


def short_name(frame: Frame) -> str:
    return frame.name.rsplit(".", 1)[-1]


def collective_frame(thread: ThreadStack | None, *, depth: int = 8) -> Frame | None:
    """The collective or device-sync frame a thread waits in, if any (innermost ``depth`` frames)."""
    if thread is None:
        return None
    for f in thread.frames[:depth * 3]:
        if f.native and _NATIVE_COLLECTIVE.search(f.name):
            return f
    for f in python_frames(thread)[:depth]:
        if _STDLIB_SYNC.search(f.filename):
            continue
        if _COLLECTIVE.match(short_name(f)):
            return f
    return None


def target_qualname(target: str) -> tuple[str | None, str]:
    """(module, qualified name) of a probe target: ``pkg.mod:Class.method`` -> (pkg.mod, Class.method);
    the older dotted form ``pkg.mod.func`` -> (pkg.mod, func); an ``@arg`` suffix is dropped."""
    target = target.split("@", 1)[0]
    if ":" in target:
        mod, qual = target.rsplit(":", 1)
        return mod or None, qual
    mod, _, func = target.rpartition(".")
    return mod or None, func


#: The code file name of the probe's rehearsal gate of a target (``probe/fault.py`` compiles it as
#: ``<sgl-seat rehearsal gate of 'Class.method'>``): its frame is a call of that target, stalled at its entry.
REHEARSAL_GATE_FILE = "<sgl-seat rehearsal gate of "


def frame_is_target(frame: Frame, target: str) -> bool:
    """Whether ``frame`` is a call of probe target ``target``.

    Why not the last dotted name alone: a real engine's targets are methods (``VocabParallelEmbedding.forward``)
    and every layer of a model has a ``forward``; matched by ``forward`` alone, every rank in any forward looked
    like it was inside its probed call. py-spy names a frame by its qualified name (``Class.method``), which must
    equal the target's; a frame named by its bare function name (older py-spy) must also sit in the target's module.
    """
    if frame.native:
        return False
    mod, qual = target_qualname(target)
    if frame.name == qual or frame.name.endswith("." + qual):
        return True
    if frame.filename == f"{REHEARSAL_GATE_FILE}{qual!r}>":
        return True  # a rehearsal stall sits in the target's gate, before the target's own frame is entered
    last = qual.rsplit(".", 1)[-1]
    if "." in frame.name or frame.name != last:
        return False
    if "." not in qual:
        return True  # a plain function target: its name is the frame's name
    if mod is None:
        return False
    path = frame.filename.replace("\\", "/")
    stem = mod.replace(".", "/")
    return path.endswith(stem + ".py") or path.endswith(stem + "/__init__.py")


def target_frame(thread: ThreadStack | None, targets: Sequence[str]) -> Frame | None:
    """The innermost frame of ``thread`` that is a call of one of ``targets`` (a probed call), if any."""
    if not targets:
        return None
    for f in python_frames(thread):
        for t in targets:
            if frame_is_target(f, t):
                # A rehearsal stall's gate frame is named as the target it stands for (the call's entry).
                return Frame(target_qualname(t)[1], t, 0) if f.filename.startswith(REHEARSAL_GATE_FILE) else f
    return None


def stuck_frame(thread: ThreadStack | None, targets: Sequence[str] = ()) -> Frame | None:
    """The frame to name: a probe target's frame if the stack holds one, else the innermost frame of
    engine code (not the standard library), else the innermost Python frame."""
    frames = python_frames(thread)
    if not frames:
        return None
    hit = target_frame(thread, targets)
    if hit is not None:
        return hit
    for f in frames:
        if not is_stdlib(f):
            return f
    return frames[0]
