"""Row-fetch probe records as columns: the one form the detectors and the replay analysis read.

Why columns: a one-hour bundle holds ~1,000,000 probe records. As :class:`ProbeRecord` objects they cost
~200 MB and seconds to build and to scan (issue 15: replay spent 3.4 s of 5.5 s building and scanning
them); as numpy columns they cost ~50 MB, and a detector's question ("which fetch is in flight past the
threshold at ``now``?") is one vectorised comparison. The live sidecar's records go through the same
:class:`ProbeColumns` (``Observation.of`` builds it), so there is one detector implementation over one
type, live and in replay.

A :class:`ProbeColumns` is also a ``Sequence[ProbeRecord]``: code that reads records one at a time keeps
working. Built from records (live), it keeps them and hands them back as they were; decoded from a
bundle, it builds a record only when one is asked for.

Columns are read-only once built. ``end``, ``gpu_start`` and ``gpu_end`` are NaN where the record has None.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from operator import attrgetter
from typing import Any, TypeVar, overload

import numpy as np
import numpy.typing as npt

from sgl_seat.core.records import ProbeRecord

__all__ = ["F64", "I64", "Mask", "ProbeColumns", "ProbeGroup", "RowsOnDemand"]

F64 = npt.NDArray[np.float64]
I64 = npt.NDArray[np.int64]
Mask = npt.NDArray[np.bool_]


@dataclass(frozen=True, slots=True)
class ProbeGroup:
    """What a run of probe records shares: the wrapped call's node, rank, process, thread and target, and for a
    CUDA graph replay the replayed graph's shape key (None: eager calls). Why the key is a group field, not a
    column: a seat captures tens of shapes, and a bundle of a million eager fetches then carries no column for it."""

    node: int
    rank: int
    pid: int
    thread: int
    target: str
    graph_key: int | None = None


#: What a heartbeat target's name ends with (the probe's ``targets.BEAT_SUFFIX``; a unit test holds them equal): its
#: records are instants that say a process went round inside a long step (``went_round``), not calls to time, so
#: learning, buckets, reports and the frames a probed call is matched by leave them out.
BEAT_SUFFIX = "@beat"


def is_beat(target: str) -> bool:
    """Whether records of ``target`` are heartbeats (see :data:`BEAT_SUFFIX`)."""
    return target.endswith(BEAT_SUFFIX)


#: The fields of a record that go to its group, and to its row (attrgetter builds the tuples in C).
_GROUP_FIELDS = attrgetter("node", "rank", "pid", "thread", "target", "graph_key")
_ROW_FIELDS = attrgetter("seq", "start", "end", "gather_size", "gpu", "gpu_start", "gpu_end")


def _frozen(a: npt.NDArray[Any]) -> npt.NDArray[Any]:
    a.flags.writeable = False
    return a


def _pick(c: npt.NDArray[Any], idx: npt.NDArray[Any]) -> npt.NDArray[Any]:
    """``c[idx]``; a column that is one value repeated (stride 0, e.g. absent GPU times) stays a broadcast view."""
    if c.strides == (0,) and len(c):
        return np.broadcast_to(c[:1], len(idx))
    out: npt.NDArray[Any] = c[idx]
    return out


R = TypeVar("R", covariant=True)


class RowsOnDemand(Sequence[R]):
    """A table of columns read as a sequence of records, each built by :meth:`record` only when asked for.

    Indexing, slicing, iteration and equality (by content, with a table of the same kind) for the column tables
    that stand in for record lists (probe records here, request shapes in ``forensics.request_table``).
    """

    __slots__ = ()

    def record(self, i: int) -> R:
        """Row ``i`` (0 <= i < len) as a record."""
        raise NotImplementedError

    def __len__(self) -> int:
        raise NotImplementedError

    @overload
    def __getitem__(self, i: int) -> R: ...

    @overload
    def __getitem__(self, i: slice) -> list[R]: ...

    def __getitem__(self, i: int | slice) -> R | list[R]:
        if isinstance(i, slice):
            return [self.record(j) for j in range(*i.indices(len(self)))]
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"{type(self).__name__} index out of range")
        return self.record(i)

    def __iter__(self) -> Iterator[R]:
        return (self.record(i) for i in range(len(self)))

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, type(self)):
            return NotImplemented
        return len(self) == len(other) and all(a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]  # mutable-looking container: equal by content


class ProbeColumns(RowsOnDemand[ProbeRecord]):
    """Probe records as numpy columns plus the distinct :class:`ProbeGroup` each row belongs to.

    ``group[i]`` indexes ``groups``; ``rank``/``node``/``pid``/``thread`` give the per-row values of the
    group fields. Derived columns are computed once, on first use.
    """

    __slots__ = ("_cache", "_records", "end", "gather_size", "gpu", "gpu_end", "gpu_start", "group", "groups",
                 "seq", "start")

    def __init__(self, groups: Sequence[ProbeGroup] = (), group: npt.ArrayLike | None = None,
                 seq: npt.ArrayLike | None = None, start: npt.ArrayLike | None = None,
                 end: npt.ArrayLike | None = None, gather_size: npt.ArrayLike | None = None,
                 gpu: npt.ArrayLike | None = None, gpu_start: npt.ArrayLike | None = None,
                 gpu_end: npt.ArrayLike | None = None, *, records: Sequence[ProbeRecord] | None = None) -> None:
        def col(v: npt.ArrayLike | None, dtype: type[np.generic]) -> npt.NDArray[Any]:
            return _frozen(np.asarray(() if v is None else v, dtype=dtype))

        self.groups: tuple[ProbeGroup, ...] = tuple(groups)
        self.group: I64 = col(group, np.int64)
        self.seq: I64 = col(seq, np.int64)
        self.start: F64 = col(start, np.float64)
        self.end: F64 = col(end, np.float64)
        self.gather_size: I64 = col(gather_size, np.int64)
        n = len(self.group)
        # Absent GPU columns are one value seen n times (a broadcast view: no memory, nothing to copy in take()).
        self.gpu: Mask = col(np.broadcast_to(False, n) if gpu is None else gpu, np.bool_)
        self.gpu_start: F64 = col(np.broadcast_to(math.nan, n) if gpu_start is None else gpu_start, np.float64)
        self.gpu_end: F64 = col(np.broadcast_to(math.nan, n) if gpu_end is None else gpu_end, np.float64)
        cols = (self.seq, self.start, self.end, self.gather_size, self.gpu, self.gpu_start, self.gpu_end)
        if any(c.shape != (n,) for c in cols):
            raise ValueError("probe columns differ in length")
        if n and (int(self.group.min()) < 0 or int(self.group.max()) >= len(self.groups)):
            raise ValueError("a probe row names a group that does not exist")
        if records is not None and len(records) != n:
            raise ValueError("probe records and columns differ in length")
        self._records: Sequence[ProbeRecord] | None = records
        self._cache: dict[str, Any] = {}

    # ---- building -------------------------------------------------------------------------------

    @classmethod
    def from_records(cls, records: Iterable[ProbeRecord]) -> ProbeColumns:
        """Columns of ``records`` in their order; the records themselves are kept (a copy of the list) for
        iteration."""
        recs = list(records)
        index: dict[tuple[int, int, int, int, str, int | None], int] = {}
        gi = [index.setdefault(k, len(index)) for k in map(_GROUP_FIELDS, recs)]
        groups = [ProbeGroup(*k) for k in index]  # insertion order is index order
        cols = list(zip(*map(_ROW_FIELDS, recs), strict=True)) or [()] * 7
        # np.array(..., float64) reads None as NaN: the in-flight end, the absent GPU times.
        return cls(groups, gi, cols[0], cols[1], np.array(cols[2], np.float64), cols[3], cols[4],
                   np.array(cols[5], np.float64), np.array(cols[6], np.float64), records=recs)

    @classmethod
    def concat(cls, parts: Sequence[ProbeColumns]) -> ProbeColumns:
        """One table of every part's rows, in order (groups merged)."""
        parts = [p for p in parts if len(p)] or list(parts[:1])
        if len(parts) == 1:
            return parts[0]
        if not parts:
            return cls()
        index: dict[ProbeGroup, int] = {}
        remapped = []
        for p in parts:
            m = np.array([index.setdefault(g, len(index)) for g in p.groups] or [0], dtype=np.int64)
            remapped.append(m[p.group])
        groups = list(index)  # insertion order is index order
        recs: list[ProbeRecord] | None = None
        if all(p._records is not None for p in parts):
            recs = [r for p in parts for r in p._records or ()]

        def cat(name: str) -> npt.NDArray[Any]:
            return np.concatenate([getattr(p, name) for p in parts])

        return cls(groups, np.concatenate(remapped), cat("seq"), cat("start"), cat("end"), cat("gather_size"),
                   cat("gpu"), cat("gpu_start"), cat("gpu_end"), records=recs)

    def take(self, rows: npt.NDArray[np.intp] | Mask) -> ProbeColumns:
        """The rows selected by an index array or a mask, in that order (groups kept as they are)."""
        idx = np.flatnonzero(rows) if rows.dtype == np.bool_ else rows
        recs = None if self._records is None else [self._records[i] for i in idx.tolist()]
        return ProbeColumns(self.groups, self.group[idx], self.seq[idx], self.start[idx], self.end[idx],
                            self.gather_size[idx], _pick(self.gpu, idx), _pick(self.gpu_start, idx),
                            _pick(self.gpu_end, idx), records=recs)

    def canonical(self) -> ProbeColumns:
        """The rows in the observation's canonical order, by (start, node, pid, seq) and then as given (a stable
        sort, the order ``sorted(records, key=...)`` gives)."""
        n = len(self)
        if n < 2:
            return self
        order = np.argsort(self.start, kind="stable")
        s = self.start[order]
        if bool(np.any(np.isnan(s))):  # NaN never equals itself: the full key decides everything
            order = np.lexsort((self.seq, self.pid, self.node, self.start))
        else:
            tie = s[1:] == s[:-1]
            if bool(np.any(tie)):
                self._order_ties(order, tie)
        if bool(np.all(order[1:] > order[:-1])):
            return self
        return self.take(order)

    def _order_ties(self, order: npt.NDArray[np.intp], tie: Mask) -> None:
        """Within each run of equal starts in ``order`` (rows sorted by start, stably), sort by (node, pid, seq) and
        then as given, in place: what a lexsort over the full key gives, but sorting only the tied rows (a
        million fetches of 8 ranks share a start some thousands of times; the full lexsort cost ~40 ms)."""
        in_run = np.zeros(len(order), np.bool_)
        in_run[1:] |= tie
        in_run[:-1] |= tie
        pos = np.flatnonzero(in_run)  # positions in ``order`` that are in a run of equal starts
        run = np.concatenate(([0], np.cumsum(~tie)))[pos]  # each position's run: runs stay where they are
        rows = order[pos]
        g = self.group[rows]
        by = np.lexsort((self.seq[rows], self._by_group("pid")[g], self._by_group("node")[g], run))
        order[pos] = rows[by]

    # ---- per-row views of the group fields ----------------------------------------------------------

    def _by_group(self, name: str) -> I64:
        """Per group, its value of ``name`` (indexed by the ``group`` column)."""
        hit = self._cache.get("group." + name)
        if hit is None:
            hit = self._cache["group." + name] = np.array([getattr(g, name) for g in self.groups] or [0], np.int64)
        return hit

    def _per_row(self, name: str) -> I64:
        hit = self._cache.get(name)
        if hit is None:
            hit = self._cache[name] = _frozen(self._by_group(name)[self.group])
        return hit

    @property
    def rank(self) -> I64:
        return self._per_row("rank")

    @property
    def node(self) -> I64:
        return self._per_row("node")

    @property
    def pid(self) -> I64:
        return self._per_row("pid")

    @property
    def thread(self) -> I64:
        return self._per_row("thread")

    def target_is(self, target: str) -> Mask:
        """Rows whose probe target is ``target``."""
        hit = np.array([g.target == target for g in self.groups] or [False], dtype=np.bool_)
        return hit[self.group]

    def graph_rows(self) -> Mask:
        """Rows that are CUDA graph replays (their group has a shape key)."""
        hit = np.array([g.graph_key is not None for g in self.groups] or [False], dtype=np.bool_)
        return hit[self.group]

    def graph_key_of(self, i: int) -> int | None:
        """Row ``i``'s replayed shape key (None: an eager call)."""
        return self.groups[int(self.group[i])].graph_key

    def beat_rows(self) -> Mask:
        """Rows that are heartbeats (:func:`is_beat`), not timed calls."""
        hit = np.array([is_beat(g.target) for g in self.groups] or [False], dtype=np.bool_)
        return hit[self.group]

    def calls(self) -> ProbeColumns:
        """These rows without the heartbeats: the timed calls (row fetches, graph replays) alone."""
        beats = self.beat_rows()
        return self.take(~beats) if bool(beats.any()) else self

    def targets(self) -> list[str]:
        """The distinct probe targets of timed calls that rows name, sorted (heartbeats left out: a stack inside a
        heartbeat's function is not inside a probed call)."""
        hit = self._cache.get("targets")
        if hit is None:
            used = np.bincount(self.group, minlength=len(self.groups)) > 0
            hit = self._cache["targets"] = sorted({g.target for g, u in zip(self.groups, used, strict=True)
                                                   if u and not is_beat(g.target)})
        return list(hit)

    # ---- the detectors' questions, vectorised (each mirrors a ProbeRecord method) ---------------------

    def in_flight_at(self, now: float) -> Mask:
        """The call had started by ``now`` and not ended at ``now`` (:func:`~sgl_seat.core.observation.in_flight`)."""
        return (self.start <= now) & ~(self.end <= now)

    def gpu_in_flight_at(self, now: float) -> Mask:
        """The call's GPU work had started by ``now`` and not finished (:meth:`ProbeRecord.gpu_in_flight`)."""
        return self.gpu & (self.gpu_start <= now) & ~(self.gpu_end <= now)

    def late_since(self, now: float, threshold: float | F64) -> F64:
        """Per row, when a late call began to be late: its host start while the call is in flight for at least
        ``threshold`` (one for all rows, or one per row), else its GPU start while its GPU work is; NaN where it
        is not late."""
        host = self.in_flight_at(now) & (now - self.start >= threshold)
        gpu = ~host & self.gpu_in_flight_at(now) & (now - self.gpu_start >= threshold)
        return np.where(host, self.start, np.where(gpu, self.gpu_start, math.nan))

    def durations(self, now: float) -> F64:
        """Seconds taken, or the age at ``now`` while in flight (:meth:`ProbeRecord.duration`)."""
        return np.where(np.isnan(self.end), now, self.end) - self.start

    # ---- Sequence[ProbeRecord] ---------------------------------------------------------------------

    def __len__(self) -> int:
        return len(self.group)

    def record(self, i: int) -> ProbeRecord:
        """Row ``i`` as a ProbeRecord (the kept record where the table was built from records)."""
        if self._records is not None:
            return self._records[i]
        g = self.groups[int(self.group[i])]
        end, gs, ge = float(self.end[i]), float(self.gpu_start[i]), float(self.gpu_end[i])
        return ProbeRecord(node=g.node, rank=g.rank, pid=g.pid, thread=g.thread, seq=int(self.seq[i]),
                           target=g.target, start=float(self.start[i]), end=None if math.isnan(end) else end,
                           gather_size=int(self.gather_size[i]), gpu=bool(self.gpu[i]),
                           gpu_start=None if math.isnan(gs) else gs, gpu_end=None if math.isnan(ge) else ge,
                           graph_key=g.graph_key)

    def __iter__(self) -> Iterator[ProbeRecord]:
        if self._records is not None:
            return iter(self._records)
        return super().__iter__()

    def __repr__(self) -> str:
        return f"ProbeColumns({len(self)} records, {len(self.groups)} groups)"

    def in_flight(self) -> list[ProbeRecord]:
        """The records whose call had not returned when the ring was read (the stalled fetch among them)."""
        return [self.record(int(i)) for i in np.flatnonzero(np.isnan(self.end))]
