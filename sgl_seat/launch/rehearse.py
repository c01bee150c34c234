"""`sgl-seat fault`: a fault injected into a running rehearsal seat, through the node agents.

A rehearsal (the spec's ``rehearsal: true``, or a sim seat) is where an operator, a test or a bench learns what
the watchdog does with a real hang before production has one. What can be done to it:

- ``probe-stall:rank=R[,after_calls=N][,gather_ge=K][,for_s=S][,target=T]``: the probe's rehearsal gate
  (``sgl_seat/probe/fault.py``) stalls rank R's next probed call that matches, inside the real engine:
  its scheduler blocks in its forward and its peers wait in the real all-reduce. Written to every node's probe
  control file (the gate picks the rank), so it works whichever node holds the rank. ``clear`` ends it.
- ``sigstop:rank=R`` / ``sigcont:rank=R`` / ``sigkill:rank=R``: the signal to rank R's scheduler process;
  ``sigstop:detokenizer`` (and ``sigcont:``, ``sigkill:``) to node 0's detokenizer (a hang outside the
  schedulers). The agent on the process's node finds it in its own engine's process group, by pid and create
  time.
- On a sim seat, the sim's own kinds (``rowfetch-stall:...``, ``crash:...``: ``up --fault`` lists them) go to
  the sim's loopback fault route, and ``clear`` clears it.

A seat that is not a rehearsal refuses every one of them here, and its agents refuse them again.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import asdict, dataclass, field
from typing import Any

import httpx

from sgl_seat.engines import backend_for
from sgl_seat.errors import ClusterError, EngineError, UsageError
from sgl_seat.launch import cluster
from sgl_seat.launch.agentclient import get_agent
from sgl_seat.launch.seatrecord.home import host_id
from sgl_seat.launch.seatrecord.record import SeatRecord, load_record
from sgl_seat.plan import LaunchPlan

PROBE_STALL = "probe-stall"
CLEAR = "clear"
SIGNALS = {"sigstop": "STOP", "sigcont": "CONT", "sigkill": "KILL"}
DETOKENIZER = "detokenizer"
CALL_TIMEOUT_S = 15.0
EXAMPLES = ("probe-stall:rank=1,for_s=30 | clear | sigstop:rank=1 | sigcont:rank=1 | sigkill:rank=1"
            " | sigstop:detokenizer")


@dataclass(slots=True)
class FaultResult:
    """What was done: the action as given, where, to which process, and when (``time.time()`` on the driver
    just before the first agent call, and each agent's own clock when it acted)."""

    seat: str
    action: str
    t: float
    nodes: list[int] = field(default_factory=list)
    pid: int | None = None
    title: str | None = None
    fault_id: str | None = None
    applied_t: float | None = None

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def _plan_of(rec: SeatRecord) -> LaunchPlan:
    if rec.plan is None:
        raise EngineError(f"seat {rec.name}'s record holds no plan", fix="bring it up with `sgl-seat up`")
    return LaunchPlan.from_json(rec.plan)


def _signal_target(plan: LaunchPlan, what: str) -> tuple[int, str]:
    """(node rank, process title) of ``rank=R``, or of one of the engine's helper processes on node 0 by its kind
    (:attr:`~sgl_seat.core.vocabulary.EngineWords.helper_titles`: SGLang's ``detokenizer``, vLLM's ``engine-core``)."""
    words = backend_for(plan.engine).words
    helpers = [kind for _, kind in words.helper_titles]
    key, _, val = what.partition("=")
    if not val:
        title = words.helper_title(what)
        if title is None:
            raise UsageError(f"seat {plan.seat}'s engine ({plan.engine}) has no {what!r} process",
                             fix=f"name a rank (rank=R) or one of {helpers}")
        node = next((n for n in plan.nodes if n.serves_http), plan.nodes[0])
        return node.node_rank, title
    if key != "rank" or not val.isdigit():
        raise UsageError(f"{what!r}: name the process as rank=R or one of {helpers}", fix=f"e.g. {EXAMPLES}")
    rank = int(val)
    for n in plan.nodes:
        for r in n.ranks:
            if r.tp_rank == rank:
                return n.node_rank, r.process_title
    raise UsageError(f"seat {plan.seat} has no rank {rank} (tp {plan.topology.tp})")


def inject(name: str, action: str) -> FaultResult:
    """Apply one rehearsal fault (the module doc lists them) to the running seat ``name``."""
    rec = load_record(name)
    plan = _plan_of(rec)
    if not plan.rehearsal:
        raise UsageError(f"seat {name} is not a rehearsal: faults are refused on it",
                         fix="rehearse on a seat whose spec says `rehearsal: true` (e.g. local-sglang)")
    kind, _, rest = action.partition(":")
    backend = backend_for(rec.engine)
    if backend.synthetic and kind not in SIGNALS:
        return _sim_fault(rec, plan, action)
    if not rec.gcs_address:
        raise EngineError(f"seat {name} is not up (no Ray cluster on record)", fix="bring it up with `sgl-seat up`")
    res = FaultResult(seat=name, action=action, t=time.time())
    cluster.connect(rec.gcs_address, rec.namespace, token_env=rec.token_env, timeout=20.0)
    try:
        if kind == PROBE_STALL or action == CLEAR:
            text = None if action == CLEAR else backend.validate_faults([action], rehearsal=True)[0]
            res.fault_id = uuid.uuid4().hex[:12]
            for node in plan.nodes:
                out = _call(name, node.node_rank, {"probe": text, "id": res.fault_id})
                res.nodes.append(node.node_rank)
                res.applied_t = res.applied_t or out.get("t")
            return res
        if kind in SIGNALS:
            node_rank, title = _signal_target(plan, rest)
            out = _call(name, node_rank, {"signal": SIGNALS[kind], "title": title})
            res.nodes, res.pid, res.title, res.applied_t = [node_rank], out.get("pid"), title, out.get("t")
            return res
        raise UsageError(f"unknown fault {action!r} for a {rec.engine} seat", fix=f"one of: {EXAMPLES}")
    finally:
        cluster.disconnect()


def _call(name: str, node_rank: int, action: dict[str, Any]) -> dict[str, Any]:
    agent = get_agent(name, node_rank)
    if agent is None:
        raise ClusterError(f"seat {name}: node {node_rank}'s agent is gone", fix="see `sgl-seat status`")
    out: dict[str, Any] = agent.call("rehearse", json.dumps(action), timeout=CALL_TIMEOUT_S)
    if out.get("error"):
        raise EngineError(f"seat {name}: {out['error']}")
    return out


def _sim_fault(rec: SeatRecord, plan: LaunchPlan, action: str) -> FaultResult:
    """A sim seat's own faults, through its loopback fault route (the demo's path)."""
    res = FaultResult(seat=rec.name, action=action, t=time.time())
    if action == CLEAR:
        for node in plan.nodes:
            rank = node.ranks[0].tp_rank
            url, _ = admin_url(rec, rank)
            admin("DELETE", url)
            res.nodes.append(node.node_rank)
        return res
    backend_for(rec.engine).validate_faults([action])
    rank_s = next((kv.split("=", 1)[1] for kv in action.partition(":")[2].split(",") if kv.startswith("rank=")),
                  None)
    if rank_s is None or not rank_s.isdigit():
        raise UsageError(f"{action!r}: a sim fault names its rank (rank=R)", fix="e.g. rowfetch-stall:rank=3")
    url, node_rank = admin_url(rec, int(rank_s))
    admin("POST", url, {"fault": action})
    res.nodes, res.applied_t = [node_rank], time.time()
    return res


def admin_url(rec: SeatRecord, rank: int) -> tuple[str, int]:
    """(fault route of the sim node that runs ``rank``, that node's rank) from the seat's record.

    The record holds the plan as applied (simulated nodes sharing a host carry their own port); the backend
    says which ports a node listens on. The route is loopback-only, so the node must run on this host.
    """
    if rec.plan is None:
        raise EngineError(f"seat {rec.name}'s record holds no plan", fix="run `sgl-seat down` and the demo again")
    plan = LaunchPlan.from_json(rec.plan)
    node = next((n for n in plan.nodes if any(r.tp_rank == rank for r in n.ranks)), None)
    if node is None:
        raise EngineError(f"seat {rec.name}'s plan has no rank {rank}")
    nrec = next((n for n in rec.nodes if n.node_rank == node.node_rank), None)
    if nrec is None or nrec.host_id != host_id():
        raise UsageError(f"rank {rank} runs on node {node.node_rank}, not on this host; the sim's fault route "
                         "answers on 127.0.0.1 only", fix="run the demo on the built-in local-sim seat")
    url = backend_for(rec.engine).fault_url(plan, node)
    if url is None:
        raise UsageError(f"engine {rec.engine!r} has no fault route", fix="run the demo on a sim seat")
    return url, node.node_rank


def admin(method: str, url: str, body: dict[str, str] | None = None) -> dict[str, Any]:
    try:
        r = httpx.request(method, url, json=body, timeout=10.0, trust_env=False)
    except httpx.HTTPError as exc:
        raise EngineError(f"sim fault route {url}: {type(exc).__name__}: {exc}",
                          fix="the sim node did not answer; see `sgl-seat logs --node 1`") from None
    if r.status_code != 200:
        raise EngineError(f"sim fault route {url} refused {method}: HTTP {r.status_code} {r.text[:300]}")
    try:
        doc = r.json()
    except ValueError:
        doc = None
    if not isinstance(doc, dict):
        raise EngineError(f"sim fault route {url} answered {method} with something other than a JSON object: "
                          f"{r.text[:200]!r}")
    return doc
