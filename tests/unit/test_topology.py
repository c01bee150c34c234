"""Topology: SGLang's rank -> node placement and its scheduler titles for every TP/EP shape."""

from __future__ import annotations

import pytest

from sgl_seat.errors import TopologyError
from sgl_seat.topology import Topology, rank_title

BASE = "sglang::scheduler"


def test_node_r_hosts_its_slice_of_tp_ranks() -> None:
    topo = Topology(nnodes=2, gpus_per_node=2, tp=4, ep=4, dp=1)
    assert [r.tp_rank for r in topo.ranks_on(0, BASE)] == [0, 1]
    assert [r.tp_rank for r in topo.ranks_on(1, BASE)] == [2, 3]
    assert [topo.node_of(r) for r in range(4)] == [0, 0, 1, 1]
    with pytest.raises(TopologyError):
        topo.node_of(4)


@pytest.mark.parametrize(
    ("tp", "ep", "titles"),
    [
        (4, 4, ["sglang::scheduler_TP0_EP0", "sglang::scheduler_TP1_EP1", "sglang::scheduler_TP2_EP2",
                "sglang::scheduler_TP3_EP3"]),
        (4, 1, ["sglang::scheduler_TP0", "sglang::scheduler_TP1", "sglang::scheduler_TP2", "sglang::scheduler_TP3"]),
        (4, 2, ["sglang::scheduler_TP0_EP0", "sglang::scheduler_TP1_EP0", "sglang::scheduler_TP2_EP1",
                "sglang::scheduler_TP3_EP1"]),
    ],
)
def test_titles_follow_sglang_for_every_ep(tp: int, ep: int, titles: list[str]) -> None:
    """SGLang leaves out _TP when tp == 1 and _EP when ep == 1; moe_ep_rank = tp_rank // (tp // ep)."""
    topo = Topology(nnodes=2, gpus_per_node=2, tp=tp, ep=ep, dp=1)
    assert [r.process_title for r in topo.all_ranks(BASE)] == titles


def test_single_gpu_title_has_no_suffix() -> None:
    assert rank_title(BASE, 0, 0, 1, 1) == "sglang::scheduler"
    assert Topology(nnodes=1, gpus_per_node=1, tp=1, ep=1, dp=1).all_ranks(BASE)[0].process_title == BASE
