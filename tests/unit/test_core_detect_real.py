"""Detectors on stacks shaped like real SGLang 0.5.23 schedulers (CPU engine, TP2 over gloo, one rank per node).

The frames are those measured on the real engine (file:line in the 0.5.23 wheel): a busy decode, the idle spin
in ``_poll_timeout_aborts``, the idle broadcast of TP>1, ``--sleep-on-idle``'s zmq poll on rank 0, a long prefill,
a rank waiting for a peer in the all-reduce inside its own probed ``VocabParallelEmbedding.forward``, the
rehearsal stall, and SIGSTOP'd processes (``/proc`` state ``T``).
"""

from __future__ import annotations

import pytest

from sgl_seat.core import detect as d
from sgl_seat.core.frames import frame_is_target
from sgl_seat.core.observation import Observation
from sgl_seat.core.records import (
    EngineProcess,
    Frame,
    LogLine,
    MetricsPoint,
    ProbeRecord,
    StackSample,
    ThreadStack,
    Verdict,
    VerdictKind,
)
from sgl_seat.engines import words_for
from sgl_seat.forensics.replay.analysis import classify_thread
from sgl_seat.spec import WatchdogSpec

TH = WatchdogSpec()
T0 = 2_000_000.0
SITE = "/opt/venv/lib/python3.11/site-packages"
SG = f"{SITE}/sglang/srt"
STD = "/usr/lib/python3.11"
RANK_NODES = {0: 0, 1: 1}
TARGET = "sglang.srt.layers.vocab_parallel_embedding:VocabParallelEmbedding.forward"

WORDS = words_for("sglang")


def F(name: str, path: str, line: int) -> Frame:
    return Frame(name, path, line)


BOTTOM = [F("Scheduler.run_event_loop", f"{SG}/managers/scheduler.py", 1498),
          F("run_scheduler_process", f"{SG}/managers/scheduler.py", 6368),
          F("BaseProcess.run", f"{STD}/multiprocessing/process.py", 108),
          F("BaseProcess._bootstrap", f"{STD}/multiprocessing/process.py", 314),
          F("_main", f"{STD}/multiprocessing/spawn.py", 135),
          F("spawn_main", f"{STD}/multiprocessing/spawn.py", 122),
          F("<module>", "<string>", 1)]
LOOP_BATCH = F("Scheduler.event_loop_overlap", f"{SG}/managers/scheduler.py", 2109)
LOOP_INGEST = F("Scheduler.event_loop_overlap", f"{SG}/managers/scheduler.py", 2078)
LOOP_IDLE = F("Scheduler.event_loop_overlap", f"{SG}/managers/scheduler.py", 2123)
MODEL = [F("LlamaForCausalLM.forward", f"{SG}/models/llama.py", 470),
         F("ModelRunner._forward_raw", f"{SG}/model_executor/model_runner.py", 1925),
         F("ModelRunner.forward", f"{SG}/model_executor/model_runner.py", 1860),
         F("TpModelWorker.forward_batch_generation", f"{SG}/managers/tp_worker.py", 675),
         F("Scheduler.run_batch", f"{SG}/managers/scheduler.py", 4704), LOOP_BATCH, *BOTTOM]
LAYER = [F("LlamaDecoderLayer.forward", f"{SG}/models/llama.py", 413),
         F("LlamaModel.forward", f"{SG}/models/llama.py", 345), *MODEL]


def decode_stack(step: int) -> list[Frame]:
    """A busy decode: somewhere in a layer's attention, at another line each sample."""
    return [F("TorchNativeAttnBackend._run_sdpa_forward_decode", f"{SG}/layers/attention/torch_native_backend.py",
              160 + step % 7),
            F("TorchNativeAttnBackend.forward_decode", f"{SG}/layers/attention/torch_native_backend.py", 250),
            F("RadixAttention.forward", f"{SG}/layers/radix_attention.py", 108),
            F("LlamaAttention.forward", f"{SG}/models/llama.py", 200), *LAYER]


PREFILL = [F("TorchNativeAttnBackend._run_sdpa_forward_extend", f"{SG}/layers/attention/torch_native_backend.py", 96),
           F("TorchNativeAttnBackend.forward_extend", f"{SG}/layers/attention/torch_native_backend.py", 210),
           F("RadixAttention.forward", f"{SG}/layers/radix_attention.py", 108),
           F("LlamaAttention.forward", f"{SG}/models/llama.py", 200), *LAYER]
INGEST = [F("Scheduler.ingest_requests", f"{SG}/managers/scheduler.py", 2205), LOOP_INGEST, *BOTTOM]
SPIN = [F("Scheduler._poll_timeout_aborts", f"{SG}/managers/scheduler.py", 3605),
        F("Scheduler.ingest_requests", f"{SG}/managers/scheduler.py", 2202), LOOP_INGEST, *BOTTOM]
IDLE_BCAST = [F("broadcast", f"{SITE}/torch/distributed/distributed_c10d.py", 3787),
              F("_exception_logger.<locals>.wrapper", f"{SITE}/torch/distributed/c10d_logger.py", 81),
              F("broadcast_pyobj", f"{SG}/utils/common.py", 2715),
              F("SchedulerRequestReceiver._broadcast_reqs_across_ranks",
                f"{SG}/managers/scheduler_components/request_receiver.py", 206),
              F("SchedulerRequestReceiver.recv_requests", f"{SG}/managers/scheduler_components/request_receiver.py",
                101), *INGEST]
SLEEP = [F("Poller.poll", f"{SITE}/zmq/sugar/poll.py", 106),
         F("IdleSleeper.maybe_sleep", f"{SG}/managers/scheduler_components/idle_sleeper.py", 37),
         F("Scheduler.maybe_sleep_on_idle", f"{SG}/managers/scheduler.py", 6162),
         F("Scheduler.on_idle", f"{SG}/managers/scheduler.py", 5328), LOOP_IDLE, *BOTTOM]
EMBED_TOP = [F("VocabParallelEmbedding.forward", f"{SG}/layers/vocab_parallel_embedding.py", 533),
             F("_probe_call", "/opt/sgl_seat/sgl_seat/probe/writer.py", 270),
             F("LlamaModel.forward", f"{SG}/models/llama.py", 330), *MODEL]
#: Rank 0 waiting for a stalled rank 1 in the all-reduce inside its own probed embedding call.
EMBED_ALLREDUCE = [F("all_reduce", f"{SITE}/torch/distributed/distributed_c10d.py", 3913),
                   F("_exception_logger.<locals>.wrapper", f"{SITE}/torch/distributed/c10d_logger.py", 81),
                   F("GroupCoordinator._all_reduce_in_place", f"{SG}/distributed/parallel_state.py", 720),
                   F("GroupCoordinator.all_reduce", f"{SG}/distributed/parallel_state.py", 699),
                   F("tensor_model_parallel_all_reduce", f"{SG}/distributed/communication_op.py", 14), *EMBED_TOP]
#: A rank waiting for a stopped peer in a decoder layer's all-reduce (outside any probed call).
LAYER_ALLREDUCE = [F("all_reduce", f"{SITE}/torch/distributed/distributed_c10d.py", 3913),
                   F("_exception_logger.<locals>.wrapper", f"{SITE}/torch/distributed/c10d_logger.py", 81),
                   F("GroupCoordinator.all_reduce", f"{SG}/distributed/parallel_state.py", 699),
                   F("tensor_model_parallel_all_reduce", f"{SG}/distributed/communication_op.py", 14),
                   F("RowParallelLinear.forward", f"{SG}/layers/linear.py", 1400), *LAYER]
#: The rehearsal stall (sgl_seat/probe/fault.py): time.sleep in a loop inside the probe's wrapper.
REHEARSAL = [F("rehearsal_stall", "/opt/sgl_seat/sgl_seat/probe/fault.py", 88),
             F("_gate", "/opt/sgl_seat/sgl_seat/probe/fault.py", 120),
             F("_probe_call", "/opt/sgl_seat/sgl_seat/probe/writer.py", 268),
             F("LlamaModel.forward", f"{SG}/models/llama.py", 330), *MODEL]
WORK_WAIT = Frame("c10d::Work::wait", "libtorch_cpu.so", 0, None, True)


def other_threads(t: float) -> tuple[ThreadStack, ...]:
    """SGLang's own watchdog thread, tqdm's monitor and a pool worker: never the main thread."""
    return (ThreadStack(2, "Thread-1 (_watchdog_thread)", False, False,
                        (F("SchedulerWatchdog._watchdog_thread", f"{SG}/managers/scheduler_watchdog.py", 80),
                         F("Thread.run", f"{STD}/threading.py", 982))),
            ThreadStack(3, "tqdm_monitor", False, False, (F("Condition.wait", f"{STD}/threading.py", 331),)),
            ThreadStack(4, "ThreadPoolExecutor-0_0", False, False,
                        (F("_worker", f"{STD}/concurrent/futures/thread.py", 81),)))


def title(rank: int) -> str:
    return f"sglang::scheduler_TP{rank}"


def sample(t: float, rank: int, frames: list[Frame], *, state: str | None = "R", error: str | None = None,
           native: bool = False) -> StackSample:
    main = ThreadStack(1, "MainThread", True, True, tuple(frames))
    return StackSample(t=t, node=RANK_NODES[rank], pid=100 + rank, title=title(rank), rank=rank, native=native,
                       threads=() if error else (main, *other_threads(t)), error=error, state=state)


def detok_sample(t: float, state: str) -> StackSample:
    th = ThreadStack(1, "MainThread", True, False,
                     (F("Socket.recv_pyobj", f"{SITE}/zmq/sugar/socket.py", 989),
                      F("DetokenizerManager.event_loop", f"{SG}/managers/detokenizer_manager.py", 120)))
    return StackSample(t=t, node=0, pid=90, title="sglang::detokenizer", rank=None, native=False, threads=(th,),
                       state=state)


def procs() -> list[EngineProcess]:
    return [EngineProcess(node=0, pid=80, title="python -m sglang.launch_server --node-rank 0", rank=None, alive=True),
            EngineProcess(node=0, pid=90, title="sglang::detokenizer", rank=None, alive=True),
            *(EngineProcess(node=r, pid=100 + r, title=title(r), rank=r, alive=True) for r in (0, 1))]


def metrics(t: float, running: float, tokens: float) -> MetricsPoint:
    return MetricsPoint(t=t, node=0, values={"sglang:num_running_reqs": running,
                                             "sglang:generation_tokens_total": tokens,
                                             "sglang:num_used_tokens": 50.0 * running + tokens % 7})


def call(rank: int, seq: int, start: float, end: float | None) -> ProbeRecord:
    return ProbeRecord(node=RANK_NODES[rank], rank=rank, pid=100 + rank, thread=1, seq=seq, target=TARGET,
                       start=start, end=end, gather_size=16)


def obs(samples: list[StackSample], probes: list[ProbeRecord], pts: list[MetricsPoint]) -> Observation:
    return Observation.of(words=WORDS, samples=samples, probes=probes, metrics=pts, processes=procs(),
                          rank_nodes=RANK_NODES)


def busy(t0: float, t1: float) -> tuple[list[StackSample], list[ProbeRecord], list[MetricsPoint]]:
    """Decode traffic from t0 to t1: stacks moving, an embedding call per step (every 50 ms), tokens flowing."""
    samples, probes, pts = [], [], []
    k, t = 0, t0
    while t <= t1:
        samples += [sample(t, r, decode_stack(k + r)) for r in (0, 1)]
        pts.append(metrics(t, running=4, tokens=100.0 * k))
        t += 1.0
        k += 1
    seq, t = 1, t0
    while t <= t1:
        probes += [call(r, seq, t, t + 0.004) for r in (0, 1)]
        seq += 1
        t += 0.05
    return samples, probes, pts


def verdicts_over(o: Observation, t0: float, t1: float, step: float = 1.0) -> list[Verdict]:
    out, t = [], t0
    while t <= t1:
        v = d.detect(o, TH, t)
        if v is not None:
            out.append(v)
        t += step
    return out


# ---- target frames ---------------------------------------------------------------------------------------------


def test_a_method_target_matches_its_own_frame_not_every_forward() -> None:
    """Every layer has a forward: only VocabParallelEmbedding.forward is the probed call."""
    assert frame_is_target(EMBED_TOP[0], TARGET)
    assert not any(frame_is_target(f, TARGET) for f in LAYER + decode_stack(0))
    # py-spy without qualified names: the bare name counts only in the target's module.
    assert frame_is_target(F("forward", f"{SG}/layers/vocab_parallel_embedding.py", 533), TARGET)
    assert not frame_is_target(F("forward", f"{SG}/models/llama.py", 413), TARGET)
    assert frame_is_target(F("fetch_rows", "/src/sgl_seat/sim/rowfetch.py", 88), "sgl_seat.sim.rowfetch:fetch_rows@ids")


# ---- idle shapes are not hangs ---------------------------------------------------------------------------------

IDLE_CASES = {
    "TP1 idle spin in _poll_timeout_aborts": {0: SPIN},
    "TP2 both ranks in the idle broadcast": {0: IDLE_BCAST, 1: IDLE_BCAST},
    "TP2 rank 0 spins, rank 1 in the idle broadcast": {0: SPIN, 1: IDLE_BCAST},
    "TP2 --sleep-on-idle: rank 0 in the zmq poll, rank 1 in the broadcast": {0: SLEEP, 1: IDLE_BCAST},
}


@pytest.mark.parametrize("case", list(IDLE_CASES))
def test_idle_shapes_fire_nothing_over_three_minutes_after_traffic(case: str) -> None:
    """Traffic for 20 s, then 3 minutes idle at 1 Hz (nothing runs, stacks unchanged, no probed call): detect()
    at every second of it finds nothing."""
    shape = IDLE_CASES[case]
    samples, probes, pts = busy(T0, T0 + 20)
    samples = [s for s in samples if s.rank in shape]
    probes = [p for p in probes if p.rank in shape]
    tokens = pts[-1].values["sglang:generation_tokens_total"]
    t = T0 + 21
    while t <= T0 + 200:
        samples += [sample(t, r, fr, state="R" if fr is SPIN else "S") for r, fr in shape.items()]
        pts.append(metrics(t, running=0, tokens=tokens))
        t += 1.0
    o = obs(samples, probes, pts)
    assert verdicts_over(o, T0 + 21, T0 + 200) == []


def test_idle_from_start_without_traffic_fires_nothing() -> None:
    samples, pts = [], []
    t = T0
    while t <= T0 + 180:
        samples += [sample(t, 0, SLEEP, state="S"), sample(t, 1, IDLE_BCAST, state="S")]
        pts.append(metrics(t, running=0, tokens=0.0))
        t += 1.0
    assert verdicts_over(obs(samples, [], pts), T0, T0 + 180, step=3.0) == []


@pytest.mark.parametrize("frames,want", [(SLEEP, "idle"), (SPIN, "idle"), (IDLE_BCAST, "collective"),
                                         (decode_stack(0), "running"), (EMBED_ALLREDUCE, "collective"),
                                         (EMBED_TOP, "rowfetch"), (LAYER_ALLREDUCE, "collective")])
def test_classify_thread_reads_an_idle_scheduler_as_idle_or_waiting(frames: list[Frame], want: str) -> None:
    th = ThreadStack(1, "MainThread", True, True, tuple(frames))
    assert classify_thread(th, frozenset({"VocabParallelEmbedding.forward"})).state == want


# ---- a long prefill --------------------------------------------------------------------------------------------


def test_a_long_prefill_on_both_ranks_is_not_a_hang_before_engine_timeout() -> None:
    """Both ranks in one attention kernel of a prefill for two minutes, requests running, tokens flat: one forward
    (every rank at the same frame of work, outside any collective and outside the probed embedding call, which
    finished before the layers ran). The probed target's name, ``forward``, is every layer's too."""
    samples, probes, pts = busy(T0, T0 + 10)
    tokens = pts[-1].values["sglang:generation_tokens_total"]
    probes += [call(r, 10_000, T0 + 10.5, T0 + 10.51) for r in (0, 1)]  # the prefill's embedding, done
    t = T0 + 11
    while t <= T0 + 130:
        samples += [sample(t, r, PREFILL) for r in (0, 1)]
        pts.append(metrics(t, running=1, tokens=tokens))
        t += 1.0
    o = obs(samples, probes, pts)
    fwd = d.one_forward(o, TH, T0 + 130)
    assert fwd is not None and "_run_sdpa_forward_extend" in fwd.frame
    assert verdicts_over(o, T0 + 11, T0 + 130) == []


BEAT = "sglang.srt.models.llama:LlamaDecoderLayer.forward@beat"


def lagging_prefill(*, beats: bool, hang: bool = False) -> Observation:
    """The fault-free soak's two false bundles (bench/results/real_watchdog_soak_trained_nofault.txt): rank 0 in a
    1,390-token prefill of the trained 30-layer model, sampled at one line of attention 5 s running, rank 1 done with
    its heads and waiting in the layer's all-reduce, 3 requests running, no token. With ``beats``, rank 0's decoder
    layers beat every 0.17 s (5 s / 30 layers), rank 1's as it enters each layer; with ``hang``, both stop at T0+21
    (rank 0 stuck in that line)."""
    samples, probes, pts = busy(T0, T0 + 10)
    tokens = pts[-1].values["sglang:generation_tokens_total"]
    probes += [call(r, 10_000, T0 + 10.5, T0 + 10.51) for r in (0, 1)]  # the prefill's embedding, done
    t = T0 + 11
    while t <= T0 + 30:
        samples += [sample(t, 0, PREFILL), sample(t, 1, LAYER_ALLREDUCE, state="S")]
        pts.append(metrics(t, running=3, tokens=tokens))
        t += 1.0
    if beats:
        seq, t = 20_000, T0 + 10.52
        while t <= (T0 + 21 if hang else T0 + 30):
            probes += [ProbeRecord(node=RANK_NODES[r], rank=r, pid=100 + r, thread=1, seq=seq, target=BEAT,
                                   start=t, end=t, gather_size=-1) for r in (0, 1)]
            seq += 1
            t += 0.17
    return obs(samples, probes, pts)


def test_a_long_prefill_on_one_rank_beside_a_waiting_peer_fires_without_beats_and_not_with_them() -> None:
    """Without the layers' heartbeats the shape is a hang's (one rank at one frame of work, its peer in a
    collective, no token): stack unchanged names rank 0 within the stack window, as the soak's false bundles did.
    With them, rank 0 went round its layer loop between every pair of samples: nothing fires; and once the beats
    stop (a real hang in that line), stack unchanged names rank 0 again, counted from the last beat."""
    blind = verdicts_over(lagging_prefill(beats=False), T0 + 11, T0 + 30)
    assert blind and blind[0].kind is VerdictKind.STACK_UNCHANGED and blind[0].rank == 0
    assert blind[0].t <= T0 + 16
    assert verdicts_over(lagging_prefill(beats=True), T0 + 11, T0 + 30) == []
    hung = verdicts_over(lagging_prefill(beats=True, hang=True), T0 + 11, T0 + 30)
    assert hung and hung[0].kind is VerdictKind.STACK_UNCHANGED and hung[0].rank == 0
    assert T0 + 21 + TH.stack_unchanged_samples - 1 <= hung[0].t <= T0 + 28
    assert "_run_sdpa_forward_extend" in (hung[0].frame or "")


def test_beats_are_not_calls_to_time_learn_or_match_frames() -> None:
    """A heartbeat's records are never in flight and never a probed frame: a stack inside LlamaDecoderLayer.forward
    is not inside a probed call, and the learner learns no beat shape."""
    from sgl_seat.core.columns import BEAT_SUFFIX
    from sgl_seat.core.learned import Learner
    from sgl_seat.probe import targets as probe_targets_mod

    assert BEAT_SUFFIX == probe_targets_mod.BEAT_SUFFIX
    assert not len(Observation.of(words=WORDS).probes.calls())  # no rows, no beats
    o = lagging_prefill(beats=True)
    assert o.probes.targets() == [TARGET]
    assert int(o.probes.beat_rows().sum()) > 100 and len(o.probes.calls()) == len(o.probes) - int(
        o.probes.beat_rows().sum())
    assert not o.probes.take(o.probes.beat_rows()).in_flight_at(T0 + 20).any()
    lr = Learner(TH)
    lr.observe(list(o.probes))
    assert lr.thresholds() is not None and all("@beat" not in k for k in lr.stats()["shapes"])
    assert lr.learned_calls + lr.warmups == len(o.probes.calls())


# ---- the rehearsal stall: several probed calls in flight -------------------------------------------------------


def stall_records(*, native: bool = False) -> Observation:
    """Decode until T0+30; then rank 1 stalls in rehearsal_stall inside its probed embedding call, and rank 0's
    probed embedding call (which began first) waits in the all-reduce inside it."""
    samples, probes, pts = busy(T0, T0 + 30)
    tokens = pts[-1].values["sglang:generation_tokens_total"]
    probes += [call(0, 99_999, T0 + 30.20, None), call(1, 99_999, T0 + 30.25, None)]
    t = T0 + 31
    while t <= T0 + 40:
        samples += [sample(t, 0, EMBED_ALLREDUCE, state="S"), sample(t, 1, REHEARSAL, state="S")]
        pts.append(metrics(t, running=4, tokens=tokens))
        t += 1.0
    if native:
        samples.append(sample(T0 + 40, 0, [WORK_WAIT, *EMBED_ALLREDUCE], native=True))
    return obs(samples, probes, pts)


def test_the_rank_not_in_a_collective_is_named_among_several_inflight_calls() -> None:
    now = T0 + 34
    v = d.detect(stall_records(), TH, now)
    assert v is not None and v.kind == VerdictKind.ROWFETCH_STALL
    assert (v.rank, v.node) == (1, 1), v.evidence
    assert v.waiting_ranks == (0,)
    assert any("rank 0 waits in all_reduce while rank 1's VocabParallelEmbedding.forward has been in flight for "
               "3.8s" in e for e in v.evidence), v.evidence


def test_the_waiter_evidence_names_its_native_wait_where_a_native_dump_exists() -> None:
    v = d.detect(stall_records(native=True), TH, T0 + 40)
    assert v is not None and v.rank == 1
    assert any("rank 0 waits in all_reduce (c10d::Work::wait) while rank 1's VocabParallelEmbedding.forward has "
               "been in flight for 9.8s" in e for e in v.evidence), v.evidence


def test_when_every_late_call_waits_in_a_collective_the_earliest_is_named() -> None:
    samples, probes, pts = busy(T0, T0 + 30)
    probes += [call(0, 99_999, T0 + 30.20, None), call(1, 99_999, T0 + 30.25, None)]
    samples += [sample(T0 + 31 + i, r, EMBED_ALLREDUCE) for i in range(5) for r in (0, 1)]
    v = d.detect(obs(samples, probes, pts), TH, T0 + 35)
    assert v is not None and v.kind == VerdictKind.ROWFETCH_STALL and v.rank == 0
    assert any("every late call waits in a collective" in e for e in v.evidence)


def test_stack_unchanged_counts_a_wait_inside_a_probed_call_as_a_wait() -> None:
    """No probe records judged late (the threshold is long), stacks unchanged: rank 1 (outside any collective) lags,
    rank 0 waits in the all-reduce inside its probed call."""
    th = WatchdogSpec(rowfetch_inflight_s=1000.0)
    v = d.detect(stall_records(), th, T0 + 40)
    assert v is not None and v.kind == VerdictKind.STACK_UNCHANGED and v.rank == 1 and v.waiting_ranks == (0,)


# ---- process stopped -------------------------------------------------------------------------------------------


def stopped_rank1(*, readable: bool, until: float = T0 + 40) -> Observation:
    """Rank 1 SIGSTOP'd at T0+30 in a decoder layer; rank 0 waits for it in the layer's all-reduce. Rank 1's probed
    call of that step is in flight too (it stopped inside the layer after its embedding call... began)."""
    samples, probes, pts = busy(T0, T0 + 30)
    tokens = pts[-1].values["sglang:generation_tokens_total"]
    probes += [call(1, 99_999, T0 + 30.1, None)]
    t = T0 + 31
    while t <= until:
        samples.append(sample(t, 0, LAYER_ALLREDUCE, state="S"))
        samples.append(sample(t, 1, REHEARSAL, state="T") if readable
                       else sample(t, 1, [], state="T", error="py-spy: failed to read the process"))
        pts.append(metrics(t, running=4, tokens=tokens))
        t += 1.0
    return obs(samples, probes, pts)


@pytest.mark.parametrize("readable", [True, False])
def test_a_stopped_rank_is_named_before_the_rowfetch_stall_it_causes(readable: bool) -> None:
    v = d.detect(stopped_rank1(readable=readable), TH, T0 + 36)
    assert v is not None and v.kind == VerdictKind.PROCESS_STOPPED, v
    assert (v.rank, v.node, v.waiting_ranks) == (1, 1, (0,))
    assert v.evidence[0].startswith("pid 101 (sglang::scheduler_TP1) on node 1 stopped (state T) for 5.0s")
    assert ("could not be read" in v.evidence[0]) is not readable
    # Its frame: the stack read while stopped, else the last one read before it stopped.
    assert v.frame is not None and ("rehearsal_stall" in v.frame if readable else "_run_sdpa_forward_decode" in v.frame)
    assert any(e.startswith("also: row-fetch stall") for e in v.evidence)
    # Replay: the same verdict from records that went through JSON.
    o = stopped_rank1(readable=readable)
    back = Observation.of(words=WORDS, samples=[StackSample.from_json(s.to_json()) for s in o.samples], probes=o.probes,
                          metrics=o.metrics, processes=o.processes, rank_nodes=RANK_NODES)
    assert d.detect(back, TH, T0 + 36) == v


def test_stopped_needs_stopped_s_and_two_samples_and_an_unbroken_run() -> None:
    """The samples' path (a bundle without the 20 Hz /proc reads), at the 3 s such bundles recorded."""
    o = stopped_rank1(readable=True)
    th3 = WatchdogSpec(stopped_s=3.0)
    v = d.detect_process_stopped(o, th3, T0 + 33)  # T at 31, 32, 33: 2 s < 3 s
    assert v is None
    assert d.detect_process_stopped(o, WatchdogSpec(stopped_s=10.0), T0 + 40) is None
    assert d.detect_process_stopped(o, th3, T0 + 34) is not None
    # One sample in state T is never enough, whatever stopped_s says.
    one = Observation.of(words=WORDS, samples=[x for x in o.samples if not (x.state == "T" and x.t > T0 + 31.5)],
                         probes=o.probes, metrics=o.metrics, processes=o.processes, rank_nodes=RANK_NODES)
    assert d.detect_process_stopped(one, TH, T0 + 31.5) is None
    # Resumed: its latest sample is running again.
    resumed = Observation.of(words=WORDS, samples=[*o.samples, sample(T0 + 41, 1, decode_stack(3), state="R")],
                             probes=o.probes, metrics=o.metrics, processes=o.processes, rank_nodes=RANK_NODES)
    assert d.detect_process_stopped(resumed, TH, T0 + 41) is None
    # Stale: the last stopped sample is long ago (the sampler lost it): nothing said now.
    assert d.detect_process_stopped(o, TH, T0 + 60) is None


@pytest.mark.parametrize("progress", [True, False])
def test_a_stopped_detokenizer_says_whether_the_schedulers_progress(progress: bool) -> None:
    samples, probes, pts = busy(T0, T0 + 40) if progress else busy(T0, T0 + 30)
    samples.append(detok_sample(T0 + 5, "S"))
    if not progress:
        tokens = pts[-1].values["sglang:generation_tokens_total"]
        pts += [metrics(T0 + 31 + i, running=4, tokens=tokens) for i in range(10)]
        samples += [sample(T0 + 31 + i, r, LAYER_ALLREDUCE if r == 0 else REHEARSAL) for i in range(10) for r in (0, 1)]
    samples += [detok_sample(T0 + 32 + i, "T") for i in range(8)]
    v = d.detect(obs(samples, probes, pts), TH, T0 + 39.5)
    assert v is not None and v.kind == VerdictKind.PROCESS_STOPPED
    assert (v.rank, v.node) == (None, 0)
    assert v.evidence[0].startswith("pid 90 (sglang::detokenizer) on node 0 stopped (state T) for 7.5s")
    assert ("the schedulers still progress" in v.evidence[1]) is progress
    assert ("made no progress" in v.evidence[1]) is not progress
    assert v.frame is not None and "recv_pyobj" in v.frame


def test_a_gone_process_is_exited_not_stopped() -> None:
    o = stopped_rank1(readable=True)
    gone = [EngineProcess(node=p.node, pid=p.pid, title=p.title, rank=p.rank, alive=p.pid != 101, gone_t=T0 + 35)
            for p in o.processes]
    o2 = Observation.of(words=WORDS, samples=o.samples, probes=o.probes, metrics=o.metrics, processes=gone,
                        rank_nodes=RANK_NODES)
    v = d.detect(o2, TH, T0 + 36)
    assert v is not None and v.kind == VerdictKind.PROCESS_EXITED


def _traceback_lines(t: float) -> list[LogLine]:
    """Real SGLang's log of a rank whose all-reduce lost its peer: the prefixed line opens a traceback and the
    error itself (gloo's "Connection reset by peer") is its last, unprefixed line (node0.log of a live seat)."""
    text = [
        "[2026-12-01 14:20:47 TP0] Scheduler hit an exception: Traceback (most recent call last):",
        f'  File "{SG}/managers/scheduler.py", line 2109, in event_loop_overlap',
        "    batch_result = self.run_batch(batch)",
        f'  File "{SITE}/torch/distributed/distributed_c10d.py", line 3913, in all_reduce',
        "    work.wait()",
        "RuntimeError: [/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:545] Read error "
        "[127.0.0.1]:53480: Connection reset by peer. This is typically caused by a remote worker hanging or bugs "
        "in the application. Check the logs of the remote worker.",
        "",
        "[2026-12-01 14:20:47] SIGQUIT received. signum=None, frame=None. It usually means one child failed.",
    ]
    return [LogLine(t=t, node=0, text=x) for x in text]


@pytest.mark.parametrize("rank0_first", [True, False])
def test_a_peer_error_told_in_a_traceback_names_the_killed_rank_not_the_victim(rank0_first: bool) -> None:
    """GIVEN rank 1 SIGKILLed and rank 0 exiting after SGLang's multi-line "Scheduler hit an exception" whose last
    line is gloo's peer error THEN rank 1 is named (rank 0 is the victim), whichever sidecar saw its death first."""
    s, p, m = busy(T0, T0 + 35)
    gone_t = {0: T0 + 35.1, 1: T0 + 35.3} if rank0_first else {0: T0 + 35.6, 1: T0 + 35.1}
    gone = [EngineProcess(node=q.node, pid=q.pid, title=q.title, rank=q.rank, alive=q.rank is None,
                          gone_t=gone_t[q.rank] if q.rank is not None else None) for q in procs()]
    o = Observation.of(words=WORDS, samples=s, probes=p, metrics=m, processes=gone, logs=_traceback_lines(T0 + 35.2),
                       rank_nodes=RANK_NODES)
    v = d.detect(o, TH, T0 + 37)
    assert v is not None and v.kind == VerdictKind.PROCESS_EXITED
    assert (v.rank, v.node) == (1, 1), v


def test_the_rehearsal_gates_frame_is_a_call_of_its_target() -> None:
    """A rehearsal stall sits in the probe's gate, compiled as ``<sgl-seat rehearsal gate of 'Class.method'>``,
    before the target's own frame is entered: that frame is the target's call (the ranks table then says the
    rank is in its row fetch, not "running")."""
    gate = F("rehearsal_gate", "<sgl-seat rehearsal gate of 'VocabParallelEmbedding.forward'>", 8)
    assert frame_is_target(gate, TARGET)
    other = F("rehearsal_gate", "<sgl-seat rehearsal gate of 'EngramEmbedding.forward'>", 8)
    assert not frame_is_target(other, TARGET)


def test_a_zmq_send_is_work_and_the_sims_on_idle_is_idle() -> None:
    """A busy real rank 0 is seen in zmq's ``Socket.send`` handing outputs to the detokenizer: not idle (a live
    sim-vs-real run classified it idle). The sim's idle rank 0 waits in its ``on_idle`` (named as SGLang's idle
    hook) under a queue wait: idle, as a real idle rank 0 is."""
    send = ThreadStack(1, "MainThread", True, True, (
        F("Socket.send", f"{SITE}/zmq/sugar/socket.py", 713),
        F("Scheduler.send_to_detokenizer", f"{SG}/managers/scheduler_output_processor_mixin.py", 900),
        *MODEL))
    assert classify_thread(send).state != "idle"
    sim_idle = ThreadStack(1, "MainThread", False, False, (
        F("Condition.wait", f"{STD}/threading.py", 331), F("Queue.get", f"{STD}/queue.py", 180),
        F("SimScheduler._drain", "/opt/sgl-seat/sgl_seat/sim/scheduler.py", 405),
        F("SimScheduler.on_idle", "/opt/sgl-seat/sgl_seat/sim/scheduler.py", 398),
        F("SimScheduler._next_plan", "/opt/sgl-seat/sgl_seat/sim/scheduler.py", 386)))
    assert classify_thread(sim_idle).state == "idle"
