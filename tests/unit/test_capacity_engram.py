"""The Engram host table: its bytes from the shipped V4.1 config, what it takes off each GPU, and the per-node
checks (host RAM, huge pages, ulimit -l, the shared layout's /proc access) against fake machines."""

from __future__ import annotations

import json
import resource
from pathlib import Path

import pytest

from sgl_seat.sizing.engram import (
    HostReaders,
    NodeNeeds,
    check_node,
    engram_tables,
    host_table_env,
    layout_problem,
    mem_available_bytes,
)
from sgl_seat.spec import SeatSpec

V41 = Path(__file__).resolve().parents[2] / "launch" / "models" / "deepseek-v4.1-flash-engram" / "config.json"
GIB = 1 << 30


def _tables():  # type: ignore[no-untyped-def]
    tables = engram_tables(json.loads(V41.read_text()))
    assert tables is not None
    return tables


def test_the_v41_tables_are_two_times_384m_rows_of_264_bytes() -> None:
    t = _tables()
    assert t.layer_ids == (1, 14) and t.row_bytes == 256 + 256 // 32 == 264
    assert t.total_bytes == (384_006_168 + 384_016_682) * 264
    assert 188 * GIB < t.total_bytes < 189 * GIB
    # TP4 in HBM: each rank holds a quarter of each table's rows.
    assert t.gpu_bytes_per_rank(4) == (96_001_542 + 96_004_171) * 264
    assert t.host_bytes_per_node("shared", tp=4, ranks_per_node=2) == t.total_bytes
    assert t.host_bytes_per_node("per_rank", tp=4, ranks_per_node=2) == 2 * t.gpu_bytes_per_rank(4)
    assert t.pinned_bytes_per_process("per_rank", tp=4) == t.gpu_bytes_per_rank(4)


def test_a_config_without_engram_keys_has_no_tables() -> None:
    assert engram_tables({"architectures": ["DeepseekV4ForCausalLM"]}) is None


def test_env_uses_sglangs_variable_names() -> None:
    assert host_table_env("per_rank", staging=True) == {
        "SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE": "1",
        "SGLANG_DSV41_ENGRAM_HOST_TABLE_LAYOUT": "per_rank",
        "SGLANG_OPT_DSV41_ENGRAM_HOST_STAGING": "1",
    }


def test_the_shared_layout_cannot_span_nodes() -> None:
    assert layout_problem("shared", nnodes=1) is None
    assert layout_problem("per_rank", nnodes=2) is None
    problem = layout_problem("shared", nnodes=2)
    assert problem is not None and "PID namespace" in problem


def _machine(*, avail_gib: float = 512, thp: str = "always [madvise] never",
             shmem: str = "always within_size [advise] never deny force", memlock: int = resource.RLIM_INFINITY,
             ptrace: str = "0", root: bool = False) -> HostReaders:
    meminfo = f"MemTotal:       1056000000 kB\nMemFree:  100 kB\nMemAvailable:   {int(avail_gib * 1024 * 1024)} kB\n"
    return HostReaders(
        meminfo=lambda: meminfo,
        thp_knob=lambda knob: shmem if knob == "shmem_enabled" else thp,
        memlock=lambda: (memlock, memlock),
        ptrace_scope=lambda: ptrace + "\n",
        is_root=lambda: root,
    )


def _needs(layout: str = "per_rank") -> NodeNeeds:
    t = _tables()
    return NodeNeeds(layout=layout,  # type: ignore[arg-type]
                     host_bytes=t.host_bytes_per_node(layout, tp=4, ranks_per_node=2),  # type: ignore[arg-type]
                     pinned_bytes_per_process=t.pinned_bytes_per_process(layout, tp=4))  # type: ignore[arg-type]


def test_a_ready_node_passes() -> None:
    assert check_node(_needs("per_rank"), _machine()) == []
    assert check_node(_needs("shared"), _machine()) == []


def test_not_enough_free_ram_fails_with_the_numbers() -> None:
    problems = check_node(_needs("per_rank"), _machine(avail_gib=40))
    assert len(problems) == 1
    assert "MemAvailable is 40.0 GiB" in problems[0] and "94.4 GiB" in problems[0]


def test_no_huge_pages_fails_naming_the_knob() -> None:
    problems = check_node(_needs("per_rank"), _machine(thp="always madvise [never]"))
    assert len(problems) == 1 and "transparent_hugepage/enabled is 'never'" in problems[0]
    problems = check_node(_needs("shared"), _machine(shmem="always within_size advise [never] deny force"))
    assert len(problems) == 1 and "transparent_hugepage/shmem_enabled" in problems[0]


def test_a_small_memlock_limit_fails_unless_root() -> None:
    problems = check_node(_needs("per_rank"), _machine(memlock=64 * 1024))
    assert len(problems) == 1 and "ulimit -l" in problems[0]
    assert check_node(_needs("per_rank"), _machine(memlock=64 * 1024, root=True)) == []


def test_the_shared_layout_needs_proc_access_between_ranks() -> None:
    problems = check_node(_needs("shared"), _machine(ptrace="2", root=True))
    assert len(problems) == 1 and "ptrace_scope is 2" in problems[0]
    assert check_node(_needs("shared"), _machine(ptrace="1", root=True)) == []
    assert check_node(_needs("per_rank"), _machine(ptrace="3")) == []


def test_an_unreadable_proc_is_a_problem_not_a_pass() -> None:
    def broken() -> str:
        raise OSError("no /proc")

    readers = HostReaders(meminfo=broken, thp_knob=lambda k: "[always]", memlock=lambda: (-1, -1),
                          ptrace_scope=lambda: "0", is_root=lambda: False)
    problems = check_node(_needs("per_rank"), readers)
    assert any("cannot read /proc/meminfo" in p for p in problems)


def test_meminfo_parsing() -> None:
    assert mem_available_bytes("MemAvailable:   2048 kB\n") == 2048 * 1024
    assert mem_available_bytes("MemTotal: 1 kB\n") is None


# -- through the plan and the node preflight ---------------------------------------------------------------

def _v41_seat(tmp_path: Path, engram: dict[str, object] | None) -> SeatSpec:
    doc: dict[str, object] = {
        "schema_version": 1, "name": "v41", "engine": "sglang",
        "model": {"path": "/m", "context_length": 409_600, "config": str(V41.parent), "weights_gb": 475},
        "cluster": {"nodes": 2, "gpus_per_node": 2, "gpu_memory_gb": 96}, "parallel": {"tp": 4, "ep": 4},
        "memory_fraction": 0.85, "slots": 8,
    }
    if engram is not None:
        doc["engram"] = engram
    return SeatSpec.model_validate(doc)


def test_plan_with_the_host_table_sets_the_env_on_every_node_and_takes_the_tables_off_the_gpus(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sgl_seat.plan import build_plan

    monkeypatch.setenv("SGLSEAT_SIZING", "mirror")
    t = _tables()
    plan = build_plan(_v41_seat(tmp_path, {"host_table": True, "layout": "per_rank"}), draft=False)
    for node in plan.nodes:
        env = node.env_dict()
        assert env["SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE"] == "1"
        assert env["SGLANG_DSV41_ENGRAM_HOST_TABLE_LAYOUT"] == "per_rank"
        assert int(env["SGLSEAT_ENGRAM_HOST_BYTES"]) == 2 * t.gpu_bytes_per_rank(4)
    cap = plan.capacity
    assert cap is not None and cap.engram_host_bytes_per_node == 2 * t.gpu_bytes_per_rank(4)
    assert cap.draft_off.weights_bytes_per_gpu == int(475 * GIB) // 4 - t.gpu_bytes_per_rank(4)
    assert cap.draft_off.fits and cap.draft_off.kv_pool_tokens > 0


def test_without_the_host_table_the_checkpoint_does_not_fit_and_the_env_is_absent(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    from sgl_seat.sizing import plan_capacity

    monkeypatch.setenv("SGLSEAT_SIZING", "mirror")
    cap = plan_capacity(_v41_seat(tmp_path, None), slots_off=8, slots_on=8, mem_fraction=0.85)
    assert cap is not None and cap.engram_host_bytes_per_node is None
    assert cap.draft_off.weights_bytes_per_gpu == int(475 * GIB) // 4
    assert not cap.draft_off.fits and "Raise --mem-fraction-static" in (cap.draft_off.problem or "")


def test_the_shared_layout_on_two_nodes_is_refused_by_the_plan(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    from sgl_seat.errors import PlanError
    from sgl_seat.plan import build_plan

    monkeypatch.setenv("SGLSEAT_SIZING", "mirror")
    with pytest.raises(PlanError, match="PID namespace"):
        build_plan(_v41_seat(tmp_path, {"host_table": True, "layout": "shared"}), draft=False)


def test_node_preflight_fails_clearly_without_ram_or_huge_pages(tmp_path: Path,
                                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    from sgl_seat.engines.preflight import Check, check_engram_host_table
    from sgl_seat.plan import build_plan

    monkeypatch.setenv("SGLSEAT_SIZING", "mirror")
    plan = build_plan(_v41_seat(tmp_path, {"host_table": True, "layout": "per_rank"}), draft=False)
    env = plan.nodes[1].env_dict()
    assert check_engram_host_table(1, env, _machine()) == []
    low = check_engram_host_table(1, env, _machine(avail_gib=16))
    assert [f.check for f in low] == [Check.ENGRAM_HOST.value]
    assert "MemAvailable is 16.0 GiB" in low[0].problem and low[0].node_rank == 1
    nohuge = check_engram_host_table(1, env, _machine(thp="always madvise [never]"))
    assert len(nohuge) == 1 and "no huge pages" in nohuge[0].problem
    # Host table off: nothing to check.
    assert check_engram_host_table(0, {}, _machine(avail_gib=1)) == []
