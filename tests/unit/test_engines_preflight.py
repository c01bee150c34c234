"""Preflight checks are pure: facts in, failures naming node, check and fix out."""

from __future__ import annotations

import pytest

from sgl_seat.engines.preflight import (
    Check,
    Failure,
    check_dist_init_reachable,
    check_gpus,
    check_ib_hca,
    check_model_path,
    check_ports_free,
    check_socket_ifnames,
    nccl_filter_selects,
    preflight_error,
)
from sgl_seat.errors import PreflightError

IFACES = ["docker0", "eth0", "eth1", "ib0", "lo"]


@pytest.mark.parametrize(("value", "selected"), [
    ("eth", ["eth0", "eth1"]),
    ("=eth0", ["eth0"]),
    ("=eth", []),
    ("^lo,docker", ["eth0", "eth1", "ib0"]),
    ("^=eth0", ["docker0", "eth1", "ib0", "lo"]),
    ("ib,eth1", ["eth1", "ib0"]),
    ("mlx5_1:1", []),
])
def test_nccl_filter_syntax_as_nccl_reads_it(value: str, selected: list[str]) -> None:
    assert nccl_filter_selects(value, IFACES) == selected


def test_gpu_count_must_match_the_bundle() -> None:
    """Sim seats: only Ray's (fake) GPU ids count."""
    assert check_gpus(0, 2, ["0", "1"], None) == []
    [f] = check_gpus(1, 2, ["0"], None)
    assert f.node_rank == 1 and f.check == Check.GPUS.value and "asks for 2" in f.problem


def test_real_gpus_must_be_visible() -> None:
    assert check_gpus(0, 2, ["0", "1"], ["GPU 0: H200", "GPU 1: H200"]) == []
    assert "not among" in check_gpus(0, 2, ["2", "3"], ["GPU 0: H200", "GPU 1: H200"])[0].problem
    assert "no GPU is visible" in check_gpus(0, 2, ["0", "1"], [])[0].problem


def test_socket_ifname_checks() -> None:
    assert check_socket_ifnames(0, {"NCCL_SOCKET_IFNAME": "eth", "GLOO_SOCKET_IFNAME": "eth0"}, IFACES) == []
    [f] = check_socket_ifnames(1, {"NCCL_SOCKET_IFNAME": "bond0"}, IFACES)
    assert "selects none" in f.problem and "bond0" in f.problem and f.node_rank == 1
    [g] = check_socket_ifnames(0, {"GLOO_SOCKET_IFNAME": "^lo"}, IFACES)
    assert "NCCL filter syntax" in g.problem
    [h] = check_socket_ifnames(0, {"GLOO_SOCKET_IFNAME": "eth0,bond0"}, IFACES)
    assert "['bond0']" in h.problem
    # An exclusion list that leaves nothing.
    assert check_socket_ifnames(0, {"NCCL_SOCKET_IFNAME": "^e,d,i,l"}, IFACES)


def test_ib_hca_checks() -> None:
    devs = {"mlx5_0": [1], "mlx5_1": [1, 2]}
    assert check_ib_hca(0, None, devs) == []
    assert check_ib_hca(0, "=mlx5_1:2", devs) == []
    assert check_ib_hca(0, "mlx5", devs) == []
    assert "mlx5_7" in check_ib_hca(0, "mlx5_0,mlx5_7", devs)[0].problem
    assert "port 3" in check_ib_hca(0, "=mlx5_1:3", devs)[0].problem
    assert "excludes every" in check_ib_hca(0, "^mlx5", devs)[0].problem
    assert "no devices" in check_ib_hca(1, "=mlx5_0", {})[0].problem


def test_model_ports_and_reachability() -> None:
    assert check_model_path(0, "/m", True) == []
    assert "/m does not exist" in check_model_path(1, "/m", False)[0].problem
    ports = {"http": 33000, "dist_init": 33005}
    assert check_ports_free(0, ports, {33000: None, 33005: None}) == []
    [f] = check_ports_free(0, ports, {33000: "bound", 33005: None})
    assert "http port 33000 is in use" in f.problem and "network.http_port" in f.fix
    assert check_dist_init_reachable(1, "10.0.0.1", 33005, None) == []
    assert "10.0.0.1:33005" in check_dist_init_reachable(1, "10.0.0.1", 33005, "Connection refused")[0].problem


def test_one_error_names_every_node_check_and_fix() -> None:
    fs = [Failure(0, "ports-free", "http port 33000 is in use (x)", "stop it"),
          Failure(1, "ports-free", "http port 33000 is in use (x)", "stop it")]
    err = preflight_error(fs)
    assert isinstance(err, PreflightError)
    text = str(err)
    assert "nodes 0, 1" in text and "node 1: ports-free: http port 33000" in text and "fix: stop it" in text
    assert Failure.from_dict(fs[0].to_dict()) == fs[0]
