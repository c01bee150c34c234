"""A closed loop of clients for the benches that load a real seat (bench/gpu/draft_seat.py,
bench/vllm/eagle_acceptance.py): each client sends the next prompt as soon as its answer is back.

Standard library only: it runs on the GPU host too, beside the seat package.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["closed_loop"]


def closed_loop(send: Callable[[str], int], prompts: Sequence[str], clients: int, seconds: float, *,
                at_stop: Callable[[], Any] | None = None, join_s: float = 300.0) -> dict[str, Any]:
    """``clients`` threads, each sending ``prompts`` in turn (from its own offset) through ``send`` (which returns
    the answer's tokens), for ``seconds``. Returns the window (``s``), the answers finished inside it (``ok``, their
    ``tokens``), the failures, and ``at_stop()`` read when the window closes (an engine's counters: the answers still
    in flight finish after it, outside the window)."""
    stop = threading.Event()
    lock = threading.Lock()
    tally = {"tokens": 0, "ok": 0, "failed": 0}

    def run(i: int) -> None:
        n = i
        while not stop.is_set():
            n += 1
            try:
                t = send(prompts[n % len(prompts)])
            except Exception:  # an answer that failed counts as one; the client goes on, as users retry
                with lock:
                    tally["failed"] += 1
                time.sleep(0.2)
                continue
            with lock:
                if not stop.is_set():
                    tally["tokens"] += t
                    tally["ok"] += 1

    threads = [threading.Thread(target=run, args=(i,), daemon=True) for i in range(clients)]
    t0 = time.monotonic()
    for t in threads:
        t.start()
    time.sleep(seconds)
    with lock:
        stop.set()
        dt = time.monotonic() - t0
        done = dict(tally)
    seen = at_stop() if at_stop is not None else None
    for t in threads:
        t.join(timeout=join_s)
    return {"clients": clients, "s": round(dt, 1), **done, "tok_s": round(done["tokens"] / dt, 2),
            "at_stop": seen}
