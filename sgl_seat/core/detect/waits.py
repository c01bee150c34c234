"""Who waits for whom: scheduler ranks in a collective, a rank's stack while its call ran, its native wait."""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from sgl_seat.core.frames import collective_frame, target_frame
from sgl_seat.core.observation import Observation, latest_by_pid, probe_targets, python_samples
from sgl_seat.core.records import Frame, StackSample, ThreadStack


def waiting_ranks(obs: Observation, now: float, *, exclude: Iterable[int | None] = ()) -> tuple[int, ...]:
    """Scheduler ranks whose latest stack is in a collective or device sync (victims of a lagging peer)."""
    skip = set(exclude)
    targets = probe_targets(obs)
    out = set()
    for s in latest_by_pid(python_samples(obs, now)).values():
        if s.rank is None or s.rank in skip or not obs.words.is_rank_process(s.title):
            continue
        if collective_wait(s.main_thread(), targets) is not None:
            out.add(s.rank)
    return tuple(sorted(out))


def collective_wait(thread: ThreadStack | None, targets: Sequence[str]) -> Frame | None:
    """The collective (or device sync) ``thread`` waits in, unless it is doing a probed call's own work.

    A thread inside a probed call is the fetcher, not a waiter, when the call's work is what it sits in; but a
    probed call may itself hold a collective (SGLang's ``VocabParallelEmbedding.forward`` all-reduces its TP
    shards inside the call): a collective *inside* the probed frame is a wait for the peers like any other.
    """
    coll = collective_frame(thread)
    if coll is None or thread is None:
        return None
    probed = target_frame(thread, targets)
    if probed is None:
        return coll
    frames = thread.frames
    at = next(i for i, f in enumerate(frames) if f is coll)
    return coll if at < next(i for i, f in enumerate(frames) if f is probed) else None


def call_stack(obs: Observation, pid: int, start: float, now: float) -> StackSample | None:
    """Process ``pid``'s latest readable stack taken in [start, now] (while a call that began at ``start`` ran)."""
    last = None
    for s in python_samples(obs, now):
        if s.pid == pid and s.t >= start and s.error is None and s.threads and (last is None or s.t >= last.t):
            last = s
    return last


def native_wait(obs: Observation, st: StackSample, now: float) -> str | None:
    """The native frame a rank blocks in (``c10d::Work::wait``): its sample's innermost frame where that dump had
    native frames, else that of its latest native dump (a capture's) where one was taken."""
    th = st.main_thread()
    if th is not None and th.frames and th.frames[0].native:
        return th.frames[0].name
    nat = [x for x in obs.samples if x.native and x.pid == st.pid and x.node == st.node and x.t <= now and x.threads]
    if nat:
        nt = max(nat, key=lambda x: x.t).main_thread()
        if nt is not None and nt.frames and nt.frames[0].native:
            return nt.frames[0].name
    return None


def rank_of_pid(obs: Observation, pid: int) -> int | None:
    for p in obs.processes:
        if p.pid == pid:
            return p.rank
    for s in obs.samples:
        if s.pid == pid:
            return s.rank
    return None
