"""The child process that runs SGLang 0.5.23's own startup sizing on CPU (``python -m sgl_seat.sizing.child``).

Why a child: SGLang's imports take seconds and install process-wide state (its published config bags, the
platform override), so the planner never imports it in its own process. The parent
(:mod:`sgl_seat.sizing.ask_sglang`) writes one JSON request per line on stdin and reads one JSON answer per line on
stdout; nothing else crosses the pipe (no pickle). The child exits at end of input.

What runs is SGLang's code, in the order ``ModelRunner`` runs it, without constructing ``ModelRunner`` (its
``__init__`` loads weights):

1. ``ServerArgs.add_cli_args`` / ``from_cli_args`` on node 0's generated flags, then ``publish`` (which runs
   ``resolve_once``: the DeepSeek-V4 presets, page size, KV dtype, chunked prefill, speculative defaults);
2. ``ModelConfig.from_server_args`` on the planning config (the only file of the model it reads);
3. ``resolve_spec_aux_hidden_state_config`` (``model_runner.py:596``), ``resolve_layer_indices`` with no model
   (``:726``; pp=1, so every layer is this rank's), ``configure_kv_cache_dtype`` (``:1551``),
   ``resolve_sliding_window_size`` (``:1353``), the ``KVCacheConfigurator`` as ``init_kv_cache_configurator``
   builds it (``:650-689``);
4. ``KVCacheConfigurator._resolve_memory_pool_config``: ``_profile_available_bytes``, ``config_from_budget``
   (``create_memory_pool_configurator`` + ``calculate_pool_sizes``), ``resolve_max_num_reqs``,
   ``finalize_with_max_running_requests``. ``configure`` is not called: it allocates the pools.

What is stubbed, and only that: the GPU memory queries (``get_device_memory_capacity`` returns the request's
total, ``get_available_gpu_memory`` the request's free memory before load and after weights, in SGLang's own
GiB float), the WORLD group handle those queries take as an argument, and the platform facts, set through
SGLang's own ``override_platform``. SGLang reads SM100 from torch directly in two places
(``select_dsv4_kv_layout``, the DeepSeek-V4 attention-backend default), so on this CPU it computes what a
non-SM100 CUDA GPU computes. torchvision has no CPU wheel for torch 2.13 on PyPI; when it cannot be imported
an import stub stands in (SGLang imports it only for image transforms); the answer names every stub.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import importlib
import importlib.abc
import importlib.machinery
import io
import json
import os
import sys
import time
import traceback
import types
from collections.abc import Callable, Iterator
from typing import Any

from sgl_seat.sizing.mirror import bisect_max

GIB = 1 << 30
#: Platform facts of a CUDA GPU node, set through SGLang's ``override_platform``.
CUDA_PLATFORM: dict[str, Any] = {
    "is_cuda": True, "is_hip": False, "is_npu": False, "is_xpu": False, "is_musa": False, "is_mps": False,
}


class _Absent:
    """What the torchvision stub hands out: importable, fails loudly when used."""

    def __init__(self, name: str) -> None:
        self._name = name

    def __getattr__(self, attr: str) -> _Absent:
        return _Absent(f"{self._name}.{attr}")

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        raise RuntimeError(f"{self._name}: torchvision is an import stub in the sizing process")

    def __mro_entries__(self, bases: tuple[Any, ...]) -> tuple[type, ...]:
        return (object,)


class _StubModule(types.ModuleType):
    def __getattr__(self, attr: str) -> Any:
        if attr.startswith("__"):
            raise AttributeError(attr)
        return _Absent(f"{self.__name__}.{attr}")


class _TorchvisionStub(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Import stub for ``torchvision`` and its submodules (only installed when the real one fails to import)."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if name == "torchvision" or name.startswith("torchvision."):
            return importlib.machinery.ModuleSpec(name, self, is_package=True)
        return None

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> types.ModuleType:
        mod = _StubModule(spec.name)
        mod.__path__ = []
        # A version and a file keep transformers' availability probe from reading "N/A" as a version.
        mod.__version__ = "0"  # type: ignore[attr-defined]
        mod.__file__ = "<sgl-seat torchvision stub>"
        return mod

    def exec_module(self, module: types.ModuleType) -> None:
        return None


def _install_stubs() -> list[str]:
    stubs = []
    try:
        importlib.import_module("torchvision")
    except Exception:
        for name in [m for m in sys.modules if m == "torchvision" or m.startswith("torchvision.")]:
            del sys.modules[name]
        sys.meta_path.insert(0, _TorchvisionStub())
        stubs.append("torchvision")
    return stubs


class _Memory:
    """The GPU memory SGLang's queries see; set per case (bytes in, SGLang's GiB floats out)."""

    total_bytes = 0
    pre_load_bytes = 0
    free_after_load_bytes = 0
    loaded = False

    def capacity_mib(self, device: Any = None) -> float:
        return self.total_bytes / (1 << 20)

    def available_gib(self, *args: Any, **kwargs: Any) -> float:
        free = self.free_after_load_bytes if self.loaded else self.pre_load_bytes
        return free / GIB


def _patch_everywhere(module_prefix: str, original: Callable[..., Any], replacement: Callable[..., Any]) -> int:
    """Replace ``original`` in every loaded SGLang module that imported it by name."""
    count = 0
    for name, mod in list(sys.modules.items()):
        if not name.startswith(module_prefix) or mod is None:
            continue
        for attr, value in list(vars(mod).items()):
            if value is original:
                setattr(mod, attr, replacement)
                count += 1
    return count


class Sizer:
    """SGLang imported once; each :meth:`run` sizes one case (re-publishing is SGLang's last-publish-wins)."""

    def __init__(self) -> None:
        t0 = time.perf_counter()
        self.stubs = _install_stubs()
        self.sa_mod = importlib.import_module("sglang.srt.server_args")
        self.rc = importlib.import_module("sglang.srt.runtime_context")
        self.common = importlib.import_module("sglang.srt.utils.common")
        self.mc_mod = importlib.import_module("sglang.srt.configs.model_config")
        self.kvc_mod = importlib.import_module("sglang.srt.mem_cache.kv_cache_configurator")
        self.pool_mod = importlib.import_module("sglang.srt.model_executor.pool_configurator")
        self.kv_dtype_mod = importlib.import_module("sglang.srt.mem_cache.kv_cache_dtype")
        comp = "sglang.srt.model_executor.model_runner_components"
        self.kv_pool_runtime = importlib.import_module(f"{comp}.kv_pool_runtime")
        self.layer_setup = importlib.import_module(f"{comp}.layer_setup")
        self.load_utils = importlib.import_module(f"{comp}.load_model_utils")
        self.spec_aux = importlib.import_module(f"{comp}.spec_aux_hidden_state")
        self.spec_info = importlib.import_module("sglang.srt.speculative.spec_info")
        self.rc.override_platform(**CUDA_PLATFORM).install()
        self.memory = _Memory()
        self.patched = {
            "get_device_memory_capacity": _patch_everywhere(
                "sglang", self.common.get_device_memory_capacity, self.memory.capacity_mib),
            "get_available_gpu_memory": _patch_everywhere(
                "sglang", self.common.get_available_gpu_memory, self.memory.available_gib),
        }
        self.version = importlib.import_module("importlib.metadata").version("sglang")
        self.parser = argparse.ArgumentParser(prog="sglang serve")
        self.sa_mod.ServerArgs.add_cli_args(self.parser)
        # SGLang's KV profiling calls gc.collect(); with the imports frozen out of the collector's reach it
        # takes milliseconds instead of half a second per case.
        gc.freeze()
        self.import_s = time.perf_counter() - t0

    def _server_args(self, argv: list[str]) -> Any:
        server_args_cls = self.sa_mod.ServerArgs
        ns = self.parser.parse_args(argv)
        ns._radix_eviction_policy_explicitly_set = any(
            a == "--radix-eviction-policy" or a.startswith("--radix-eviction-policy=") for a in argv
        )
        return server_args_cls.from_cli_args(ns)

    def _model_config(self, server_args: Any) -> Any:
        get_model = self.rc.get_model
        return self.mc_mod.ModelConfig.from_server_args(
            server_args, model_path=get_model().model_path, model_revision=get_model().revision,
            is_draft_model=False, context_length=get_model().context_length,
        )

    def _configurator(self, server_args: Any, model_config: Any) -> Any:
        """The ``KVCacheConfigurator`` as ``ModelRunner.init_kv_cache_configurator`` builds it (target runner)."""
        rc = self.rc
        get_model, get_spec, get_schedule, get_parallel = rc.get_model, rc.get_spec, rc.get_schedule, rc.get_parallel
        spec_algorithm = self.spec_info.SpeculativeAlgorithm.from_string(get_spec().speculative_algorithm)
        aux = self.spec_aux.resolve_spec_aux_hidden_state_config(
            server_args=server_args, model_config=model_config, spec_algorithm=spec_algorithm, is_draft_worker=False,
        )
        layer_info = self.layer_setup.resolve_layer_indices(
            model=None, model_config=model_config, is_draft_worker=False, draft_model_idx=None,
        )
        resolved, kv_dtype = self.kv_dtype_mod.configure_kv_cache_dtype(
            server_args_kv_cache_dtype=get_model().kv_cache_dtype, model=None, model_dtype=model_config.dtype,
            is_draft_worker=False, is_dflash=spec_algorithm.is_dflash_family(),
            speculative_draft_attention_backend=None,
            speculative_draft_kv_cache_dtype=get_spec().speculative_draft_kv_cache_dtype,
        )
        kv_dtype_str = resolved if resolved is not None else get_model().kv_cache_dtype
        sliding_window = self.load_utils.resolve_sliding_window_size(None, model_config)
        # The WORLD group is only handed to the (stubbed) memory query; pp = 1.
        get_parallel().override_permanently(world_group=types.SimpleNamespace(cpu_group=None, world_size=1))
        kvc = self.kvc_mod.KVCacheConfigurator(
            device="cuda", gpu_id=0, attn_dp_size=get_parallel().attn_dp_size, pp_size=1, pp_group=None,
            model=None, model_config=model_config, server_args=server_args, kv_cache_dtype=kv_dtype,
            kv_cache_dtype_str=kv_dtype_str, model_dtype=model_config.dtype, page_size=get_schedule().page_size,
            sliding_window_size=sliding_window, spec_algorithm=spec_algorithm, is_draft_worker=False,
            post_capture_kv_active=self.kv_pool_runtime.is_post_capture_kv_active(
                server_args=server_args, is_draft_worker=False, spec_algorithm=spec_algorithm,
                token_to_kv_pool_allocator=None,
            ),
            spec_aux_config=aux, draft_parallel_layout=None, is_hybrid_swa=model_config.is_hybrid_swa,
            is_hybrid_swa_compress=model_config.is_hybrid_swa_compress,
            use_mla_backend=model_config.attention_arch == self.mc_mod.AttentionArch.MLA, layer_info=layer_info,
            forward_stream=None, req_to_token_pool=None, token_to_kv_pool_allocator=None, memory_pool_config=None,
            draft_model_idx=None,
        )
        return kvc

    def _size(self, argv: list[str], case: dict[str, Any]) -> dict[str, Any]:
        rc = self.rc
        self.memory.total_bytes = int(case["gpu_memory_bytes"])
        self.memory.pre_load_bytes = int(case["pre_load_bytes"])
        self.memory.free_after_load_bytes = int(case["free_after_load_bytes"])
        self.memory.loaded = False
        server_args = self._server_args(argv)
        rc.publish(server_args, role="scheduler", ranks=rc.SpawnRanks(world_rank=0, gpu_id=0))
        model_config = self._model_config(server_args)
        kvc = self._configurator(server_args, model_config)
        self._last = (server_args, model_config)
        # measure_pre_model_load_memory, then the weights load: the KV budget sees free-after-load.
        pre_model_load_gib = self.memory.available_gib()
        self.memory.loaded = True
        available_bytes = kvc._profile_available_bytes(pre_model_load_gib)
        configurator = self.pool_mod.create_memory_pool_configurator(kvc)
        config = kvc._resolve_memory_pool_config(pre_model_load_gib)
        schedule = rc.get_schedule()
        out: dict[str, Any] = {
            "max_total_num_tokens": int(config.max_total_num_tokens),
            "max_running_requests": int(config.max_running_requests),
            "swa_max_total_num_tokens": _opt_int(config.swa_max_total_num_tokens),
            "c4_max_total_num_tokens": int(config.c4_max_total_num_tokens),
            "c128_max_total_num_tokens": int(config.c128_max_total_num_tokens),
            "c4_state_pool_size": int(config.c4_state_pool_size),
            "c128_state_pool_size": int(config.c128_state_pool_size),
            "available_bytes": int(available_bytes),
            "configurator": type(configurator).__name__,
            "bytes_per_token": _per_token(configurator),
            "resolved": {
                "model_type": str(getattr(model_config.hf_config, "model_type", "")),
                "architecture": str(model_config.hf_config.architectures[0]),
                "context_len": int(model_config.context_len),
                "page_size": int(schedule.page_size),
                "kv_cache_dtype": str(kvc.kv_cache_dtype_str),
                "chunked_prefill_size": _opt_int(schedule.chunked_prefill_size),
                "swa_full_tokens_ratio": schedule.swa_full_tokens_ratio,
                "sliding_window_size": _opt_int(kvc.sliding_window_size),
                "speculative_algorithm": rc.get_spec().speculative_algorithm,
                "speculative_num_draft_tokens": _opt_int(rc.get_spec().speculative_num_draft_tokens),
            },
        }
        swa_cap = getattr(configurator, "swa_cap_tokens", None)
        out["swa_mode"] = None if not hasattr(configurator, "swa_cap_tokens") else ("cap" if swa_cap else "ratio")
        return out

    def run(self, case: dict[str, Any]) -> dict[str, Any]:
        argv = [str(a) for a in case["argv"]]
        if "--device" not in argv:
            argv += ["--device", "cuda"]  # what a GPU node resolves; on this CPU it would resolve "cpu"
        env = {str(k): str(v) for k, v in (case.get("env") or {}).items()}
        result: dict[str, Any] = {"id": case.get("id"), "ok": False, "error": None}
        with _environ(env), _quiet():
            try:
                result.update(self._size(argv, case))
                result["ok"] = True
            except Exception as exc:
                result["error"] = f"{type(exc).__name__}: {exc}"
                result["traceback_tail"] = traceback.format_exc().splitlines()[-6:]
            if result["ok"] and case.get("search_slots"):
                result["max_slots_that_fit"] = self._max_slots(case)
        return result

    def _max_slots(self, case: dict[str, Any]) -> int:
        """Largest ``--max-running-requests`` SGLang sizes without error and without reducing it.

        Each trial re-runs the configurator with the published ``max_running_requests`` overridden through the
        schedule bag's own ``override`` (what sizing reads; the rest of the resolved config is the case's).
        """
        rc = self.rc
        server_args, model_config = self._last
        pre_gib = self.memory.pre_load_bytes / GIB

        def fits(slots: int) -> bool:
            with rc.get_schedule().override(max_running_requests=slots):
                try:
                    config = self._configurator(server_args, model_config)._resolve_memory_pool_config(pre_gib)
                except Exception:
                    return False
            return bool(config.max_running_requests == slots)

        return bisect_max(fits, int(case.get("slots_limit", 4096)))


def _opt_int(value: Any) -> int | None:
    return None if value is None else int(value)


def _per_token(configurator: Any) -> float | None:
    for attr in ("bytes_per_full_token", "_cell_size"):
        value = getattr(configurator, attr, None)
        if isinstance(value, int | float):
            return float(value)
    return None


@contextlib.contextmanager
def _environ(env: dict[str, str]) -> Iterator[None]:
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """SGLang prints and logs freely; stdout is the answer channel, so everything else goes to stderr."""
    sink = io.StringIO()
    with contextlib.redirect_stdout(sink):
        yield
    if sink.getvalue():
        sys.stderr.write(sink.getvalue())


def main() -> int:
    out = sys.stdout
    try:
        with _quiet():
            sizer = Sizer()
    except Exception as exc:
        out.write(json.dumps({"ready": False, "error": f"{type(exc).__name__}: {exc}"}) + "\n")
        out.flush()
        return 1
    out.write(json.dumps({"ready": True, "sglang_version": sizer.version, "import_s": round(sizer.import_s, 3),
                          "stubs": sizer.stubs, "patched": sizer.patched}) + "\n")
    out.flush()
    for line in sys.stdin:
        if not line.strip():
            continue
        request = json.loads(line)
        answers = [sizer.run(case) for case in request["cases"]]
        out.write(json.dumps({"results": answers}) + "\n")
        out.flush()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
