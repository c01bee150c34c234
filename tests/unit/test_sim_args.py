"""The sim's command line is the plan's SGLang argv; unknown flags and bad values are refused clearly."""

from __future__ import annotations

import pytest

from sgl_seat.errors import UsageError
from sgl_seat.plan import Placeholder, build_plan
from sgl_seat.sim import args, contract
from sgl_seat.spec import load_spec
from sgl_seat.topology import topology_of


def _plan_argv(draft: bool, node_rank: int = 0) -> tuple[list[str], dict[str, str]]:
    p = build_plan(load_spec("local-sim"), draft=draft).fill({Placeholder.NODE0_ADDR: "127.0.0.1"})
    node = p.nodes[node_rank]
    cmd = list(node.command)
    i = cmd.index("-m")
    assert cmd[i + 1] == "sgl_seat.sim.launch_server"
    return cmd[i + 2 :], node.env_dict()


def test_env_names_match_the_planner() -> None:
    """The planner writes the sim's knobs (through the sim backend) under the names the sim reads."""
    p = build_plan(load_spec("local-sim"), draft=True, faults=("crash:rank=2,after_s=30",))
    env = p.nodes[0].env_dict()
    for name in (args.ENV_KV_TOKENS, args.ENV_ACCEPT_RATE, args.ENV_STEP_FLOOR_MS, args.ENV_FAULTS):
        assert name in env
    assert "crash:rank=2,after_s=30" in env[args.ENV_FAULTS].split(";")


@pytest.mark.parametrize("draft", [False, True])
def test_plan_argv_parses_with_the_plans_figures(draft: bool) -> None:
    argv, env = _plan_argv(draft, node_rank=1)
    cfg = args.parse(argv, env)
    assert (cfg.tp_size, cfg.ep_size, cfg.nnodes, cfg.node_rank) == (4, 4, 2, 1)
    assert cfg.dist_init_addr == "127.0.0.1:31005"
    assert cfg.served_model_name == "sim-dsv41"
    assert cfg.enable_metrics and cfg.watchdog_timeout == 60.0
    # The sim runs with the plan's own capacity figures (whatever the sizing computes), passed through env.
    cap = build_plan(load_spec("local-sim"), draft=draft).capacity
    assert cap is not None
    want = cap.draft_on if draft else cap.draft_off
    assert cfg.kv_tokens == want.kv_pool_tokens > 0
    assert cfg.max_running_requests == want.max_running_requests == (8 if draft else 32)
    assert cfg.accept_rate == 0.81
    assert cfg.local_tp_ranks() == [2, 3]
    assert cfg.spec_on == draft
    if draft:
        assert (cfg.speculative_algorithm, cfg.speculative_num_steps, cfg.speculative_eagle_topk,
                cfg.speculative_num_draft_tokens) == ("EAGLE", 3, 1, 4)
    assert args.SimConfig.from_json(cfg.to_json()) == cfg


def test_titles_match_the_planner() -> None:
    topo = topology_of(load_spec("local-sim"))
    for r in topo.all_ranks(contract.SCHEDULER_TITLE_PREFIX):
        assert contract.scheduler_title(r.tp_rank, r.ep_rank, topo.tp, topo.ep) == r.process_title
    assert contract.scheduler_title(0, 0, 1, 1) == "sglang::scheduler"


def test_unknown_flag_is_argparse_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ei:
        args.parse(["--model-path", "m", "--speculative-disable-by-batch-size", "8"], {})
    assert ei.value.code == 2
    err = capsys.readouterr().err
    assert "unrecognized arguments: --speculative-disable-by-batch-size" in err
    assert "Traceback" not in err


def test_missing_model_path_is_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as ei:
        args.parse(["--tp-size", "2"], {})
    assert ei.value.code == 2
    assert "--model-path" in capsys.readouterr().err


@pytest.mark.parametrize(
    ("extra", "needle"),
    [
        (["--nnodes", "2", "--node-rank", "2", "--dist-init-addr", "h:1", "--tp-size", "2"], "is outside 0..1"),
        (["--nnodes", "2", "--tp-size", "2"], "--dist-init-addr is required"),
        (["--tp-size", "3", "--nnodes", "2", "--dist-init-addr", "h:1"], "multiple of --nnodes"),
        (["--tp-size", "4", "--ep-size", "3"], "must divide --tp-size"),
        (["--dist-init-addr", "nohost"], "is not host:port"),
        (["--mem-fraction-static", "1.5"], "outside (0, 1)"),
        (["--speculative-num-steps", "3"], "need --speculative-algorithm"),
        (["--dist-timeout", "0"], "--dist-timeout 0 must be at least 1"),
    ],
)
def test_semantic_errors_are_usage_errors(extra: list[str], needle: str) -> None:
    with pytest.raises(UsageError) as ei:
        args.parse(["--model-path", "m", *extra], {})
    assert needle in str(ei.value)


@pytest.mark.parametrize(
    ("env", "needle"),
    [
        ({"SGLSEAT_SIM_KV_TOKENS": "lots"}, "is not a whole number"),
        ({"SGLSEAT_SIM_ACCEPT_RATE": "1.5"}, "outside [0, 1]"),
        ({"SGLSEAT_SIM_STEP_FLOOR_MS": "-1"}, "outside"),
        ({"SGLSEAT_SIM_FAULTS": "explode:rank=1"}, "unknown kind"),
        ({"SGLSEAT_SIM_FAULTS": "crash:rank=9"}, "names rank 9"),
    ],
)
def test_bad_environment_is_refused(env: dict[str, str], needle: str) -> None:
    with pytest.raises(UsageError) as ei:
        args.parse(["--model-path", "m", "--tp-size", "2"], env)
    assert needle in str(ei.value)


def test_defaults_and_sglang_resolution() -> None:
    cfg = args.parse(["--model-path", "a/b/", "--speculative-algorithm", "nextn"], {})
    assert cfg.served_model_name == "b"
    assert cfg.speculative_algorithm == "EAGLE"  # NEXTN is aliased, as in SGLang
    assert (cfg.speculative_num_steps, cfg.speculative_eagle_topk, cfg.speculative_num_draft_tokens) == (3, 1, 4)
    assert cfg.max_running_requests == 48  # SGLang's speculative default
    assert cfg.kv_tokens == args.DEFAULT_KV_TOKENS_ON
    small = args.parse(["--model-path", "m", "--max-running-requests", "64"], {"SGLSEAT_SIM_KV_TOKENS": "40"})
    assert small.max_running_requests == 20  # min(requested, token_capacity // 2)
    tp1 = args.parse(["--model-path", "m", "--port", "32500"], {"SGLSEAT_SIM_NODE_PORT": "32510"})
    assert tp1.port == 32500 and tp1.node_port == 32510 and tp1.admin_port == 32512
    assert "sgl_seat.sim.launch_server --model-path m --port 32500" in tp1.launch_command
