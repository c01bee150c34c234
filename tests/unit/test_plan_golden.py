"""Golden plans: the text and JSON an operator sees for the shipped profiles are pinned.

A change that alters any command line, environment or capacity figure must show up here as a
diff; regenerate deliberately with ``UPDATE_GOLDEN=1 pytest tests/unit/test_plan_golden.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from sgl_seat.plan import build_plan, render_text
from sgl_seat.spec import load_spec

GOLDEN = Path(__file__).resolve().parents[1] / "fixtures" / "plans"
CASES = [("large", False), ("large", True), ("local-sim", False), ("local-sim", True)]


@pytest.fixture(autouse=True)
def _mirror(monkeypatch: pytest.MonkeyPatch) -> None:
    """Goldens are the mirror's figures, the same with or without SGLang installed; the contract tests hold the
    mirror to SGLang's own sizing (tests/contract/test_sizing_mirror.py, test_sizing_sglang.py)."""
    monkeypatch.setenv("SGLSEAT_SIZING", "mirror")


def _check(name: str, actual: str) -> None:
    path = GOLDEN / name
    if os.environ.get("UPDATE_GOLDEN"):
        path.write_text(actual, encoding="utf-8")
    assert path.is_file(), f"missing golden {path}; run with UPDATE_GOLDEN=1"
    assert actual == path.read_text(encoding="utf-8"), f"{name} differs from its golden file"


@pytest.mark.parametrize(("seat", "draft"), CASES)
def test_plan_text_and_json_match_golden(seat: str, draft: bool) -> None:
    plan = build_plan(load_spec(seat), draft=draft)
    stem = f"{seat}-draft-{'on' if draft else 'off'}"
    _check(f"{stem}.txt", render_text(plan))
    _check(f"{stem}.json", json.dumps(plan.to_json(), indent=2) + "\n")


def test_plan_json_has_the_documented_keys() -> None:
    """The keys the issue promises to scripts that read `plan --json`."""
    doc = build_plan(load_spec("large"), draft=True).to_json()
    assert doc["schema_version"] == 1
    assert [n["node_rank"] for n in doc["nodes"]] == [0, 1]
    assert all(isinstance(a, str) for n in doc["nodes"] for a in n["command"])
    assert all(isinstance(n["env"], dict) for n in doc["nodes"])
    assert doc["placement"]["strategy"] == "STRICT_SPREAD"
    assert doc["placement"]["bundles"] == [{"CPU": 16.0, "GPU": 2.0}, {"CPU": 16.0, "GPU": 2.0}]
    for state in ("draft_off", "draft_on"):
        cap = doc["capacity"][state]
        for key in ("kv_bytes_per_token", "kv_pool_tokens", "max_running_requests", "weights_bytes_per_gpu"):
            assert isinstance(cap[key], int), (state, key)


def test_large_seat_is_computed_and_compared_with_the_field_report_not_fitted_to_it() -> None:
    """PT-R-2026-019's figures are an observation: the plan shows its own and says how they compare."""
    cap = build_plan(load_spec("large"), draft=True).capacity
    assert cap is not None and cap.source == "mirror"
    assert cap.draft_off.max_running_requests == 32 and cap.draft_on.max_running_requests == 8
    assert cap.draft_on.kv_pool_tokens < cap.draft_off.kv_pool_tokens
    notes = " ".join(cap.notes)
    assert "890,000" in notes and "260,352" in notes and "not fitted away" in notes
    assert f"{cap.draft_off.kv_pool_tokens:,} draft off" in notes


def test_node_env_is_per_node_not_copied_from_node0() -> None:
    plan = build_plan(load_spec("large"))
    env0, env1 = (n.env_dict() for n in plan.nodes)
    assert env0["NCCL_SOCKET_IFNAME"] != env1["NCCL_SOCKET_IFNAME"]
    assert env0["NCCL_IB_HCA"] == "mlx5_0" and env1["NCCL_IB_HCA"] == "mlx5_1"
    assert env0["NCCL_IB_GID_INDEX"] == env1["NCCL_IB_GID_INDEX"] == "3"


def test_fill_replaces_placeholders_everywhere() -> None:
    from sgl_seat.plan import LaunchPlan, Placeholder

    plan = build_plan(load_spec("local-sim"), draft=True)
    assert set(plan.placeholders()) == {"${node0_addr}", "${agent_python}", "${request_log_dir}"}
    filled = plan.fill({Placeholder.NODE0_ADDR: "127.0.0.1", Placeholder.AGENT_PYTHON: "/venv/bin/python",
                        Placeholder.REQUEST_LOG_DIR: "/home/u/.sgl-seat/logs/local-sim/requests"})
    assert filled.placeholders() == []
    assert filled.nodes[0].command[-2:] == ("--log-requests-target", "/home/u/.sgl-seat/logs/local-sim/requests")
    assert "--log-requests" not in filled.nodes[1].command  # only node 0 serves requests
    assert filled.nodes[1].command[0] == "/venv/bin/python"
    assert "127.0.0.1:31005" in filled.nodes[1].command
    again = LaunchPlan.from_json(json.loads(json.dumps(filled.to_json())))
    assert again.nodes == filled.nodes and again.placement == filled.placement
