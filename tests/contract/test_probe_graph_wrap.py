"""The probe wraps SGLang 0.5.23's CUDA graph-replay entry when SGLang's own modules are imported (issue 25).

SGLang decodes, and verifies the draft, by replaying captured graphs: ``DecodeCudaGraphRunner.execute`` calls
``self.backend.replay(self._replay_graph_key, forward_batch)`` (``decode_cuda_graph_runner.py``), the backend being
``FullCudaGraphBackend`` or ``BreakableCudaGraphBackend`` (``runner_backend/utils.py``, ``resolve_decode_backend``).
As in ``test_probe_engram_wrap.py``, not a source-text check but the boot path a real seat uses: the large seat's
plan is built, node 0's environment (``SGLSEAT_PROBE`` with the DeepSeek-V4 family's targets, ``PYTHONPATH`` with
the probe's ``sitecustomize`` first) fills a fresh interpreter that imports SGLang's backend modules; each replay
target must then be the probe's graph wrapper, and one replay of a ``FullCudaGraphBackend`` built around a stand-in
graph (no GPU in CI: its ``replay()`` only counts) with a real SGLang ``ShapeKey`` and a runner that captured 4
tokens per request must land in the ring as a graph replay of 8 x 4 = 32 tokens, shape key 8. The LlamaForCausalLM
family's ``link`` targets (each backend's constructor gives the backend its runner, which SGLang 0.5.17's do not keep)
are checked the same way on the local-sglang seat's plan.
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
FULL = "sglang.srt.model_executor.runner_backend.full_cuda_graph_backend:FullCudaGraphBackend.replay"
BREAKABLE = "sglang.srt.model_executor.runner_backend.breakable_cuda_graph_backend:BreakableCudaGraphBackend.replay"

CHILD = r"""
import json, sys, types
from sgl_seat.sizing.child import _install_stubs
stubs = _install_stubs()                      # torchvision only, and only if the real one fails to import
probe = sys.modules.get("sgl_seat.probe") or sys.modules.get("sgl_seat_probe")
pending = dict(probe.installed()) if probe else None
from sglang.srt.model_executor.runner_backend.full_cuda_graph_backend import FullCudaGraphBackend
from sglang.srt.model_executor.runner_backend.breakable_cuda_graph_backend import BreakableCudaGraphBackend
from sglang.srt.model_executor.runner.shape_key import ShapeKey

class StandInGraph:                           # torch.cuda.CUDAGraph's replay(), without a GPU
    replays = 0
    def replay(self):
        StandInGraph.replays += 1

backend = object.__new__(FullCudaGraphBackend) # its __init__ asks for the TP group of a running engine
key = ShapeKey(size=8)
backend._graphs = {key: StandInGraph()}
backend._outputs = {key: "logits"}
backend._cuda_graph_runner = types.SimpleNamespace(captured_req_width=4, ragged_verify_mode=False)
try:
    out = backend.replay(key, None)
    call = f"returned {out!r}"
except Exception as exc:
    call = f"{type(exc).__name__}: {exc}"
ring = probe.ring_file()
recs = [(r.target, r.gather_size, r.graph_key, r.end is not None) for r in probe.read_ring(ring)] if ring else []
print(json.dumps({"stubs": stubs, "pending_before_import": pending, "installed": probe.installed(),
                  "wrapped": {"full": getattr(FullCudaGraphBackend.replay, "__sgl_seat_probe__", None),
                              "breakable": getattr(BreakableCudaGraphBackend.replay, "__sgl_seat_probe__", None)},
                  "call": call, "graph_replays": StandInGraph.replays, "records": recs}))
"""


def test_graph_replay_targets_are_wrapped_when_sglang_imports_them(tmp_path: Path,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    require(installed_version() == "0.5.23", "SGLang 0.5.23 is not installed")
    monkeypatch.setenv("SGLSEAT_SIZING", "mirror")  # the plan's figures are not under test here
    plan = build_plan(load_spec("large"), draft=True)
    env = dict(plan.nodes[0].env_dict())
    targets = env["SGLSEAT_PROBE"].split(",")
    graph_targets = [t for t in targets if t.endswith(":graph")]
    assert {t.split("@")[0] for t in graph_targets} == {FULL, BREAKABLE}, targets
    env["PYTHONPATH"] = env["PYTHONPATH"].replace(Placeholder.WATCHDOG_BOOT.value, boot_dir())
    env["SGLSEAT_PROBE_DIR"] = str(tmp_path / "rings")
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("SGLSEAT_")}
    child_env.update({k: env[k] for k in ("SGLSEAT_PROBE", "SGLSEAT_PROBE_DIR")})
    child_env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(ROOT)])
    proc = subprocess.run([sys.executable, "-c", CHILD], env=child_env, capture_output=True, text=True,
                          timeout=CHILD_S, cwd=tmp_path, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    # Waiting for SGLang's modules before any import, then wrapped by SGLang's own import of them.
    assert all(out["pending_before_import"][t] == "pending" for t in graph_targets), out["pending_before_import"]
    assert all(out["installed"][t] == "installed" for t in graph_targets), out["installed"]
    assert out["wrapped"] == {"full": FULL, "breakable": BREAKABLE}, out["wrapped"]
    # One replay through SGLang's own FullCudaGraphBackend.replay: the graph replayed, and the ring holds it as a
    # graph replay of the runner's 4 tokens per request x ShapeKey.size 8.
    assert out["call"] == "returned 'logits'" and out["graph_replays"] == 1, out
    assert out["records"] == [[FULL, 32, 8, True]], out["records"]


FULL_INIT = "sglang.srt.model_executor.runner_backend.full_cuda_graph_backend:FullCudaGraphBackend.__init__"
BREAKABLE_INIT = ("sglang.srt.model_executor.runner_backend.breakable_cuda_graph_backend:"
                  "BreakableCudaGraphBackend.__init__")

LINK_CHILD = r"""
import json, sys, types
from sgl_seat.sizing.child import _install_stubs
stubs = _install_stubs()
probe = sys.modules.get("sgl_seat.probe") or sys.modules.get("sgl_seat_probe")
import sglang.srt.model_executor.runner_backend.full_cuda_graph_backend as full_mod
from sglang.srt.model_executor.runner_backend.full_cuda_graph_backend import FullCudaGraphBackend
from sglang.srt.model_executor.runner_backend.breakable_cuda_graph_backend import BreakableCudaGraphBackend
from sglang.srt.model_executor.runner.shape_key import ShapeKey

class StandInGraph:
    def replay(self):
        pass

full_mod.get_parallel = lambda: types.SimpleNamespace(tp_group=None)  # __init__ asks a running engine's TP group
runner = types.SimpleNamespace(captured_req_width=4, ragged_verify_mode=False, device_module=None)
try:
    backend = FullCudaGraphBackend(runner)    # SGLang's own constructor, through the link
    made = "kept" if backend._cuda_graph_runner is runner else "other runner"
    key = ShapeKey(size=3)
    backend._graphs = {key: StandInGraph()}
    backend._outputs = {key: "logits"}
    call = repr(backend.replay(key, None))
except Exception as exc:
    made = call = f"{type(exc).__name__}: {exc}"
ring = probe.ring_file()
recs = [(r.target, r.gather_size, r.graph_key, r.end is not None) for r in probe.read_ring(ring)] if ring else []
print(json.dumps({"stubs": stubs, "installed": probe.installed(),
                  "links": {"full": getattr(FullCudaGraphBackend.__init__, "__sgl_seat_probe__", None),
                            "breakable": getattr(BreakableCudaGraphBackend.__init__, "__sgl_seat_probe__", None)},
                  "made": made, "call": call, "records": recs}))
"""


def test_the_llama_familys_links_wrap_sglangs_backend_constructors(tmp_path: Path,
                                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    """The LlamaForCausalLM family (the H200's GPU engine runs SGLang 0.5.17, whose backends drop their runner) links
    each backend's constructor argument as its runner. On the installed 0.5.23, through the same boot path: both
    constructors are the probe's link, SGLang's own ``FullCudaGraphBackend.__init__`` still runs and keeps its runner
    (the link changes nothing there), and a replay of 3 requests x 4 tokens lands in the ring as 12 tokens."""
    require(installed_version() == "0.5.23", "SGLang 0.5.23 is not installed")
    monkeypatch.setenv("SGLSEAT_SIZING", "mirror")
    plan = build_plan(load_spec("local-sglang"))
    env = dict(plan.nodes[0].env_dict())
    targets = env["SGLSEAT_PROBE"].split(",")
    links = [t for t in targets if t.endswith(":link")]
    assert {t.split("@")[0] for t in links} == {FULL_INIT, BREAKABLE_INIT}, targets
    assert {t.split("@")[0] for t in targets if t.endswith(":graph")} == {FULL, BREAKABLE}, targets
    env["PYTHONPATH"] = env["PYTHONPATH"].replace(Placeholder.WATCHDOG_BOOT.value, boot_dir())
    child_env = {k: v for k, v in os.environ.items() if not k.startswith("SGLSEAT_")}
    child_env.update({"SGLSEAT_PROBE": env["SGLSEAT_PROBE"], "SGLSEAT_PROBE_DIR": str(tmp_path / "rings")})
    child_env["PYTHONPATH"] = os.pathsep.join([env["PYTHONPATH"], str(ROOT)])
    proc = subprocess.run([sys.executable, "-c", LINK_CHILD], env=child_env, capture_output=True, text=True,
                          timeout=CHILD_S, cwd=tmp_path, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert all(out["installed"][t] == "installed" for t in links), out["installed"]
    assert out["links"] == {"full": FULL_INIT, "breakable": BREAKABLE_INIT}, out["links"]
    assert out["made"] == "kept" and out["call"] == "'logits'", out
    assert out["records"] == [[FULL, 12, 3, True]], out["records"]
    assert "runner not linked" not in proc.stderr, proc.stderr[-3000:]
