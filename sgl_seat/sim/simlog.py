"""SGLang-style logging for every sim process: ``[YYYY-mm-dd HH:MM:SS TP0 EP0] message`` on stderr.

Why: sgl-seat's node agent captures the engine's stdout/stderr and its parsers read SGLang's lines (KV pool,
decode batches, the watchdog). Children inherit the node main process's stderr, so every rank's lines land
in the same stream, each prefixed the way SGLang prefixes them.
"""

from __future__ import annotations

import logging
import sys

from sgl_seat.sim.contract import LOG_DATEFMT, LOG_FORMAT

LOGGER_NAME = "sglang"
SYNTHETIC_NOTE = (
    "sgl-seat sim engine: a stand-in for SGLang 0.5.23 with no GPU; every figure it reports "
    "(KV pool, memory, throughput, latency, acceptance) is SYNTHETIC."
)


def configure(prefix: str = "", level: str = "info") -> logging.Logger:
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(logging.Formatter(LOG_FORMAT.format(prefix=prefix), datefmt=LOG_DATEFMT))
    root = logging.getLogger()
    for h in list(root.handlers):
        root.removeHandler(h)
    root.addHandler(handler)
    root.setLevel(getattr(logging, level.upper(), logging.INFO))
    for noisy in ("uvicorn.access", "httpx", "httpcore"):
        logging.getLogger(noisy).setLevel(logging.WARNING)
    return logging.getLogger(LOGGER_NAME)


def get() -> logging.Logger:
    return logging.getLogger(LOGGER_NAME)
