"""What the detectors look at: :class:`Observation`, the records of one node or a whole seat.

The live sidecar builds one from its rings, a capture from every node's part, and ``replay`` from a
bundle, always through :meth:`Observation.of` (a canonical order), so the detectors see the same
sequence live and offline. The small lookups below are shared by the detectors and ``watch``'s rank view.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from sgl_seat.core.columns import ProbeColumns
from sgl_seat.core.learned import LearnedThresholds
from sgl_seat.core.records import EngineProcess, LogLine, MetricsPoint, ProbeRecord, StackSample
from sgl_seat.core.vocabulary import NO_WORDS, EngineWords


@dataclass(frozen=True)
class Observation:
    """Everything the detectors look at, for one node or (at capture and in replay) the whole seat.

    ``rank_nodes`` maps each scheduler rank to its node (from the plan's topology); records carry
    their own node too, the map fills the gaps (e.g. a rank known only from a probe record).

    ``probes`` are columns (:class:`~sgl_seat.core.columns.ProbeColumns`, also a sequence of records): a
    bundle holds up to a million of them, and the detectors read them vectorised, live and in replay alike.

    ``learned``: the row-fetch thresholds learned from healthy calls (:mod:`sgl_seat.core.learned`), the node's
    live, the bundle's in replay; None: the fixed threshold for every call.

    ``words``: the engine's names for its processes and metrics (:mod:`sgl_seat.core.vocabulary`), from its
    backend: the detectors ask by meaning, never by an engine's name.
    """

    samples: tuple[StackSample, ...] = ()
    probes: ProbeColumns = field(default_factory=ProbeColumns)
    metrics: tuple[MetricsPoint, ...] = ()
    logs: tuple[LogLine, ...] = ()
    processes: tuple[EngineProcess, ...] = ()
    rank_nodes: Mapping[int, int] = field(default_factory=dict)
    learned: LearnedThresholds | None = None
    words: EngineWords = NO_WORDS

    @classmethod
    def of(cls, *, samples: Iterable[StackSample] = (), probes: Iterable[ProbeRecord] | ProbeColumns = (),
           metrics: Iterable[MetricsPoint] = (), logs: Iterable[LogLine] = (),
           processes: Iterable[EngineProcess] = (), rank_nodes: Mapping[int, int] | None = None,
           learned: LearnedThresholds | None = None, words: EngineWords) -> Observation:
        """Build from any iterables, in a canonical order (so live and replay see the same sequence)."""
        return cls(
            samples=tuple(sorted(samples, key=lambda s: (s.t, s.node, s.pid, s.native))),
            probes=(probes if isinstance(probes, ProbeColumns) else ProbeColumns.from_records(probes)).canonical(),
            metrics=tuple(sorted(metrics, key=lambda m: (m.t, m.node))),
            logs=tuple(logs),
            processes=tuple(sorted(processes, key=lambda p: (p.node, p.pid))),
            rank_nodes=dict(rank_nodes or {}),
            learned=learned,
            words=words,
        )

    def merged(self, other: Observation) -> Observation:
        return Observation.of(
            samples=(*self.samples, *other.samples), probes=ProbeColumns.concat([self.probes, other.probes]),
            metrics=(*self.metrics, *other.metrics), logs=(*self.logs, *other.logs),
            processes=(*self.processes, *other.processes), rank_nodes={**self.rank_nodes, **other.rank_nodes},
            learned=other.learned if self.learned is None else
            self.learned if other.learned is None else self.learned.merged(other.learned),
            words=other.words if self.words == NO_WORDS else self.words,
        )


def python_samples(obs: Observation, now: float) -> list[StackSample]:
    """The Python-only (periodic) stack samples taken at or before ``now``."""
    return [s for s in obs.samples if not s.native and s.t <= now]


def latest_by_pid(samples: Sequence[StackSample]) -> dict[int, StackSample]:
    """Each process's latest sample that has a stack (failed dumps skipped)."""
    out: dict[int, StackSample] = {}
    for s in samples:
        if s.error is None and s.threads and (s.pid not in out or s.t >= out[s.pid].t):
            out[s.pid] = s
    return out


def node_of(obs: Observation, rank: int | None, fallback: int | None = None) -> int | None:
    """The node of scheduler ``rank``: the plan's map, else any record that names both."""
    if rank is None:
        return fallback
    if rank in obs.rank_nodes:
        return obs.rank_nodes[rank]
    for p in obs.processes:
        if p.rank == rank:
            return p.node
    for s in obs.samples:
        if s.rank == rank:
            return s.node
    return fallback


def probe_targets(obs: Observation) -> list[str]:
    """The probe targets the observation's row-fetch records name (what a stuck frame is matched against)."""
    return obs.probes.targets()


def in_flight(p: ProbeRecord, now: float) -> bool:
    """A probed call started by ``now`` that had not ended at ``now``."""
    return p.start <= now and (p.end is None or p.end > now)
