"""DeepSeek-V4.1's Engram host table: its bytes, what it takes off the GPUs, and the per-node checks it needs.

SGLang 0.5.23 keeps each Engram layer's hashed n-gram table (fp8 rows plus one e8m0 scale per 32 values,
``sglang/srt/layers/engram.py``) TP-sharded in HBM unless ``SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE=1`` moves it
into pinned host memory (``_HostTable``): ``shared`` maps one memfd per TP group (every rank opens rank 0's
descriptor through ``/proc``, so the ranks must share a PID namespace and may open each other's ``/proc/<pid>/fd``),
``per_rank`` maps only the rank's own rows. Without huge pages SGLang warns of ~10x slower lookups; the pin is
``cudaHostRegister`` of the whole mapping.

Everything here is pure: the node checks take readers (``/proc/meminfo``, the THP knobs, ``RLIMIT_MEMLOCK``,
Yama's ``ptrace_scope``), so unit tests give them fake machines.
"""

from __future__ import annotations

import os
import re
import resource
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

#: ``FP8_BLOCK_SIZE`` of SGLang's Engram tables: one e8m0 scale byte per 32 fp8 values.
ENGRAM_FP8_BLOCK = 32
ENV_HOST_TABLE = "SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE"
ENV_LAYOUT = "SGLANG_DSV41_ENGRAM_HOST_TABLE_LAYOUT"
ENV_STAGING = "SGLANG_OPT_DSV41_ENGRAM_HOST_STAGING"
#: sgl-seat's own variables beside SGLang's: what the node's preflight must find (bytes), set by the plan.
ENV_SEAT_HOST_BYTES = "SGLSEAT_ENGRAM_HOST_BYTES"
ENV_SEAT_PIN_BYTES = "SGLSEAT_ENGRAM_PIN_BYTES"
Layout = Literal["shared", "per_rank"]
THP_DIR = "/sys/kernel/mm/transparent_hugepage"


@dataclass(frozen=True, slots=True)
class EngramTables:
    """The Engram tables a config declares (``engram_layer_ids``, ``engram_num_embeddings``, ``engram_head_dim``)."""

    layer_ids: tuple[int, ...]
    rows: tuple[int, ...]
    head_dim: int

    @property
    def row_bytes(self) -> int:
        return self.head_dim + self.head_dim // ENGRAM_FP8_BLOCK

    @property
    def total_bytes(self) -> int:
        return sum(self.rows) * self.row_bytes

    def gpu_bytes_per_rank(self, tp: int) -> int:
        """What the tables take on each GPU when they stay in HBM (rows TP-sharded)."""
        return sum(-(-n // tp) for n in self.rows) * self.row_bytes

    def host_bytes_per_node(self, layout: Layout, *, tp: int, ranks_per_node: int) -> int:
        """Host memory one node maps: the whole tables once (shared), or its ranks' shards (per_rank)."""
        if layout == "shared":
            return self.total_bytes
        return ranks_per_node * self.gpu_bytes_per_rank(tp)

    def pinned_bytes_per_process(self, layout: Layout, *, tp: int) -> int:
        """What one rank registers with ``cudaHostRegister`` (its whole mapping)."""
        return self.total_bytes if layout == "shared" else self.gpu_bytes_per_rank(tp)


def engram_tables(config: Mapping[str, Any]) -> EngramTables | None:
    """The tables of a planning config, or None when it has no Engram layers (config.json, or its text_config)."""
    cfg = config.get("text_config") if isinstance(config.get("text_config"), Mapping) else config
    assert isinstance(cfg, Mapping)
    layer_ids = tuple(int(x) for x in (cfg.get("engram_layer_ids") or ()))
    if not layer_ids:
        return None
    rows = tuple(int(x) for x in (cfg.get("engram_num_embeddings") or ()))
    if len(rows) != len(layer_ids):
        raise ValueError(f"engram_num_embeddings has {len(rows)} entries for {len(layer_ids)} engram layers")
    return EngramTables(layer_ids=layer_ids, rows=rows, head_dim=int(cfg.get("engram_head_dim") or 0))


def host_table_env(layout: Layout, *, staging: bool, host_bytes: int | None = None,
                   pinned_bytes: int | None = None) -> dict[str, str]:
    """The environment every node's SGLang needs for the host table (SGLang's own variable names), plus what
    the node's preflight must find, when known (sgl-seat's ``SGLSEAT_ENGRAM_*``; SGLang ignores them)."""
    env = {ENV_HOST_TABLE: "1", ENV_LAYOUT: layout}
    if staging:
        env[ENV_STAGING] = "1"
    if host_bytes is not None and pinned_bytes is not None:
        env[ENV_SEAT_HOST_BYTES] = str(host_bytes)
        env[ENV_SEAT_PIN_BYTES] = str(pinned_bytes)
    return env


def needs_from_env(env: Mapping[str, str]) -> NodeNeeds | None:
    """What a node needs, from the engine environment the plan wrote (None: host table off or sizes unknown)."""
    if env.get(ENV_HOST_TABLE) != "1" or ENV_SEAT_HOST_BYTES not in env:
        return None
    layout: Layout = "per_rank" if env.get(ENV_LAYOUT) == "per_rank" else "shared"
    return NodeNeeds(layout=layout, host_bytes=int(env[ENV_SEAT_HOST_BYTES]),
                     pinned_bytes_per_process=int(env.get(ENV_SEAT_PIN_BYTES, env[ENV_SEAT_HOST_BYTES])))


def layout_problem(layout: Layout, *, nnodes: int) -> str | None:
    """Why the layout cannot work on this seat, or None. ``shared`` maps rank 0's memfd in every TP rank."""
    if layout == "shared" and nnodes > 1:
        return (
            "the shared Engram host-table layout opens TP rank 0's memfd through /proc on every TP rank, which "
            f"needs all ranks in one PID namespace; this seat's TP group spans {nnodes} nodes "
            "(SGLang fails with 'cannot open rank 0's memfd through /proc')"
        )
    return None


@dataclass(frozen=True, slots=True)
class HostReaders:
    """Where the node checks read the machine; tests pass fakes."""

    meminfo: Callable[[], str] = field(default=lambda: Path("/proc/meminfo").read_text(encoding="ascii"))
    thp_knob: Callable[[str], str] = field(
        default=lambda knob: Path(f"{THP_DIR}/{knob}").read_text(encoding="ascii")
    )
    memlock: Callable[[], tuple[int, int]] = field(default=lambda: resource.getrlimit(resource.RLIMIT_MEMLOCK))
    ptrace_scope: Callable[[], str] = field(
        default=lambda: Path("/proc/sys/kernel/yama/ptrace_scope").read_text(encoding="ascii")
    )
    is_root: Callable[[], bool] = field(default=lambda: os.geteuid() == 0)


@dataclass(frozen=True, slots=True)
class NodeNeeds:
    """What one node must offer for the host table."""

    layout: Layout
    host_bytes: int
    pinned_bytes_per_process: int


def mem_available_bytes(meminfo: str) -> int | None:
    match = re.search(r"^MemAvailable:\s+(\d+)\s*kB", meminfo, re.MULTILINE)
    return int(match.group(1)) * 1024 if match else None


def thp_mode(text: str) -> str:
    """The active choice of a THP knob (``always [madvise] never`` -> ``madvise``)."""
    match = re.search(r"\[(\w+)\]", text)
    return match.group(1) if match else text.strip()


def _gib(n: int) -> str:
    return f"{n / (1 << 30):.1f} GiB"


def check_node(needs: NodeNeeds, readers: HostReaders) -> list[str]:
    """Problems that would stop (or cripple) the host table on this node, each saying what to change.

    Empty when the node is ready. A reader that fails counts as a problem: a check that cannot run does not pass.
    """
    problems: list[str] = []
    try:
        available = mem_available_bytes(readers.meminfo())
    except OSError as exc:
        available = None
        problems.append(f"cannot read /proc/meminfo ({exc}); the Engram host table needs {_gib(needs.host_bytes)}")
    if available is not None and available < needs.host_bytes:
        problems.append(
            f"host RAM: MemAvailable is {_gib(available)} but the Engram host table ({needs.layout}) needs "
            f"{_gib(needs.host_bytes)} on this node; free memory, use layout per_rank, or keep the tables in HBM"
        )
    # SGLang madvises MADV_HUGEPAGE: anonymous memory (per_rank) follows 'enabled', the memfd (shared) 'shmem_enabled'.
    knob = "shmem_enabled" if needs.layout == "shared" else "enabled"
    ok_modes = {"always", "within_size", "advise"} if knob == "shmem_enabled" else {"always", "madvise"}
    try:
        mode = thp_mode(readers.thp_knob(knob))
    except OSError as exc:
        problems.append(f"huge pages: cannot read {THP_DIR}/{knob} ({exc})")
    else:
        if mode not in ok_modes:
            problems.append(
                f"huge pages: transparent_hugepage/{knob} is '{mode}', so the host table gets no huge pages "
                f"(SGLang: 'expect ~10x slower lookups'); set it to one of {sorted(ok_modes)}"
            )
    soft, _hard = readers.memlock()
    if soft != resource.RLIM_INFINITY and soft < needs.pinned_bytes_per_process and not readers.is_root():
        problems.append(
            f"ulimit -l is {soft} bytes but each rank pins {_gib(needs.pinned_bytes_per_process)} of host table "
            "(cudaHostRegister); raise the memlock limit (ulimit -l unlimited) for the engine's user"
        )
    if needs.layout == "shared":
        try:
            scope = readers.ptrace_scope().strip()
        except OSError:
            scope = "0"  # no Yama: /proc/<pid>/fd follows plain ownership
        if scope not in ("0", "") and not (scope == "1" and readers.is_root()):
            problems.append(
                f"shared layout: kernel.yama.ptrace_scope is {scope}, so a TP rank cannot open rank 0's memfd "
                "through /proc/<pid>/fd; run the ranks as root with ptrace_scope <= 1, set it to 0, or use per_rank"
            )
    return problems
