"""Rehearsal faults on a real engine: only a seat the spec marks ``rehearsal: true`` takes them, they reach the
probe's gate through the plan's environment, and the node agent acts only on its own engine's processes.

No Ray: the agent is the plain class, its "engine" a small process tree started by it (a stand-in for SGLang's
launcher with a child titled like a scheduler).
"""

from __future__ import annotations

import dataclasses
import json
import sys
import time
from pathlib import Path

import psutil
import pytest

from sgl_seat.engines import backend_for
from sgl_seat.engines.family_targets import family_targets
from sgl_seat.errors import PlanError, UsageError
from sgl_seat.launch.actors.agent import NodeAgent
from sgl_seat.launch.rehearse import _signal_target
from sgl_seat.launch.seatrecord.home import HOME_ENV
from sgl_seat.plan import PROBE_ENV_TARGETS, LaunchPlan, NodePlan, build_plan
from sgl_seat.probe import fault as probe_fault
from sgl_seat.spec import SeatSpec, load_spec

FAULT = "probe-stall:rank=1,after_calls=20,for_s=30"


@pytest.fixture
def real() -> SeatSpec:
    return load_spec("local-sglang")


def test_the_rehearsal_profile_probes_the_embedding_lookup_and_carries_the_gate(real: SeatSpec) -> None:
    plan = build_plan(real, faults=(FAULT,))
    assert plan.rehearsal
    for n in plan.nodes:
        env = n.env_dict()
        targets = env[PROBE_ENV_TARGETS].split(",")
        assert targets[0] == "sglang.srt.layers.vocab_parallel_embedding:VocabParallelEmbedding.forward@input_:numel"
        # the decoder layer's heartbeat, the graph backends' links and replays (the GPU engine's; on the CPU engine
        # they are never called)
        assert targets[1] == "sglang.srt.models.llama:LlamaDecoderLayer.forward@:beat"
        assert targets == list(family_targets("LlamaForCausalLM")) and len(targets) == 6
        assert env[probe_fault.ENV_REHEARSAL] == "1"
        assert probe_fault.parse_probe_fault(env[probe_fault.ENV_FAULTS]) == probe_fault.parse_probe_fault(FAULT)
    back = LaunchPlan.from_json(json.loads(json.dumps(plan.to_json())))
    assert back.rehearsal


def test_the_engines_layer_names_the_probes_switches_as_the_probe_reads_them() -> None:
    from sgl_seat.engines import base

    assert base.ENV_PROBE_REHEARSAL == probe_fault.ENV_REHEARSAL
    assert base.ENV_PROBE_FAULTS == probe_fault.ENV_FAULTS


def test_a_production_seat_refuses_faults_and_carries_no_gate(real: SeatSpec) -> None:
    prod = real.model_copy(update={"rehearsal": False})
    with pytest.raises(UsageError, match="not a rehearsal"):
        build_plan(prod, faults=(FAULT,))
    plan = build_plan(prod)
    assert not plan.rehearsal
    assert all(probe_fault.ENV_REHEARSAL not in n.env_dict() for n in plan.nodes)


def test_a_real_seat_takes_probe_stalls_only(real: SeatSpec) -> None:
    with pytest.raises(UsageError, match="probe-stall"):
        build_plan(real, faults=("crash:rank=1",))
    with pytest.raises(UsageError):
        backend_for("sglang").validate_faults(["probe-stall:rank=one"], rehearsal=True)
    assert backend_for("sglang").validate_faults([], rehearsal=False) == ()


def test_a_fault_without_a_probe_is_refused(real: SeatSpec) -> None:
    blind = real.model_copy(update={"watchdog": real.watchdog.model_copy(update={"enabled": False})})
    with pytest.raises(PlanError, match="probe"):
        build_plan(blind, faults=(FAULT,))


def test_sim_seats_are_rehearsals() -> None:
    assert build_plan(load_spec("local-sim")).rehearsal


def test_fault_targets_are_found_in_the_plan(real: SeatSpec) -> None:
    plan = build_plan(real)
    assert _signal_target(plan, "rank=1") == (1, "sglang::scheduler_TP1")
    assert _signal_target(plan, "rank=0") == (0, "sglang::scheduler_TP0")
    assert _signal_target(plan, "detokenizer") == (0, "sglang::detokenizer")
    with pytest.raises(UsageError, match="no rank 5"):
        _signal_target(plan, "rank=5")
    with pytest.raises(UsageError):
        _signal_target(plan, "pid=5")


# -- the node agent ------------------------------------------------------------------------------------

#: A launcher that starts a child titled like a scheduler (argv[0] is the title SGLang's setproctitle writes).
_TREE = ("import subprocess, sys, time\n"
         "c = subprocess.Popen(['sglang::scheduler_TP1', '-c', 'import time; time.sleep(60)'],"
         " executable=sys.executable)\n"
         "time.sleep(60)\n")


def _agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, *, rehearsal: bool) -> tuple[NodeAgent, Path]:
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "home"))
    probe_dir = tmp_path / "probe"
    probe_dir.mkdir(mode=0o700)
    plan = build_plan(load_spec("local-sglang"))
    node = plan.nodes[1]
    node = NodePlan(node_rank=1, ranks=node.ranks, command=(sys.executable, "-c", _TREE),
                    env=(("SGLSEAT_PROBE_DIR", str(probe_dir)),), serves_http=False)
    plan = dataclasses.replace(plan, nodes=(plan.nodes[0], node), rehearsal=rehearsal)
    agent = NodeAgent("local-sglang", 1, "sglang")
    monkeypatch.setattr(NodeAgent, "_gpu_ids", staticmethod(lambda: []))
    agent.start_engine(json.dumps(plan.to_json()))
    return agent, probe_dir


def _wait_for_title(agent: NodeAgent, title: str) -> dict[str, object]:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        found = [p for p in agent.state()["processes"] if p["title"] == title]
        if found:
            return dict(found[0])
        time.sleep(0.1)
    raise AssertionError(f"{title} never appeared")


def test_the_agent_signals_its_own_engines_process_and_writes_the_probe_control_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    agent, probe_dir = _agent(tmp_path, monkeypatch, rehearsal=True)
    try:
        proc = _wait_for_title(agent, "sglang::scheduler_TP1")
        out = json.loads(agent.rehearse(json.dumps({"signal": "STOP", "title": "sglang::scheduler_TP1"})))
        assert out["error"] is None and out["pid"] == proc["pid"]
        deadline = time.monotonic() + 5
        while psutil.Process(out["pid"]).status() != psutil.STATUS_STOPPED and time.monotonic() < deadline:
            time.sleep(0.05)
        assert psutil.Process(out["pid"]).status() == psutil.STATUS_STOPPED
        json.loads(agent.rehearse(json.dumps({"signal": "CONT", "title": "sglang::scheduler_TP1"})))
        assert psutil.Process(out["pid"]).status() != psutil.STATUS_STOPPED
        missing = json.loads(agent.rehearse(json.dumps({"signal": "KILL", "title": "sglang::detokenizer"})))
        assert "no live engine process" in missing["error"]

        armed = json.loads(agent.rehearse(json.dumps({"probe": FAULT, "id": "a1"})))
        assert armed["error"] is None
        doc = json.loads((probe_dir / probe_fault.CONTROL_FILE).read_text())
        assert doc["id"] == "a1" and probe_fault.parse_probe_fault(doc["fault"]).rank == 1
        json.loads(agent.rehearse(json.dumps({"probe": None, "id": "a2"})))
        assert not (probe_dir / probe_fault.CONTROL_FILE).exists()
        bad = json.loads(agent.rehearse(json.dumps({"probe": "probe-stall:rank=x", "id": "a3"})))
        assert bad["error"]
    finally:
        json.loads(agent.kill_engine(5.0))
    assert json.loads(agent.survivors()) == []


def test_the_agent_of_a_production_seat_refuses(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    agent, probe_dir = _agent(tmp_path, monkeypatch, rehearsal=False)
    try:
        proc = _wait_for_title(agent, "sglang::scheduler_TP1")
        out = json.loads(agent.rehearse(json.dumps({"signal": "KILL", "title": "sglang::scheduler_TP1"})))
        assert "not a rehearsal" in out["error"]
        assert psutil.Process(int(str(proc["pid"]))).is_running()
        out = json.loads(agent.rehearse(json.dumps({"probe": FAULT, "id": "x"})))
        assert "not a rehearsal" in out["error"] and not (probe_dir / probe_fault.CONTROL_FILE).exists()
    finally:
        json.loads(agent.kill_engine(5.0))
    assert json.loads(agent.survivors()) == []


def test_sigkill_is_a_real_kill(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    agent, _ = _agent(tmp_path, monkeypatch, rehearsal=True)
    try:
        _wait_for_title(agent, "sglang::scheduler_TP1")
        out = json.loads(agent.rehearse(json.dumps({"signal": "KILL", "title": "sglang::scheduler_TP1"})))
        deadline = time.monotonic() + 5
        while psutil.pid_exists(out["pid"]) and psutil.Process(out["pid"]).status() != psutil.STATUS_ZOMBIE \
                and time.monotonic() < deadline:
            time.sleep(0.05)
        assert not psutil.pid_exists(out["pid"]) or psutil.Process(out["pid"]).status() == psutil.STATUS_ZOMBIE
    finally:
        json.loads(agent.kill_engine(5.0))
    assert json.loads(agent.survivors()) == []


def test_a_new_engine_starts_with_no_stale_run_time_fault(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN a control file left in the node's probe directory by an earlier seat (its stall never cleared: its
    engine died first) WHEN the agent starts an engine THEN the file is gone before the engine starts, so the new
    engine's first forward does not stall (it did: `up` then hung and SGLang's own watchdog killed it)."""
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "home"))
    probe_dir = tmp_path / "probe"
    probe_dir.mkdir(mode=0o700)
    assert probe_fault.write_control(str(probe_dir), FAULT, fault_id="old") is not None
    plan = build_plan(load_spec("local-sglang"))
    node = NodePlan(node_rank=1, ranks=plan.nodes[1].ranks,
                    command=(sys.executable, "-c", "import time; time.sleep(30)"),
                    env=(("SGLSEAT_PROBE_DIR", str(probe_dir)),), serves_http=False)
    plan = dataclasses.replace(plan, nodes=(plan.nodes[0], node), rehearsal=True)
    agent = NodeAgent("local-sglang", 1, "sglang")
    monkeypatch.setattr(NodeAgent, "_gpu_ids", staticmethod(lambda: []))
    agent.start_engine(json.dumps(plan.to_json()))
    try:
        assert not (probe_dir / probe_fault.CONTROL_FILE).exists()
    finally:
        json.loads(agent.kill_engine(5.0))
    assert json.loads(agent.survivors()) == []
