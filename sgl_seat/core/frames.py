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


def stuck_frame(thread: ThreadStack | None, targets: Sequence[str] = ()) -> Frame | None:
    """The frame to name: a probe target's frame if the stack holds one, else the innermost frame of
    engine code (not the standard library), else the innermost Python frame."""
    frames = python_frames(thread)
    if not frames:
        return None
    names = {t.rsplit(":", 1)[-1].rsplit(".", 1)[-1] for t in targets}
    for f in frames:
        if short_name(f) in names:
            return f
    for f in frames:
        if not is_stdlib(f):
            return f
    return frames[0]
