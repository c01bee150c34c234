"""The in-engine probe: times configured calls (row fetches) into a lock-free shared-memory ring.

Loaded into every engine process through the plan's environment (``SGLSEAT_PROBE`` names the
targets, ``SGLSEAT_PROBE_DIR`` the ring directory; see :mod:`sgl_seat.watchdog.boot` for engines
that have no hook of ours). Each wrapped call writes one 64-byte slot: start time, end time (0 while
the call is in flight, so a fetch that never returns is visible with its age), gather size, thread
and target. The ring is one mmap'd file per process, ``<dir>/probe-<pid>.ring``; the sidecar reads it
with :func:`read_ring`.

Its parts, one module each:

- :mod:`.ring`: the ring's format (header, slots, the lap-tagged end word, the GPU side area) and its reader
  (:func:`read_ring`, :class:`RingReader`, :func:`list_rings`), the only part the sidecar needs;
- :mod:`.targets`: target syntax (:func:`parse_target`) and which argument is a call's gather size;
- :mod:`.beat`: heartbeat targets (mode ``beat``): instant records that say a process goes round inside a long
  step of work;
- :mod:`.writer`: this process's ring, the Python wrappers (:func:`make_wrapper`) and all the mutable state the
  hot path reads (the C writer and the generated wrappers read it through that module's dict);
- :mod:`.native`: building and loading the C writer, ``probe_native.c`` beside it;
- :mod:`.gpu`: the GPU stream timer (:class:`GpuTimer`, :func:`cuda_paths`, :func:`enable_gpu`), torch only
  when it starts;
- :mod:`.installer`: wrapping targets now or when their module is imported (:func:`install`,
  :func:`install_from_env`);
- :mod:`.guard`: warn once instead of raising, private directories only;
- :mod:`.fault`: rehearsal faults (``probe-stall``: a probed call of a test seat stalls on purpose), only where
  ``SGLSEAT_PROBE_REHEARSAL=1`` (:func:`parse_probe_fault`, :func:`write_control`).

This package uses the standard library only (torch is imported lazily, where GPU timing starts) and never
raises into the engine: a probe that cannot install or write warns once on stderr and gets out of the way. Its
modules import each other relatively on purpose: ``watchdog/boot/sitecustomize.py`` loads this directory by
path as the package ``sgl_seat_probe`` into engine interpreters that may not have sgl-seat installed.
"""

from __future__ import annotations

from . import fault
from .fault import CONTROL_FILE, ENV_FAULTS, ENV_REHEARSAL, ProbeFault, parse_probe_fault, write_control
from .gpu import (
    DEFAULT_COALESCE_US,
    DEFAULT_GPU_PATH,
    ENV_GPU,
    ENV_GPU_COALESCE,
    ENV_GPU_PATH,
    ENV_GPU_POLL,
    ENV_GPU_TIMING,
    PREFILL_EVENTS,
    CudaPaths,
    FastPath,
    GpuTimer,
    cuda_paths,
    disable_gpu,
    enable_gpu,
    enable_gpu_cuda,
    gpu_timer,
)
from .installer import ENV_TARGETS, install, install_from_env, installed
from .native import ENV_NATIVE, ENV_NATIVE_CACHE
from .ring import (
    DEFAULT_SLOTS,
    GPU_DONE,
    GPU_NONE,
    GPU_QUEUED,
    GPU_SLOT_BYTES,
    GPU_STARTED,
    HEADER_BYTES,
    MAGIC,
    MAX_TARGETS,
    RING_VERSION,
    SLOT_BYTES,
    SLOT_WORDS,
    TARGET_NAME_BYTES,
    RingError,
    RingHeader,
    RingNotReady,
    RingReader,
    RingRecord,
    default_dir,
    list_rings,
    read_header,
    read_ring,
    ring_path,
)
from .targets import TargetSpec, parse_target, parse_targets
from .writer import ENV_DIR, ENV_NODE, ENV_RANK, ENV_SLOTS, make_wrapper, native_state, reset, ring_file

__all__ = [
    "CONTROL_FILE",
    "DEFAULT_COALESCE_US",
    "DEFAULT_GPU_PATH",
    "DEFAULT_SLOTS",
    "ENV_DIR",
    "ENV_FAULTS",
    "ENV_GPU",
    "ENV_GPU_COALESCE",
    "ENV_GPU_PATH",
    "ENV_GPU_POLL",
    "ENV_GPU_TIMING",
    "ENV_NATIVE",
    "ENV_NATIVE_CACHE",
    "ENV_NODE",
    "ENV_RANK",
    "ENV_REHEARSAL",
    "ENV_SLOTS",
    "ENV_TARGETS",
    "GPU_DONE",
    "GPU_NONE",
    "GPU_QUEUED",
    "GPU_SLOT_BYTES",
    "GPU_STARTED",
    "HEADER_BYTES",
    "MAGIC",
    "MAX_TARGETS",
    "PREFILL_EVENTS",
    "RING_VERSION",
    "SLOT_BYTES",
    "SLOT_WORDS",
    "TARGET_NAME_BYTES",
    "CudaPaths",
    "FastPath",
    "GpuTimer",
    "ProbeFault",
    "RingError",
    "RingHeader",
    "RingNotReady",
    "RingReader",
    "RingRecord",
    "TargetSpec",
    "cuda_paths",
    "default_dir",
    "disable_gpu",
    "enable_gpu",
    "enable_gpu_cuda",
    "fault",
    "gpu_timer",
    "install",
    "install_from_env",
    "installed",
    "list_rings",
    "make_wrapper",
    "native_state",
    "parse_probe_fault",
    "parse_target",
    "parse_targets",
    "read_header",
    "read_ring",
    "reset",
    "ring_file",
    "ring_path",
    "write_control",
]
