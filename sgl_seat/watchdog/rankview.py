"""Per-rank summaries for ``watch``: state, top frame, row-fetch percentiles, in-flight age; tokens/s.

Pure functions over an :class:`~sgl_seat.core.observation.Observation` and ``now``; the sidecar puts
their JSON in its snapshot. They read stacks through the same frame helpers as the detectors.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from sgl_seat.core.columns import is_beat
from sgl_seat.core.frames import collective_frame, stuck_frame
from sgl_seat.core.observation import Observation, in_flight, latest_by_pid, node_of, probe_targets, python_samples
from sgl_seat.core.records import MetricsPoint
from sgl_seat.core.stats import percentile
from sgl_seat.core.vocabulary import EngineWords


@dataclass(frozen=True, slots=True)
class RankView:
    rank: int
    node: int | None
    pid: int | None
    state: str
    frame: str | None
    fetch_p50_ms: float | None
    fetch_p99_ms: float | None
    inflight_age_s: float | None
    fetches: int
    #: The oldest in-flight fetch is in flight on the GPU (its CUDA events), the call itself having returned.
    inflight_on_gpu: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "node": self.node, "pid": self.pid, "state": self.state, "frame": self.frame,
                "rowfetch_p50_ms": self.fetch_p50_ms, "rowfetch_p99_ms": self.fetch_p99_ms,
                "inflight_age_s": self.inflight_age_s, "fetches": self.fetches,
                "inflight_on_gpu": self.inflight_on_gpu}


def rank_views(obs: Observation, now: float, *, window_s: float = 30.0) -> list[RankView]:
    """State per scheduler rank: running / waiting (collective) / fetching / gpu fetch / exited / unknown."""
    latest = {s.rank: s for s in latest_by_pid(python_samples(obs, now)).values()
              if s.rank is not None and obs.words.is_rank_process(s.title)}
    procs = {p.rank: p for p in obs.processes if p.rank is not None and obs.words.is_rank_process(p.title)}
    ranks = sorted(set(latest) | set(procs) | {p.rank for p in obs.probes if p.rank >= 0} | set(obs.rank_nodes))
    targets = probe_targets(obs)
    out = []
    for r in ranks:
        s = latest.get(r)
        proc = procs.get(r)
        mine = [p for p in obs.probes if p.rank == r and p.start <= now and not is_beat(p.target)]
        done = [p.duration(now) for p in mine if p.end is not None and p.end <= now and p.end >= now - window_s]
        infl = [now - p.start for p in mine if in_flight(p, now)]
        gpu_infl = [p.gpu_age(now) for p in mine if not in_flight(p, now) and p.gpu_in_flight(now)]
        on_gpu = bool(gpu_infl) and max(gpu_infl) > max(infl, default=0.0)
        infl += gpu_infl
        thread = s.main_thread() if s else None
        if proc is not None and not proc.alive:
            state = "exited"
        elif infl and max(infl) >= 1.0:
            state = "gpu fetch" if on_gpu else "fetching"  # gpu fetch: the call returned, its kernel has not
        elif s is None:
            state = "unknown"
        elif collective_frame(thread) is not None:
            state = "collective"
        else:
            state = "running"
        f = stuck_frame(thread, targets) if thread else None
        out.append(RankView(
            rank=r, node=node_of(obs, r), pid=(s.pid if s else proc.pid if proc else None), state=state,
            frame=f.label if f else None,
            fetch_p50_ms=percentile(done, 50) * 1e3 if done else None,
            fetch_p99_ms=percentile(done, 99) * 1e3 if done else None,
            inflight_age_s=max(infl) if infl else None, fetches=len(done), inflight_on_gpu=on_gpu))
    return out


def tokens_per_s(metrics: Sequence[MetricsPoint], now: float, words: EngineWords, *,
                 window_s: float = 10.0) -> float | None:
    """Generation tokens per second over the last ``window_s`` of ``/metrics`` points (the engine's counter)."""
    name = words.generated
    pts = [m for m in metrics if m.t <= now and name in m.values]
    pts.sort(key=lambda m: m.t)
    if len(pts) < 2:
        return None
    last = pts[-1]
    first = next((m for m in pts if m.t >= last.t - window_s), pts[0])
    if last.t <= first.t:
        return None
    return (last.values[name] - first.values[name]) / (
        last.t - first.t)
