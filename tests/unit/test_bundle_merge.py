"""`bundle merge` (issue 11): the coordinator's bundle without node 1 and node 1's own partial bundle join into
one bundle that `replay` reads, with the verdict over all ranks again.

The two parts are cut from the golden two-node stall bundle (tests/fixtures/bundles/stall, a live sim seat whose
rank 3, on node 1, stalled): node 0's records as the coordinator would have written them with node 1 cut off,
node 1's as its sidecar would have written them locally.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from sgl_seat.core.records import VerdictKind
from sgl_seat.errors import BundleError
from sgl_seat.forensics import encode_bundle, read_bundle, write_bundle
from sgl_seat.forensics.format.merge import merge_bundles
from sgl_seat.forensics.replay.replayer import replay_bundle
from tests.cli_runner import run_cli

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "bundles" / "stall"


def _part(dest: Path, name: str, node: int, missing: int) -> Path:
    b = read_bundle(GOLDEN)

    def on(x: Any) -> bool:
        return bool(x.node == node)

    files = encode_bundle(
        stacks=[s for s in b.stacks if on(s)], native_stacks=[s for s in b.native_stacks if on(s)],
        probes=[p for p in b.probes if on(p)], metrics=[m for m in b.metrics if on(m)],
        processes=[p for p in b.processes if on(p)], logs=[ln for ln in b.logs if on(ln)],
        env={node: b.env.get(node, {})}, requests=b.requests if node == 0 else None,
        log_text={node: b.log_text.get(node, "")}, process_state={node: b.process_state.get(node, {})}, gpu={})
    fields: dict[str, Any] = {k: v for k, v in b.manifest.to_json().items()
                              if k not in ("files", "schema_version", "bundle_id", "live_verdict")}
    fields.update(nodes=[node], missing_nodes=[{"node": missing, "ranks": [], "detail": "cut off"}])
    return write_bundle(dest, name, fields, files, quota_mb=64)


def test_merge_restores_the_seat_wide_verdict(tmp_path: Path) -> None:
    coord = _part(tmp_path, "coord", 0, 1)
    local = _part(tmp_path, "local", 1, 0)
    assert replay_bundle(coord).verdict is not None
    assert replay_bundle(coord).verdict.kind is VerdictKind.NODE_UNREACHABLE  # type: ignore[union-attr]
    out = merge_bundles([coord, local], tmp_path / "out")
    res = replay_bundle(out)
    full = replay_bundle(GOLDEN)
    assert res.bundle.manifest.nodes == (0, 1)
    assert res.replayed is not None and full.replayed is not None
    assert (res.replayed.kind, res.replayed.rank, res.replayed.node) == (
        full.replayed.kind, full.replayed.rank, full.replayed.node)
    assert res.replayed.kind is not VerdictKind.NODE_UNREACHABLE
    assert len(res.bundle.stacks) == len(read_bundle(GOLDEN).stacks)
    assert "missing_nodes" not in res.bundle.manifest.extra
    assert [m["bundle_id"] for m in res.bundle.manifest.extra["merged_from"]] == ["coord", "local"]
    assert res.to_json()["divergence"]["summary"] == full.to_json()["divergence"]["summary"]


def test_merge_refuses_one_bundle_and_the_cli_merges(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    coord = _part(tmp_path, "coord", 0, 1)
    with pytest.raises(BundleError, match="at least two"):
        merge_bundles([coord], tmp_path)
    local = _part(tmp_path, "local", 1, 0)
    monkeypatch.setenv("SGLSEAT_HOME", str(tmp_path / "home"))
    rc = run_cli(["bundle", "merge", str(coord), str(local), "--into", str(tmp_path / "cli"), "--json"], monkeypatch)
    doc = json.loads(capsys.readouterr().out)
    assert rc == 0 and doc["ok"] and doc["nodes"] == [0, 1]
    assert Path(doc["path"]).name == "coord-merged"
