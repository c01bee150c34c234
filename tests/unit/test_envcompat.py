"""This project's environment variables (issue 49, item 4): the prefix ``SGLSEAT_``; ``SGL_SEAT_`` for one release.

SGLang claims ``SGL_``: at import, ``sglang/srt/environ.py`` rewrites every ``SGL_*`` variable to ``SGLANG_*`` with a
deprecation warning (0.5.23 ``_handle_deprecated_envs``, 0.5.17 ``_convert_SGL_to_SGLANG``), so an engine given
``SGL_SEAT_NAME`` opened its log with "Environment variable SGL_SEAT_NAME is deprecated, please use
SGLANG_SEAT_NAME". ``tests/contract/test_env_prefix_sglang.py`` holds :data:`SGLANG_CLAIMS` to SGLang's own code.

This file names the old prefix on purpose; /tmp/rename-env.sh (the mechanical rename) leaves it alone.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest
import yaml

from rigs.checkout import cli_argv
from sgl_seat import envcompat
from sgl_seat.errors import SpecError
from sgl_seat.forensics.format.scrub import scrub_env
from sgl_seat.plan import LaunchPlan, build_plan
from sgl_seat.probe import oldnames
from sgl_seat.spec import builtin_seats_dir, load_spec, parse_spec

REPO = Path(__file__).resolve().parents[2]
BUNDLES = REPO / "tests" / "fixtures" / "bundles"

#: SGLang's rule, copied: a variable it rewrites to ``SGLANG_*`` with a warning. 0.5.23:
#: ``sglang/srt/environ.py`` ``_handle_deprecated_envs`` (``key.startswith("SGL_")``, about line 2298); 0.5.17:
#: ``_convert_SGL_to_SGLANG`` (``key.startswith("SGL_")``, about line 1407). ``SGLANG_*`` it reads as its own.
SGLANG_CLAIMS = re.compile(r"^(SGL_|SGLANG_)")


def _all_env(plan: LaunchPlan) -> dict[str, str]:
    env: dict[str, str] = {}
    for n in plan.nodes:
        env.update(n.env_dict())
    for h in plan.hosts:
        env.update(dict(h.env))
    return env


# ---- the prefix ------------------------------------------------------------------------------------------------


def test_the_new_prefix_is_not_sglangs() -> None:
    assert not SGLANG_CLAIMS.match(envcompat.NEW_PREFIX)
    assert SGLANG_CLAIMS.match(envcompat.OLD_PREFIX)  # why it changed: the rule can tell them apart


@pytest.mark.parametrize("seat", ["local-sglang", "large"])
def test_a_real_sglang_seats_plan_gives_the_engine_no_variable_sglang_claims_as_its_own_deprecated(seat: str) -> None:
    """GIVEN the plan of a real SGLang seat (the CPU engine's local-sglang, and the GPU profile)
    THEN no variable of its engine environment starts with ``SGL_`` (SGLang would warn and copy it), and this
    project's own are all ``SGLSEAT_*``."""
    plan = build_plan(load_spec(seat))
    assert plan.engine == "sglang"
    env = _all_env(plan)
    ours = {k for k in env if envcompat.is_own(k)}
    assert {"SGLSEAT_NAME", "SGLSEAT_PROBE", "SGLSEAT_PROBE_DIR"} <= ours  # not vacuous: the plan sets ours
    assert [k for k in env if k.startswith("SGL_")] == []
    assert [k for k in ours if SGLANG_CLAIMS.match(k)] == []
    assert all(k.startswith(envcompat.NEW_PREFIX) for k in ours)


def test_the_rehearsal_faults_variables_are_new_names_too() -> None:
    from sgl_seat.engines.base import ENV_PROBE_FAULTS, ENV_PROBE_REHEARSAL

    for name in (ENV_PROBE_FAULTS, ENV_PROBE_REHEARSAL):
        assert name.startswith(envcompat.NEW_PREFIX) and not SGLANG_CLAIMS.match(name)


def test_no_module_of_the_package_names_an_old_variable() -> None:
    """The old prefix is spelt only by the compatibility code (and lines marked ``old-env-name``)."""
    allowed = {"sgl_seat/envcompat.py", "sgl_seat/probe/oldnames.py"}
    found = []
    for path in sorted((REPO / "sgl_seat").rglob("*")):
        rel = path.relative_to(REPO).as_posix()
        if not path.is_file() or path.suffix not in (".py", ".c", ".yaml", ".json", ".sh") or rel in allowed:
            continue
        for i, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
            if envcompat.OLD_PREFIX in line and "old-env-name" not in line:
                found.append(f"{rel}:{i}")
    assert found == []


# ---- the compatibility shim ------------------------------------------------------------------------------------


def test_an_old_name_alone_is_read_as_the_new_one_with_one_line_naming_both() -> None:
    env = {"SGL_SEAT_HOME": "/srv/seat", "PATH": "/bin"}
    said: list[str] = []
    lines = envcompat.migrate(env, warn=said.append)
    assert env == {"SGLSEAT_HOME": "/srv/seat", "PATH": "/bin"}  # the old name gone: children never see it
    assert lines == said and len(said) == 1
    assert "SGL_SEAT_HOME" in said[0] and "SGLSEAT_HOME" in said[0] and "deprecated" in said[0]


def test_both_names_set_to_different_values_the_new_wins_and_a_line_says_so() -> None:
    env = {"SGL_SEAT_HOME": "/old", "SGLSEAT_HOME": "/new"}
    said: list[str] = []
    envcompat.migrate(env, warn=said.append)
    assert env == {"SGLSEAT_HOME": "/new"}
    assert len(said) == 1 and "SGL_SEAT_HOME" in said[0] and "SGLSEAT_HOME" in said[0] and "wins" in said[0]


def test_both_names_set_to_the_same_value_quietly_keep_the_new() -> None:
    env = {"SGL_SEAT_HOME": "/same", "SGLSEAT_HOME": "/same"}
    said: list[str] = []
    assert envcompat.migrate(env, warn=said.append) == [] and said == []
    assert env == {"SGLSEAT_HOME": "/same"}


def test_nothing_old_nothing_said() -> None:
    env = {"SGLSEAT_HOME": "/h", "SGLANG_USE_CPU_ENGINE": "1", "SGL_OTHER": "x"}  # SGL_OTHER: not ours
    said: list[str] = []
    assert envcompat.migrate(env, warn=said.append) == [] and said == []
    assert env == {"SGLSEAT_HOME": "/h", "SGLANG_USE_CPU_ENGINE": "1", "SGL_OTHER": "x"}


def test_every_sgl_seat_process_migrates_at_import_with_one_stderr_line_per_old_name(tmp_path: Path) -> None:
    """GIVEN an sgl-seat process started with an old name set WHEN it imports sgl_seat (every entry does: the CLI,
    the Ray actors, the sim's processes) THEN it reads the new name, one line on stderr names both, and the process
    it starts inherits only the new name."""
    code = ("import os, subprocess, sys, sgl_seat.launch.seatrecord.home as h; print(h.seat_home());"
            "print(sorted(k for k in os.environ if 'SEAT_HOME' in k));"
            "print(subprocess.run([sys.executable, '-c', 'import os; print(sorted(k for k in os.environ "
            "if \"SEAT_HOME\" in k))'], capture_output=True, text=True).stdout.strip())")
    env = {k: v for k, v in os.environ.items() if not envcompat.is_own(k)}
    env["SGL_SEAT_HOME"] = str(tmp_path / "home")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    lines = out.stdout.splitlines()
    assert lines == [str(tmp_path / "home"), "['SGLSEAT_HOME']", "['SGLSEAT_HOME']"]
    warned = [ln for ln in out.stderr.splitlines() if "SGL_SEAT_HOME" in ln]
    assert len(warned) == 1 and "SGLSEAT_HOME" in warned[0]


def test_the_cli_runs_with_an_old_name_and_says_so(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not envcompat.is_own(k)}
    env.update({"SGL_SEAT_HOME": str(tmp_path / "home"), "NO_COLOR": "1"})
    out = subprocess.run([*cli_argv(), "bundle", "ls", "--json"], env=env,
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stderr.count("SGL_SEAT_HOME") == 1 and "SGLSEAT_HOME" in out.stderr
    json.loads(out.stdout)


# ---- readers of recorded names ---------------------------------------------------------------------------------


def test_lookup_reads_a_recorded_environment_under_either_name() -> None:
    assert envcompat.lookup({"SGL_SEAT_NAME": "old-seat"}, "SGLSEAT_NAME") == "old-seat"
    assert envcompat.lookup({"SGLSEAT_NAME": "new-seat"}, "SGLSEAT_NAME") == "new-seat"
    assert envcompat.lookup({"SGLSEAT_NAME": "new", "SGL_SEAT_NAME": "old"}, "SGLSEAT_NAME") == "new"
    assert envcompat.lookup({"SGLSEAT_NAME": "n"}, "SGL_SEAT_NAME") == "n"  # asked by the old name
    assert envcompat.lookup({}, "SGLSEAT_NAME") is None


@pytest.mark.parametrize("bundle", sorted(p.name for p in BUNDLES.iterdir() if (p / "env.json").is_file()))
def test_recorded_bundles_keep_their_old_names_and_are_read_by_them(bundle: str) -> None:
    """The committed bundles were recorded before the rename: their engines' environment names the seat and the
    probe directory the old way, and the readers find both (the plan's too)."""
    from sgl_seat.forensics import read_bundle

    b = read_bundle(BUNDLES / bundle)
    manifest: dict[str, Any] = json.loads((BUNDLES / bundle / "manifest.json").read_text())
    for node, env in b.env.items():
        if not env:  # a node whose engine was already gone at the capture (crash: node 1)
            continue
        assert envcompat.lookup(env, "SGLSEAT_NAME") == manifest["seat"]
        assert envcompat.lookup(env, "SGLSEAT_PROBE_DIR"), f"{bundle} node {node}"
    old_plan = LaunchPlan.from_json(manifest["plan"])
    for n in old_plan.nodes:
        assert envcompat.lookup(n.env_dict(), "SGLSEAT_NAME") == manifest["seat"]


def test_scrubbing_keeps_the_tokenizer_variable_under_either_name() -> None:
    """``*_TOKENIZER`` says TOKEN but holds a path: kept, in new bundles and in those recorded before the rename."""
    out = scrub_env({"SGLSEAT_TOKENIZER": "/models/tok", "SGL_SEAT_TOKENIZER": "/models/tok", "HF_TOKEN": "hf_x"})
    assert out["SGLSEAT_TOKENIZER"] == "/models/tok" and out["SGL_SEAT_TOKENIZER"] == "/models/tok"
    assert out["HF_TOKEN"].startswith("<redacted")


# ---- the probe's fallback --------------------------------------------------------------------------------------


def test_the_probe_adopts_the_old_names_of_a_seat_planned_by_the_previous_release() -> None:
    env = {"SGL_SEAT_PROBE": "m:f", "SGL_SEAT_PROBE_DIR": "/d", "SGLSEAT_PROBE_DIR": "/new", "X": "1"}
    assert oldnames.adopt(env) == ["SGLSEAT_PROBE"]
    assert env["SGLSEAT_PROBE"] == "m:f" and env["SGLSEAT_PROBE_DIR"] == "/new"  # a new name set wins
    assert oldnames.get("SGLSEAT_PROBE_SLOTS", {"SGL_SEAT_PROBE_SLOTS": "64"}) == "64"
    assert oldnames.get("SGLSEAT_PROBE_SLOTS", {}) is None


_CHILD = textwrap.dedent("""
    import json, os, sys
    boot, targets_dir = sys.argv[1], sys.argv[2]
    sys.path.insert(0, boot)
    import sitecustomize  # what site runs at start-up in an engine with the boot directory on PYTHONPATH
    probe = sys.modules.get("sgl_seat_probe")
    sys.path.insert(0, targets_dir)
    import old_target
    old_target.fetch_rows(None, [1, 2])
    print(json.dumps({"by_path": probe is not None, "installed": probe.installed() if probe else None,
                      "ring": probe.ring_file() if probe else None}), flush=True)
    os._exit(0)
""")


def test_the_probe_loads_by_path_from_an_old_plans_environment(tmp_path: Path) -> None:
    """GIVEN an engine interpreter without sgl-seat and the old names (a seat planned by the previous release)
    WHEN the boot directory's sitecustomize runs THEN the probe installs the target of ``SGL_SEAT_PROBE`` and its
    ring lands in ``SGL_SEAT_PROBE_DIR``."""
    from sgl_seat import probe
    from sgl_seat.watchdog import boot_dir

    targets = tmp_path / "targets"
    targets.mkdir()
    (targets / "old_target.py").write_text("def fetch_rows(table, ids):\n    return len(ids)\n")
    rings = tmp_path / "rings"
    env = {k: v for k, v in os.environ.items() if not envcompat.is_own(k)}
    env.update({"SGL_SEAT_PROBE": "old_target:fetch_rows@ids", "SGL_SEAT_PROBE_DIR": str(rings),
                "SGL_SEAT_PROBE_NATIVE": "0"})
    proc = subprocess.run([sys.executable, "-S", "-I", "-c", _CHILD, boot_dir(), str(targets)], env=env,
                          capture_output=True, text=True, timeout=120, cwd=tmp_path, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["by_path"] and out["installed"] == {"old_target:fetch_rows@ids": "installed"}, out
    (ring,) = probe.list_rings(str(rings)).values()
    assert ring == out["ring"]
    assert [r.gather_size for r in probe.read_ring(ring, node=0)] == [2]


# ---- the spec -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["SGLSEAT_NAME", "SGL_SEAT_NAME", "SGLSEAT_PROBE_DIR"])
def test_a_hosts_env_may_not_set_the_projects_own_prefix_old_or_new(name: str) -> None:
    doc: dict[str, Any] = yaml.safe_load((builtin_seats_dir() / "local-sim.yaml").read_text())
    doc["network"].pop("node_env")
    doc["cluster"]["hosts"] = [{"name": "a", "address": "198.18.0.1", "env": {name: "x"}},
                               {"name": "b", "address": "198.18.0.2"}]
    with pytest.raises(SpecError, match="set by sgl-seat itself"):
        parse_spec(yaml.safe_dump(doc), path=str(builtin_seats_dir() / "local-sim.yaml"))
