"""The sim's CUDA mode on a CPU-only machine: the flag, the gpu-stall fault, the GPU choice per rank.

The GPU paths themselves (NCCL, pinned copies, the spin kernel) need a GPU: the last test runs them where torch
sees one and is skipped, saying why, where it does not (CI). ``bench/gpu/gpu_watchdog.py`` runs them on H200s.
"""

from __future__ import annotations

import pytest

from sgl_seat.errors import UsageError
from sgl_seat.sim import args, rowfetch
from sgl_seat.sim.faults import GPU_STALL, FaultState, parse_fault
from sgl_seat.sim.step import device

ARGV = ["--model-path", "m", "--tp-size", "2", "--nnodes", "2", "--node-rank", "1",
        "--dist-init-addr", "127.0.0.1:38001"]


def test_device_flag_defaults_to_cpu_and_takes_cuda() -> None:
    assert args.parse(ARGV, {}).device == "cpu"
    cfg = args.parse([*ARGV, "--device", "cuda"], {})
    assert cfg.device == "cuda"
    assert args.SimConfig.from_json(cfg.to_json()) == cfg
    with pytest.raises(SystemExit):
        args.parse([*ARGV, "--device", "tpu"], {})


def test_device_from_the_environment_when_the_flag_is_absent() -> None:
    assert args.parse(ARGV, {args.ENV_DEVICE: "cuda"}).device == "cuda"
    assert args.parse([*ARGV, "--device", "cpu"], {args.ENV_DEVICE: "cuda"}).device == "cpu"
    torch = pytest.importorskip("torch")
    want = "cuda" if torch.cuda.is_available() else "cpu"
    assert args.parse(ARGV, {args.ENV_DEVICE: "auto"}).device == want
    with pytest.raises(UsageError, match="cpu, cuda or auto"):
        args.parse(ARGV, {args.ENV_DEVICE: "gpu"})


def test_gpu_stall_fault_parses_and_fires_once() -> None:
    f = parse_fault("gpu-stall:rank=1,after_steps=20,for_s=30")
    assert (f.kind, f.rank, f.after_steps, f.for_s) == (GPU_STALL, 1, 20, 30.0)
    assert parse_fault(f.spec()) == f
    st = FaultState(rank=1)
    assert st.arm(f, now=0.0)
    assert st.on_step(step=19, gather=8, now=1.0).gpu_stall is None
    fx = st.on_step(step=20, gather=8, now=1.1)
    assert fx.gpu_stall == f and fx.gpu_stall_s == 30.0 and fx.stall is None
    assert st.on_step(step=21, gather=8, now=1.2).gpu_stall is None


def test_gpu_stall_is_refused_without_cuda() -> None:
    env = {args.ENV_FAULTS: "gpu-stall:rank=1,after_steps=5"}
    with pytest.raises(UsageError, match="--device cpu"):
        args.parse(ARGV, env)
    assert args.parse([*ARGV, "--device", "cuda"], env).faults == ("gpu-stall:rank=1,after_steps=5",)


@pytest.mark.parametrize(("rank", "per_node", "visible", "want"),
                         [(0, 1, 1, 0), (1, 1, 1, 0), (3, 2, 2, 1), (2, 2, 2, 0), (5, 4, 2, 1)])
def test_each_rank_takes_its_index_on_its_node(rank: int, per_node: int, visible: int, want: int) -> None:
    """One GPU per simulated node (Ray's CUDA_VISIBLE_DEVICES shows one): every rank there uses GPU 0."""
    assert device.local_gpu(rank, per_node, visible) == want


def test_no_visible_gpu_is_an_error_that_says_where_to_look() -> None:
    with pytest.raises(RuntimeError, match="CUDA_VISIBLE_DEVICES"):
        device.local_gpu(0, 1, 0)


def test_cpu_fetch_is_unchanged_by_the_cuda_mode_code() -> None:
    table = rowfetch.make_table(rows=16, width=8)
    ids = rowfetch.make_ids(1, 5, 16)
    out = rowfetch.fetch_rows(table, ids)
    assert out.device.type == "cpu" and out.shape == (5, 8)
    assert bool((out == table[ids]).all())


def test_cuda_fetch_and_gpu_stall_return_at_once() -> None:
    torch = pytest.importorskip("torch")
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device here (CI has none): the CUDA fetch and spin run in bench/gpu/gpu_watchdog.py")
    rank = device.CudaRank(0, 1)
    table = rowfetch.pin_table(rowfetch.make_table(rows=64))
    rowfetch.use_cuda(rank.device, rank.cycles_per_s, 64)
    try:
        ids = rowfetch.make_ids(1, 8, 64)
        rows = rowfetch.fetch_rows(table, ids)
        assert rows.device.type == "cuda" and bool((rows.cpu() == table[ids]).all())
        import time
        rowfetch.arm_gpu_stall(0.5)
        t0 = time.monotonic()
        rowfetch.fetch_rows(table, ids)
        assert time.monotonic() - t0 < 0.2, "the host thread must not wait for a stalled stream"
        rank.sync()
        assert time.monotonic() - t0 >= 0.4
    finally:
        rowfetch._device = None
        rowfetch._staging = None
