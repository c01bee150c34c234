"""The H200 seat's command lines parse with SGLang 0.5.17's own argument parser: the version that seat runs.

The GPU seat (``launch/seats/h200-1.yaml``) runs SGLang 0.5.17, the newest release whose kernels are built for the
H200 image's torch; every other contract here is 0.5.23's. 0.5.17's parser (``ServerArgs.add_cli_args``) runs in
a child process: the CPU engine's interpreter (``.venv-sglang``) with 0.5.17's Python first on its path
(``scripts/install-sglang-0517-parser.sh``). Only the parse runs: 0.5.17's ``from_cli_args`` resolves the device
and refuses a machine without an accelerator. A flag 0.5.17 does not know, a value of the wrong type or outside its
choices fails here, not on the GPU host.
"""

from __future__ import annotations

import json
import os
import select
import subprocess
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from sgl_seat.engines import backend_for
from sgl_seat.engines.base import engine_venv
from sgl_seat.plan import Placeholder, build_plan
from sgl_seat.spec import load_spec
from tests.contract.conftest import CHILD_S, require

pytestmark = [pytest.mark.contract]

REPO = Path(__file__).resolve().parents[2]
OVERLAY = Path(os.environ.get("SGLSEAT_CACHE", Path.home() / ".cache" / "sgl-seat")) / "sglang-0.5.17-parser"
ENGINE = Path(engine_venv())
ENGINE_PYTHON = ENGINE / "bin" / "python"
#: Parses each argv list of each stdin line's JSON with 0.5.17's parser; one JSON answer a line: the version and, per
#: list, the namespace or argparse's error. One child serves the module's tests: SGLang's import is most of its cost.
_CHILD = r"""
import argparse, contextlib, io, json, sys
import sglang
from sglang.srt.server_args import ServerArgs
for line in sys.stdin:
    out = {"version": sglang.__version__, "file": sglang.__file__, "parsed": []}
    for argv in json.loads(line):
        p = argparse.ArgumentParser(prog="sglang.launch_server")
        ServerArgs.add_cli_args(p)
        err = io.StringIO()
        try:
            with contextlib.redirect_stderr(err):
                ns = p.parse_args(argv)
            out["parsed"].append({"ok": True, "ns": {k: v for k, v in vars(ns).items()
                                                     if isinstance(v, (str, int, float, bool, type(None), list))}})
        except SystemExit:
            out["parsed"].append({"ok": False, "error": err.getvalue().strip().splitlines()[-1:]})
    print(json.dumps(out), flush=True)
"""

Parse = Callable[[list[list[str]]], dict[str, Any]]


@pytest.fixture(scope="module")
def parse_0517() -> Iterator[Parse]:
    """0.5.17's parser in one child for the module: a call sends argv lists and reads their answer line."""
    require(OVERLAY.joinpath("sglang", "srt", "server_args.py").is_file() and ENGINE_PYTHON.is_file(),
            "SGLang 0.5.17's parser is not installed (scripts/install-sglang-0517-parser.sh; .venv-sglang)")
    env = {"PATH": os.environ.get("PATH", ""), "PYTHONPATH": str(OVERLAY), "HOME": os.environ.get("HOME", "/root"),
           "SGLANG_USE_CPU_ENGINE": "1", "HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1",
           "LD_LIBRARY_PATH": str(ENGINE / "lib" / "sgl-seat-stub")}
    with tempfile.TemporaryFile("w+") as errors, subprocess.Popen(
            [str(ENGINE_PYTHON), "-c", _CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=errors,
            env=env, text=True) as proc:
        assert proc.stdin is not None and proc.stdout is not None
        stdin, stdout = proc.stdin, proc.stdout

        def parse(argvs: list[list[str]]) -> dict[str, Any]:
            stdin.write(json.dumps(argvs) + "\n")
            stdin.flush()
            ready, _, _ = select.select([stdout], [], [], CHILD_S)
            line = stdout.readline() if ready else ""
            if not line:
                errors.seek(0)
                pytest.fail(f"0.5.17's parser gave no answer within {CHILD_S} s:\n{errors.read()[-3000:]}")
            doc: dict[str, Any] = json.loads(line)
            assert doc["version"] == "0.5.17" and doc["file"].startswith(str(OVERLAY)), doc
            return doc

        try:
            yield parse
        finally:
            stdin.close()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(timeout=30)


def _h200_plans(tmp_path: Path) -> list[tuple[str, Any, Any]]:
    """h200-1 with the draft off and each draft it can run (EAGLE head, STANDALONE draft, NGRAM)."""
    import yaml

    base = yaml.safe_load((REPO / "launch" / "seats" / "h200-1.yaml").read_text())
    models = REPO / "launch" / "models"
    drafts = {"off": None, "eagle": {"algorithm": "EAGLE"},
              "standalone": {"algorithm": "STANDALONE", "model_path": "${engine_venv}/models/llama-8b-shape-4layers",
                             "config": str(models / "llama-8b-shape-4layers")},
              "ngram": {"algorithm": "NGRAM", "draft_tokens": 12, "model_path": None, "config": None},
              # the gate's hybrid arm (SGLang's default tiers) and a tuned seat's policy (sgl-seat tune draft)
              "eagle-adaptive": {"algorithm": "EAGLE", "adaptive": True},
              "eagle-policy": {"algorithm": "EAGLE", "off_above": 20}}
    out = []
    for arm, change in drafts.items():
        doc = json.loads(json.dumps(base))
        doc["model"]["config"] = str(models / "llama-8b-shape")
        doc["draft"]["config"] = str(models / "llama-8b-shape-eagle")
        doc["draft"].update({k: v for k, v in (change or {}).items()})
        doc["draft"] = {k: v for k, v in doc["draft"].items() if v is not None}
        path = tmp_path / f"h200-1-{arm}.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        spec = load_spec(str(path))
        plan = build_plan(spec, draft=change is not None).fill(
            {Placeholder.NODE0_ADDR: "10.1.2.3", Placeholder.AGENT_PYTHON: "python3", Placeholder.ENGINE_VENV: "/eng",
             Placeholder.REQUEST_LOG_DIR: "/logs", Placeholder.WATCHDOG_BOOT: "/boot",
             Placeholder.SEAT_FILES: "/files"})
        out.append((arm, spec, plan))
    return out


def test_every_h200_line_parses_with_sglang_0517_and_means_what_the_plan_meant(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, parse_0517: Parse) -> None:
    monkeypatch.setenv("SGLSEAT_SIZING", "mirror")  # the lines are the point; sizing is held elsewhere
    plans = _h200_plans(tmp_path)
    argvs = []
    for _, spec, plan in plans:
        (node,) = plan.nodes
        assert node.command[1:3] == ("-m", backend_for(spec.engine).module)
        argvs.append(list(node.command[3:]))
    doc = parse_0517(argvs)
    for (arm, spec, plan), got in zip(plans, doc["parsed"], strict=True):
        assert got["ok"], f"{arm}: SGLang 0.5.17 refuses the plan's line: {got['error']}"
        ns = got["ns"]
        assert (ns["tp_size"], ns["nnodes"], ns["port"], ns["host"]) == (1, 1, spec.network.http_port, "127.0.0.1")
        assert ns["mem_fraction_static"] == pytest.approx(plan.mem_fraction)
        assert ns["max_running_requests"] == plan.slots
        assert (ns["attention_backend"], ns["sampling_backend"], ns["load_format"]) == ("triton", "pytorch", "dummy")
        assert ns["cuda_graph_max_bs_decode"] == spec.gpu.cuda_graph_max_bs
        assert ns["disable_prefill_cuda_graph"] is True
        assert ns["enable_metrics"] is True and ns["log_requests_target"] == ["/logs"]
        if arm == "off":
            assert ns["speculative_algorithm"] is None
            continue
        assert ns["speculative_algorithm"] == spec.draft.algorithm
        assert ns["speculative_num_draft_tokens"] == spec.draft.draft_tokens
        assert ns["speculative_adaptive"] is arm.startswith("eagle-")
        assert ns["speculative_adaptive_config"] == ("/files/adaptive-config.json" if arm == "eagle-policy" else None)
        assert (arm == "eagle-policy") == bool(plan.files)
        if arm == "ngram":
            assert ns["speculative_draft_model_path"] is None
        else:
            assert ns["speculative_draft_model_path"] == spec.draft.model_path.replace("${engine_venv}", "/eng")
            assert (ns["speculative_num_steps"], ns["speculative_eagle_topk"]) == (spec.draft.steps, 1)


def test_sglang_0517s_parser_really_refuses_what_it_does_not_know(parse_0517: Parse) -> None:
    """The child is 0.5.17's parser, not a permissive stand-in: a flag only 0.5.23 has, an invented one and a
    backend outside 0.5.17's choices are refused."""
    doc = parse_0517([["--model-path", "/m", "--enable-hicache"],
                       ["--model-path", "/m", "--speculative-disable-by-batch-size", "8"],
                       ["--model-path", "/m", "--attention-backend", "no-such-backend"],
                       ["--model-path", "/m", "--cuda-graph-max-bs-decode", "8"]])
    assert [p["ok"] for p in doc["parsed"]] == [False, False, False, True]


def test_the_tp2_seats_lines_parse_on_both_nodes_with_sglang_0517(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                  parse_0517: Parse) -> None:
    """h200x2-tp2 (TP2 across two Ray nodes of one H200 each): both nodes' lines, draft off, EAGLE and STANDALONE,
    parse with 0.5.17's parser as the plan meant them (node rank, nnodes, dist-init, the draft), and every engine's
    environment keeps NVLink multicast off."""
    import yaml

    monkeypatch.setenv("SGLSEAT_SIZING", "mirror")
    base = yaml.safe_load((REPO / "launch" / "seats" / "h200x2-tp2.yaml").read_text())
    models = REPO / "launch" / "models"
    lines, meant = [], []
    for arm, change in (("off", None), ("eagle", {}), ("standalone", {
            "algorithm": "STANDALONE", "model_path": "${engine_venv}/models/llama-8b-shape-4layers",
            "config": str(models / "llama-8b-shape-4layers")})):
        doc = json.loads(json.dumps(base))
        doc["model"]["config"] = str(models / "llama-8b-shape")
        doc["draft"]["config"] = str(models / "llama-8b-shape-eagle")
        doc["draft"].update(change or {})
        path = tmp_path / f"tp2-{arm}.yaml"
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        spec = load_spec(str(path))
        plan = build_plan(spec, draft=change is not None).fill(
            {Placeholder.NODE0_ADDR: "10.1.2.3", Placeholder.AGENT_PYTHON: "python3", Placeholder.ENGINE_VENV: "/eng",
             Placeholder.REQUEST_LOG_DIR: "/logs", Placeholder.WATCHDOG_BOOT: "/boot"})
        assert len(plan.nodes) == 2
        for node in plan.nodes:
            env = node.env_dict()
            assert (env["NCCL_NVLS_ENABLE"], env["TORCH_SYMM_MEM_DISABLE_MULTICAST"], env["NVSHMEM_DISABLE_NVLS"]) \
                == ("0", "1", "1")
            lines.append(list(node.command[3:]))
            meant.append((arm, node.node_rank, spec))
    doc = parse_0517(lines)
    for (arm, rank, spec), got in zip(meant, doc["parsed"], strict=True):
        assert got["ok"], f"{arm} node {rank}: SGLang 0.5.17 refuses the plan's line: {got['error']}"
        ns = got["ns"]
        assert (ns["tp_size"], ns["nnodes"], ns["node_rank"]) == (2, 2, rank)
        assert ns["dist_init_addr"] == f"10.1.2.3:{spec.network.dist_init_port}"
        assert ns["speculative_algorithm"] == (None if arm == "off" else spec.draft.algorithm)
