"""Every command line sgl-seat generates parses with SGLang 0.5.23's own argument parser.

The parser is SGLang's (``ServerArgs.add_cli_args`` + ``from_cli_args``), installed by
``scripts/install-sglang-parser.sh``; a flag SGLang does not know, or a value of the wrong type,
fails here before it can fail on a GPU node. The parsed fields must also mean what we meant.
"""

from __future__ import annotations

import pytest

from sgl_seat.engines import backend_for
from sgl_seat.errors import CapacityError, PlanError
from sgl_seat.plan import Placeholder, build_plan
from sgl_seat.spec import builtin_profiles, load_spec
from tests.contract.sglang_parser import parse_with_sglang

# Without SGLang these skip, except under CI=true where they fail (tests/contract/conftest.py).
pytestmark = [pytest.mark.contract, pytest.mark.usefixtures("sglang_required", "_mirror_sizing")]


@pytest.fixture
def _mirror_sizing(monkeypatch: pytest.MonkeyPatch) -> None:
    """The command lines are the point here: capacity through the mirror keeps the matrix fast (SGLang's own
    sizing of these plans is checked in test_sizing_sglang.py, the mirror against it in test_sizing_mirror.py)."""
    monkeypatch.setenv("SGLSEAT_SIZING", "mirror")

#: The profiles whose engine takes SGLang's command line (SGLang's and its double's; vLLM's are parsed by vLLM in
#: tests/contract/test_vllm_args.py).
SGLANG_LINE = [seat for seat in builtin_profiles() if backend_for(load_spec(seat).engine).module
               in (backend_for("sglang").module, backend_for("sim").module)]

MATRIX = [
    (seat, draft, slots, mf)
    for seat in SGLANG_LINE
    for draft in (False, True)
    for slots in (None, 1, 4, 8, 32, 64)
    for mf in (None, 0.8, 0.85, 0.9)
]


def _flags(command: tuple[str, ...], engine: str) -> list[str]:
    assert command[1:3] == ("-m", backend_for(engine).module)
    return list(command[3:])


@pytest.mark.parametrize(("seat", "draft", "slots", "mf"), MATRIX)
def test_generated_argv_parses_with_sglang(seat: str, draft: bool, slots: int | None, mf: float | None) -> None:
    spec = load_spec(seat)
    cannot_draft = backend_for(spec.engine).draft_problem(spec)
    if draft and cannot_draft:  # SGLang's CPU engine: refused before anything runs, with the reason
        with pytest.raises(PlanError, match="--draft on is refused"):
            build_plan(spec, draft=draft, slots=slots, mem_fraction=mf)
        return
    try:
        plan = build_plan(spec, draft=draft, slots=slots, mem_fraction=mf)
    except CapacityError:
        pytest.skip("configuration refused by the planner (cannot boot): nothing to launch")
    plan = plan.fill({Placeholder.NODE0_ADDR: "10.1.2.3", Placeholder.AGENT_PYTHON: "python3"})
    for node in plan.nodes:
        parsed = parse_with_sglang(_flags(node.command, spec.engine))
        assert parsed["tp_size"] == spec.parallel.tp
        assert parsed["ep_size"] == spec.parallel.ep
        assert parsed["nnodes"] == spec.cluster.nodes
        assert parsed["node_rank"] == node.node_rank
        assert parsed["dist_init_addr"] == f"10.1.2.3:{spec.network.dist_init_port}"
        assert parsed["mem_fraction_static"] == pytest.approx(plan.mem_fraction)
        assert parsed["max_running_requests"] == plan.slots
        assert parsed["context_length"] == spec.model.context_length
        assert parsed["watchdog_timeout"] == pytest.approx(spec.watchdog.engine_timeout_s)
        assert parsed["enable_metrics"] is True
        assert parsed["port"] == spec.network.http_port
        assert parsed["host"] == spec.network.host
        if spec.device == "cpu":  # the CPU engine's flags, as SGLang's parser reads them
            assert parsed["device"] == "cpu"
            assert parsed["attention_backend"] == "torch_native"
            assert parsed["load_format"] == spec.cpu.load_format
            assert parsed["max_total_tokens"] == spec.cpu.max_total_tokens
            assert parsed["sleep_on_idle"] is True
        if draft:
            assert parsed["speculative_algorithm"] == spec.draft.algorithm
            assert parsed["speculative_num_steps"] == spec.draft.steps
            assert parsed["speculative_eagle_topk"] == 1
            assert parsed["speculative_num_draft_tokens"] == spec.draft.draft_tokens
        else:
            assert parsed["speculative_algorithm"] is None


def test_the_parser_really_rejects_an_invented_flag() -> None:
    """Guards the test above: the contract parser must fail on a flag SGLang 0.5.23 lacks."""
    from tests.contract.sglang_parser import SglangParseError

    with pytest.raises(SglangParseError, match="speculative-disable-by-batch-size"):
        parse_with_sglang(["--model-path", "/m", "--speculative-disable-by-batch-size", "8"])
