"""Node loss as a verdict (issue 11): a capture that holds only some nodes names the missing node and its ranks,
and never presents "every rank waits in a collective" over half the ranks.

The one-node bundle here is what the coordinator writes when node 1 does not answer: the golden two-node stall
bundle (tests/fixtures/bundles/stall, from a live sim seat) with node 1's records dropped and ``nodes: [0]``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sgl_seat.core.nodeloss import missing_nodes, node_unreachable
from sgl_seat.core.records import Verdict, VerdictKind
from sgl_seat.engines import words_for
from sgl_seat.forensics import encode_bundle, read_bundle, write_bundle
from sgl_seat.forensics.replay.replayer import replay_bundle
from sgl_seat.spec import WatchdogSpec
from sgl_seat.watchdog.capture import assemble

WORDS = words_for("sglang")

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "bundles" / "stall"
RANK_NODES = {0: 0, 1: 0, 2: 1, 3: 1}


def _one_node_bundle(dest: Path, *, with_detail: bool) -> Path:
    b = read_bundle(GOLDEN)
    keep = [s for s in b.stacks if s.node == 0]
    files = encode_bundle(
        stacks=keep, native_stacks=[s for s in b.native_stacks if s.node == 0],
        probes=[p for p in b.probes if p.node == 0], metrics=[m for m in b.metrics if m.node == 0],
        processes=[p for p in b.processes if p.node == 0], logs=[ln for ln in b.logs if ln.node == 0],
        env={0: b.env.get(0, {})}, requests=None, log_text={0: b.log_text.get(0, "")},
        process_state={0: b.process_state.get(0, {})}, gpu={})
    fields: dict[str, Any] = {k: v for k, v in b.manifest.to_json().items()
                              if k not in ("files", "schema_version", "bundle_id", "live_verdict")}
    fields["nodes"] = [0]
    if with_detail:
        fields["missing_nodes"] = [{"node": 1, "ranks": [2, 3], "detail": "GetTimeoutError: no answer in 5 s"}]
    return write_bundle(dest, "one-node", fields, files, quota_mb=64)


@pytest.mark.parametrize("with_detail", [True, False])  # False: a bundle written before missing_nodes existed
def test_replay_of_a_one_node_bundle_names_the_missing_node(tmp_path: Path, with_detail: bool) -> None:
    res = replay_bundle(_one_node_bundle(tmp_path, with_detail=with_detail))
    doc = res.to_json()
    text = json.dumps(doc)
    assert res.replayed is not None and res.replayed.kind is VerdictKind.NODE_UNREACHABLE
    assert res.replayed.node == 1 and res.replayed.node_ranks == (2, 3)
    assert ("GetTimeoutError" in " ".join(res.replayed.evidence)) is with_detail
    summary = doc["divergence"]["summary"]
    assert "node 1 (ranks 2, 3) missing from this bundle" in summary
    assert "every rank waits in a collective" not in text
    assert doc["verdict"]["kind"] == "node-unreachable" and doc["verdict"]["node_ranks"] == [2, 3]


def test_the_full_bundle_is_unchanged() -> None:
    res = replay_bundle(GOLDEN)
    assert res.replayed is not None and res.replayed.kind is not VerdictKind.NODE_UNREACHABLE
    assert "missing_nodes" not in res.to_json()["divergence"]


def test_assemble_without_node_1_writes_a_node_unreachable_bundle(tmp_path: Path) -> None:
    part = {"node": 0, "t": 1000.0, "samples": [], "native": [], "probes": [], "metrics": [], "logs": [],
            "processes": [], "process_state": {"node": 0, "processes": []}, "gpu": None, "log_text": "",
            "env": {}, "capture": [{"node": 0, "step": "capture", "status": "ok", "detail": "0.1s"}]}
    missing = [{"node": 1, "step": "reach", "status": "unreachable", "detail": "ping: GetTimeoutError after 3 s"}]
    res = assemble(words=WORDS, seat="s", parts=[part], trigger={"t": 1000.0, "node": 0}, trigger_verdict=None,
                   thresholds=WatchdogSpec(), rank_nodes=RANK_NODES, plan=None, dest_root=tmp_path, quota_mb=64,
                   missing=missing, now=1001.0)
    assert res.error is None and res.path is not None
    assert res.verdict is not None and res.verdict.kind is VerdictKind.NODE_UNREACHABLE
    assert (res.verdict.node, res.verdict.node_ranks) == (1, (2, 3))
    assert "node-unreachable" in res.bundle_id
    m = read_bundle(Path(res.path)).manifest
    assert m.verdict == res.verdict and m.nodes == (0,)
    assert m.extra["missing_nodes"] == [{"node": 1, "ranks": [2, 3], "detail": "ping: GetTimeoutError after 3 s"}]


def test_verdict_json_round_trip_and_old_verdicts() -> None:
    partial = Verdict(kind=VerdictKind.STACK_UNCHANGED, rank=None, node=None, frame=None, t=5.0)
    v = node_unreachable([1, 2], {0: 0, 1: 1, 2: 2}, 5.0, why={1: "timeout"}, last_seen={2: "sample at t=3.0"},
                         partial=partial)
    assert Verdict.from_json(v.to_json()) == v
    assert v.evidence[0] == "node 1 (rank 1) did not answer the capture: timeout"
    assert "node 2 last seen: sample at t=3.0" in v.evidence
    assert "only: stack unchanged" in v.evidence[-1] and "partial" in v.evidence[-1]
    assert "node_ranks" not in partial.to_json()  # old verdicts keep their exact JSON
    assert missing_nodes({0: 0, 1: 1}, [0, 1]) == []
    with pytest.raises(ValueError, match="at least one"):
        node_unreachable([], {}, 0.0)
