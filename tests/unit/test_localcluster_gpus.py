"""The local cluster gives each simulated node its own real GPUs where the host has enough (issue 12)."""

from __future__ import annotations

from sgl_seat.launch.host import localcluster as lc


def test_each_node_sees_its_own_gpus_where_the_host_has_one_per_simulated_gpu() -> None:
    envs = [lc.node_gpu_env(i, 2, 2, host_gpus=4) for i in range(2)]
    assert [e["CUDA_VISIBLE_DEVICES"] for e in envs] == ["0,1", "2,3"]
    assert {e[lc.SIM_DEVICE_ENV] for e in envs} == {"auto"}
    assert lc.node_gpu_env(1, 2, 1, host_gpus=8)["CUDA_VISIBLE_DEVICES"] == "1"


def test_fake_gpu_counts_leave_the_environment_alone() -> None:
    assert lc.node_gpu_env(0, 2, 2, host_gpus=3) == {}  # not one real GPU per simulated GPU: CPU sim
    assert lc.node_gpu_env(1, 2, 1, host_gpus=0) == {}

