"""The seat's supervisor: after a hang's bundle is on disk, heal the seat as the spec's ``watchdog.on_hang`` says.

Who acts must outlive the `up` that started the seat and any one node: a detached Ray actor on the node the driver
ran on (the head, for a local cluster the only host), named per seat, started by `up` once the seat is READY when
the policy is not ``capture``, and killed by `down` before anything else so that it never takes the teardown for a
hang. It holds no state that the seat record does not: every action is written to the record as it happens
(``remediations``), so `status` reads it with or without the actor.

Once a second (:data:`POLL_S`) it reads every sidecar's snapshot; a bundle it has not seen before, complete on disk
(a sidecar lists a bundle only once it is written whole), is handed to :mod:`sgl_seat.core.remediation`, which
decides from the verdict, the policy, the history and the clock: nothing, restart, roll the draft back, or refuse
(budget spent, or hung again within the cooldown of the last remediation). Then the supervisor applies it with the
same code `up` runs: sidecars stopped, every engine's process group SIGTERMed then SIGKILLed (in-flight requests
get their connection closed, never a hang), the plan rebuilt with the draft off for a rollback, the engines started
and waited for (:func:`sgl_seat.launch.bringup.start_engines`), one request completed, sidecars started again. The
timings land in the seat record and in the bundle (:func:`sgl_seat.forensics.format.bundle.annotate`).
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import httpx

from sgl_seat.core.records import Verdict
from sgl_seat.core.remediation import DraftShape, RemediationRecord, decide
from sgl_seat.deadline import bounded
from sgl_seat.engines import backend_for
from sgl_seat.errors import SeatError
from sgl_seat.forensics.format.annotate import annotate
from sgl_seat.launch import bringup
from sgl_seat.launch.agentclient import AgentClient, call_all, get_agent
from sgl_seat.launch.seatrecord.record import SeatRecord, load_record, record_lock, save_record
from sgl_seat.launch.seatrecord.state import SeatState
from sgl_seat.launch.sidecars import context_of, start_sidecars, stop_sidecars
from sgl_seat.launch.stages import NullReporter, Stages
from sgl_seat.plan import LaunchPlan, build_plan
from sgl_seat.watchdog.actors import count_remediations, snapshots

log = logging.getLogger(__name__)

#: How often the sidecars' snapshots are read for a new bundle.
POLL_S = 1.0
#: SIGTERM grace per engine group before SIGKILL (as `down`).
KILL_GRACE_S = 10.0
#: How long a restarted seat may take to serve again before the remediation counts as failed.
START_TIMEOUT_S = 600.0


def supervisor_name(seat: str) -> str:
    return f"sgl-seat-supervisor-{seat}"


@dataclass(frozen=True, slots=True)
class SupervisorConfig:
    """What `up` hands the supervisor: the seat, the home its record lives in, and `up`'s own overrides (the plan
    of a rollback is rebuilt from the spec with them, the draft off)."""

    seat: str
    home: str
    slots: int | None = None
    mem_fraction: float | None = None
    faults: tuple[str, ...] = ()
    poll_s: float = POLL_S

    def to_json(self) -> str:
        return json.dumps({"seat": self.seat, "home": self.home, "slots": self.slots,
                           "mem_fraction": self.mem_fraction, "faults": list(self.faults), "poll_s": self.poll_s})

    @classmethod
    def from_json(cls, text: str) -> SupervisorConfig:
        d = json.loads(text)
        return cls(seat=d["seat"], home=d["home"], slots=d.get("slots"), mem_fraction=d.get("mem_fraction"),
                   faults=tuple(d.get("faults") or ()), poll_s=float(d.get("poll_s", POLL_S)))


def first_request(endpoint: str, timeout: float) -> tuple[bool, str]:
    """One short completion through rank 0's native route: serving again means a request comes back whole."""
    body = {"text": "sgl-seat: serving again?", "sampling_params": {"max_new_tokens": 2, "temperature": 0}}
    try:
        r = httpx.post(f"{endpoint}/generate", json=body, timeout=timeout, trust_env=False)
    except httpx.HTTPError as exc:
        return False, f"{type(exc).__name__}: {exc}"
    return r.status_code == 200, f"HTTP {r.status_code}"


class Supervisor:
    """The supervisor's work, apart from Ray's actor face (:class:`SupervisorActor`) so a test can drive it."""

    def __init__(self, cfg: SupervisorConfig, *, clock: Callable[[], float] = time.time) -> None:
        self.cfg = cfg
        self.clock = clock
        self.seen: set[str] = set()
        self.busy: str | None = None  # what it is doing now, for `watch`
        self.path: str | None = None  # the bundle being answered
        self.errors: list[str] = []
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- the loop -------------------------------------------------------------------------------

    def start(self) -> None:
        self.seen |= {b for b in self._bundle_ids()}  # bundles from before it started are not its to act on
        self._thread = threading.Thread(target=self._run, name="seat-supervisor", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()

    def _run(self) -> None:
        while not self._stop.wait(self.cfg.poll_s):
            try:
                self.tick()
            except Exception as exc:  # never let one bad round end the supervisor
                log.exception("supervisor round failed")
                self._note_error(f"{type(exc).__name__}: {exc}")

    def _note_error(self, text: str) -> None:
        """Keep the last ten errors, each cut to 300 characters (:meth:`state`)."""
        self.errors = [*self.errors[-9:], text[:300]]

    def _snapshots(self) -> list[dict[str, Any]]:
        rec = load_record(self.cfg.seat)
        return snapshots(rec.name, rec.namespace, len(rec.nodes), timeout=5.0)

    def _bundle_ids(self) -> list[str]:
        return [str(b.get("bundle_id")) for s in self._snapshots() for b in s.get("bundles", [])]

    def tick(self) -> None:
        """One round: act on each complete bundle not seen before, oldest first."""
        for snap in self._snapshots():
            for doc in snap.get("bundles", []):
                bid = str(doc.get("bundle_id"))
                if bid in self.seen or doc.get("status") != "ok":
                    continue
                self.seen.add(bid)
                if self._stop.is_set():
                    return
                if not isinstance(doc.get("verdict"), dict):
                    continue  # a capture asked for by hand: no hang to heal
                try:
                    self.handle(doc)
                except Exception as exc:  # said, not swallowed: the next bundle is acted on as usual
                    log.exception("bundle %s: the supervisor could not act on it", bid)
                    self._note_error(f"bundle {bid}: {type(exc).__name__}: {exc}")

    # -- one hang ---------------------------------------------------------------------------------

    def handle(self, doc: dict[str, Any]) -> dict[str, Any]:
        """Decide on one bundle and carry the decision out; returns the remediation as recorded."""
        rec = load_record(self.cfg.seat)
        verdict = Verdict.from_json(doc["verdict"])
        now = self.clock()
        decision = decide(verdict, rec.policy(), rec.remediation_history(), now, draft=self._draft_shape(rec))
        entry = RemediationRecord.begin(decision, verdict, str(doc.get("bundle_id")), now, draft_before=rec.draft)
        self.path = doc.get("path")
        log.warning("bundle %s (%s): %s: %s", entry.bundle_id, entry.verdict, decision.action.value, decision.reason)
        if not decision.action.remediates() and not decision.exhausted:
            self._save(entry, new=True)
            return entry.to_json()
        if decision.exhausted:
            self.busy = f"refused: {decision.reason}"
            self._save(entry, new=True, state=SeatState.REMEDIATION_EXHAUSTED, reason=decision.reason)
            try:
                self._stop_seat()
            finally:
                self.busy = None
                self._count(entry)
            return entry.to_json()
        self.busy = f"{decision.action.value}: {decision.reason}"
        self._save(entry, new=True, state=SeatState.REMEDIATING, reason=decision.reason)
        try:
            entry = self._restart(entry, draft_off=decision.action.value == "rollback-draft")
        except Exception as exc:
            log.exception("remediation failed")
            entry = entry.failed(f"{type(exc).__name__}: {exc}"[:500])
            self._save(entry, state=SeatState.FAILED, reason=f"{entry.action.value} failed: {entry.error}")
        finally:
            self.busy = None
        self._count(entry)
        return entry.to_json()

    def _draft_shape(self, rec: SeatRecord) -> DraftShape:
        """The draft as the seat runs it: on or off from the record, its slots from the plan (`up --slots` included),
        its tokens per slot from the spec `up` recorded (the plan carries them only inside the engine's flags)."""
        slots = int((rec.plan or {}).get("slots") or 0)
        tokens = 0
        with contextlib.suppress(SeatError, OSError):  # an old record's spec moved: a verify's size is unknown
            spec = rec.seat_spec()
            tokens = spec.draft.draft_tokens if spec is not None else 0
        return DraftShape(enabled=rec.draft, slots=slots, draft_tokens=tokens)

    def _save(self, entry: RemediationRecord, *, new: bool = False, state: SeatState | None = None,
              reason: str | None = None) -> None:
        """Write ``entry`` into the bundle it answers, then (a new remediation, or the one of the same bundle
        updated) and ``state`` into the seat record, under the record's lock. Best effort once it acts: a home that
        takes no write (the bundle may just have filled it) must not stop the seat from being brought back."""
        if self.path:
            try:  # a bundle on another host, or a read-only one: the record has it
                annotate(self.path, "remediation", entry.bundle_json())
            except Exception as exc:
                log.warning("bundle %s: remediation not recorded in it: %s", entry.bundle_id, exc)
        try:
            with record_lock(self.cfg.seat):
                rec = load_record(self.cfg.seat)
                same = [i for i, r in enumerate(rec.remediations)
                        if r.get("bundle_id") == entry.bundle_id and r.get("started") == entry.started]
                if same:
                    rec.remediations[same[-1]] = entry.to_json()
                else:
                    rec.add_remediation(entry)
                if state is not None:
                    self._set_state(rec, entry, state, reason)
                save_record(rec)
        except SeatError as exc:
            log.warning("remediation %s: the seat record could not be updated: %s", entry.bundle_id, exc.message)

    @staticmethod
    def _set_state(rec: SeatRecord, entry: RemediationRecord, target: SeatState, reason: str | None) -> None:
        up_states = (SeatState.READY, SeatState.DEGRADED, SeatState.NODE_LOST)
        if rec.state in up_states and target is not SeatState.READY:  # `status` has not seen the hang yet
            rec.set_state(SeatState.HUNG, f"the watchdog latched a hang: bundle {entry.bundle_id} ({entry.verdict})")
        if rec.state is not target:
            rec.set_state(target, reason)
        elif reason is not None:
            rec.reason = reason
        if target is SeatState.READY:
            rec.reason = None
            rec.hang_bundle = rec.hang_verdict = None

    # -- actions ------------------------------------------------------------------------------------

    def _agents(self, rec: SeatRecord) -> list[AgentClient]:
        clients = [get_agent(rec.name, n.node_rank) for n in rec.nodes]
        missing = [n.node_rank for n, c in zip(rec.nodes, clients, strict=True) if c is None]
        if missing:
            raise SeatError(f"the node agents of nodes {missing} are gone: the seat cannot be restarted in place",
                            fix=f"sgl-seat down {rec.name}, then up again")
        return [c for c in clients if c is not None]

    def _kill_engines(self, rec: SeatRecord, *, sidecars: bool = True) -> list[str]:
        if sidecars and not rec.no_watchdog:
            with contextlib.suppress(Exception):  # a sidecar that does not stop must not keep the hang serving
                stop_sidecars(context_of(rec, settings=False))
        clients = self._agents(rec)
        refs = [(c, c.submit("kill_engine", KILL_GRACE_S)) for c in clients]
        survivors: list[str] = []
        for c, ref in refs:
            res = c.wait(ref, KILL_GRACE_S + 20.0, "kill_engine")
            survivors += [f"node {c.node_rank}: pid {s['pid']} ({s['title'][:60]})" for s in res["survivors"]]
        return survivors

    def _stop_seat(self) -> None:
        """Refused: the seat stays down, saying why; its sidecars start again with no engine to watch and export
        that (``sgl_seat_remediation_exhausted``, the alert's input), even where stopping an engine failed."""
        rec = load_record(self.cfg.seat)
        try:
            survivors = self._kill_engines(rec)
            if survivors:
                log.warning("engine processes survived SIGKILL: %s", "; ".join(survivors))
        finally:
            self._sidecars(rec)

    def _sidecars(self, rec: SeatRecord) -> None:
        if rec.no_watchdog:
            return
        started = start_sidecars(context_of(rec))
        if not started.ok:
            log.warning("the seat's sidecars: %s", started.detail)
            self._note_error(f"sidecars: {started.detail}")

    def _restart(self, entry: RemediationRecord, *, draft_off: bool) -> RemediationRecord:
        """Stop every engine, start them again (with the draft off for a rollback), wait until a request completes,
        start the sidecars; returns the entry with its timings. The new plan is made and checked before anything
        is stopped: a spec that no longer plans the same seat leaves the seat as it is and fails the remediation."""
        rec = load_record(self.cfg.seat)
        clients = self._agents(rec)
        backend = backend_for(rec.engine)
        if rec.plan is None:
            raise SeatError("the seat record holds no plan to restart from")
        plan = LaunchPlan.from_json(rec.plan)
        if draft_off:
            plan = self._draft_off_plan(rec, plan, clients, backend)
        survivors: list[str] = []
        try:
            survivors = self._kill_engines(rec)
            if survivors:
                raise SeatError("engine processes survived SIGKILL: " + "; ".join(survivors))
            entry = entry.stopped(self.clock())
            self._save(entry)
            if self._stop.is_set():
                raise SeatError("`down` stopped the supervisor before the engines were started again")
            if draft_off:
                rec = load_record(self.cfg.seat)
                rec.plan, rec.draft, rec.kv_predicted = plan.to_json(), False, bringup.predicted_kv(plan)
                save_record(rec)
            deadline = time.monotonic() + START_TIMEOUT_S

            def left() -> float:
                if self._stop.is_set():
                    raise SeatError("`down` stopped the supervisor while the engines were starting")
                rem_s = deadline - time.monotonic()
                if rem_s <= 0:
                    raise SeatError(f"the engines did not serve again within {START_TIMEOUT_S:.0f} s")
                return rem_s

            bringup.start_engines(rec, clients, plan, backend, Stages(NullReporter()), left)
            save_record(rec)
            while True:
                ok, why = first_request(rec.endpoint or "", timeout=min(60.0, left()))
                if ok:
                    break
                if time.monotonic() + 0.5 >= deadline:
                    raise SeatError(f"the engines came up but no request completed: {why}")
                time.sleep(0.5)
            entry = entry.served(self.clock())
        except BaseException:
            if not survivors:  # engines half started by a failed start: not left running unwatched
                with contextlib.suppress(Exception):
                    self._kill_engines(load_record(self.cfg.seat), sidecars=False)
            raise
        finally:
            if not self._stop.is_set():
                with contextlib.suppress(Exception):
                    self._sidecars(load_record(self.cfg.seat))
        self._save(entry, state=SeatState.READY)
        return entry

    def _draft_off_plan(self, rec: SeatRecord, plan: LaunchPlan, clients: list[AgentClient],
                        backend: Any) -> LaunchPlan:
        """The seat's plan with the draft off, from the spec `up` recorded (its mem_fraction and faults; the spec's own
        draft-off slots, not `up --slots`, which sized the draft-on seat; its ports where `up --port-base` moved
        them), bound to the same nodes; refused where the spec no longer plans the same seat (nodes, ports: only an
        old record's spec, read again from its file, can have changed)."""
        spec = rec.seat_spec()
        if spec is None:
            raise SeatError("the seat record holds no spec: the plan cannot be rebuilt with the draft off")
        fresh = build_plan(spec.with_port_base(plan.http_port), draft=False, slots=None,
                           mem_fraction=self.cfg.mem_fraction, faults=self.cfg.faults)
        same = (len(fresh.nodes) == len(plan.nodes) and fresh.http_port == plan.http_port
                and fresh.dist_init_port == plan.dist_init_port)
        if not same:
            raise SeatError(f"the spec {rec.spec_source} no longer plans this seat (nodes or ports changed since "
                            "`up`): the draft is not rolled back in place", fix=f"sgl-seat down {rec.name}, then up")
        infos = call_all(clients, "node_info", lambda c: (), timeout=60.0)
        bound: LaunchPlan = bringup.bind_plan(fresh, backend, rec, infos)
        return bound

    def _count(self, entry: RemediationRecord) -> None:
        """Every node's exporter counts the seat's remediations (`sgl_seat_remediations_total`, the exhausted gauge):
        the sidecars may be new since the last one, so each is handed the whole history and counts what it has not."""

        rec = load_record(self.cfg.seat)
        try:
            count_remediations(rec.name, rec.namespace, len(rec.nodes), rec.remediations, timeout=10.0)
        except Exception as exc:
            log.warning("remediation %s not counted by the sidecars: %s", entry.bundle_id, exc)

    def state(self) -> dict[str, Any]:
        return {"seat": self.cfg.seat, "busy": self.busy, "seen": sorted(self.seen), "errors": list(self.errors)}


class SupervisorActor:
    """Ray face of :class:`Supervisor`: JSON strings in and out."""

    def __init__(self, config_json: str) -> None:
        logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
        self.core = Supervisor(SupervisorConfig.from_json(config_json))
        self.core.start()

    def ping(self) -> str:
        return "ok"

    def state(self) -> str:
        return json.dumps(self.core.state())

    def stop(self) -> str:
        self.core.stop()
        return "stopped"


def start_supervisor(cfg: SupervisorConfig, namespace: str, timeout: float = 30.0) -> None:
    """Start the seat's supervisor, detached, on the node this driver is connected through (its record's host)."""
    import ray
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from sgl_seat.launch.cluster import get

    here = ray.get_runtime_context().get_node_id()
    handle: Any = bounded("creating the seat's supervisor", ray.remote(SupervisorActor).options(
        name=supervisor_name(cfg.seat), namespace=namespace, lifetime="detached", num_cpus=0, max_restarts=0,
        scheduling_strategy=NodeAffinitySchedulingStrategy(node_id=here, soft=False),
        runtime_env={"env_vars": {"SGLSEAT_HOME": cfg.home}},
    ).remote, cfg.to_json(), timeout=timeout)
    get(handle.ping.remote(), timeout, "the seat's supervisor")


def stop_supervisor(seat: str, namespace: str, timeout: float = 15.0) -> bool:
    """Kill the seat's supervisor if it runs; True when there was one."""
    import ray

    try:
        handle = bounded("ray.get_actor (supervisor)", ray.get_actor, supervisor_name(seat), namespace=namespace)
    except ValueError:
        return False
    with contextlib.suppress(Exception):
        bounded("stopping the supervisor", lambda: ray.get(handle.stop.remote(), timeout=timeout), timeout=timeout)
    bounded("ray.kill(supervisor)", ray.kill, handle, no_restart=True, timeout=timeout)
    # ray.kill is asynchronous: wait until the name is free, so that a restart it was driving is over before
    # `down` kills the engines, and a `down; up` right after finds the name unused.
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            bounded("ray.get_actor (supervisor)", ray.get_actor, supervisor_name(seat), namespace=namespace)
        except ValueError:
            return True
        time.sleep(0.2)
    raise SeatError(f"the seat's supervisor {supervisor_name(seat)} is still registered {timeout:.0f} s after "
                    "ray.kill", fix="run `sgl-seat down` again")
