"""The sim's decode steps as CUDA graphs (``--sim-cuda-graphs``, with ``--device cuda``), the way SGLang decodes.

Why: on a real GPU seat SGLang 0.5.23 runs decode, and the draft's verify, by replaying a CUDA graph captured per
batch-size bucket (``DecodeCudaGraphRunner`` -> ``self.backend.replay(shape_key, forward_batch)``), and the
Engram host-table read is a kernel inside that graph: no Python frame of its own, no probed call. The sim's eager
CUDA mode (:mod:`sgl_seat.sim.step.device`) fetches in ``fetch_rows``, which the probe sees; this mode takes that away
as SGLang does, so that the watchdog must see the hang from the replay alone.

What it does, per rank:

- captures one ``torch.cuda.CUDAGraph`` per bucket of :data:`CAPTURE_BS` up to the seat's running-request cap
  (SGLang's ``capture_bs``), each for ``bs x captured_req_width`` tokens: ``captured_req_width`` is the draft's
  tokens per request (``--speculative-num-draft-tokens``) when the draft is on (the verify's graph), else 1, so a
  replay's token count depends on the draft as SGLang's ``padded_num_tokens = bs * captured_req_width`` does;
- the graph's body is the step's GPU work on the rows: the host-table read as a kernel (``index_select`` over a
  CUDA view of the *pinned host* table, a UVA read over the bus, where the view can be made; else over a device
  copy of the table, and :attr:`SimGraphRunner.host_read` says which), the matmul, and the value the step
  all-reduces;
- replays through :class:`SimGraphBackend` ``.replay(shape_key, static_forward_batch)``, named and shaped as
  SGLang's ``FullCudaGraphBackend.replay`` (``runner_backend/full_cuda_graph_backend.py``), with the backend's
  ``_cuda_graph_runner`` holding ``captured_req_width`` and ``ragged_verify_mode`` as SGLang's runner does: the
  probe's graph target (``sgl_seat.sim.graphs:SimGraphBackend.replay@shape_key:graph``) sizes both the same way;
- a ``gpu-stall`` fault on a graph-mode rank stalls *inside a replayed graph*: the next replay is of a variant of
  its bucket's graph captured then with a spin kernel (``torch.cuda._sleep``, the stand-in the eager mode uses for
  a UVA read that does not return) before the table read. The host thread returns from the replay at once and
  runs on into the all-reduce and the device sync, like its peers.

A step whose batch is larger than the largest bucket, and every prefill, runs eagerly (SGLang's ``can_run_graph``
false), through ``fetch_rows``. The all-reduce stays outside the graph here (in SGLang it is inside): so on two
GPUs the waiting rank's replay completes and only the stalled rank's stays in flight.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from sgl_seat.sim.step.device import FOREVER_S, CudaRank, spin

log = logging.getLogger(__name__)

#: Batch sizes captured (SGLang's small-batch buckets), cut at the seat's running-request cap.
CAPTURE_BS: tuple[int, ...] = (1, 2, 4, 8, 16, 24, 32, 48, 64)
UVA = "uva"
DEVICE_COPY = "device-copy"


@dataclass(frozen=True, slots=True)
class ShapeKey:
    """The captured graph's key, as SGLang's ``ShapeKey`` (``runner/shape_key.py``): ``size`` counts requests."""

    size: int


def capture_sizes(max_bs: int) -> list[int]:
    """The buckets captured for a cap of ``max_bs`` running requests (at least the smallest one)."""
    return [b for b in CAPTURE_BS if b <= max(1, max_bs)] or [1]


def bucket_for(bs: int, sizes: list[int]) -> int | None:
    """The smallest captured bucket that holds ``bs`` requests; None: larger than every bucket (run eagerly)."""
    return next((b for b in sizes if b >= bs), None)


class _CudaArray:
    """An object with ``__cuda_array_interface__`` naming a device-accessible pointer (torch.as_tensor reads it)."""

    def __init__(self, ptr: int, shape: tuple[int, ...], typestr: str) -> None:
        self.__cuda_array_interface__ = {"shape": shape, "typestr": typestr, "data": (ptr, False), "version": 2,
                                         "strides": None}


def uva_view(table: torch.Tensor, device: torch.device) -> torch.Tensor:
    """A CUDA tensor over the pinned host ``table``'s own memory: a kernel reading it reads host memory over the
    bus (UVA: a pinned allocation's host pointer is valid on the device). Raises where that cannot be had."""
    if not table.is_pinned():
        raise ValueError("the host table is not pinned")
    raw = table.view(torch.int16)  # __cuda_array_interface__ has no bfloat16 typestr
    with torch.cuda.device(device):
        view = torch.as_tensor(_CudaArray(raw.data_ptr(), tuple(raw.shape), "<i2"), device=device)
    return view.view(table.dtype)


class SimGraphBackend:
    """One CUDA graph per shape key; ``replay`` launches the captured one (SGLang's ``FullCudaGraphBackend``)."""

    def __init__(self, cuda_graph_runner: SimGraphRunner) -> None:
        self._cuda_graph_runner = cuda_graph_runner
        self._graphs: dict[ShapeKey, torch.cuda.CUDAGraph] = {}
        self._stalled: torch.cuda.CUDAGraph | None = None  # a one-off variant with a spin inside (gpu-stall)

    def capture_one(self, shape_key: ShapeKey, forward_fn: Callable[[], None], pool: Any) -> None:
        self._graphs[shape_key] = _capture(forward_fn, pool)

    def can_run(self, shape_key: ShapeKey) -> bool:
        return shape_key in self._graphs

    def arm_stalled(self, graph: torch.cuda.CUDAGraph) -> None:
        self._stalled = graph

    def replay(self, shape_key: ShapeKey, static_forward_batch: Any = None) -> None:
        """Launch the graph of ``shape_key`` on the current stream (the armed stalled variant, once, if any)."""
        graph, self._stalled = (self._stalled, None) if self._stalled is not None else (self._graphs[shape_key], None)
        graph.replay()


def _capture(fn: Callable[[], None], pool: Any, *, warm: bool = True) -> torch.cuda.CUDAGraph:
    """Capture ``fn`` into a graph, after one warm-up run on a side stream (torch's recipe for ``torch.cuda.graph``).

    ``warm=False`` for the stalled variant: a warm-up would run its spin for real, and nothing is synchronised
    after it (the host must not wait for the GPU here, as a replay does not). ``thread_local`` capture: the probe's
    reader threads query events meanwhile (in relaxed mode) and must not invalidate it."""
    if warm:
        side = torch.cuda.Stream()  # type: ignore[no-untyped-call]  # torch's Stream.__new__ has no annotations
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            fn()
        torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool, capture_error_mode="thread_local"):
        fn()
    if warm:
        torch.cuda.synchronize()
    return graph


class SimGraphRunner:
    """One rank's captured decode graphs: static buffers, the buckets, the backend that replays them."""

    def __init__(self, gpu: CudaRank, table: torch.Tensor, *, max_bs: int, draft_tokens: int | None) -> None:
        self.gpu = gpu
        self.captured_req_width = max(1, draft_tokens or 1)  # SGLang's name: tokens per request in the graph
        self.ragged_verify_mode = False  # SGLang's name: the key counts requests, not tokens
        self.capture_bs = capture_sizes(max_bs)
        self.max_tokens = self.capture_bs[-1] * self.captured_req_width
        try:
            self.table = uva_view(table, gpu.device)
            probe_ids = torch.tensor([0, table.shape[0] - 1])
            if not torch.equal(self.table[probe_ids.to(gpu.device)].cpu(), table[probe_ids]):
                raise RuntimeError("a UVA read gave other values than the host table")
            self.host_read = UVA
        except Exception as exc:
            log.warning("sim graphs: no UVA view of the pinned host table (%s: %s); the graph reads a device copy",
                        type(exc).__name__, exc)
            self.table = table.to(gpu.device)
            self.host_read = DEVICE_COPY
        rows = table.shape[0]
        self.ids = torch.zeros(self.max_tokens, dtype=torch.int64, device=gpu.device)
        self.out = torch.zeros(1, dtype=torch.float32, device=gpu.device)
        self._rows = rows
        self._cycles_per_s = gpu.cycles_per_s
        self.pool = torch.cuda.graph_pool_handle()
        self.backend = SimGraphBackend(self)
        for bs in self.capture_bs:
            self.backend.capture_one(ShapeKey(bs), self._body(bs * self.captured_req_width), self.pool)
        torch.cuda.synchronize()

    def _body(self, tokens: int, stall_s: float | None = None) -> Callable[[], None]:
        """One captured graph's work for ``tokens`` tokens: [a spin,] the table read, the matmul, the step's value."""
        def forward() -> None:
            if stall_s is not None:
                spin(stall_s, self._cycles_per_s)
            rows = torch.index_select(self.table, 0, self.ids[:tokens])
            y = rows @ self.gpu.weight
            self.out.copy_(y[0, :1].float())
        return forward

    def key_for(self, bs: int) -> ShapeKey | None:
        """The shape key a decode step of ``bs`` requests replays; None: no captured bucket holds it."""
        b = bucket_for(bs, self.capture_bs)
        return None if b is None else ShapeKey(b)

    def arm_stall(self, key: ShapeKey, seconds: float | None) -> None:
        """The next replay (of ``key``'s bucket) is a variant captured now with a spin of ``seconds`` inside it."""
        tokens = key.size * self.captured_req_width
        body = self._body(tokens, FOREVER_S if seconds is None else seconds)
        self.backend.arm_stalled(_capture(body, None, warm=False))  # a private pool: the buckets keep theirs

    def execute(self, key: ShapeKey, ids: torch.Tensor) -> torch.Tensor:
        """Load the step's row ids into the static buffer and replay ``key``'s graph; the step's value (device)."""
        tokens = key.size * self.captured_req_width
        n = min(int(ids.numel()), tokens)
        self.ids[:n].copy_(ids[:n].to(self.gpu.device, non_blocking=True))
        if n < tokens:
            self.ids[n:tokens].zero_()  # padded tokens read row 0, as SGLang's padded slots read a valid row
        self.backend.replay(key, None)
        return self.out
