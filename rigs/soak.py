#!/usr/bin/env python3
"""Soak and fault campaign for the watchdog: does it stay quiet on healthy work, and how fast does it catch faults?

A two-node local sim seat (rigs/simrig.py: no Ray, in-process sidecars at the default thresholds of
``watchdog/thresholds.yaml``), draft off for the first half of the run and draft on for the second, under
background ``/generate`` traffic (client processes of its own). Healthy episodes, each kind once on each seat first,
then at random between faults as the time allows:

- ``idle``: every client stops for 5-20 s (the seat idles, then traffic comes back);
- ``burst``: clients past the slot cap (32 draft off, 8 draft on) for 8-15 s, so requests queue;
- ``prefill``: one uncached 400,000-token prompt while the background traffic runs. The sim's prefill cost is set
  (``SGLSEAT_SIM_PREFILL_TOKEN_MS``, SYNTHETIC) so that this prompt is one forward of >= 30 s on every rank;
- ``slow``: one rank 5x slower but alive (``slow:factor=5``) for 15-25 s.

Faults, ``--faults`` of each kind (default 20) at random times and random ranks, each followed by recovery:

- ``stall``: a CPU-side row-fetch stall at a random step and gather size (``rowfetch-stall:after_steps,gather_ge``);
  recovery: the stall is cleared through the sim's admin route and the watchdog re-arms on its own;
- ``slow-stall``: the rank's row fetches slowed for 2-6 s, then stalled (``slow-stall``); recovery as above;
- ``crash``: the rank is SIGKILLed at a random step; recovery: the seat (and its sidecars) restarted, as `up`
  would (the sim cannot restart one rank).

When each fault began is taken from the engine's side, not the watchdog's: a stall from the probe record of the
stalled fetch (its start), a crash from a 10 ms poll of the rank's pid by this script. The table gives false bundles
per hour of healthy traffic (bundles while no fault was active and the watchdog was armed), per fault kind the
latency from the fault to the bundle on disk (p50/p95/max), from the fault passing the detector's own threshold to
the detection and to the bundle (a stall is a stall once a fetch is ``rowfetch_inflight_s`` = 3 s late: "stall ->
bundle", target p95 <= 3 s; a crash has no threshold), misses (a fault that fired with no bundle within 30 s) and
wrong verdicts (a bundle naming another kind or rank), and how many native stacks the fault bundles hold (a
capture takes them inside a budget after the Python ones; the rest keep their Python stack). ``--minutes`` is the
planned length: every fault is injected even if that stretches it (a crash's recovery is a seat restart, tens of
seconds on a loaded box).
Every engine figure is SYNTHETIC (the sim). Ports 30800-30899. With ``--seat local-sglang`` the soak runs on real
SGLang instead (bench/realsoak.py says how). Usage::

    python bench/watchdog_soak.py [--minutes 30] [--faults 20] [--seed 1] [--json]
    python bench/watchdog_soak.py --seat local-sglang [--minutes 30] [--faults 5]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import httpx

# The rigs are not in the wheel: import them from the checkout (this file also runs as the client process).
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from rigs.simrig import SimSeat, Traffic, sim_spec
from sgl_seat.core.records import VerdictKind
from sgl_seat.procstate import pid_state
from sgl_seat.sim.args import ENV_PREFILL_MS
from sgl_seat.spec import WatchdogSpec
from sgl_seat.watchdog.sidecar import Sidecar

#: SYNTHETIC prefill cost (ms per uncached prompt token): a 400k-token prompt is one forward of about 32 s
#: (draft on: 40 s, the draft-extend factor 1.25 on top).
PREFILL_TOKEN_MS = 0.08
LONG_PROMPT = 400_000
BASE_PORT = 30800  # draft off: 30800-30816; draft on: 30840-30856 (the CI test passes its own: 30860-30876)
FAULT_KINDS = ("stall", "slow-stall", "crash")
HEALTHY_KINDS = ("idle", "burst", "prefill", "slow")
MISS_AFTER_S = 30.0  # a fault that fired and has no bundle this long after is a miss
FIRE_WITHIN_S = 30.0  # a fault that has not fired this long after it was armed is "not fired"
REARM_WITHIN_S = 60.0
BACKGROUND_CONCURRENCY = 4
#: What each kind's verdict must be, and the detector threshold it waits out before it may fire.
EXPECTED = {"stall": VerdictKind.ROWFETCH_STALL, "slow-stall": VerdictKind.ROWFETCH_STALL,
            "crash": VerdictKind.PROCESS_EXITED}


@dataclass
class FaultResult:
    """One injected fault and what the watchdog made of it."""

    kind: str
    draft: bool
    rank: int
    spec: str
    armed_at: float
    began_at: float | None = None  # the engine-side start (stalled fetch's start, the pid's death)
    detected_at: float | None = None
    written_at: float | None = None
    verdict: str | None = None
    verdict_rank: int | None = None
    outcome: str = "pending"  # caught | miss | wrong | not fired
    extra_bundles: int = 0
    recovery: str = ""
    native: tuple[int, int] | None = None  # (native stacks captured, processes dumped) in its bundle
    collect_s: float | None = None  # of detection -> bundle: the nodes' parts (stack dumps), then writing it
    assemble_s: float | None = None

    def latency(self) -> float | None:
        return None if self.written_at is None or self.began_at is None else self.written_at - self.began_at


@dataclass
class Episode:
    kind: str
    draft: bool
    start: float
    end: float
    counted_s: float  # healthy seconds (watchdog armed, no fault active)
    detail: str = ""


@dataclass
class SoakReport:
    minutes: float
    seed: int
    thresholds: dict[str, Any]
    faults: list[FaultResult] = field(default_factory=list)
    episodes: list[Episode] = field(default_factory=list)
    healthy_s: float = 0.0
    false_bundles: list[dict[str, Any]] = field(default_factory=list)
    not_injected: dict[str, int] = field(default_factory=dict)
    seat_starts: int = 0
    load: list[tuple[float, float, float]] = field(default_factory=list)
    wall_s: float = 0.0
    prefill_forward_s: list[float] = field(default_factory=list)
    probe_read_errors: int = 0

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def percentile(xs: list[float], q: float) -> float:
    """Nearest-rank percentile (no interpolation: with a small sample p95 is an observed value)."""
    s = sorted(xs)
    return s[max(0, math.ceil(q / 100 * len(s)) - 1)]


@contextlib.contextmanager
def _env(name: str, value: str) -> Iterator[None]:
    old = os.environ.get(name)
    os.environ[name] = value
    try:
        yield
    finally:
        if old is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old


class Rig:
    """One seat generation with its sidecars, its background traffic, and the bookkeeping of bundles."""

    def __init__(self, draft: bool, workdir: Path, report: SoakReport, rng: random.Random,
                 log: Callable[[str], None], base_port: int = BASE_PORT) -> None:
        self.draft = draft
        self.workdir = workdir
        self.report = report
        self.rng = rng
        self.log = log
        self.port = base_port + (40 if draft else 0)
        self.seat: SimSeat | None = None
        self.sidecars: dict[int, Sidecar] = {}
        self.background: TrafficProc | None = None
        self.seen: set[str] = set()  # bundle paths already attributed
        self.all_sidecars: list[Sidecar] = []
        self.th = WatchdogSpec()

    @property
    def slot_cap(self) -> int:
        return 8 if self.draft else 32

    # ---- seat life cycle

    def start(self) -> None:
        # The port in the name: a seat's probe rings live under /dev/shm/sgl-seat-<name>, so two soaks at once (the
        # bench and the CI test) must differ in name as in ports (one run's sidecars removed the other's rings).
        name = f"soak-{'on' if self.draft else 'off'}-{self.port}"
        spec = sim_spec(name, self.port, **self.th.model_dump())  # every watchdog key at its default
        gen = self.report.seat_starts
        self.seat = SimSeat(spec, draft=self.draft, workdir=self.workdir / f"{name}-{gen}")
        t0 = time.time()
        with _env(ENV_PREFILL_MS, str(PREFILL_TOKEN_MS)):
            self.seat.start()
        self.report.seat_starts += 1
        self.sidecars = self.seat.sidecars(self.workdir / "bundles", gpu=False)
        self.all_sidecars += list(self.sidecars.values())
        for s in self.sidecars.values():
            s.start()
        self.start_background()
        self.log(f"seat {name} (draft {'on' if self.draft else 'off'}) up in {time.time() - t0:.1f} s")
        time.sleep(6.0)  # stack history and metrics before anything is judged

    def stop(self) -> None:
        self.stop_background()
        for s in self.sidecars.values():
            s.stop()
            self.report.probe_read_errors += s.probes.errors if s.probes is not None else 0
        if self.seat is not None:
            self.seat.stop()
        self.sidecars = {}

    def restart(self) -> None:
        self.stop()
        self.start()

    def start_background(self) -> None:
        assert self.seat is not None
        self.background = TrafficProc(self.seat.url, concurrency=BACKGROUND_CONCURRENCY, max_new_tokens=48,
                                      seed=self.rng.randrange(1 << 30))

    def stop_background(self) -> None:
        if self.background is not None:
            self.background.stop(30)
            self.background = None

    # ---- watchdog state

    def armed(self) -> bool:
        return all(s.latched_at is None for s in self.sidecars.values())

    def wait_armed(self, timeout: float = REARM_WITHIN_S) -> bool:
        deadline = time.time() + timeout
        while time.time() < deadline:
            if self.armed():
                return True
            time.sleep(0.25)
        return False

    def new_bundles(self) -> list[dict[str, Any]]:
        out = []
        for s in self.all_sidecars:
            for d in list(s.bundles):
                if d["path"] not in self.seen:
                    self.seen.add(d["path"])
                    out.append(d)
        return sorted(out, key=lambda d: float(d["detected_at"]))

    def file_false(self, docs: list[dict[str, Any]], where: str) -> None:
        for d in docs:
            v = d.get("verdict") or {}
            self.report.false_bundles.append({"where": where, "draft": self.draft, "path": d["path"],
                                              "kind": v.get("kind"), "rank": v.get("rank"),
                                              "evidence": (v.get("evidence") or [])[:2]})
            self.log(f"  FALSE BUNDLE during {where}: {v.get('kind')} rank {v.get('rank')} {d['path']}")

    # ---- healthy episodes

    def healthy(self, kind: str) -> None:
        if not self.wait_armed():
            self.log("  watchdog did not re-arm; restarting the seat")
            self.restart()
        self.file_false(self.new_bundles(), "recovery")
        t0 = time.time()
        detail = getattr(self, f"_ep_{kind.replace('-', '_')}")()
        t1 = time.time()
        false = self.new_bundles()
        self.file_false(false, kind)
        counted = t1 - t0
        self.report.healthy_s += counted
        self.report.episodes.append(Episode(kind, self.draft, t0, t1, counted, detail))
        self.log(f"  healthy {kind:8} {t1 - t0:6.1f} s {detail}")

    def _ep_idle(self) -> str:
        self.stop_background()
        gap = self.rng.uniform(5, 20)
        time.sleep(gap)
        self.start_background()
        time.sleep(3)
        return f"idle gap {gap:.0f} s"

    def _ep_burst(self) -> str:
        assert self.seat is not None
        n = self.slot_cap + self.rng.randint(8, 16)
        dur = self.rng.uniform(8, 15)
        burst = TrafficProc(self.seat.url, concurrency=n, max_new_tokens=32, seed=self.rng.randrange(1 << 30))
        time.sleep(dur)
        done = burst.stop(60)
        return (f"{n} clients (cap {self.slot_cap}) for {dur:.0f} s, {done.get('completed')} done, "
                f"{done.get('errors')} errors")

    def _ep_prefill(self) -> str:
        assert self.seat is not None
        ids = [self.rng.randrange(256, 4352) for _ in range(LONG_PROMPT)]  # uncached: fresh random ids
        body = {"input_ids": ids, "sampling_params": {"max_new_tokens": 4, "ignore_eos": True}}
        t0 = time.time()
        with httpx.Client(timeout=300.0, trust_env=False) as c:
            r = c.post(f"{self.seat.url}/generate", json=body)
        took = time.time() - t0
        ok = r.status_code == 200
        meta = r.json().get("meta_info", {}) if ok else {}
        if ok:
            self.report.prefill_forward_s.append(took)
        return (f"{LONG_PROMPT}-token prompt: HTTP {r.status_code}, {took:.1f} s to its answer"
                f" (prompt_tokens {meta.get('prompt_tokens')})")

    def _ep_slow(self) -> str:
        assert self.seat is not None
        rank = self.rng.randrange(4)
        dur = self.rng.uniform(15, 25)
        self.seat.inject(f"slow:rank={rank},factor=5,for_s={dur:.1f}", rank)
        time.sleep(dur + 2)
        self.seat.clear_faults()
        return f"rank {rank} 5x slower for {dur:.0f} s"

    # ---- faults

    def _rank_pid(self, rank: int) -> int:
        assert self.seat is not None and self.seat.plan is not None
        node = self.seat.plan.topology.node_of(rank)
        r = httpx.get(f"{self.seat.admin_url(node)}/sim/ranks", timeout=10.0, trust_env=False)
        r.raise_for_status()
        return int(next(x["pid"] for x in r.json()["ranks"] if x["tp_rank"] == rank))

    def fault(self, kind: str) -> FaultResult:
        assert self.seat is not None and self.seat.plan is not None
        if not self.wait_armed():
            self.restart()
        self.file_false(self.new_bundles(), "before a fault")
        # A healthy lead-in of random length: faults land at random times (and it counts as healthy time).
        lead = self.rng.uniform(1.0, 6.0)
        time.sleep(lead)
        self.file_false(self.new_bundles(), "lead-in")
        self.report.healthy_s += lead
        rank = self.rng.randrange(4)
        steps = self.seat.forward_count(0) + self.rng.randint(1, 60)
        if kind == "stall":
            spec = f"rowfetch-stall:rank={rank},after_steps={steps},gather_ge={self.rng.choice((1, 4, 8, 16, 32, 64))}"
        elif kind == "slow-stall":
            spec = (f"slow-stall:rank={rank},ms={self.rng.choice((50, 100, 200, 400))},"
                    f"slow_s={self.rng.uniform(2, 6):.1f},after_steps={steps}")
        else:
            spec = f"crash:rank={rank},after_steps={steps}"
        res = FaultResult(kind=kind, draft=self.draft, rank=rank, spec=spec, armed_at=time.time())
        died = threading.Event()
        death: list[float] = []
        watcher = None
        if kind == "crash":
            pid = self._rank_pid(rank)
            watcher = threading.Thread(target=_watch_pid, args=(pid, death, died), daemon=True)
            watcher.start()
        self.seat.inject(spec, rank)
        res.armed_at = time.time()
        self._await(res, died, death)
        if watcher is not None:
            died.set()
            watcher.join(2)
        self._recover(res)
        return res

    def _stall_start(self, rank: int, since: float) -> float | None:
        """The start of rank's first fetch since ``since`` that was (or is) late by the stall threshold."""
        assert self.seat is not None and self.seat.plan is not None
        sc = self.sidecars.get(self.seat.plan.topology.node_of(rank))
        if sc is None or sc.probes is None:
            return None
        now = time.time()
        late = [p.start for p in sc.probes.records() if p.rank == rank and p.start >= since - 1.0
                and p.duration(now) >= self.th.rowfetch_inflight_s]
        return min(late) if late else None

    def _await(self, res: FaultResult, died: threading.Event, death: list[float]) -> None:
        deadline_fire = res.armed_at + FIRE_WITHIN_S + (6.0 if res.kind == "slow-stall" else 0.0)
        while True:
            time.sleep(0.1)
            now = time.time()
            if res.began_at is None:
                if res.kind == "crash":
                    if death:
                        res.began_at = death[0]
                else:
                    res.began_at = self._stall_start(res.rank, res.armed_at)
            docs = self.new_bundles()
            if docs:
                d, extra = docs[0], docs[1:]
                v = d.get("verdict") or {}
                res.detected_at, res.written_at = float(d["detected_at"]), float(d["written_at"])
                res.verdict, res.verdict_rank = v.get("kind"), v.get("rank")
                if res.began_at is None and res.kind != "crash":
                    res.began_at = self._stall_start(res.rank, res.armed_at)
                ok = res.verdict == EXPECTED[res.kind].value and res.verdict_rank == res.rank
                res.native = _native_count(d.get("path"))
                if isinstance(d.get("collect_s"), float) and isinstance(d.get("seconds"), float):
                    # the sidecar's collect_s runs from the capture's start to the bundle written (parts + writing)
                    res.collect_s, res.assemble_s = d["collect_s"] - d["seconds"], d["seconds"]
                res.outcome = "caught" if ok else "wrong"
                if res.began_at is None:  # a bundle, but the fault never fired: the bundle is not its
                    self.file_false([d], f"{res.kind} armed, not yet fired")
                    res.outcome = "pending"
                    res.detected_at = res.written_at = None
                    res.verdict = None
                    res.verdict_rank = None
                else:
                    res.extra_bundles += len(extra)
                    return
            if res.began_at is None and now > deadline_fire:
                res.outcome = "not fired"
                return
            if res.began_at is not None and now > res.began_at + MISS_AFTER_S:
                res.outcome = "miss"
                return

    def _recover(self, res: FaultResult) -> None:
        assert self.seat is not None
        if res.kind == "crash" or res.outcome in ("miss",):
            self.restart()
            res.recovery = "seat restarted"
        else:
            self.seat.clear_faults()
            if self.wait_armed():
                res.recovery = "stall cleared; watchdog re-armed"
            else:
                self.restart()
                res.recovery = "stall cleared; no re-arm: seat restarted"
        if res.outcome == "not fired":
            self.seat.clear_faults()
        res.extra_bundles += len(self.new_bundles())


class TrafficProc:
    """Client threads (rigs.simrig.Traffic) in a process of their own: in this process they would contend for
    the GIL with the in-process sidecars and delay their polling, which a seat's sidecars (Ray actors, one
    process each) do not suffer."""

    def __init__(self, url: str, *, concurrency: int, max_new_tokens: int, seed: int) -> None:
        args = json.dumps({"url": url, "concurrency": concurrency, "max_new_tokens": max_new_tokens, "seed": seed})
        self.proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--traffic", args],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
        assert self.proc.stdout is not None
        self.proc.stdout.readline()  # "ready": its clients are sending (imports take seconds on a loaded box)

    def stop(self, timeout: float = 30.0) -> dict[str, Any]:
        """Stop the clients (SIGTERM; they finish their requests); their counts."""
        self.proc.send_signal(signal.SIGTERM)
        try:
            out, _ = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, _ = self.proc.communicate()
        try:
            doc = json.loads(out.decode().strip().splitlines()[-1])
        except (ValueError, IndexError):
            return {}
        return doc if isinstance(doc, dict) else {}


def _traffic_main(args: str) -> int:
    """``--traffic JSON``: run clients until SIGTERM, then print their counts as one JSON line."""
    a = json.loads(args)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    t = Traffic(a["url"], concurrency=a["concurrency"], max_new_tokens=a["max_new_tokens"], seed=a["seed"]).start()
    print("ready", flush=True)
    while not done.wait(0.5):
        pass
    t.stop(30)
    print(json.dumps({"completed": t.ok, "errors": t.failed, "tokens": t.tokens}), flush=True)
    return 0


def _native_count(path: str | None) -> tuple[int, int] | None:
    """(native stacks captured, processes dumped) from a bundle's capture steps: the capture takes native dumps
    inside a budget (watchdog/capture.py NATIVE_BUDGET_S) and says which missed it."""
    if not path:
        return None
    try:
        steps = json.loads((Path(path) / "manifest.json").read_text())["capture"]
    except (OSError, ValueError, KeyError):
        return None
    native = [st for st in steps if str(st.get("step", "")).startswith("py-spy --native ")]
    return sum(1 for st in native if st.get("status") == "ok"), len(native)


def _watch_pid(pid: int, out: list[float], stop: threading.Event) -> None:
    """Poll ``pid`` every 10 ms; record when it dies (gone or a zombie): the crash's engine-side time."""
    while not stop.is_set():
        if pid_state(pid) in (None, "Z", "X"):
            out.append(time.time())
            return
        time.sleep(0.01)


def _plan(rng: random.Random, faults: dict[str, int], drafts: tuple[bool, ...]) -> dict[bool, list[str]]:
    """Faults split over the drafts (first draft gets the odd one), shuffled."""
    out: dict[bool, list[str]] = {d: [] for d in drafts}
    for kind in FAULT_KINDS:
        for i in range(faults.get(kind, 0)):
            out[drafts[i % len(drafts)]].append(kind)
    for d in drafts:
        rng.shuffle(out[d])
    return out


#: Rough seconds one fault costs (lead-in, detection, recovery; a crash restarts the seat), to budget time.
FAULT_COST_S = {"stall": 20.0, "slow-stall": 25.0, "crash": 40.0}
HEALTHY_COST_S = {"idle": 18.0, "burst": 15.0, "prefill": 45.0, "slow": 25.0}


def run_soak(*, minutes: float, faults: dict[str, int], seed: int, workdir: Path, base_port: int = BASE_PORT,
             drafts: tuple[bool, ...] = (False, True), healthy_first: tuple[str, ...] = (),
             log: Callable[[str], None] = print) -> SoakReport:
    """The whole campaign; returns the report (print it with :func:`table`).

    ``faults``: how many of each kind (split over ``drafts``); ``healthy_first``: episodes run on every seat
    before anything else whatever the time budget (the CI version's long prefill)."""
    rng = random.Random(seed)  # the campaign's shape, not a secret
    report = SoakReport(minutes=minutes, seed=seed, thresholds=WatchdogSpec().model_dump())
    t_start = time.time()
    deadline = t_start + minutes * 60
    plan = _plan(rng, faults, drafts)
    stop_load = threading.Event()
    loader = threading.Thread(target=_sample_load, args=(report.load, stop_load), daemon=True)
    loader.start()
    try:
        for i, draft in enumerate(drafts):
            share_end = t_start + (deadline - t_start) * (i + 1) / len(drafts)
            todo = plan[draft]
            rig = Rig(draft, workdir, report, rng, log, base_port)
            rig.start()
            try:
                # Every healthy kind at least once per draft (while the faults' time allows), then at random;
                # faults interleaved. The faults are all injected even if that stretches the run.
                healthy_cycle = list(HEALTHY_KINDS)
                rng.shuffle(healthy_cycle)
                for kind in healthy_first:
                    rig.healthy(kind)
                    healthy_cycle.remove(kind)
                while todo or share_end - time.time() > 15:
                    spare = share_end - time.time() - sum(FAULT_COST_S[k] for k in todo)
                    fits = [k for k in HEALTHY_KINDS if HEALTHY_COST_S[k] <= spare] or ["idle"]
                    nxt = healthy_cycle[0] if healthy_cycle else rng.choice(fits)
                    if not todo or spare > HEALTHY_COST_S[nxt] * 0.5:
                        if healthy_cycle:
                            healthy_cycle.pop(0)
                        rig.healthy(nxt)
                    if todo:
                        kind = todo.pop(0)
                        res = rig.fault(kind)
                        report.faults.append(res)
                        lat = res.latency()
                        log(f"  fault {kind:10} rank {res.rank} {res.outcome:9} "
                            + (f"{lat:5.2f} s to bundle" if lat is not None else "")
                            + f" ({res.verdict} rank {res.verdict_rank}; {res.recovery})")
            finally:
                rig.stop()
                rig.file_false(rig.new_bundles(), "end")
    finally:
        stop_load.set()
        loader.join(2)
        report.wall_s = time.time() - t_start
    return report


def _sample_load(out: list[tuple[float, float, float]], stop: threading.Event) -> None:
    while not stop.wait(30):
        out.append(os.getloadavg())


def table(r: SoakReport) -> str:
    """The result table (what the issue asks for), as text."""
    th = r.thresholds
    lines = ["", f"watchdog soak: {r.wall_s / 60:.1f} min wall, seed {r.seed}, sim engine (every engine figure "
             "SYNTHETIC), thresholds at their defaults: "
             + ", ".join(f"{k}={th[k]}" for k in ("sample_hz", "no_progress_s", "stack_unchanged_samples",
                                                  "rowfetch_inflight_s"))]
    hours = r.healthy_s / 3600
    eps: dict[str, list[float]] = {}
    for e in r.episodes:
        eps.setdefault(e.kind, []).append(e.counted_s)
    lead = r.healthy_s - sum(e.counted_s for e in r.episodes)
    lines.append(f"healthy traffic watched: {r.healthy_s / 60:.1f} min ("
                 + ", ".join(f"{k} x{len(eps.get(k, []))} {sum(eps.get(k, [])) / 60:.1f} min" for k in HEALTHY_KINDS)
                 + f", lead-ins before faults {lead / 60:.1f} min)")
    if r.prefill_forward_s:
        lines.append(f"long prefills ({LONG_PROMPT} tokens): answered in "
                     + ", ".join(f"{s:.0f}" for s in r.prefill_forward_s) + " s")
    fb = len(r.false_bundles)
    rate = fb / hours if hours > 0 else float("nan")
    lines.append(f"false bundles: {fb} in {hours:.2f} h of healthy traffic = {rate:.1f} per hour   (target 0)")
    for fb_doc in r.false_bundles:
        lines.append(f"  false: during {fb_doc['where']} (draft {'on' if fb_doc['draft'] else 'off'}): "
                     f"{fb_doc['kind']} rank {fb_doc['rank']}: {'; '.join(fb_doc['evidence'])[:160]}")
    lines.append("")
    hdr = (f"{'fault kind':12}{'n':>4}{'caught':>8}{'miss':>6}{'wrong':>7}{'unfired':>9}  "
           f"{'fault->bundle':>20}  {'past threshold->detect':>23}  {'past threshold->bundle':>23}")
    lines.append(hdr + f"{'target':>13}")
    lines.append(f"{'':12}{'':>4}{'':>8}{'':>6}{'':>7}{'':>9}  {'p50/p95/max (s)':>20}  {'p50/p95/max (s)':>23}  "
                 f"{'p50/p95/max (s)':>23}")
    lines.append("-" * (len(hdr) + 13))
    for kind in FAULT_KINDS:
        rs = [f for f in r.faults if f.kind == kind]
        done = [f for f in rs if f.outcome in ("caught", "wrong") and f.latency() is not None]
        thr = th["rowfetch_inflight_s"] if kind != "crash" else 0.0
        cnt = {o: sum(1 for f in rs if f.outcome == o) for o in ("caught", "miss", "wrong", "not fired")}
        cols = []
        for xs in ([f.latency() or 0.0 for f in done],
                   [(f.detected_at or 0.0) - (f.began_at or 0.0) - thr for f in done],
                   [(f.latency() or 0.0) - thr for f in done]):
            cols.append(f"{percentile(xs, 50):.2f}/{percentile(xs, 95):.2f}/{max(xs):.2f}" if xs else "-")
        lines.append(f"{kind:12}{len(rs):>4}{cnt['caught']:>8}{cnt['miss']:>6}{cnt['wrong']:>7}"
                     f"{cnt['not fired']:>9}  {cols[0]:>20}  {cols[1]:>23}  {cols[2]:>23}{'p95 <= 3.00':>13}")
    extra = sum(f.extra_bundles for f in r.faults)
    lines.append(f"extra bundles inside fault windows (one fault, one bundle): {extra}")
    for name, xs in (("collecting the nodes' parts", [f.collect_s for f in r.faults if f.collect_s is not None]),
                     ("writing the bundle", [f.assemble_s for f in r.faults if f.assemble_s is not None])):
        if xs:
            lines.append(f"of detection -> bundle, {name}: p50 {percentile(xs, 50):.2f} s, "
                         f"p95 {percentile(xs, 95):.2f} s, max {max(xs):.2f} s")
    nat = [f.native for f in r.faults if f.native is not None]
    if nat:
        lines.append(f"native stacks in the fault bundles: {sum(n[0] for n in nat)} of {sum(n[1] for n in nat)} "
                     "processes inside the capture's native budget (the others kept their Python stack, and the "
                     "bundle says so)")
    for f in r.faults:
        if f.outcome in ("miss", "wrong"):
            lines.append(f"  {f.outcome}: {f.kind} {f.spec} (draft {'on' if f.draft else 'off'}): verdict "
                         f"{f.verdict} rank {f.verdict_rank}")
    if r.not_injected:
        lines.append(f"not injected (time ran out): {r.not_injected}")
    lines.append(f"seat starts: {r.seat_starts}; probe ring read errors: {r.probe_read_errors}")
    if r.load:
        one = [x[0] for x in r.load]
        lines.append(f"load average (1 min) while it ran: min {min(one):.2f}, median {percentile(one, 50):.2f}, "
                     f"max {max(one):.2f} (2 cores)")
    return "\n".join(lines)


def main(real: Callable[[argparse.Namespace], int] | None = None) -> int:
    """The soak's command line; ``real`` runs ``--seat local-sglang`` (bench/watchdog_soak.py passes it)."""
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--minutes", type=float, default=30.0, help="length of the soak (faults may stretch it)")
    ap.add_argument("--faults", type=int, default=None,
                    help="faults of each kind (split over draft off and on; default 20); with --seat local-sglang, "
                         "probe stalls per seat (default 5, on each of the two seats)")
    ap.add_argument("--seat", choices=("local-sglang",), default=None,
                    help="soak real SGLang through `sgl-seat up` instead of the sim (bench/realsoak.py)")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--draft", choices=("both", "on", "off"), default="both")
    ap.add_argument("--keep", action="store_true", help="keep the work directory (bundles, logs)")
    ap.add_argument("--json", action="store_true", help="also print the raw report as JSON")
    ap.add_argument("--traffic", help=argparse.SUPPRESS)  # internal: the client process (TrafficProc)
    a = ap.parse_args()
    if a.traffic:
        return _traffic_main(a.traffic)
    if a.seat:
        if real is None:
            ap.error("--seat local-sglang runs from bench/watchdog_soak.py")
        return real(a)
    if a.faults is None:
        a.faults = 20
    home = Path(os.environ.get("SGLSEAT_HOME") or tempfile.gettempdir())
    home.mkdir(parents=True, exist_ok=True)
    work = Path(tempfile.mkdtemp(prefix="watchdog-soak-", dir=home))
    drafts = {"both": (False, True), "on": (True,), "off": (False,)}[a.draft]

    def log(msg: str) -> None:
        print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)

    import sgl_seat

    log(f"watchdog soak: {a.minutes} min, {a.faults} faults of each kind, work dir {work}, code from "
        f"{Path(sgl_seat.__file__).parent}")
    try:
        rep = run_soak(minutes=a.minutes, faults=dict.fromkeys(FAULT_KINDS, a.faults), seed=a.seed, workdir=work,
                       drafts=drafts, healthy_first=HEALTHY_KINDS, log=log)
    finally:
        if not a.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(table(rep))
    if a.json:
        print(json.dumps(rep.to_json(), indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
