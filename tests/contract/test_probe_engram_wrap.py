"""The probe really wraps SGLang 0.5.23's Engram functions when SGLang's own modules are imported.

Issue 12: not a source-text check of the target names, but the boot path a real seat uses. The large seat's plan
is built; node 0's environment (``SGLSEAT_PROBE`` with the DeepSeek-V4 family's targets, ``PYTHONPATH`` with the
probe's ``sitecustomize`` first, as the plan sets it) is filled as the node agent fills it, and a fresh interpreter
started with it imports ``sglang.srt.layers.engram`` and ``sglang.srt.layers.engram_staging``: the import hook
must have replaced every target by the probe's wrapper, and a call of the wrapped ``engram_gather`` must land in
the ring (the Triton launch behind it fails on a machine without a GPU; the record is written either way).

SGLang's import chain reaches ``torchvision`` (image transforms of a vision config, nothing Engram uses). Its
PyPI wheel for torch 2.13 is built against CUDA torch and fails to register its operators under the CPU torch
(``operator torchvision::nms does not exist``), and the CPU wheel's index is not reachable from CI; so where the
real one cannot be imported, the sizing child's import stub stands in for it (:mod:`sgl_seat.sizing.child`),
and the child says so. Under CI=true a missing SGLang fails this test (conftest.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sgl_seat.plan import Placeholder, build_plan
from sgl_seat.sizing import installed_version
from sgl_seat.spec import load_spec
from sgl_seat.watchdog import boot_dir
from tests.contract.conftest import CHILD_S, require

pytestmark = pytest.mark.contract

ROOT = Path(__file__).resolve().parents[2]

CHILD = r"""
import json, sys
from sgl_seat.sizing.child import _install_stubs
stubs = _install_stubs()                      # torchvision only, and only if the real one fails to import
probe = sys.modules.get("sgl_seat.probe") or sys.modules.get("sgl_seat_probe")
pending = dict(probe.installed()) if probe else None
import sglang.srt.layers.engram as engram
import sglang.srt.layers.engram_staging as staging
import torch
objs = {
    "sglang.srt.layers.engram:engram_gather": engram.engram_gather,
    "sglang.srt.layers.engram:EngramEmbedding.forward": engram.EngramEmbedding.forward,
    "sglang.srt.layers.engram_staging:EngramRowStager._gather": staging.EngramRowStager._gather,
    "sglang.srt.layers.engram_staging:EngramRowStager.stage": staging.EngramRowStager.stage,
}
wrapped = {k: getattr(v, "__sgl_seat_probe__", None) for k, v in objs.items()}
ids = torch.arange(5)
try:
    engram.engram_gather(0, 0, ids, torch.empty((5, 8)), 8, 8)
    call = "returned"
except Exception as exc:                      # no GPU here: the kernel launch fails after the record is written
    call = type(exc).__name__
ring = probe.ring_file()
recs = [(r.target, r.gather_size, r.end is not None) for r in probe.read_ring(ring)] if ring else []
print(json.dumps({"stubs": stubs, "pending_before_import": pending, "installed": probe.installed(),
                  "wrapped": wrapped, "call": call, "records": recs}))
"""


def test_engram_targets_are_wrapped_when_sglang_imports_them(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    require(installed_version() == "0.5.23", "SGLang 0.5.23 is not installed")
    monkeypatch.setenv("SGLSEAT_SIZING", "mirror")  # the plan's figures are not under test here
    plan = build_plan(load_spec("large"), draft=True)
    env = dict(plan.nodes[0].env_dict())
    targets = env["SGLSEAT_PROBE"].split(",")
    assert any(t.startswith("sglang.srt.layers.engram:engram_gather") for t in targets), targets
    assert env["PYTHONPATH"].split(":")[0] == Placeholder.WATCHDOG_BOOT.value  # the plan puts the boot dir first
    env["PYTHONPATH"] = env["PYTHONPATH"].replace(Placeholder.WATCHDOG_BOOT.value, boot_dir())
    env["SGLSEAT_PROBE_DIR"] = str(tmp_path / "rings")
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("SGLSEAT_")}
    child_env.update({k: env[k] for k in ("SGLSEAT_PROBE", "SGLSEAT_PROBE_DIR")})
    child_env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(ROOT)])
    proc = subprocess.run([sys.executable, "-c", CHILD], env=child_env, capture_output=True, text=True,
                          timeout=CHILD_S, cwd=tmp_path, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    # The Engram targets (the family's graph-replay targets wait for modules this child does not import: see
    # test_probe_graph_wrap.py).
    engram = [t for t in targets if t.startswith("sglang.srt.layers.")]
    names = {t.split("@")[0] for t in engram}
    # The targets were waiting for SGLang's modules (installed by sitecustomize at start-up, before any import) ...
    assert out["pending_before_import"] and set(out["pending_before_import"].values()) == {"pending"}
    # ... and SGLang's own import of them replaced each one by the probe's wrapper.
    assert {out["installed"][t] for t in engram} == {"installed"}, out["installed"]
    assert {k for k, v in out["wrapped"].items() if v == k} == names, out["wrapped"]
    gathers = [r for r in out["records"] if r[0] == "sglang.srt.layers.engram:engram_gather"]
    assert gathers == [["sglang.srt.layers.engram:engram_gather", 5, True]], (out["call"], out["records"])
