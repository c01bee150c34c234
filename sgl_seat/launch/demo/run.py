"""The README's first command: the toolkit's main job, end to end, on the local-sim seat (or, with
``--seat local-sglang``, on real SGLang: the draft off, since its CPU engine cannot run one, and the stall a
SIGSTOP of the last rank's scheduler, a fault any real seat takes; a rehearsal seat also takes probe stalls through
`sgl-seat fault`).

`sgl-seat demo` brings the seat up with the draft on, sends it traffic, injects a host row-fetch stall on
rank 3 through the sim's own loopback admin route (the fault mechanism the sim offers; nothing here writes
a bundle), waits for the watchdog's bundle to appear, replays it offline (verdict, the gather-size bucket
where row-fetch latency explodes, the HTML report) and takes the seat down.

`down` runs in ``finally`` once `up` has returned: the demo never leaves a seat behind, whether a step
fails or the user presses Ctrl-C (an interrupted `up` takes itself down). The sim's answers, latencies and
token counts are synthetic; the watchdog, the capture and the replay are the toolkit's real code.

Timing of "seconds to bundle" (every clock is ``time.time()`` on this host: the local-sim seat's sidecars
run here): the start is the moment the admin route answered that the fault is armed in rank 3's process
(it fires at that rank's next forward step, within one step under traffic); ``detected`` is the bundle
trigger's time (the sidecar's detector fired: the stalled fetch had been in flight for the seat's
``watchdog.rowfetch_inflight_s``), ``written`` the manifest's ``created`` (every node's part assembled and
written), ``seen`` when this process's poll (every :data:`POLL_S`) found the complete bundle directory.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sgl_seat.core.nodeloss import names
from sgl_seat.engines import backend_for
from sgl_seat.errors import EngineError, SeatError, UsageError
from sgl_seat.forensics import verify_bundle
from sgl_seat.forensics.format.store import complete_bundles, wait_for_bundle
from sgl_seat.forensics.replay.bundle_html import render_html
from sgl_seat.forensics.replay.replayer import replay_bundle
from sgl_seat.launch.demo.clients import Answer, Load, ask
from sgl_seat.launch.rehearse import admin, admin_url
from sgl_seat.launch.seatrecord.home import host_id, seat_home
from sgl_seat.launch.seatrecord.record import SeatRecord, bundles_dir_of
from sgl_seat.launch.stages import NullReporter, Reporter, Stage, Stages, StageTimes
from sgl_seat.launch.teardown import down, sigint_ignored
from sgl_seat.launch.up import UpOptions, up
from sgl_seat.spec import SeatSpec

PROMPTS = (
    "In one sentence, what is a KV cache?",
    "Why can speculative decoding lower throughput on a shared server?",
    "Name one reason a multi-node launch hangs at startup.",
)

#: The rank whose host row fetch is stalled (the field report's hangs were on one rank of the second node).
STALL_RANK = 3
POLL_S = 0.2
#: The sim backend's name for a node's admin port, and the sim's fault route on it (sgl_seat.sim.front.admin; launch
#: may not import the sim itself, only its backend).
SYNTHETIC_NOTE = ("sim engine: answers, token counts and latencies are synthetic; the stall is injected through "
                  "the sim's fault route; the watchdog, capture and replay are the toolkit's real code")


#: Traffic before the stall: --quick, else a full minute (the stack history a bundle keeps before the hang,
#: as on a seat that has served a while).
QUICK_WARM_S = 5.0
FULL_WARM_S = 60.0
#: How long the demo waits for the bundle after the injection (the watchdog acceptance is 10 s).
BUNDLE_TIMEOUT_S = 30.0
#: The same on a real engine, whose stopped scheduler the watchdog names from unchanged stacks and no progress
#: (its detectors were tuned on the sim; issue 23 holds them to real schedulers).
REAL_BUNDLE_TIMEOUT_S = 120.0
#: After the warm-up, how long the traffic may still take to complete its first request (a loaded box).
FIRST_ANSWER_S = 30.0


@dataclass(frozen=True, slots=True)
class DemoOptions:
    """``quick``: one question and :data:`QUICK_WARM_S` of traffic before the stall, else three questions and
    :data:`FULL_WARM_S`. ``html``: where the report goes (default $SGLSEAT_HOME/reports/<seat>/<bundle id>.html)."""

    quick: bool = False
    html: Path | None = None
    up_timeout: float = 600.0

    @property
    def prompts(self) -> Sequence[str]:
        return PROMPTS[:1] if self.quick else PROMPTS

    @property
    def warm_s(self) -> float:
        return QUICK_WARM_S if self.quick else FULL_WARM_S

    @property
    def concurrency(self) -> int:
        return 4 if self.quick else 8


@dataclass(slots=True)
class DemoResult:
    """What the demo did and found; ``to_json`` is the ``demo --json`` document."""

    seat: str
    endpoint: str
    quick: bool
    synthetic: bool
    draft: bool = True
    stages: StageTimes = field(default_factory=StageTimes)
    substages: dict[str, list[Stage]] = field(default_factory=dict)  # `up`'s and `down`'s own
    answers: list[Answer] = field(default_factory=list)
    traffic: dict[str, int] = field(default_factory=dict)
    injection: dict[str, Any] = field(default_factory=dict)
    bundle: dict[str, Any] = field(default_factory=dict)
    verdict: dict[str, Any] | None = None
    verdict_matches_live: bool | None = None
    comparison: str | None = None
    exploding_bucket: dict[str, Any] | None = None
    other_buckets_max_ms: float | None = None
    html: str | None = None

    def to_json(self) -> dict[str, Any]:
        return {
            "seat": self.seat, "endpoint": self.endpoint, "draft": self.draft, "quick": self.quick,
            "synthetic": self.synthetic, "synthetic_note": SYNTHETIC_NOTE if self.synthetic else None,
            "total_s": round(self.stages.total(), 3),
            "stages": [{**s.to_json(), **({"stages": [x.to_json() for x in self.substages[s.name]]}
                                          if s.name in self.substages else {})} for s in self.stages.records],
            "answers": [{"prompt": a.prompt, "text": a.text, "completion_tokens": a.completion_tokens}
                        for a in self.answers],
            "traffic": self.traffic, "injection": self.injection, "bundle": self.bundle,
            "verdict": self.verdict,
            # the replayed verdict against the one the triggering sidecar reached live on its own node's view
            "verdict_matches_live": self.verdict_matches_live,
            "comparison": self.comparison,
            "exploding_bucket": self.exploding_bucket, "other_buckets_max_ms": self.other_buckets_max_ms,
            "html": self.html,
        }


def fault_words(injection: dict[str, Any]) -> str:
    """What the demo did to the seat, as its summary says it: a SIGSTOP is no stall."""
    if injection.get("fault") == "SIGSTOP":
        return f"the SIGSTOP of rank {injection['rank']}'s scheduler"
    return f"the stall on rank {injection['rank']}"


def waiting_words(ranks: Sequence[int]) -> str:
    """"rank 0 waits in a collective", "ranks 0, 1 wait in a collective", or that none does."""
    if not ranks:
        return "no rank waits in a collective"
    return f"{names(list(ranks))} {'waits' if len(ranks) == 1 else 'wait'} in a collective"


def stall_rank(spec: SeatSpec) -> int:
    """The rank the demo stalls: rank 3 on a sim seat (its row fetch), the last rank on a real one."""
    return STALL_RANK if backend_for(spec.engine).synthetic else spec.parallel.tp - 1


def demo_draft(spec: SeatSpec) -> bool:
    """The draft on, as the field report's seat ran, unless the engine cannot run it (SGLang's CPU engine)."""
    return backend_for(spec.engine).draft_problem(spec) is None


def check_spec(spec: SeatSpec) -> None:
    """A sim seat with a rank 3 (its row fetch is stalled through the sim's fault route), or a real seat whose
    nodes all run on this host (a scheduler is stopped with SIGSTOP, which needs its pid here)."""
    if not backend_for(spec.engine).synthetic:
        if spec.cluster.address != "local" or spec.parallel.tp < 2:
            raise UsageError(f"seat {spec.name} runs engine {spec.engine!r} on cluster {spec.cluster.address!r};"
                             " on a real engine the demo stalls a scheduler with SIGSTOP, which needs a seat of"
                             " TP >= 2 whose nodes all run on this host (cluster.address: local)",
                             fix="run `sgl-seat demo --seat local-sglang`, or without --seat (the sim seat)")
        return
    if spec.parallel.tp <= STALL_RANK:
        raise UsageError(f"seat {spec.name} has tp {spec.parallel.tp}: no rank {STALL_RANK} to stall",
                         fix="use a sim seat with tp 4 or more, e.g. the built-in local-sim")










@contextlib.contextmanager
def _stage(stages: Stages, name: str, detail: str) -> Iterator[dict[str, str]]:
    """One of the demo's own stages; Ctrl-C shows as "interrupted" on its line."""
    with stages.stage(name, detail) as note:
        try:
            yield note
        except KeyboardInterrupt:
            note["detail"] = "interrupted"
            raise


def run_demo(spec: SeatSpec, opts: DemoOptions, *, reporter: Reporter | None,
             say: Callable[[str], None]) -> DemoResult:
    """Up (draft on where the engine runs it), traffic, a stall on one rank, bundle, replay, HTML, always down."""
    check_spec(spec)
    synthetic = backend_for(spec.engine).synthetic
    draft = demo_draft(spec)
    res = DemoResult(seat=spec.name, endpoint="", quick=opts.quick, synthetic=synthetic, draft=draft)
    stages = Stages(reporter or NullReporter())
    stages.times = res.stages
    say(f"demo: seat {spec.name} from {spec.source}" + (" (quick)" if opts.quick else ""))
    if synthetic:
        say(f"({SYNTHETIC_NOTE})")
    word = "on" if draft else f"off ({backend_for(spec.engine).draft_problem(spec)})"
    say(f"\n[1/6] up, draft {word}")
    rec, times = up(spec, UpOptions(draft=draft, timeout=opts.up_timeout), reporter)
    res.stages.records.append(Stage("up", times.total(), f"READY at {rec.endpoint}"))
    res.substages["up"] = list(times.records)
    res.endpoint = rec.endpoint or ""
    load = Load(res.endpoint, spec.model.name, concurrency=opts.concurrency)  # halted by the cleanup on every path
    failed = True
    try:
        say(f"seat {rec.name} is READY at {res.endpoint} (draft {'on' if draft else 'off'}) in "
            f"{times.total():.1f} s")
        unwatched = [f"{w.name}: {w.detail}" for w in times.warnings() if w.name == "sidecars"]
        if rec.no_watchdog or unwatched:
            raise EngineError("the seat is up without its watchdog sidecars, so no stall would be caught: "
                              + ("; ".join(unwatched) or "the spec sets watchdog.enabled: false"),
                              fix="use a seat with the watchdog on; `up` prints why its sidecars did not start")
        _traffic(spec, opts, res, stages, say, load)
        if synthetic:
            _inject(rec, res, stages, say, bundles_dir_of(rec))  # where `up` told the sidecars to write
        else:
            _stop_scheduler(rec, stall_rank(spec), res, stages, say, bundles_dir_of(rec))
        _replay(spec, opts, res, stages, say)
        failed = False
    finally:
        with sigint_ignored():
            _cleanup(rec, load, res, reporter, say, failed)
    return res


def _traffic(spec: SeatSpec, opts: DemoOptions, res: DemoResult, stages: Stages, say: Callable[[str], None],
             load: Load) -> None:
    say(f"\n[2/6] traffic: {len(opts.prompts)} question(s), then {opts.concurrency} clients for "
        f"{opts.warm_s:.0f} s")
    with _stage(stages, "traffic", f"{opts.concurrency} clients") as note:
        for p in opts.prompts:
            a = ask(res.endpoint, spec.model.name, p)
            res.answers.append(a)
            text = a.text.strip()
            text = text if len(text) <= 100 else text[:100] + "..."
            say(f"> {a.prompt}\n  {text}  [{a.completion_tokens} tokens{', synthetic' if res.synthetic else ''}]")
        load.start()
        time.sleep(opts.warm_s)
        if not load.answered.wait(FIRST_ANSWER_S):  # the stall must interrupt traffic that flows
            raise EngineError(f"no request of the traffic completed in {opts.warm_s + FIRST_ANSWER_S:.0f} s "
                              f"({load.to_json()['requests_failed']} failed)", fix="see `sgl-seat logs --node 0`")
        res.traffic = load.to_json()
        note["detail"] = (f"{res.traffic['requests_ok']} requests, {res.traffic['completion_tokens']} tokens"
                          + (" (synthetic)" if res.synthetic else ""))


def _inject(rec: SeatRecord, res: DemoResult, stages: Stages, say: Callable[[str], None], bdir: Path) -> None:
    fault = f"rowfetch-stall:rank={STALL_RANK}"
    url, node = admin_url(rec, STALL_RANK)
    res.injection = {"fault": fault, "rank": STALL_RANK, "node": node, "admin_url": url, "armed_at": None}
    say(f"\n[3/6] inject a host row-fetch stall on rank {STALL_RANK} (node {node}) through the sim's fault route")
    with _stage(stages, "inject", f"{fault} -> {url}") as note:
        before = complete_bundles(bdir)
        admin("POST", url, {"fault": fault})
        t_inj = time.time()
        note["detail"] = f"{fault} armed on node {node} ({url})"
    res.injection["armed_at"] = t_inj
    _wait_bundle(res, stages, say, bdir, before, t_inj,
                 how=f"rerun with `sgl-seat up --draft on`, inject with `curl -X POST {url} -d "
                     f"'{{\"fault\": \"{fault}\"}}'` and follow `sgl-seat watch`",
                 start="the sim's fault route answered that the stall is armed")


def _stop_scheduler(rec: SeatRecord, rank: int, res: DemoResult, stages: Stages, say: Callable[[str], None],
                    bdir: Path) -> None:
    """A real engine has no fault route: stop ``rank``'s scheduler process with SIGSTOP (released in cleanup).

    Its peers then wait in the real all-reduce, as the field report's ranks waited on the stalled one.
    """
    node = next((n for n in rec.nodes if any(r.tp_rank == rank for r in n.ranks)), None)
    rk = None if node is None else next(r for r in node.ranks if r.tp_rank == rank)
    if node is None or rk is None or rk.pid is None or node.host_id != host_id():
        raise UsageError(f"rank {rank}'s scheduler is not a process of this host in seat {rec.name}'s record",
                         fix="run the demo on a local seat (cluster.address: local)")
    res.injection = {"fault": "SIGSTOP", "rank": rank, "node": node.node_rank, "pid": rk.pid, "title": rk.title,
                     "armed_at": None}
    say(f"\n[3/6] stop rank {rank}'s scheduler ({rk.title}, pid {rk.pid}, node {node.node_rank}) with SIGSTOP:"
        " a fault from outside the engine, which any real seat takes")
    with _stage(stages, "inject", f"SIGSTOP -> {rk.title} pid {rk.pid}") as note:
        before = complete_bundles(bdir)
        os.kill(rk.pid, signal.SIGSTOP)
        t_inj = time.time()
        note["detail"] = f"{rk.title} (pid {rk.pid}) stopped"
    res.injection["armed_at"] = t_inj
    _wait_bundle(res, stages, say, bdir, before, t_inj,
                 how=f"bring the seat up, `kill -STOP {rk.pid}` and follow `sgl-seat watch`",
                 start=f"SIGSTOP was sent to {rk.title}", timeout=REAL_BUNDLE_TIMEOUT_S)


def _wait_bundle(res: DemoResult, stages: Stages, say: Callable[[str], None], bdir: Path, before: set[Path],
                 t_inj: float, *, how: str, start: str, timeout: float | None = None) -> None:
    timeout = BUNDLE_TIMEOUT_S if timeout is None else timeout  # read at call time (tests shorten it)
    say(f"\n[4/6] wait for the watchdog's bundle under {bdir} (up to {timeout:g} s)")
    with _stage(stages, "bundle", f"watching {bdir}") as note:
        found = wait_for_bundle(bdir, before, timeout)
        if found is None:
            raise EngineError(f"no bundle under {bdir} within {timeout:g} s of the injected stall",
                              fix=f"the watchdog sidecars log through Ray; {how}")
        path, t_seen = found
        m = verify_bundle(path)  # checksums and manifest, as `replay` checks them
        res.bundle = {
            "id": m.bundle_id, "path": str(path), "verified": True,
            "detected_after_s": round(m.trigger_t - t_inj, 3),
            "written_after_s": round(m.created - t_inj, 3),
            "seen_after_s": round(t_seen - t_inj, 3),
            "timing": f"seconds after {start} (time.time() on this "
                      "host): detected = the bundle trigger's time (the sidecar's detector fired), written = the "
                      f"manifest's created time, seen = this process's poll (every {POLL_S:g} s) found it",
        }
        note["detail"] = f"{m.bundle_id}, {res.bundle['seen_after_s']:.1f} s after the injection"
    say(f"bundle {m.bundle_id}: trigger {res.bundle['detected_after_s']:.1f} s, written "
        f"{res.bundle['written_after_s']:.1f} s, seen {res.bundle['seen_after_s']:.1f} s after the injection "
        f"(checksums verified)\n  {path}")


def _replay(spec: SeatSpec, opts: DemoOptions, res: DemoResult, stages: Stages, say: Callable[[str], None]) -> None:
    say("\n[5/6] replay the bundle offline")
    path = Path(res.bundle["path"])
    html = opts.html or seat_home() / "reports" / spec.name / f"{res.bundle['id']}.html"
    with _stage(stages, "replay", str(path)) as note:
        result = replay_bundle(path)
        html.parent.mkdir(parents=True, exist_ok=True)
        html.write_text(render_html(result), encoding="utf-8")
        doc = result.to_json()
        v = doc["verdict"]
        res.verdict = None if v is None else {k: v[k] for k in ("kind", "rank", "node", "frame", "waiting_ranks")}
        res.verdict_matches_live = result.live_matches
        res.comparison = result.comparison
        rf = doc["rowfetch"]
        # Only the verdict's own cause: a row-fetch stall's bucket (forensics.replay.agree), never the loudest one.
        res.exploding_bucket = rf["cause_bucket"]
        worst = rf["cause_bucket"]
        others = [b["max_ms"] for b in rf["buckets"]
                  if worst is None or b["gather_size_min"] != worst["gather_size_min"]]
        res.other_buckets_max_ms = max(others) if others else None
        res.html = str(html)
        note["detail"] = f"verdict: {'none' if v is None else v['kind']}"
    syn = " (synthetic latencies)" if res.synthetic else ""
    if v is None:
        say("verdict: none (the replayed detectors found no hang)")
    else:
        say(f"verdict: {v['kind']} on rank {v['rank']}, node {v['node']}, in {v['frame']}")
        say(f"  {waiting_words(v['waiting_ranks'])}")
        say(f"  {res.comparison}")
    if worst is not None:
        say(f"exploding bucket: gather {worst['gather_size_min']}-{worst['gather_size_max']} rows, max "
            f"{worst['max_ms']:,.0f} ms" + (f" (every other bucket: max {res.other_buckets_max_ms:,.0f} ms)"
                                           if res.other_buckets_max_ms is not None else "") + syn)
    say(f"HTML report: {html}")


def _cleanup(rec: SeatRecord, load: Load, res: DemoResult, reporter: Reporter | None,
             say: Callable[[str], None], failed: bool) -> None:
    """Release the stall (so in-flight requests finish), stop the traffic, take the seat down.

    After a failure the first error is the one the user sees: a cleanup error is only printed then.
    """
    say("\n[6/6] down")
    load.halt()
    if res.injection.get("admin_url"):  # the fault route was about to be called, or was: disarm (harmless)
        with contextlib.suppress(SeatError):
            admin("DELETE", res.injection["admin_url"])
    if res.injection.get("pid"):  # a stopped scheduler: let it go on, so that `down` drains a live tree
        with contextlib.suppress(OSError):
            os.kill(res.injection["pid"], signal.SIGCONT)
    if load.started:
        load.stop(10.0)
        res.traffic = load.to_json()
    try:
        times = down(rec.name, reporter)
    except SeatError as exc:
        if not failed:
            raise
        say(f"down failed too: {exc}")
        return
    res.stages.records.append(Stage("down", times.total(), "no engine process remains"))
    res.substages["down"] = list(times.records)
    say(f"seat {rec.name} is down in {times.total():.1f} s; no engine process remains")
    if not failed and res.verdict is not None:
        v = res.verdict
        say(f"\ndemo done in {res.stages.total():.1f} s of stages: {fault_words(res.injection)} "
            f"was captured {res.bundle['seen_after_s']:.1f} s after the injection and diagnosed as "
            f"{v['kind']} on rank {v['rank']}, node {v['node']}")
