"""Heartbeat targets (mode ``beat``): a call inside each step of work says the process goes round.

Why: the stack detectors judge a scheduler stuck when its main-thread stack stays the same for several samples
and it started or ended no probed call between them (``went_round`` in the watchdog's core). A healthy long
forward breaks that: the trained SmolLM2-135M's 1,390-token prefill on the CPU engine runs 30 float32 layers for
5 s with one row fetch (the embedding lookup) at its start, and 1 Hz samples find it at the same line of the
attention code each time (the layer loop calls it from one line). The fault-free soak wrote two false
"stack unchanged" bundles so (``bench/results/real_watchdog_soak_trained_nofault.txt``). A decoder layer's
``forward`` starts 30 times in that forward: each start is the rank's own word that it is not stuck.

A beat is an instant record (start = end, gather size -1, target ``module:qualname@beat``), written at most once
per :data:`BEAT_EVERY_S` per process: enough for 1 Hz stack samples, and the ring and a bundle hold about ten
more records a second per rank, not thirty per step. It is never in flight, so the row-fetch detector never
judges it; the core leaves beats out of learning, buckets and reports. No rehearsal gate (a beat never stalls).
"""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from typing import Any

from . import writer
from .targets import TargetSpec

#: At most one beat per process this often (seconds).
BEAT_EVERY_S = 0.1
_EVERY_NS = int(BEAT_EVERY_S * 1e9)
_last_ns = 0  # this process's last beat (a forked child's first call writes one at once: harmless)


def make_beat_wrapper(fn: Callable[..., Any], spec: TargetSpec) -> Callable[..., Any]:
    """Wrap ``fn`` so that a call writes a beat when the process's last one is :data:`BEAT_EVERY_S` old."""
    tidx = writer._register_target(spec.name)
    clock = time.monotonic_ns

    @functools.wraps(fn)
    def beat_wrapper(*args: Any, **kwargs: Any) -> Any:
        global _last_ns
        t = clock()
        if t - _last_ns >= _EVERY_NS:
            _last_ns = t
            writer.write_beat(tidx)
        return fn(*args, **kwargs)

    beat_wrapper.__sgl_seat_probe__ = spec.name  # type: ignore[attr-defined]
    return beat_wrapper
