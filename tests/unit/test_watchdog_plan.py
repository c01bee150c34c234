"""The probe reaches each node through the plan's environment (and only when the watchdog is on)."""

from __future__ import annotations

from pathlib import Path

import yaml

from sgl_seat import probe
from sgl_seat.engines.family_targets import SIM_TARGETS, family_targets, targets_file
from sgl_seat.plan import PROBE_ENV_DIR, PROBE_ENV_TARGETS, Placeholder, build_plan
from sgl_seat.spec import load_spec, parse_spec
from sgl_seat.watchdog import boot_dir


def _spec(seat: str, **watchdog: object) -> object:
    path = Path(load_spec(seat).source or "")
    doc = yaml.safe_load(path.read_text())
    doc.setdefault("watchdog", {}).update(watchdog)
    return parse_spec(yaml.safe_dump(doc), path=str(path))


def test_sim_nodes_get_the_rowfetch_target_and_their_own_ring_dir() -> None:
    plan = build_plan(load_spec("local-sim"))
    envs = [n.env_dict() for n in plan.nodes]
    assert [e[PROBE_ENV_TARGETS] for e in envs] == [",".join(SIM_TARGETS)] * 2
    assert [e[PROBE_ENV_DIR] for e in envs] == [f"/dev/shm/sgl-seat-local-sim/node{r}" for r in (0, 1)]
    assert all("PYTHONPATH" not in e for e in envs)  # the sim loads the probe itself


def test_sglang_nodes_load_the_probe_through_sitecustomize() -> None:
    plan = build_plan(load_spec("large"))
    env = plan.nodes[1].env_dict()
    assert env["PYTHONPATH"] == Placeholder.WATCHDOG_BOOT.value
    assert env[PROBE_ENV_TARGETS].split(",") == list(family_targets("DeepseekV4ForCausalLM"))
    filled = plan.fill({Placeholder.WATCHDOG_BOOT: boot_dir()})
    assert Path(filled.nodes[1].env_dict()["PYTHONPATH"], "sitecustomize.py").is_file()


def test_user_pythonpath_is_kept_after_the_loader() -> None:
    spec = _spec("large")
    doc = spec.model_dump(exclude={"source"})  # type: ignore[attr-defined]
    doc["network"]["env"]["PYTHONPATH"] = "/opt/extra"
    plan = build_plan(parse_spec(yaml.safe_dump(doc), path=spec.source))  # type: ignore[attr-defined]
    assert plan.nodes[0].env_dict()["PYTHONPATH"] == f"{Placeholder.WATCHDOG_BOOT.value}:/opt/extra"


def test_watchdog_off_means_no_probe() -> None:
    plan = build_plan(_spec("large", enabled=False))  # type: ignore[arg-type]
    for n in plan.nodes:
        env = n.env_dict()
        assert PROBE_ENV_TARGETS not in env and PROBE_ENV_DIR not in env and "PYTHONPATH" not in env
    assert Placeholder.WATCHDOG_BOOT.value not in plan.placeholders()


def test_shipped_targets_parse() -> None:
    assert targets_file() is not None
    for fam in ("sim", "DeepseekV4ForCausalLM", "LlamaForCausalLM", "Qwen3MoeForCausalLM"):
        for t in family_targets(fam):
            probe.parse_target(t)
    assert family_targets("NoSuchArch") == ()
