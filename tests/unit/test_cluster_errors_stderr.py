"""Ray's driver prints the cluster's error messages to stdout from a thread of its own; `--json` commands need
stdout for the JSON alone (CI: `down --json` began with "(raylet) The node ... has been marked dead").
``cluster.errors_to_stderr`` sends them to stderr. Ray's own printer runs here, with a message as its listener hands
it over."""

from __future__ import annotations

import pytest

from sgl_seat.launch import cluster


def test_the_clusters_error_messages_go_to_stderr(capsys: pytest.CaptureFixture[str]) -> None:
    from ray._private import worker as ray_worker

    before = ray_worker.print_to_stdstream
    try:
        cluster.errors_to_stderr()
        cluster.errors_to_stderr()  # once per process: not wrapped twice
        wrapped = ray_worker.print_to_stdstream
        assert wrapped is not before and getattr(wrapped, "sgl_seat_stderr", False)
        msg = "The node with node id: 5c11 and address: 198.18.0.2 has been marked dead"
        ray_worker.print_to_stdstream({"lines": [msg], "pid": "raylet", "is_err": False}, ignore_prefix=False)
        out, err = capsys.readouterr()
        assert msg not in out and msg in err
    finally:
        ray_worker.print_to_stdstream = before
