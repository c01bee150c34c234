"""`bundle merge`: join the parts of one incident that were written on both sides of a partition.

When a node is cut off, the coordinator writes a bundle without it (``node-unreachable``) and the cut-off
node's sidecar writes its own partial bundle on its host. Once both are reachable, merging takes each node's
records from the bundle that holds that node (the first one given wins where two do), recomputes the verdict
over the merged records with the same rule as the capture (a node that isolated itself, by its own check, comes
first, then a node still missing), and writes one
bundle through the forensics writer, naming the bundles it came from (``merged_from``, optional in schema 1).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from sgl_seat.core.detect import detect, thresholds_from
from sgl_seat.core.isolation import checks_from_json
from sgl_seat.core.learned import LearnedThresholds
from sgl_seat.core.nodeloss import loss_verdict, missing_nodes
from sgl_seat.core.observation import Observation
from sgl_seat.errors import BundleError
from sgl_seat.forensics.format.bundle import Bundle, read_bundle, write_bundle
from sgl_seat.forensics.format.encode import encode_bundle
from sgl_seat.forensics.format.extras import learned_of, why_missing, words_of
from sgl_seat.forensics.format.layout import REQUESTS

MERGE_QUOTA_MB = 1 << 20  # a merge writes where the operator says; the seat's quota is not this command's to apply


def _owner(bundles: Sequence[Bundle]) -> dict[int, Bundle]:
    """Node -> the first bundle that holds it."""
    out: dict[int, Bundle] = {}
    for b in bundles:
        for n in b.manifest.nodes:
            out.setdefault(n, b)
    return out


def merge_bundles(paths: Sequence[Path], dest_root: Path) -> Path:
    """Merge the bundles at ``paths`` (the coordinator's first) into ``dest_root/<first id>-merged``."""
    if len(paths) < 2:
        raise BundleError("merge needs at least two bundles", fix="pass the coordinator's bundle and the partial ones")
    bundles = [read_bundle(p) for p in paths]
    first = bundles[0].manifest
    seats = {b.manifest.seat for b in bundles}
    if len(seats) != 1:
        raise BundleError(f"the bundles are of different seats {sorted(seats)}", fix="merge bundles of one seat")
    owner = _owner(bundles)

    def mine(node: int, b: Bundle) -> bool:
        return owner.get(node) is b

    stacks = [s for b in bundles for s in b.stacks if mine(s.node, b)]
    native = [s for b in bundles for s in b.native_stacks if mine(s.node, b)]
    probes = [p for b in bundles for p in b.probes if mine(p.node, b)]
    metrics = [m for b in bundles for m in b.metrics if mine(m.node, b)]
    processes = [p for b in bundles for p in b.processes if mine(p.node, b)]
    logs = [ln for b in bundles for ln in b.logs if mine(ln.node, b)]
    rank_nodes: dict[int, int] = {}
    for b in bundles:
        for r, n in b.manifest.rank_nodes.items():
            rank_nodes.setdefault(r, n)
    nodes = sorted(owner)
    with_requests = [b for b in bundles if REQUESTS in b.manifest.files]
    files = encode_bundle(
        stacks=sorted(stacks, key=lambda s: s.t), native_stacks=sorted(native, key=lambda s: (s.node, s.pid)),
        probes=probes, metrics=sorted(metrics, key=lambda m: m.t), processes=processes,
        logs=sorted(logs, key=lambda ln: ln.t),
        env={n: b.env.get(n, {}) for n, b in owner.items()},
        requests=with_requests[0].requests if with_requests else None,
        log_text={n: b.log_text[n] for n, b in owner.items() if n in b.log_text},
        process_state={n: b.process_state[n] for n, b in owner.items() if n in b.process_state},
        gpu={n: b.gpu[n] for n, b in owner.items() if n in b.gpu})
    t = first.verdict.t if first.verdict is not None else first.trigger_t
    learned: LearnedThresholds | None = None  # each bundle's own nodes' learned shapes (keys name the node)
    for b in bundles:
        one = learned_of(b)
        if one is not None:
            node = {k: k.split("|", 1)[0] for k in one.entries}
            one = dataclasses.replace(one, entries={k: e for k, e in one.entries.items()
                                                    if node[k].isdigit() and mine(int(node[k]), b)})
            learned = one if learned is None else learned.merged(one)
    obs = Observation.of(samples=stacks, probes=probes, metrics=metrics, logs=logs, processes=processes,
                         rank_nodes=rank_nodes, learned=learned, words=words_of(bundles[0]))
    verdict = detect(obs, thresholds_from(first.thresholds), t)
    lost = missing_nodes(rank_nodes, nodes)
    # Each node's own check from the bundle that holds the node: the side with the evidence names the node
    # (an isolated node's bundle outranks its peer's "node-unreachable" of it).
    checks = {n: c for b in bundles for n, c in checks_from_json(b.manifest.extra.get("self_check")).items()
              if mine(n, b)}
    lv = loss_verdict(rank_nodes, nodes, t, checks=checks, why=why_missing(bundles[0]), partial=verdict)
    if lv is not None:
        verdict = lv
    fields: dict[str, Any] = {k: v for k, v in first.to_json().items()
                              if k not in ("files", "schema_version", "bundle_id", "missing_nodes", "self_check")}
    fields.update(
        verdict=verdict.to_json() if verdict is not None else fields.get("verdict"),
        nodes=nodes, ranks=sorted(rank_nodes), rank_nodes={str(r): n for r, n in sorted(rank_nodes.items())},
        time_range={"start": min(b.manifest.time_start for b in bundles),
                    "end": max(b.manifest.time_end for b in bundles)},
        capture=[c for b in bundles for c in b.manifest.capture],
        merged_from=[{"bundle_id": b.manifest.bundle_id, "nodes": list(b.manifest.nodes),
                      "verdict": b.manifest.verdict.to_json() if b.manifest.verdict else None} for b in bundles],
    )
    fields.pop("learned", None)
    if learned is not None:
        fields["learned"] = learned.to_json()
    if checks:
        fields["self_check"] = {str(n): c.to_json() for n, c in sorted(checks.items())}
    if lost:
        fields["missing_nodes"] = [{"node": n, "ranks": sorted(r for r, x in rank_nodes.items() if x == n),
                                    "detail": why_missing(bundles[0]).get(n, "")} for n in lost]
    return write_bundle(dest_root, f"{first.bundle_id}-merged", fields, files, quota_mb=MERGE_QUOTA_MB)
