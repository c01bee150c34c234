"""The local cluster's holder starts over when Ray's fixed node-start wait runs out, and only then.

Ray's ``Cluster`` is replaced by a stand-in at the one seam (the class the holder is given); the stand-in raises
Ray's own message for the attempts the test chooses.
"""

from __future__ import annotations

import threading
from typing import Any, ClassVar

import pytest

from sgl_seat.launch.host import localcluster as lc

RAY_TIMEOUT = ("The current node timed out during startup. This could happen because some of the raylet failed "
               "to startup or the GCS has become overloaded.")


class FakeCluster:
    """Counts what the holder asks of it; ``add_node`` fails with ``error`` while ``fail_left`` > 0."""

    built: ClassVar[list[FakeCluster]] = []
    fail_left = 0
    error = RAY_TIMEOUT

    def __init__(self, *, initialize_head: bool, head_node_args: dict[str, Any]) -> None:
        assert initialize_head and head_node_args["node_ip_address"] == "127.0.0.1"
        self.head_args = head_node_args
        self.nodes: list[dict[str, float]] = []
        self.shut = False
        FakeCluster.built.append(self)

    def add_node(self, *, num_cpus: int, num_gpus: int, node_ip_address: str, resources: dict[str, float]) -> None:
        if FakeCluster.fail_left > 0:
            FakeCluster.fail_left -= 1
            raise Exception(FakeCluster.error)  # what ray._private.node raises: a bare Exception
        self.nodes.append(resources)

    def shutdown(self) -> None:
        self.shut = True


@pytest.fixture
def fake(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    FakeCluster.built, FakeCluster.fail_left, FakeCluster.error = [], 0, RAY_TIMEOUT
    stopped: list[int] = []
    monkeypatch.setattr(lc, "_stop_descendants", lambda: stopped.append(1))
    monkeypatch.setattr(lc, "host_gpu_count", lambda: 0)
    return stopped


def _start(attempts: int = lc.START_ATTEMPTS) -> Any:
    return lc.start_nodes(FakeCluster, nodes=2, gpus_per_node=2, cpus_per_node=3, port=0, stop=threading.Event(),
                          attempts=attempts)


def test_a_node_that_misses_rays_wait_starts_the_cluster_over(fake: list[int],
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    FakeCluster.fail_left = 2
    cluster = _start()
    assert len(FakeCluster.built) == 3 and cluster is FakeCluster.built[-1]
    assert [c.shut for c in FakeCluster.built] == [True, True, False]  # the failed attempts were shut down
    assert len(fake) == 2  # and what they left was stopped before the next one
    assert cluster.nodes == [{"sgl_seat_sim_node_0": 1.0}, {"sgl_seat_sim_node_1": 1.0}]
    assert "attempt 1 of 3" in capsys.readouterr().out


def test_after_the_last_attempt_rays_error_is_raised(fake: list[int]) -> None:
    FakeCluster.fail_left = 5
    with pytest.raises(Exception, match="timed out during startup"):
        _start(attempts=2)
    assert len(FakeCluster.built) == 2 and all(c.shut for c in FakeCluster.built)
    assert len(fake) == 2  # nothing of the last attempt is left either


def test_any_other_failure_is_not_retried(fake: list[int]) -> None:
    FakeCluster.fail_left, FakeCluster.error = 1, "Address already in use"
    with pytest.raises(Exception, match="already in use"):
        _start()
    assert len(FakeCluster.built) == 1


def test_a_drawn_gcs_port_is_never_one_ray_takes_for_another_component(fake: list[int],
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    # On an H100 host the free port drawn for the GCS was 52365, the dashboard agent's default, and Ray refused the
    # head ("trying to use a port number 52365 that is used by other components").
    drawn = iter([52365, 8265, 6379, 10001, 41234])
    monkeypatch.setattr(lc, "any_free_port", lambda: next(drawn))
    cluster = _start()
    assert cluster.head_args["gcs_server_port"] == 41234


def test_a_port_the_caller_names_is_kept(fake: list[int]) -> None:
    cluster = lc.start_nodes(FakeCluster, nodes=1, gpus_per_node=0, cpus_per_node=1, port=45678,
                             stop=threading.Event())
    assert cluster.head_args["gcs_server_port"] == 45678
