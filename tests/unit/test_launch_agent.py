"""Node agent logic that needs no Ray: the engine's environment, placeholders, checks per backend, logs."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from sgl_seat.engines import backend_for, parse_kv_tokens, preflight_facts
from sgl_seat.engines.base import argv_value
from sgl_seat.errors import UsageError
from sgl_seat.launch.actors.agent import NodeAgent, engine_env, tail_lines
from sgl_seat.launch.seatrecord.home import HOME_ENV
from sgl_seat.launch.seatrecord.names import agent_name, namespace_of, pg_name
from sgl_seat.netports import held
from sgl_seat.plan import LaunchPlan, Placeholder, build_plan
from sgl_seat.spec import load_spec


@pytest.fixture
def plan() -> LaunchPlan:
    return build_plan(load_spec("local-sim"), draft=True)


def test_plan_crosses_to_the_agent_as_json_and_fills(plan: LaunchPlan) -> None:
    """GIVEN the driver fills node 0's address WHEN the agent rebuilds the plan from JSON and fills its
    Python THEN no placeholder is left in any argv or env."""
    filled = plan.fill({Placeholder.NODE0_ADDR: "127.0.0.1"})
    back = LaunchPlan.from_json(json.loads(json.dumps(filled.to_json())))
    back = back.fill({Placeholder.AGENT_PYTHON: "/venv/bin/python", Placeholder.REQUEST_LOG_DIR: "/h/requests"})
    assert back.placeholders() == []
    assert back.nodes[1].command[0] == "/venv/bin/python"
    assert argv_value(back.nodes[1].command, "--dist-init-addr") == f"127.0.0.1:{plan.dist_init_port}"
    assert argv_value(back.nodes[1].command, "--nope") is None


def test_engine_env_layers_plan_env_and_rays_gpus(plan: LaunchPlan) -> None:
    env = engine_env(plan.nodes[1], {"PATH": "/bin", "GLOO_SOCKET_IFNAME": "eth9", "CUDA_VISIBLE_DEVICES": "7"},
                     ["0", "1"])
    assert env["PATH"] == "/bin"
    assert env["GLOO_SOCKET_IFNAME"] == "lo"          # the plan's per-node env wins over the node's
    assert env["CUDA_VISIBLE_DEVICES"] == "0,1"       # Ray's assignment, written out explicitly
    assert env["SGLSEAT_NAME"] == "local-sim"


def test_names_are_per_seat() -> None:
    assert namespace_of("a") != namespace_of("b")
    assert agent_name("a", 1) == "sgl-seat-a-node1" and pg_name("a") == "sgl-seat-a-pg"


def test_sim_agent_runs_only_the_checks_that_apply(plan: LaunchPlan, monkeypatch: pytest.MonkeyPatch,
                                                   tmp_path: Path) -> None:
    """A busy HTTP port fails on every node, dist-init only on node 0; the sim skips model and HCA checks."""
    monkeypatch.setenv(HOME_ENV, str(tmp_path))
    busy = {plan.http_port, plan.dist_init_port}
    checked: set[tuple[str, int]] = set()

    def holder(port: int, host: str) -> str | None:
        checked.add((host, port))
        return "bound" if port in busy else None

    monkeypatch.setattr(preflight_facts, "port_holder", holder)
    monkeypatch.setattr(preflight_facts, "interfaces", lambda: ["lo", "eth0"])
    monkeypatch.setattr(preflight_facts, "ib_devices", lambda: pytest.fail("sim seats do not check HCAs"))
    monkeypatch.setattr(preflight_facts, "path_exists", lambda p: pytest.fail("sim seats do not check the model path"))
    plan = plan.fill({Placeholder.NODE0_ADDR: "127.0.0.1"})  # as the driver does before preflight
    for r in (0, 1):
        agent = NodeAgent("local-sim", r, "sim")
        fs = agent.local_checks(plan, plan.nodes[r], ["0", "1"])
        assert {f.node_rank for f in fs} == {r}
        ports = sorted(f.problem.split()[0] for f in fs)
        assert ports == (["dist_init", "http"] if r == 0 else ["http"])
    # Checked where the engine binds (local-sim: loopback), never on every interface.
    assert {h for h, _ in checked} == {"127.0.0.1"} and (("127.0.0.1", plan.dist_init_port) in checked)
    assert agent.log_path == tmp_path / "logs" / "local-sim" / "node1.log"


def test_ports_are_checked_on_the_address_the_engine_binds(plan: LaunchPlan) -> None:
    bind_host = backend_for("sim").bind_host
    argv = ["python", "-m", "sglang.launch_server", "--host", "10.0.0.5", "--dist-init-addr", "10.0.0.7:5000"]
    assert bind_host(argv, "http") == "10.0.0.5"
    assert bind_host(argv, "dist_init") == "10.0.0.7"
    assert bind_host(argv, "sim admin") == "127.0.0.1"  # the sim's fault routes are loopback only
    assert bind_host(["x", "--dist-init-addr", "[fd00::1]:5000"], "dist_init") == "fd00::1"
    assert bind_host(["x"], "http") == "127.0.0.1"  # SGLang's default --host
    assert bind_host(["x", "--host=10.0.0.9", "--dist-init-addr=10.0.0.8:5000"], "dist_init") == "10.0.0.8"
    assert argv_value(["x", "--host=10.0.0.9"], "--host") == "10.0.0.9"  # argparse's --flag=value form too
    assert argv_value(["x", "--hostname", "h", "--host"], "--host") is None  # no value, and not a prefix match
    filled = plan.fill({Placeholder.NODE0_ADDR: "127.0.0.1"})
    assert {bind_host(filled.nodes[0].command, w) for w in ("http", "dist_init", "sim admin")} == {"127.0.0.1"}


def test_a_listener_on_the_engines_address_is_found() -> None:
    with held(listen=True) as port:
        assert "bound to 127.0.0.1:" in (preflight_facts.port_holder(port, "127.0.0.1") or "")
    assert preflight_facts.port_holder(port, "127.0.0.1") is None


def test_tail_lines(tmp_path: Path) -> None:
    p = tmp_path / "x.log"
    p.write_text("".join(f"line {i}\n" for i in range(500)))
    assert tail_lines(p, 3) == ["line 497", "line 498", "line 499"]
    assert tail_lines(tmp_path / "missing", 3) == []


def test_kv_line_is_parsed_as_sglang_prints_it() -> None:
    text = ("[2026 TP0 EP0] Load weight end.\n[2026 TP0 EP0] KV Cache is allocated. dtype: torch.bfloat16, "
            "#tokens: 260352, KV size: 12.31 GB\n")
    assert parse_kv_tokens(text) == 260352
    assert parse_kv_tokens("SWA KV Cache VA upper bound. #tokens: 1,024, K size: 1 GB") == 1024
    assert parse_kv_tokens("nothing here") is None


def test_sglang_refuses_faults_and_sim_accepts_them() -> None:
    with pytest.raises(UsageError, match="not a rehearsal"):
        backend_for("sglang").validate_faults(["crash:rank=2"])
    assert backend_for("sglang").validate_faults([]) == ()
    with pytest.raises(UsageError):
        backend_for("tgi")


def test_the_ports_the_launcher_checks_are_the_ports_the_sim_binds(plan: LaunchPlan) -> None:
    """GIVEN node 1 co-located with node 0 (the backend's own-host environment) WHEN the sim parses node 1's
    argv and environment THEN it listens on the HTTP port and serves its admin routes on the admin port that
    preflight checks for it."""
    from sgl_seat.sim import args

    sim = backend_for("sim")
    filled = plan.fill({Placeholder.NODE0_ADDR: "127.0.0.1"})
    node = filled.nodes[1]
    env = {**node.env_dict(), **(sim.colocated_env(filled, 1) or {})}
    cfg = args.parse(list(node.command[3:]), env)
    colocated = dataclasses.replace(node, env=tuple(sorted(env.items())))
    assert sim.listen_ports(filled, colocated) == {"http": cfg.node_port, "sim admin": cfg.admin_port}
    assert cfg.node_port != filled.http_port  # its own port, not node 0's


def test_sim_faults_are_checked_with_the_sims_parser() -> None:
    sim = backend_for("sim")
    assert sim.validate_faults(["crash:rank=2,after_s=30"]) == ("crash:rank=2,after_s=30",)
    with pytest.raises(UsageError):
        sim.validate_faults(["explode:rank=1"])


def test_read_log_returns_whole_lines_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`logs -f` never prints half a line: an unfinished line waits for its newline."""
    monkeypatch.setenv(HOME_ENV, str(tmp_path))
    agent = NodeAgent("s", 0, "sim")
    agent.log_path.parent.mkdir(parents=True)
    agent.log_path.write_bytes("one\ntwo é".encode())
    first = json.loads(agent.read_log(0))
    assert first["data"] == "one\n" and first["offset"] == 4
    with agent.log_path.open("ab") as fh:
        fh.write(b" done\n")
    second = json.loads(agent.read_log(first["offset"]))
    assert second["data"] == "two é done\n"
    assert json.loads(agent.read_log(second["offset"]))["data"] == ""


@pytest.mark.parametrize(("lost_before_exit_s", "first"), [(5.0, "scheduler"), (0.1, "engine")])
def test_a_scheduler_is_named_first_only_when_it_went_well_before_its_engine(
        plan: LaunchPlan, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, lost_before_exit_s: float,
        first: str) -> None:
    """GIVEN node 1's engine killed, its schedulers seen gone ``lost_before_exit_s`` before, and the state read
    that reaps the exit coming before the watch thread stamps it WHEN the state is read THEN the reason names the
    scheduler first only when it went more than 1 s before the engine (real SGLang: a killed scheduler takes
    its launcher seconds later); a process group killed at once is the engine's exit."""
    import subprocess
    import sys
    import time

    monkeypatch.setenv(HOME_ENV, str(tmp_path))
    agent = NodeAgent(plan.seat, 1, "sim")
    agent.node = plan.nodes[1]
    agent.proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"], start_new_session=True)
    try:
        titles = [r.process_title for r in agent.node.ranks]
        agent.rank_pids = {t: (agent.proc.pid + 10_000_000 + i, 0.0) for i, t in enumerate(titles)}  # gone pids
        agent.proc.kill()
        agent.proc.wait(10)
        agent.rank_lost_at = {t: time.time() - lost_before_exit_s for t in titles}
        st = agent.state()  # exited_at unset: no watch thread stamped the exit
    finally:
        if agent.proc.poll() is None:
            agent.proc.kill()
    assert not st["alive"]
    if first == "scheduler":
        assert st["reason"].startswith(f"node 1: scheduler process gone: {titles[0]}"), st["reason"]
        assert st["reason"].endswith(f"then its engine (pid {agent.proc.pid}) killed by SIGKILL")
    else:
        assert st["reason"] == f"node 1 engine (pid {agent.proc.pid}) killed by SIGKILL", st["reason"]
    assert st["exited_at"] == pytest.approx(time.time() - lost_before_exit_s, abs=1.0)


def test_an_engine_interpreter_by_path_puts_its_directory_first_on_path(plan: LaunchPlan) -> None:
    """SGLang's own watchdog runs `py-spy` by name: the engine's environment must find its own tools first."""
    node = dataclasses.replace(plan.nodes[0], command=("/opt/engine/bin/python", "-m", "sglang.launch_server"))
    env = engine_env(node, {"PATH": "/usr/bin:/opt/engine/bin:/bin"}, [])
    assert env["PATH"] == "/opt/engine/bin:/usr/bin:/bin"
    bare = dataclasses.replace(plan.nodes[0], command=("python3", "-m", "sglang.launch_server"))
    assert engine_env(bare, {"PATH": "/usr/bin"}, [])["PATH"] == "/usr/bin"
