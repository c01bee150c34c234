"""The sim's CUDA graph mode, the parts that run without a GPU: which buckets are captured, which one a decode step
replays, and that the mode is refused where there is no CUDA device to capture on (the rest runs on the H200 in
``bench/gpu/gpu_watchdog.py --graphs``)."""

from __future__ import annotations

import pytest

from sgl_seat.errors import UsageError
from sgl_seat.sim import args
from sgl_seat.sim.graphs import CAPTURE_BS, bucket_for, capture_sizes

BASE = ["--model-path", "sim/x", "--tp-size", "1"]


def test_buckets_stop_at_the_running_request_cap() -> None:
    assert capture_sizes(16) == [1, 2, 4, 8, 16]
    assert capture_sizes(20) == [1, 2, 4, 8, 16]
    assert capture_sizes(0) == [1]
    assert capture_sizes(10_000) == list(CAPTURE_BS)


def test_a_step_replays_the_smallest_bucket_that_holds_it() -> None:
    sizes = capture_sizes(48)
    assert [bucket_for(bs, sizes) for bs in (1, 3, 8, 9, 25, 48)] == [1, 4, 8, 16, 32, 48]
    assert bucket_for(49, sizes) is None, "larger than every bucket: the step runs eagerly, as SGLang's"


def test_graph_mode_needs_cuda() -> None:
    with pytest.raises(UsageError, match="replays CUDA graphs"):
        args.parse([*BASE, "--device", "cpu", "--sim-cuda-graphs"], env={})
    with pytest.raises(UsageError, match="replays CUDA graphs"):
        args.parse([*BASE, "--device", "cpu"], env={args.ENV_CUDA_GRAPHS: "1"})
    assert args.parse([*BASE, "--device", "cpu"], env={}).cuda_graphs is False
