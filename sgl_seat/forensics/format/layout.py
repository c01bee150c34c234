"""Where things live in a bundle, and the limits a reader enforces on untrusted input.

The names here are the bundle format (schema_version 1); ``forensics/README.md`` documents each one
and ``forensics/bundle.schema.json`` the manifest. The live watchdog writes these names through
:func:`sgl_seat.forensics.format.bundle.write_bundle`, and ``replay`` reads them, so both sides import them
from this one module instead of spelling strings.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

__all__ = [
    "BUNDLE_ID_RE",
    "ENV",
    "FILE_NAME_RE",
    "INCOMPLETE",
    "INCOMPLETE_PREFIX",
    "INCOMPLETE_SCHEMA_VERSION",
    "LOGS",
    "MANIFEST",
    "MAX_FILES",
    "MAX_FILE_BYTES",
    "MAX_LINE_BYTES",
    "MAX_MANIFEST_BYTES",
    "METRICS",
    "NATIVE_STACKS",
    "PROBE",
    "PROCESSES",
    "REQUESTS",
    "SCHEMA_VERSION",
    "STACKS",
    "bundles_home",
    "gpu_file",
    "log_file",
    "process_state_file",
    "seat_bundles_dir",
]

#: Major version of the bundle format. Readers refuse any other major with BundleVersionError.
SCHEMA_VERSION = 1

MANIFEST = "manifest.json"
#: Python stack history (py-spy --nonblocking), all ranks of all nodes, stack-table JSON lines.
STACKS = "stacks.jsonl"
#: Capture-time stacks (py-spy --native, or Python-only where native failed), same encoding.
NATIVE_STACKS = "native_stacks.jsonl"
#: Row-fetch probe records, column blocks per (node, rank, pid, thread, target) or one record per line.
PROBE = "probe.jsonl"
#: MetricsPoint records: rank 0's /metrics history.
METRICS = "metrics.jsonl"
#: EngineProcess records: every engine process seen, alive or exited with its code.
PROCESSES = "processes.jsonl"
#: LogLine records: the engine log tail of every node as the detectors saw it.
LOGS = "logs.jsonl"
#: Environment of each node's engine, secrets scrubbed: {"<node>": {"NAME": "value"}}.
ENV = "env.json"
#: Request shapes recorded before the trigger (redacted by default), one per line.
REQUESTS = "requests.jsonl"

#: A capture that could not be written whole (a full or failing disk) stays as ``<dest>/.incomplete-<id>/``: a
#: dot name, so nothing that lists or resolves bundles takes it for one, and never renamed to ``<id>``.
INCOMPLETE_PREFIX = ".incomplete-"
#: Its marker: which files were written and which are missing, and why (see forensics/README.md, "Writing"). The
#: writer puts it there first, so even a disk that fills up at once leaves the list of what was to be written.
INCOMPLETE = "INCOMPLETE.json"
#: Version of the marker's own format (a small JSON object; readers refuse another major).
INCOMPLETE_SCHEMA_VERSION = 1


def log_file(node: int) -> str:
    """Raw engine log tail of one node (scrubbed text, for humans; ``logs.jsonl`` is what detectors read)."""
    return f"logs/node{node}.log"


def gpu_file(node: int) -> str:
    """``nvidia-smi -q`` output of one node, where nvidia-smi exists."""
    return f"gpu/node{node}.txt"


def process_state_file(node: int) -> str:
    """psutil state of one node's engine processes (status, threads, CPU, RSS, connections), free-form JSON."""
    return f"processes/node{node}.json"


#: Bundle ids become directory names: no separators, no leading dot.
BUNDLE_ID_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$")
#: File names inside a bundle: at most three levels of plain names, no leading dot, no ``..``.
FILE_NAME_RE = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9._-]{0,127}(/[A-Za-z0-9_][A-Za-z0-9._-]{0,127}){0,2}$")

# Limits for untrusted bundles: generous for a real one-hour bundle, small enough that a hostile one
# cannot make the reader allocate without bound.
MAX_MANIFEST_BYTES = 8 * 1024 * 1024
MAX_FILES = 4096
MAX_FILE_BYTES = 8 * 1024 * 1024 * 1024
MAX_LINE_BYTES = 64 * 1024 * 1024


def bundles_home() -> Path:
    """``$SGLSEAT_HOME/bundles`` (default ``~/.sgl-seat/bundles``)."""
    home = os.environ.get("SGLSEAT_HOME")
    base = Path(home).expanduser() if home else Path.home() / ".sgl-seat"
    return base / "bundles"


def seat_bundles_dir(seat: str, configured: str | None = None) -> Path:
    """Where one seat's bundles go: ``configured`` (the spec's ``bundles.dir``) when set, else
    ``$SGLSEAT_HOME/bundles/<seat>``. The one place that decides it: `up` records the result for the
    sidecars, and `watch`, `replay` and `bundle` read it back from the seat's record."""
    return Path(configured).expanduser() if configured else bundles_home() / seat
