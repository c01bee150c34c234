"""Spec -> LaunchPlan: the exact per-node command, environment and Ray placement, as data.

``build_plan`` is pure: it reads the spec (and the model's config.json for capacity) and returns a
frozen plan that prints to stable text and JSON. Nothing here touches Ray or starts a process;
``sgl_seat.launch`` applies a plan. What differs between engines (module, flags, environment, probe targets,
faults, refusals) comes from the engine's backend (``sgl_seat.engines``) in one answer per plan
(:class:`~sgl_seat.engines.EngineFacts`); nothing here compares engine names or asks the backend again.
Values only known at apply time (node 0's address, the node's Python) are typed placeholders that
:meth:`LaunchPlan.fill` replaces. About 430 lines: the plan's types, its builder and its text/JSON
rendering belong together (the golden files pin all three at once).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, field, replace
from typing import Any

from sgl_seat.engines import EngineFacts, backend_for, engine_names
from sgl_seat.engines.base import Placeholder as Placeholder  # where launch and the tests find it
from sgl_seat.errors import PlanError, UsageError
from sgl_seat.sizing import (
    Capacity,
    CapacityReport,
    host_table_env,
    layout_problem,
    plan_capacity,
    refuse_if_unbootable,
)
from sgl_seat.spec import SeatSpec, spec_location
from sgl_seat.topology import RankInfo, Topology, topology_of

PLAN_SCHEMA_VERSION = 1

SEAT_ENV_NAME = "SGLSEAT_NAME"
# The watchdog probe (sgl_seat.probe): targets, ring directory, and for engines without a hook of
# ours (real SGLang) the directory of its sitecustomize loader, first on PYTHONPATH.
PROBE_ENV_TARGETS = "SGLSEAT_PROBE"
PROBE_ENV_DIR = "SGLSEAT_PROBE_DIR"


@dataclass(frozen=True, slots=True)
class NodePlan:
    """What one node runs: its engine command (argv) and its own environment."""

    node_rank: int
    ranks: tuple[RankInfo, ...]
    command: tuple[str, ...]
    env: tuple[tuple[str, str], ...]
    serves_http: bool
    #: The ``cluster.hosts`` entry this node was matched to at apply time (None: no hosts, or not yet bound).
    host: str | None = None
    #: Interfaces preflight expects on that host (``cluster.hosts[].interfaces``).
    expect_interfaces: tuple[str, ...] = ()

    def env_dict(self) -> dict[str, str]:
        return dict(self.env)


@dataclass(frozen=True, slots=True)
class HostPlan:
    """One ``cluster.hosts`` entry as the plan carries it: matched to a node only once Ray has placed it."""

    name: str
    address: str
    env: tuple[tuple[str, str], ...]
    interfaces: tuple[str, ...] = ()
    ray_resource: str | None = None
    node_rank: int | None = None

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "address": self.address, "env": dict(self.env),
                "interfaces": list(self.interfaces), "ray_resource": self.ray_resource, "node_rank": self.node_rank}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> HostPlan:
        return cls(name=d["name"], address=d["address"], env=tuple(sorted(d.get("env", {}).items())),
                   interfaces=tuple(d.get("interfaces", [])), ray_resource=d.get("ray_resource"),
                   node_rank=d.get("node_rank"))

    def matches(self, ip: str | None, hostname: str | None) -> bool:
        return self.address in (ip, hostname)


#: How much of a host's pinning resource one bundle takes: a fraction, so several seats can pin one host.
PIN_AMOUNT = 0.001


@dataclass(frozen=True, slots=True)
class Placement:
    """The Ray placement group: bundle i is node rank i; bundle 0 serves HTTP."""

    bundles: tuple[tuple[tuple[str, float], ...], ...]
    strategy: str = "STRICT_SPREAD"

    def bundle_dicts(self) -> list[dict[str, float]]:
        return [dict(b) for b in self.bundles]


@dataclass(frozen=True, slots=True)
class LaunchPlan:
    """Everything `up` needs, serialisable to JSON so a node agent gets nothing but data."""

    seat: str
    engine: str
    draft: bool
    slots: int
    mem_fraction: float
    http_port: int
    dist_init_port: int
    topology: Topology
    nodes: tuple[NodePlan, ...]
    placement: Placement
    capacity: CapacityReport | None
    warnings: tuple[str, ...] = field(default=())
    hosts: tuple[HostPlan, ...] = field(default=())
    #: Where capacity comes from when the engine does not size it from GPU memory (SGLang's CPU engine).
    capacity_note: str | None = None
    #: A rehearsal seat (the spec's ``rehearsal``, or a stand-in engine): `sgl-seat fault` may act on it.
    rehearsal: bool = False
    #: Files every node's engine reads, (name, text) in ``${seat_files}``: the draft policy's adaptive tiers.
    files: tuple[tuple[str, str], ...] = field(default=())
    #: The draft policy when the draft runs SGLang's adaptive tiers (``None``: a static draft, or none).
    draft_policy: dict[str, Any] | None = None
    schema_version: int = PLAN_SCHEMA_VERSION

    @property
    def endpoint(self) -> str:
        return f"http://{Placeholder.NODE0_ADDR.value}:{self.http_port}"

    def placeholders(self) -> list[str]:
        text = json.dumps([[n.command, n.env] for n in self.nodes])
        return [p.value for p in Placeholder if p.value in text]

    def fill(self, values: dict[Placeholder, str]) -> LaunchPlan:
        """Replace placeholders in every node's argv and env (apply time)."""

        def sub(s: str) -> str:
            for ph, val in values.items():
                s = s.replace(ph.value, val)
            return s

        nodes = tuple(
            replace(n, command=tuple(sub(a) for a in n.command), env=tuple((k, sub(v)) for k, v in n.env))
            for n in self.nodes
        )
        return replace(self, nodes=nodes)

    def bind_hosts(self, found: dict[int, tuple[str | None, str | None]]) -> LaunchPlan:
        """Give every node the env of the host Ray actually put it on (``found``: node rank -> (ip, hostname)).

        The per-host env wins over ``network.env``; a node on no named host, a host holding two nodes, or a
        pinned rank found elsewhere is a :class:`PlanError` naming the addresses seen.
        """
        if not self.hosts:
            return self
        nodes = []
        used: dict[str, int] = {}
        problems = []
        for nd in self.nodes:
            ip, hostname = found.get(nd.node_rank, (None, None))
            host = next((h for h in self.hosts if h.matches(ip, hostname)), None)
            if host is None:
                problems.append(f"node {nd.node_rank} is at {ip} ({hostname}), which matches no cluster.hosts address"
                                f" {[h.address for h in self.hosts]}")
                continue
            if host.name in used:
                problems.append(f"nodes {used[host.name]} and {nd.node_rank} both landed on host {host.name!r}")
            used[host.name] = nd.node_rank
            pinned = next((h for h in self.hosts if h.node_rank == nd.node_rank), None)
            if pinned is not None and pinned.name != host.name:
                problems.append(f"node {nd.node_rank} is pinned to host {pinned.name!r} but Ray put it on"
                                f" {host.name!r}")
            env = {**nd.env_dict(), **dict(host.env)}
            nodes.append(replace(nd, env=tuple(sorted(env.items())), host=host.name,
                                 expect_interfaces=host.interfaces))
        if problems:
            raise PlanError("the nodes do not match cluster.hosts: " + "; ".join(problems),
                            fix="give each host's node IP (as `ray status` lists it) or its hostname in"
                                " cluster.hosts[].address")
        return replace(self, nodes=tuple(nodes))

    def to_json(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "seat": self.seat,
            "engine": self.engine,
            "draft": self.draft,
            "slots": self.slots,
            "mem_fraction": self.mem_fraction,
            "endpoint": self.endpoint,
            "http_port": self.http_port,
            "dist_init_port": self.dist_init_port,
            "placeholders": self.placeholders(),
            "topology": {
                "nnodes": self.topology.nnodes,
                "gpus_per_node": self.topology.gpus_per_node,
                "tp": self.topology.tp,
                "ep": self.topology.ep,
                "dp": self.topology.dp,
                "world_size": self.topology.world_size,
            },
            "nodes": [
                {
                    "node_rank": n.node_rank,
                    "serves_http": n.serves_http,
                    "ranks": [
                        {"tp_rank": r.tp_rank, "ep_rank": r.ep_rank, "local_rank": r.local_rank,
                         "title": r.process_title}
                        for r in n.ranks
                    ],
                    "command": list(n.command),
                    "env": n.env_dict(),
                    **({"host": n.host} if n.host is not None else {}),
                    **({"expect_interfaces": list(n.expect_interfaces)} if n.expect_interfaces else {}),
                }
                for n in self.nodes
            ],
            "placement": {"strategy": self.placement.strategy, "bundles": self.placement.bundle_dicts(),
                          "http_bundle": 0},
            "capacity": self.capacity.to_json() if self.capacity else None,
            **({"capacity_note": self.capacity_note} if self.capacity_note else {}),
            **({"rehearsal": True} if self.rehearsal else {}),
            **({"draft_policy": self.draft_policy} if self.draft_policy else {}),
            **({"files": dict(self.files)} if self.files else {}),
            "warnings": list(self.warnings),
            **({"hosts": [h.to_json() for h in self.hosts]} if self.hosts else {}),
        }

    def dumps(self) -> str:
        return json.dumps(self.to_json(), indent=2, sort_keys=False)

    @classmethod
    def from_json(cls, doc: dict[str, Any]) -> LaunchPlan:
        """Rebuild a plan from :meth:`to_json` (node agents receive it this way). Capacity is dropped."""
        if doc.get("schema_version") != PLAN_SCHEMA_VERSION:
            raise PlanError(f"plan schema_version {doc.get('schema_version')!r} is not {PLAN_SCHEMA_VERSION}",
                            fix="use the same sgl-seat version on the driver and the nodes")
        t = doc["topology"]
        topo = Topology(nnodes=t["nnodes"], gpus_per_node=t["gpus_per_node"], tp=t["tp"], ep=t["ep"], dp=t["dp"])
        nodes = tuple(
            NodePlan(
                node_rank=n["node_rank"],
                ranks=tuple(RankInfo(tp_rank=r["tp_rank"], ep_rank=r["ep_rank"], node_rank=n["node_rank"],
                                     local_rank=r["local_rank"], process_title=r["title"]) for r in n["ranks"]),
                command=tuple(n["command"]),
                env=tuple(sorted(n["env"].items())),
                serves_http=n["serves_http"],
                host=n.get("host"),
                expect_interfaces=tuple(n.get("expect_interfaces", [])),
            )
            for n in doc["nodes"]
        )
        placement = Placement(
            bundles=tuple(tuple(sorted(b.items())) for b in doc["placement"]["bundles"]),
            strategy=doc["placement"]["strategy"],
        )
        return cls(
            seat=doc["seat"], engine=doc["engine"], draft=doc["draft"], slots=doc["slots"],
            mem_fraction=doc["mem_fraction"], http_port=doc["http_port"], dist_init_port=doc["dist_init_port"],
            topology=topo, nodes=nodes, placement=placement, capacity=None, warnings=tuple(doc["warnings"]),
            hosts=tuple(HostPlan.from_json(h) for h in doc.get("hosts", [])),
            capacity_note=doc.get("capacity_note"),
            rehearsal=bool(doc.get("rehearsal", False)),
            files=tuple(sorted(doc.get("files", {}).items())),
            draft_policy=doc.get("draft_policy"),
        )


def _fmt_float(x: float) -> str:
    return format(x, "g")


def _check_draft_family(spec: SeatSpec, cap: CapacityReport | None) -> None:
    """DeepSeek-V4 accepts only EAGLE with explicit steps and topk 1 (contracts section 2)."""
    if cap is None or not cap.model.startswith("DeepseekV4"):
        return
    if spec.draft.algorithm != "EAGLE":
        raise PlanError(
            f"{spec.draft.algorithm}: SGLang 0.5.23 refuses it for {cap.model}"
            " ('Only EAGLE and DSPARK speculative algorithms are supported')",
            fix="set draft.algorithm: EAGLE (NEXTN is not aliased in time for DeepSeek-V4)",
            **spec_location(spec, "draft.algorithm"),
        )
    if spec.draft.topk != 1:
        raise PlanError(f"{spec.draft.topk}: DeepSeek-V4 needs topk 1", fix="set draft.topk: 1",
                        **spec_location(spec, "draft.topk"))


def probe_dir(seat: str, node_rank: int) -> str:
    """Where one node's probe rings live (shared memory; one directory per seat and node)."""
    # A fixed path in a shared directory: the probe refuses a directory it does not own or that others can
    # write, and creates its ring files with O_EXCL | O_NOFOLLOW, so a planted link cannot redirect them.
    return f"/dev/shm/sgl-seat-{seat}/node{node_rank}"  # noqa: S108


def _probe_env(spec: SeatSpec, engine: EngineFacts, cap: CapacityReport | None, node_rank: int,
               env: dict[str, str]) -> None:
    """Add the watchdog probe's environment for one node (nothing when the engine has no targets)."""
    targets = engine.probe_targets(spec.model.architecture or (cap.model if cap is not None else None))
    if not spec.watchdog.enabled or not targets:
        return
    env[PROBE_ENV_TARGETS] = ",".join(targets)
    env[PROBE_ENV_DIR] = probe_dir(spec.name, node_rank)
    if not engine.loads_probe_itself:
        boot = Placeholder.WATCHDOG_BOOT.value
        env["PYTHONPATH"] = f"{boot}:{env['PYTHONPATH']}" if env.get("PYTHONPATH") else boot


def _engram_env(spec: SeatSpec, topo: Topology, cap: CapacityReport | None) -> dict[str, str]:
    """SGLang's Engram host-table environment for every node (empty while the tables stay in HBM), with the
    bytes each node's preflight must find free."""
    if not spec.engram.host_table:
        return {}
    problem = layout_problem(spec.engram.layout, nnodes=topo.nnodes)
    if problem:
        raise PlanError(problem, fix="set engram.layout: per_rank", **spec_location(spec, "engram.layout"))
    return host_table_env(spec.engram.layout, staging=spec.engram.host_staging,
                          host_bytes=cap.engram_host_bytes_per_node if cap else None,
                          pinned_bytes=cap.engram_pinned_bytes_per_process if cap else None)


def build_plan(
    spec: SeatSpec,
    *,
    draft: bool | None = None,
    slots: int | None = None,
    mem_fraction: float | None = None,
    faults: tuple[str, ...] = (),
) -> LaunchPlan:
    """Pure: spec (+ overrides) -> LaunchPlan. Refuses a configuration that cannot boot."""
    topo = topology_of(spec)
    use_draft = spec.draft.enabled if draft is None else draft
    mf = spec.memory_fraction if mem_fraction is None else mem_fraction
    if not 0.05 < mf < 1.0:
        # A flag's value, not the spec's (memory_fraction is held to the same range when the spec loads).
        raise UsageError(f"--mem-fraction {mf}: outside (0.05, 1.0)", fix="pass e.g. --mem-fraction 0.85")
    slots_off = slots if (slots is not None and not use_draft) else spec.slots
    slots_on = slots if (slots is not None and use_draft) else spec.draft.slots
    if min(slots_off, slots_on) < 1:
        raise UsageError(f"--slots {slots}: must be at least 1", fix="pass a positive --slots")
    chosen = slots_on if use_draft else slots_off
    # The one question to the engine's backend: everything engine-specific about this seat, or its refusal
    # (faults it does not take, a draft it cannot run).
    if spec.engine not in engine_names():
        raise PlanError(f"unknown engine {spec.engine!r}", fix=f"use one of {engine_names()}",
                        **spec_location(spec, "engine"))
    engine = backend_for(spec.engine).describe(spec, topo, draft=use_draft, faults=faults)

    # Capacity is sized on node 0's own command line for each draft state (SGLang's sizing reads it).
    argv0 = {d: engine.argv(node_rank=0, draft=d, slots=slots_on if d else slots_off, mem_fraction=mf)
             for d in (False, True)}
    # An engine that does not size from GPU memory says where capacity comes from instead; no GPU figure.
    cap_note = engine.capacity_note
    cap = None if cap_note else plan_capacity(spec, slots_off=slots_off, slots_on=slots_on, mem_fraction=mf,
                                              argv_off=argv0[False], argv_on=argv0[True],
                                              real_sglang=engine.sized_by_sglang)
    engram_env = _engram_env(spec, topo, cap)
    if use_draft:
        _check_draft_family(spec, cap)
    if cap is not None:
        refuse_if_unbootable(spec, cap.draft_on if use_draft else cap.draft_off)
    warnings: list[str] = []
    if cap is None:
        if cap_note is None:
            warnings.append("model.config is not set: KV pool and slot ceiling are not predicted")
    elif not cap.draft_off.predicted:
        warnings.append(f"KV pool and slot ceiling are not predicted: {cap.draft_off.problem}")
    warnings += engine.warnings

    policy, files = engine.draft_policy(cap, chosen, warnings) if use_draft else (None, ())
    sel = (cap.draft_on if use_draft else cap.draft_off) if cap else None
    nodes = []
    for r in range(topo.nnodes):
        argv = engine.argv(node_rank=r, draft=use_draft, slots=chosen, mem_fraction=mf)
        env = dict(spec.network.env)
        if spec.network.node_env:
            env.update(spec.network.node_env[r])
        env[SEAT_ENV_NAME] = spec.name
        env.update(engram_env)
        _probe_env(spec, engine, cap, r, env)
        env.update(engine.node_env(sel.kv_pool_tokens if sel is not None else None))
        nodes.append(
            NodePlan(
                node_rank=r,
                ranks=tuple(topo.ranks_on(r, engine.rank_title)),
                command=(spec.python, "-m", engine.module, *argv),
                env=tuple(sorted(env.items())),
                serves_http=r == 0,
            )
        )
    if engine.faults and engine.faults_need_probe and not any(PROBE_ENV_TARGETS in n.env_dict() for n in nodes):
        raise PlanError(f"--fault needs the watchdog's probe inside the engine, and seat {spec.name!r} has none",
                        fix="set watchdog.enabled: true and model.architecture (or model.config) to a family "
                            "in watchdog/probe-targets.yaml")
    bundle = (("CPU", float(spec.cluster.cpus_per_node)), ("GPU", float(topo.gpus_per_node)))
    hosts = tuple(HostPlan(name=h.name, address=h.address, env=tuple(sorted(h.env.items())),
                           interfaces=tuple(h.interfaces), ray_resource=h.ray_resource, node_rank=h.node_rank)
                  for h in spec.cluster.hosts)
    pins = {h.node_rank: h.ray_resource for h in hosts if h.node_rank is not None and h.ray_resource}
    bundles = tuple(tuple(sorted((*bundle, (pins[r], PIN_AMOUNT)))) if r in pins else bundle
                    for r in range(topo.nnodes))
    return LaunchPlan(
        seat=spec.name,
        engine=spec.engine,
        draft=use_draft,
        slots=chosen,
        mem_fraction=mf,
        http_port=spec.network.http_port,
        dist_init_port=spec.network.dist_init_port,
        topology=topo,
        nodes=tuple(nodes),
        placement=Placement(bundles=bundles),
        capacity=cap,
        warnings=tuple(warnings),
        hosts=hosts,
        capacity_note=cap_note,
        rehearsal=spec.rehearsal or engine.synthetic,
        files=files,
        draft_policy=policy,
    )


def _boots(c: Capacity) -> str:
    if not c.predicted:
        return "unknown"
    return "yes" if c.fits else "NO"


def _opt_tokens(n: int | None) -> str:
    return "-" if n is None else f"{n:,}"


def _tokens(n: int) -> str:
    return f"{n:,}"


def _hosts_text(plan: LaunchPlan) -> list[str]:
    """The ``cluster.hosts`` block of the text plan: which rank each host holds, and its own env."""
    if not plan.hosts:
        return []
    out = ["", f"hosts: {len(plan.hosts)} (each node gets the env of the host Ray puts it on)"]
    for h in plan.hosts:
        if h.node_rank is not None:
            where = f"node {h.node_rank}, pinned by resource {h.ray_resource}"
        else:
            where = "whichever node rank Ray places there"
        out.append(f"  host {h.name} ({h.address}): {where}")
        out += [f"    env {k}={v}" for k, v in h.env]
        if h.interfaces:
            out.append(f"    expects interfaces: {', '.join(h.interfaces)}")
    return out


def render_text(plan: LaunchPlan) -> str:
    """Stable, readable text of a plan (golden files pin it)."""
    t = plan.topology
    out = [
        f"seat {plan.seat}  engine {plan.engine}  draft {'on' if plan.draft else 'off'}  "
        f"slots {plan.slots}  mem-fraction {_fmt_float(plan.mem_fraction)}",
        f"topology: {t.nnodes} nodes x {t.gpus_per_node} GPUs, TP{t.tp}/EP{t.ep}, world size {t.world_size}",
        f"endpoint: {plan.endpoint}",
        "",
        f"placement: {plan.placement.strategy}, {len(plan.placement.bundles)} bundles (bundle 0 serves HTTP)",
    ]
    for i, b in enumerate(plan.placement.bundle_dicts()):
        res = ", ".join(f"{k}: {_fmt_float(v)}" for k, v in b.items())
        out.append(f"  bundle {i} -> node {i}: {{{res}}}")
    out += _hosts_text(plan)
    words = backend_for(plan.engine).words  # the titles, without the engine's prefix
    for n in plan.nodes:
        ranks = ", ".join(words.short_title(r.process_title) for r in n.ranks)
        pin = next((h.name for h in plan.hosts if h.node_rank == n.node_rank), None)
        host_of = (f" on host {n.host}" if n.host else f" on host {pin} (pinned; its env below + that host's)" if pin
                   else " on the host Ray picks (its env below + that host's)" if plan.hosts else "")
        out += ["", f"node {n.node_rank}{' (HTTP)' if n.serves_http else ''}{host_of}: {ranks}"]
        out.append("  command: " + shlex.join(n.command))
        for k, v in n.env:
            out.append(f"  env {k}={v}")
    out.append("")
    cap = plan.capacity
    if cap is None:
        out.append(f"capacity: {plan.capacity_note}" if plan.capacity_note
                   else "capacity: not predicted (model.config not set)")
    else:
        off, on = cap.draft_off, cap.draft_on
        gib = 1 << 30
        rows = [
            ("", "draft off", "draft on"),
            ("weights per GPU", f"{off.weights_bytes_per_gpu / gib:.2f} GiB",
             f"{(on.weights_bytes_per_gpu + on.draft_weights_bytes_per_gpu) / gib:.2f} GiB"),
            ("KV bytes per token", _tokens(off.kv_bytes_per_token), _tokens(on.kv_bytes_per_token)),
            ("SWA pool tokens", _opt_tokens(off.swa_pool_tokens), _opt_tokens(on.swa_pool_tokens)),
            ("slots asked", str(off.requested_slots), str(on.requested_slots)),
            ("KV pool tokens", _tokens(off.kv_pool_tokens), _tokens(on.kv_pool_tokens)),
            ("max running requests", str(off.max_running_requests), str(on.max_running_requests)),
            ("most slots that fit", _tokens(off.max_slots_that_fit), _tokens(on.max_slots_that_fit)),
            ("boots", _boots(off), _boots(on)),
        ]
        out.append(f"capacity ({cap.model}, {cap.gpu_memory_bytes / gib:g} GiB per GPU, computed by "
                   f"{cap.source_label}):")
        for label, left, right in rows:
            out.append(f"  {label:<22}{left:>16}{right:>16}")
        for state in (off, on):
            if state.problem:
                out.append(f"  draft {'on' if state.draft else 'off'}: {state.problem}")
        if cap.engram_host_bytes_per_node is not None:
            out.append(f"  Engram host table: {cap.engram_host_bytes_per_node / gib:.1f} GiB of host memory per node")
        out += [f"  note: {n}" for n in cap.notes]
    out += _policy_text(plan.draft_policy)
    for w in plan.warnings:
        out.append(f"warning: {w}")
    return "\n".join(out) + "\n"


def _policy_text(p: dict[str, Any] | None) -> list[str]:
    if not p:
        return []
    k = p["keeps"]
    if "schedule" in p:  # the engine's own schedule in a flag (vLLM's), no tier file
        out = [f"draft policy: {p['flag']}: {json.dumps(p['schedule'])} ([first, last running requests, draft tokens])"]
    elif p["kind"] == "off_above":
        out = [f"draft policy: draft up to {p['speculates_up_to']} running requests, none above (off_above: "
               f"{p['off_above']}): --speculative-adaptive, {p['how']}",
               f"  {p['flag_file']}: {json.dumps(p['config'], sort_keys=True)}"]
    else:
        out = [f"draft policy: --speculative-adaptive with {p['tiers']}"]
    if "kv_pool_tokens" in k:
        out.append(f"  keeps the draft's KV pool {_tokens(k['kv_pool_tokens'])} tokens and slot cap "
                   f"{k['max_running_requests']} (draft off: {_tokens(k['draft_off_kv_pool_tokens'])} tokens, "
                   f"{k['draft_off_max_running_requests']} slots): not given back")
    return [*out, f"  {k['note']}"]
