"""An independent run of SGLang 0.5.23's startup sizing, for the contract tests (not used by sgl-seat itself).

Written apart from ``sgl_seat/sizing/child.py`` so the plan's figures are checked against code that
shares none of the plan's argument handling: the argv goes through SGLang's own ``prepare_server_args`` (the
server's entry point, logging setup included), the memory figures are computed here from the spec's inputs,
and ``ModelRunner``'s steps are replayed from its source order. Reads one JSON document on stdin, writes one
on stdout::

    {"cases": [{"argv": [...], "gpu_gib": 96, "weights_per_gpu_bytes": N, "draft_bytes": N}],
     "configs": ["<dir with config.json>", ...]}
    -> {"cases": [{"tokens": N, "max_running_requests": N, "swa": N} | {"error": "..."}],
        "configs": [{"model_type": ..., "engram_rows_from_primes": [...] | null} | {"error": "..."}]}
"""

from __future__ import annotations

import contextlib
import io
import json
import sys
import types
from typing import Any

GIB = 1 << 30


def _patch(original: Any, replacement: Any) -> None:
    for mod in list(sys.modules.values()):
        if mod is None or not getattr(mod, "__name__", "").startswith("sglang"):
            continue
        for name, value in list(vars(mod).items()):
            if value is original:
                setattr(mod, name, replacement)


def main() -> int:
    request = json.load(sys.stdin)
    real_stdout = sys.stdout
    sys.stdout = sys.stderr
    from sgl_seat.sizing.child import _install_stubs  # only the torchvision import stub

    _install_stubs()
    from sglang.srt.configs.model_config import AttentionArch, ModelConfig
    from sglang.srt.mem_cache import kv_cache_dtype
    from sglang.srt.mem_cache.kv_cache_configurator import KVCacheConfigurator
    from sglang.srt.model_executor.model_runner_components import (
        kv_pool_runtime,
        layer_setup,
        load_model_utils,
        spec_aux_hidden_state,
    )
    from sglang.srt.runtime_context import (
        SpawnRanks,
        get_model,
        get_parallel,
        get_schedule,
        get_spec,
        override_platform,
        publish,
    )
    from sglang.srt.server_args import prepare_server_args
    from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
    from sglang.srt.utils import common

    override_platform(is_cuda=True, is_hip=False, is_npu=False).install()
    state = {"total": 0.0, "free": 0.0}
    _patch(common.get_device_memory_capacity, lambda device=None: state["total"] / (1 << 20))
    _patch(common.get_available_gpu_memory, lambda *a, **k: state["free"] / GIB)

    def size(case: dict[str, Any]) -> dict[str, Any]:
        total = case["gpu_gib"] * GIB
        pre = total - GIB  # CUDA context
        state["total"], state["free"] = total, pre
        argv = list(case["argv"])
        if "--device" not in argv:
            argv += ["--device", "cuda"]
        server_args = prepare_server_args(argv)
        publish(server_args, role="scheduler", ranks=SpawnRanks(world_rank=0, gpu_id=0))
        with contextlib.suppress(Exception):
            get_parallel().override_permanently(world_group=types.SimpleNamespace(cpu_group=None, world_size=1))
        pre_model_load = state["free"] / GIB  # ModelRunner.init_torch_distributed
        mc = ModelConfig.from_server_args(server_args, model_path=get_model().model_path,
                                          model_revision=get_model().revision, is_draft_model=False,
                                          context_length=get_model().context_length)
        algo = SpeculativeAlgorithm.from_string(get_spec().speculative_algorithm)
        aux = spec_aux_hidden_state.resolve_spec_aux_hidden_state_config(
            server_args=server_args, model_config=mc, spec_algorithm=algo, is_draft_worker=False)
        # load_model: weights (target, then the draft worker's) leave this much free.
        state["free"] = pre - case["weights_per_gpu_bytes"] - case["draft_bytes"] - 2 * GIB
        layer_info = layer_setup.resolve_layer_indices(model=None, model_config=mc, is_draft_worker=False)
        resolved, dtype = kv_cache_dtype.configure_kv_cache_dtype(
            server_args_kv_cache_dtype=get_model().kv_cache_dtype, model=None, model_dtype=mc.dtype,
            is_draft_worker=False, is_dflash=algo.is_dflash_family(), speculative_draft_attention_backend=None,
            speculative_draft_kv_cache_dtype=get_spec().speculative_draft_kv_cache_dtype)
        kvc = KVCacheConfigurator(
            device="cuda", gpu_id=0, attn_dp_size=get_parallel().attn_dp_size, pp_size=1, pp_group=None, model=None,
            model_config=mc, server_args=server_args, kv_cache_dtype=dtype,
            kv_cache_dtype_str=resolved or get_model().kv_cache_dtype, model_dtype=mc.dtype,
            page_size=get_schedule().page_size,
            sliding_window_size=load_model_utils.resolve_sliding_window_size(None, mc), spec_algorithm=algo,
            is_draft_worker=False,
            post_capture_kv_active=kv_pool_runtime.is_post_capture_kv_active(
                server_args=server_args, is_draft_worker=False, spec_algorithm=algo, token_to_kv_pool_allocator=None),
            spec_aux_config=aux, draft_parallel_layout=None, is_hybrid_swa=mc.is_hybrid_swa,
            is_hybrid_swa_compress=mc.is_hybrid_swa_compress, use_mla_backend=mc.attention_arch == AttentionArch.MLA,
            layer_info=layer_info, forward_stream=None, req_to_token_pool=None, token_to_kv_pool_allocator=None,
            memory_pool_config=None, draft_model_idx=None)
        config = kvc._resolve_memory_pool_config(pre_model_load)
        return {"tokens": config.max_total_num_tokens, "max_running_requests": config.max_running_requests,
                "swa": config.swa_max_total_num_tokens}

    def load_config(path: str) -> dict[str, Any]:
        argv = ["--model-path", path, "--tp-size", "4", "--mem-fraction-static", "0.85", "--device", "cuda"]
        state["total"] = 96 * GIB
        server_args = prepare_server_args(argv)
        publish(server_args, role="scheduler", ranks=SpawnRanks(world_rank=0, gpu_id=0))
        mc = ModelConfig.from_server_args(server_args, model_path=path, is_draft_model=False)
        out: dict[str, Any] = {"model_type": mc.hf_config.model_type, "context_len": mc.context_len,
                               "engram_rows_from_primes": None, "engram_rows": None}
        if getattr(mc.hf_config, "engram_layer_ids", None):
            from sglang.srt.layers.engram import EngramLayout

            layout = EngramLayout.from_config(mc.hf_config)
            out["engram_rows_from_primes"] = [layout.column_bounds(i)[-1] for i in range(len(layout.layer_ids))]
            out["engram_rows"] = list(layout.num_embeddings)
        return out

    answers: dict[str, list[dict[str, Any]]] = {"cases": [], "configs": []}
    for key, fn in (("cases", size), ("configs", load_config)):
        for item in request.get(key, []):
            try:
                with contextlib.redirect_stdout(io.StringIO()):
                    answers[key].append(fn(item))
            except Exception as exc:
                answers[key].append({"error": f"{type(exc).__name__}: {exc}"})
    real_stdout.write(json.dumps(answers) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
