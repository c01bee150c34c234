"""`status` as a library call: reconcile the local record with Ray, the agents and rank 0's health.

The local record is a cache that can drift from Ray (DESIGN: ``status`` reconciles it): a seat whose `up`
or `down` died half-way, whose local cluster is gone, whose agents or engines died, or whose rank 0 does not
answer its health route is marked FAILED or DEGRADED here, with the reason; a seat whose watchdog has latched
a hang is HUNG, naming the bundle (health alone cannot see a stalled rank: rank 0 may still answer).
A seat that needs an operator (FAILED, REMEDIATION-EXHAUSTED) keeps its state and first reason; a remediation in
progress (REMEDIATING) is left to the supervisor that writes the record, unless it has been pending longer than
:data:`REMEDIATION_STALE_S` (a supervisor that died), when the seat is reconciled as any other.
``status_json`` is what ``status --json`` prints (its fields: ``docs/status-json.md``).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence
from typing import Any

from sgl_seat.core.remediation import PENDING_STALE_S, Outcome, RemediationRecord, budget_used
from sgl_seat.engines import backend_for
from sgl_seat.errors import ClusterError, HomeError, SeatError
from sgl_seat.launch import cluster, health
from sgl_seat.launch.agentclient import apply_engine_state, dead_reason, get_agent
from sgl_seat.launch.cluster import NoAnswer
from sgl_seat.launch.seatrecord.record import NodeRecord, SeatRecord, load_record, record_lock, save_record
from sgl_seat.launch.seatrecord.state import SeatState
from sgl_seat.launch.teardown import busy, holder_alive
from sgl_seat.watchdog.actors import snapshots

log = logging.getLogger(__name__)

#: Seconds to wait for the sidecars' snapshots (a wedged sidecar must not hold `status` up).
SIDECAR_TIMEOUT_S = 5.0
#: Seconds a remediation may stay pending before `status` stops leaving the seat to its supervisor (the decision
#: takes it for abandoned after as long).
REMEDIATION_STALE_S = PENDING_STALE_S


def status(name: str, *, timeout: float = 20.0) -> SeatRecord:
    """Reconcile the local record with Ray, the agents and rank 0's health; save and return it."""
    rec = load_record(name)
    loaded = rec.updated_at
    if rec.state is SeatState.REMEDIATING and remediation_in_progress(rec, time.time()):
        return rec  # the supervisor is bringing the seat back and writes the record itself
    if rec.state in (SeatState.PLACING, SeatState.STARTING, SeatState.STOPPING):
        if busy(rec):
            return rec  # `up` or `down` is still working on it and writes the record itself
        what = "`down`" if rec.state is SeatState.STOPPING else "`up`"
        _fail(rec, f"{what} (pid {rec.busy_pid}) ended before finishing ({rec.state.value}); run `sgl-seat down`")
    if not rec.gcs_address:
        return _save(rec, loaded)
    if rec.local_cluster and not holder_alive(rec):
        _fail(rec, "the local Ray cluster `up` started is gone (its holder process exited)")
        return _save(rec, loaded)
    try:
        cluster.connect(rec.gcs_address, rec.namespace, token_env=rec.token_env, timeout=timeout)
    except ClusterError as exc:
        _fail(rec, f"Ray cluster unreachable: {exc.message}")
        return _save(rec, loaded)
    try:
        _reconcile(rec, timeout)
    finally:
        cluster.disconnect()
    return _save(rec, loaded)


def _save(rec: SeatRecord, loaded: float | None) -> SeatRecord:
    """Save what `status` found, unless the record changed on disk since `status` read it: the seat's supervisor
    writes it while it heals the seat (the remediation, REMEDIATING, a new plan), and a `status` that began before
    must not put back the older copy. Then the record on disk is the newer truth, and is what `status` shows."""
    with record_lock(rec.name):
        try:
            disk = load_record(rec.name)
        except SeatError:
            return rec  # gone meanwhile (`down`): not brought back
        if disk.updated_at != loaded:
            return disk
        try:
            save_record(rec)
        except HomeError as exc:  # a full or read-only home: the state is still worth showing
            log.warning("%s (this status is shown, not saved)", exc.message)
    return rec


def remediation_in_progress(rec: SeatRecord, now: float) -> bool:
    """Whether the seat's latest remediation is pending and younger than :data:`REMEDIATION_STALE_S`."""
    hist = rec.remediation_history()
    last = hist[-1] if hist else None
    return last is not None and last.outcome is Outcome.PENDING and now - last.started < REMEDIATION_STALE_S


def _fail(rec: SeatRecord, reason: str, tail: Sequence[str] = ()) -> None:
    if rec.state.needs_operator():
        return  # sticky: keep the first reason
    rec.set_state(SeatState.FAILED, reason)
    rec.log_tail = list(tail)


def _reconcile(rec: SeatRecord, timeout: float) -> None:
    try:
        found = [(node, get_agent(rec.name, node.node_rank)) for node in rec.nodes]
    except ClusterError as exc:
        _fail(rec, exc.message)
        return
    gone = [node for node, c in found if c is None]
    seen = ({int(s.get("node", -1)): s for s in snapshots(rec.name, rec.namespace, len(rec.nodes),
                                                           timeout=min(timeout, SIDECAR_TIMEOUT_S))}
            if gone and not rec.no_watchdog else {})
    for node in gone:
        line, node.alive = agent_gone(rec, node, seen.get(node.node_rank))
        _fail(rec, line)
    clients = [c for _, c in found if c is not None]
    states: list[dict[str, Any]] = []
    lost: list[str] = []
    refs = [(c, c.submit("engine_state")) for c in clients]
    for c, ref in refs:
        try:
            st = c.wait(ref, timeout, "engine_state")
        except NoAnswer as exc:
            lost.append(node_lost_line(rec, c.node_rank, exc.message))
            continue
        except ClusterError as exc:
            _fail(rec, exc.message)
            continue
        states.append(st)
        apply_engine_state(rec.nodes[c.node_rank], st)
        if c.node_rank == 0 and st.get("kv_tokens") is not None:
            rec.kv_actual = st["kv_tokens"]
    dead = dead_reason(states)
    if dead:  # a node lost first (its raylet killed, say) is named before the engines that died after it
        _fail(rec, "; ".join([*lost, dead[0]]), dead[1])
    if rec.state.needs_operator():
        return
    if lost:
        rec.set_state(SeatState.NODE_LOST, "; ".join(lost))
        return
    backend = backend_for(rec.engine)
    code, err = health.probe(f"{rec.endpoint}{backend.health_path}", timeout=5.0)
    snaps = [] if rec.no_watchdog else snapshots(rec.name, rec.namespace, len(rec.nodes),
                                                 timeout=min(timeout, SIDECAR_TIMEOUT_S))
    hang = None if rec.no_watchdog else hang_of(snaps)
    rec.capture_failures = capture_failures_of(snaps)
    if hang is not None:
        rec.hang_bundle, rec.hang_verdict = hang
        failed = latched_failure(snaps)
        rec.set_state(SeatState.HUNG, "the watchdog latched a hang: "
                      + (f"bundle {rec.hang_bundle}" if rec.hang_bundle else
                         f"its capture left no complete bundle ({failed.get('reason')})" if failed else
                         "capture in progress")
                      + (f" ({rec.hang_verdict})" if rec.hang_verdict else "")
                      + ("" if code == 200 else f"; rank 0 {backend.health_path}: {err}"))
        return
    rec.hang_bundle = rec.hang_verdict = None
    if code == 200:
        rec.set_state(SeatState.READY)
        rec.reason = None
    else:
        rec.set_state(SeatState.DEGRADED, f"every engine process is alive but rank 0 {backend.health_path}: {err}")


def agent_gone(rec: SeatRecord, node: NodeRecord, snap: dict[str, Any] | None) -> tuple[str, bool]:
    """A node agent gone: the reason's line, saying what became of its engines as that node's watchdog sidecar sees
    them, and whether they are all alive. A killed agent (measured on the local sim seat) leaves its engines
    serving, which only `down` can stop then."""
    line = f"node {node.node_rank} agent ({node.agent}" + (f", pid {node.agent_pid}" if node.agent_pid else "") + \
        ") is gone"
    procs = [p for p in (snap or {}).get("processes") or [] if p.get("node") in (None, node.node_rank)]
    if not procs:
        why = (snap or {}).get("error") or "its sidecar sees no engine process"
        return f"{line}; its engines unseen ({why})", False
    alive = [int(p["pid"]) for p in procs if p.get("alive")]
    if len(alive) == len(procs):
        pids = ", ".join(str(p) for p in alive)
        return (f"{line}; its watchdog sees its engine processes alive (pids {pids}): they go on serving, but "
                f"nothing can stop or restart them through Ray now: `sgl-seat down {rec.name}` stops them "
                f"(from their host if Ray cannot reach it: `sgl-seat down --local {rec.name}`)"), True
    dead = ", ".join(str(p["pid"]) for p in procs if not p.get("alive"))
    return f"{line}; its watchdog sees engine processes gone (pids {dead})", False


def node_lost_line(rec: SeatRecord, node_rank: int, why: str) -> str:
    """One lost node for the NODE-LOST reason: its address and host, its ranks, and what the call got."""
    node = rec.nodes[node_rank]
    ranks = ", ".join(str(r.tp_rank) for r in node.ranks) or "-"
    where = f"{node.ip or '?'}" + (f", host {node.host}" if node.host else "")
    return f"node {node_rank} ({where}; ranks {ranks}) unreachable: {why}"


def hang_of(snaps: Sequence[dict[str, Any]]) -> tuple[str | None, str | None] | None:
    """The hang the watchdog is latched on, from the sidecars' snapshots: (bundle id, verdict line), or None.

    A sidecar latches when a capture starts and unlatches only after its detectors are quiet and it has seen
    progress, so "latched" is the watchdog's own word that the seat is hung. The bundle is found on whichever
    node coordinated the capture (its ``bundles`` entries carry the ``capture_id`` that every latch names);
    while the capture is still being written there is none yet.
    """
    latched = {s.get("latched_by") for s in snaps if s.get("latched")}
    if not latched:
        return None
    for s in snaps:
        for b in reversed(s.get("bundles") or []):
            if b.get("capture_id") in latched:
                v = b.get("verdict") or {}
                line = (f"{v.get('kind')} rank {v.get('rank')} node {v.get('node')} {v.get('frame') or ''}".strip()
                        if v else None)
                return b.get("bundle_id"), line
    return None, None


#: Failed captures `status` keeps (newest; each sidecar keeps its own last 20).
MAX_CAPTURE_FAILURES = 5


def capture_failures_of(snaps: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The watchdog's captures that the disk did not take whole, from every sidecar's snapshot, newest last:
    each with its node, the bundle id it would have had, the reason (disk-full, read-only, ...), where the part
    written was left (``.incomplete-<id>``, or None) and which files are missing."""
    keys = ("t", "capture_id", "bundle_id", "reason", "error", "path", "missing")
    out = [{"node": s.get("node"), **{k: f.get(k) for k in keys}}
           for s in snaps for f in (s.get("capture_failures") or []) if isinstance(f, dict)]
    out.sort(key=lambda f: float(f.get("t") or 0.0))
    return out[-MAX_CAPTURE_FAILURES:]


def latched_failure(snaps: Sequence[dict[str, Any]]) -> dict[str, Any] | None:
    """The failed capture that holds the watchdog's latch (a hang whose bundle the disk did not take), or None."""
    latched = {s.get("latched_by") for s in snaps if s.get("latched")}
    return next((f for s in snaps for f in reversed(s.get("capture_failures") or [])
                 if isinstance(f, dict) and f.get("capture_id") in latched), None)


def capture_failure_line(f: dict[str, Any]) -> str:
    """One failed capture as `status` prints it."""
    missing = list(f.get("missing") or [])
    shown = ", ".join(missing[:4]) + (f", ... ({len(missing)} files)" if len(missing) > 4 else "")
    where = f"; the part written is in {f['path']}" if f.get("path") else "; nothing of it was written"
    return (f"capture {f.get('bundle_id')} (node {f.get('node')}) left no complete bundle: {f.get('reason')}"
            + (f", missing {shown}" if missing else "") + where)


def kv_line(rec: SeatRecord) -> str:
    """The KV pool as `status` prints it: the plan's prediction (or why there is none) and what the engine reported
    (or that it has not yet), with where that figure comes from."""
    if rec.kv_predicted is not None:
        predicted = f"predicted {rec.kv_predicted:,} tokens"
    else:  # the plan sized no pool: its engine's note says why (SGLang's CPU engine), else no config to size from
        note = (rec.plan or {}).get("capacity_note") or "the plan sized none: model.config not set"
        predicted = f"no prediction ({note})"
    actual = f"actual {rec.kv_actual:,} tokens" if rec.kv_actual is not None else "actual not reported yet"
    return f"KV pool: {predicted}, {actual} ({backend_for(rec.engine).kv_actual_source})"


def _rounded(x: float | None) -> float | None:
    return None if x is None else round(x, 3)


def remediation_json(r: RemediationRecord) -> dict[str, Any]:
    """One remediation as `status --json` shows it: the record, and its stages in seconds from its start."""
    return {**r.to_json(),
            "engines_stopped_s": _rounded(None if r.engines_stopped is None else r.engines_stopped - r.started),
            "serving_again_s": _rounded(r.hang_to_serving_s())}


def remediation_status(rec: SeatRecord, now: float) -> dict[str, Any]:
    """The seat's on_hang policy, how much of its budget is used at ``now``, and its history (`status --json`)."""
    policy = rec.policy()
    hist = rec.remediation_history()
    used = budget_used(policy, hist, now)
    return {"policy": policy.to_json(), "used": used, "left": max(policy.max - used, 0),
            "exhausted": rec.state is SeatState.REMEDIATION_EXHAUSTED,
            "history": [remediation_json(r) for r in hist]}


def remediation_lines(rec: SeatRecord, now: float) -> list[str]:
    """`status`'s lines about healing by policy: the policy and budget, then each remediation with its timings.
    None for a seat on ``on_hang: capture`` that never had one."""
    hist = rec.remediation_history()
    if rec.on_hang == "capture" and not hist:
        return []
    policy = rec.policy()
    used = budget_used(policy, hist, now)
    out = [f"on hang: {policy.on_hang} ({used} of {policy.max} remediations used in the last {policy.window_s:.0f} s;"
           f" cooldown {policy.cooldown_s:.0f} s)"]
    for i, r in enumerate(hist, 1):
        when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(r.started))
        line = f"  {i}. {when}  {r.action.value}  {r.outcome.value}"
        if r.engines_stopped is not None:
            line += f"; engines stopped +{r.engines_stopped - r.started:.1f} s"
        if r.serving_again is not None:
            line += f"; serving again +{r.serving_again - r.started:.1f} s"
        if r.draft_before is not None and r.draft_after is not None and r.draft_before != r.draft_after:
            line += f"; draft {'on' if r.draft_before else 'off'} -> {'on' if r.draft_after else 'off'}"
        line += f"  bundle {r.bundle_id or '-'}"
        out.append(line)
        out.append(f"     {r.verdict}: {r.reason}" + (f"; error: {r.error}" if r.error else ""))
    return out


def node_processes(rec: SeatRecord, node: NodeRecord) -> list[dict[str, Any]]:
    """Every live process of the node's engine, as its agent last saw them: pid, parent, title and what it is to the
    engine (``main``, ``scheduler`` for a rank's process, a helper's kind such as ``detokenizer`` or ``engine-core``,
    ``other``), by the engine's own words."""
    words = backend_for(rec.engine).words
    out = []
    for p in sorted(node.processes, key=lambda p: int(p.get("pid") or 0)):
        title = str(p.get("title") or "")
        kind = words.kind_of_title(title)
        if p.get("pid") == node.engine_pid:
            kind = "main"
        elif kind == "main":  # an untitled process that is not the node's engine main: the resource tracker, ...
            kind = "other"
        out.append({"pid": p.get("pid"), "ppid": p.get("ppid"), "title": title[:200], "kind": kind})
    return out


def status_json(rec: SeatRecord, *, now: float | None = None) -> dict[str, Any]:
    """What `status --json` prints: the record's view of the seat (stable keys; ``docs/status-json.md``)."""
    return {
        "name": rec.name,
        "state": rec.state.value,
        "reason": rec.reason,
        "endpoint": rec.endpoint,
        "engine": rec.engine,
        "draft": rec.draft,
        "cluster": {"address": rec.cluster_address, "gcs_address": rec.gcs_address, "local": rec.local_cluster},
        "namespace": rec.namespace,
        "placement_group": rec.pg_name,
        # The sim echoes the plan's prediction as its pool, so for a sim seat "actual" is not a measurement.
        "kv_pool": {"predicted": rec.kv_predicted, "actual": rec.kv_actual,
                    "actual_source": backend_for(rec.engine).kv_actual_source},
        "hang": ({"bundle": rec.hang_bundle, "verdict": rec.hang_verdict}
                 if rec.state is SeatState.HUNG else None),
        "nodes": [
            {
                "node_rank": n.node_rank,
                "ip": n.ip,
                # The node's address as Ray reports it, and the cluster.hosts entry it was matched to.
                "address": n.ip,
                "host": n.host,
                "node_id": n.node_id,
                "agent": n.agent,
                "agent_pid": n.agent_pid,
                "gpu_ids": n.gpu_ids,
                "engine_pid": n.engine_pid,
                "pgid": n.pgid,
                "alive": n.alive,
                "returncode": n.returncode,
                "log_path": n.log_path,
                "pids": n.pids,
                "ranks": [{"tp_rank": r.tp_rank, "ep_rank": r.ep_rank, "title": r.title, "pid": r.pid,
                           "alive": r.alive, "state": r.state} for r in n.ranks],
                "processes": node_processes(rec, n),
            }
            for n in rec.nodes
        ],
        "log_tail": rec.log_tail,
        # The watchdog's captures that a full or read-only disk cut short (none: []).
        "capture_failures": [dict(f) for f in rec.capture_failures],
        # Healing by policy (watchdog.on_hang): the policy, the budget used now, every remediation with timings.
        "on_hang": rec.on_hang,
        "remediation": remediation_status(rec, time.time() if now is None else now),
        "updated_at": rec.updated_at,
    }
