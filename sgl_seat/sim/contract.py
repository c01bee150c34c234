"""Every name the sim claims to share with SGLang 0.5.23, in one place.

The sim's code builds its routes, JSON fields, metric names, process titles and log lines from these
constants, and ``tests/contract/test_sim_contract.py`` checks each one against the SGLang package source.
A name added here without a twin in SGLang fails that test; a name the sim uses without listing it here
is a review bug. Names the sim adds on its own (its admin routes, its "synthetic" markers) are listed
separately under ``SIM_ONLY_*`` so the contract test can skip them knowingly.
"""

from __future__ import annotations

from typing import Final

from sgl_seat.topology import rank_title

SGLANG_VERSION: Final = "0.5.23"

# --- process titles (sglang/srt/managers/scheduler.py, detokenizer_manager.py) -----------------------------
# The rank suffix rule lives with the planner's rank placement (one rule for plan, agent and sim).
SCHEDULER_TITLE_PREFIX: Final = "sglang::scheduler"
DETOKENIZER_TITLE: Final = "sglang::detokenizer"


def scheduler_title(tp_rank: int, ep_rank: int, tp_size: int, ep_size: int) -> str:
    """SGLang's scheduler title for a pure TP(+EP) rank: ``sglang::scheduler`` and the rank's suffix."""
    return rank_title(SCHEDULER_TITLE_PREFIX, tp_rank, ep_rank, tp_size, ep_size)


def scheduler_prefix(tp_rank: int, ep_rank: int, tp_size: int, ep_size: int) -> str:
    """SGLang's log prefix for a pure TP(+EP) rank: ``" TP{tp}"`` if tp>1, ``" EP{ep}"`` if ep>1."""
    return scheduler_title(tp_rank, ep_rank, tp_size, ep_size).removeprefix(SCHEDULER_TITLE_PREFIX).replace("_", " ")


# --- HTTP routes (sglang/srt/entrypoints/http_server.py) -----------------------------------------------------
# (method, path) pairs served by node 0.
ROUTES: Final[tuple[tuple[str, str], ...]] = (
    ("GET", "/health"),
    ("GET", "/health_generate"),
    ("GET", "/ready"),
    ("GET", "/model_info"),
    ("GET", "/get_model_info"),
    ("GET", "/server_info"),
    ("GET", "/get_server_info"),
    ("GET", "/flush_cache"),
    ("POST", "/flush_cache"),
    ("POST", "/generate"),
    ("PUT", "/generate"),
    ("POST", "/v1/completions"),
    ("POST", "/v1/chat/completions"),
    ("GET", "/v1/models"),
    ("GET", "/metrics"),
)
# Routes of the dummy health server on nodes >= 1 (sglang/srt/utils/common.py launch_dummy_health_check_server).
DUMMY_ROUTES: Final[tuple[tuple[str, str], ...]] = (
    ("GET", "/ping"),
    ("GET", "/health"),
    ("GET", "/health_generate"),
)
METRICS_ROUTE: Final = "/metrics"

# The sim's own admin routes: loopback only, on each node's admin port (sgl_seat.sim.front.ports). Not SGLang's.
SIM_ONLY_ROUTES: Final[tuple[tuple[str, str], ...]] = (
    ("GET", "/sim/faults"),
    ("POST", "/sim/faults"),
    ("DELETE", "/sim/faults"),
    ("GET", "/sim/ranks"),
)

# --- JSON fields ----------------------------------------------------------------------------------------------
# /server_info top level: scheduler init info (scheduler.py get_init_info) + http_server.server_info.
SERVER_INFO_FIELDS: Final[tuple[str, ...]] = (
    "status",
    "max_total_num_tokens",
    "max_req_input_len",
    "startup_time",
    "internal_states",
    "version",
    "launch_command",
    "kv_events",
    "frontend",
)
# The sim's own /server_info key (not SGLang's): {"synthetic": true, ...}.
SIM_ONLY_SERVER_INFO_KEY: Final = "sgl_seat_sim"
# ServerArgs fields the sim reports in /server_info (resolved_dict()); each is a real ServerArgs field.
SERVER_ARGS_FIELDS: Final[tuple[str, ...]] = (
    "model_path",
    "served_model_name",
    "tp_size",
    "ep_size",
    "nnodes",
    "node_rank",
    "dist_init_addr",
    "dist_timeout",
    "mem_fraction_static",
    "max_running_requests",
    "context_length",
    "chunked_prefill_size",
    "watchdog_timeout",
    "enable_metrics",
    "host",
    "port",
    "decode_log_interval",
    "enable_cache_report",
    "disable_radix_cache",
    "speculative_algorithm",
    "speculative_draft_model_path",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
    "speculative_adaptive",
    "speculative_adaptive_config",
)
# internal_states[i] (scheduler_components/internal_state.py).
INTERNAL_STATE_FIELDS: Final[tuple[str, ...]] = (
    "world_size",
    "startup_time",
    "effective_max_running_requests_per_dp",
    "last_gen_throughput",
    "memory_usage",
    "avg_spec_accept_length",
)
# internal_states[i].memory_usage (scheduler_components/memory_usage.py build_memory_usage).
MEMORY_USAGE_FIELDS: Final[tuple[str, ...]] = (
    "weight",
    "kvcache",
    "startup_available",
    "token_capacity",
    "token_capacity_swa",
    "graph",
)
# /model_info (http_server.model_info).
MODEL_INFO_FIELDS: Final[tuple[str, ...]] = (
    "model_path",
    "served_model_name",
    "tokenizer_path",
    "is_generation",
    "preferred_sampling_params",
    "weight_version",
    "load_format",
    "model_type",
    "architectures",
)
# /generate output and meta_info (tokenizer_manager.py).
GENERATE_OUTPUT_FIELDS: Final[tuple[str, ...]] = ("text", "output_ids", "meta_info")
META_INFO_FIELDS: Final[tuple[str, ...]] = (
    "id",
    "finish_reason",
    "prompt_tokens",
    "completion_tokens",
    "cached_tokens",
    "e2e_latency",
    "weight_version",
    "spec_verify_ct",
    "spec_accept_rate",
    "spec_accept_length",
)
# OpenAI-compatible bodies (sglang/srt/entrypoints/openai/protocol.py): class -> fields the sim emits.
OPENAI_FIELDS: Final[dict[str, tuple[str, ...]]] = {
    "UsageInfo": ("prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details", "reasoning_tokens"),
    "PromptTokensDetails": ("cached_tokens",),
    "ErrorResponse": ("object", "message", "type", "param", "code"),
    "CompletionResponse": ("id", "object", "created", "model", "choices", "usage"),
    "CompletionResponseChoice": ("index", "text", "logprobs", "finish_reason", "matched_stop"),
    "CompletionStreamResponse": ("id", "object", "created", "model", "choices", "usage"),
    "CompletionResponseStreamChoice": ("index", "text", "logprobs", "finish_reason", "matched_stop"),
    "ChatCompletionResponse": ("id", "object", "created", "model", "choices", "usage"),
    "ChatCompletionResponseChoice": ("index", "message", "logprobs", "finish_reason", "matched_stop"),
    "ChatMessage": ("role", "content", "reasoning_content"),
    "ChatCompletionStreamResponse": ("id", "object", "created", "model", "choices", "usage"),
    "ChatCompletionResponseStreamChoice": ("index", "delta", "logprobs", "finish_reason", "matched_stop"),
    "DeltaMessage": ("role", "content", "reasoning_content"),
    "ModelCard": ("id", "object", "created", "owned_by", "root", "parent", "max_model_len"),
    "ModelList": ("object", "data"),
    "CompletionRequest": ("model", "prompt", "max_tokens", "stream", "stream_options", "stop", "temperature", "n"),
    "ChatCompletionRequest": (
        "model", "messages", "max_tokens", "max_completion_tokens", "stream", "stream_options", "stop",
        "temperature", "n",
    ),
    "StreamOptions": ("include_usage",),
}
# The "object" values of OpenAI bodies, exactly as protocol.py spells its defaults.
OPENAI_OBJECTS: Final[dict[str, str]] = {
    "CompletionResponse": "text_completion",
    "ChatCompletionResponse": "chat.completion",
    "ChatCompletionStreamResponse": "chat.completion.chunk",
    "ModelList": "list",
    "ModelCard": "model",
    "ErrorResponse": "error",
}
MODEL_OWNED_BY: Final = "sglang"
# /generate request fields (io_struct.GenerateReqInput) and sampling params (sampling_params.SamplingParams).
GENERATE_REQUEST_FIELDS: Final[tuple[str, ...]] = ("text", "input_ids", "sampling_params", "stream", "rid")
SAMPLING_PARAM_FIELDS: Final[tuple[str, ...]] = (
    "max_new_tokens", "temperature", "stop", "stop_token_ids", "ignore_eos",
)

# --- Prometheus (sglang/srt/observability/metrics_collector.py) ---------------------------------------------
SCHEDULER_LABELS: Final[tuple[str, ...]] = ("model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank")
TOKENIZER_LABELS: Final[tuple[str, ...]] = ("model_name", "engine_type")
ENGINE_TYPE: Final = "unified"
CACHE_SOURCE_DEVICE: Final = "device"

# name -> (kind, extra labels beyond the collector's base labels)
SCHEDULER_GAUGES: Final[dict[str, tuple[str, ...]]] = {
    "sglang:num_running_reqs": (),
    "sglang:num_queue_reqs": (),
    "sglang:gen_throughput": (),
    "sglang:cache_hit_rate": (),
    "sglang:token_usage": (),
    "sglang:num_used_tokens": (),
    "sglang:spec_accept_length": (),
    "sglang:spec_accept_rate": (),
    "sglang:max_total_num_tokens": (),
    "sglang:context_len": (),
    "sglang:decode_sum_seq_lens": (),
}
# Scheduler counters: one pass a forward (SGLang labels it by CUDA-graph use: decode_cuda_graph / decode_none).
SCHEDULER_COUNTERS: Final[dict[str, tuple[str, ...]]] = {
    "sglang:cuda_graph_passes_total": ("mode",),
}
CUDA_GRAPH_MODE_NONE: Final = "decode_none"
TOKENIZER_COUNTERS: Final[dict[str, tuple[str, ...]]] = {
    "sglang:prompt_tokens_total": ("is_streaming",),
    "sglang:generation_tokens_total": ("is_streaming",),
    "sglang:num_requests_total": ("is_streaming",),
    "sglang:cached_tokens_total": ("cache_source",),
    "sglang:spec_verify_calls_total": (),
}
TOKENIZER_HISTOGRAMS: Final[dict[str, tuple[str, ...]]] = {
    "sglang:time_to_first_token_seconds": ("is_streaming",),
    "sglang:inter_token_latency_seconds": (),
    "sglang:e2e_request_latency_seconds": ("is_streaming",),
}
METRIC_NAMES: Final[tuple[str, ...]] = (*SCHEDULER_GAUGES, *SCHEDULER_COUNTERS, *TOKENIZER_COUNTERS,
                                        *TOKENIZER_HISTOGRAMS)
# The sim's own marker metric (not SGLang's): says every figure on the page is synthetic.
SIM_ONLY_METRICS: Final[tuple[str, ...]] = ("sgl_seat_sim_synthetic",)

# --- log lines (format strings SGLang logs; the sim fills the same fields) -----------------------------------
LOG_FORMAT: Final = "[%(asctime)s{prefix}] %(message)s"
LOG_DATEFMT: Final = "%Y-%m-%d %H:%M:%S"


def log_kv_allocated(num_tokens: int, kv_gb: float, dtype: str = "torch.bfloat16") -> str:
    """memory_pool.py (MLA form): ``KV Cache is allocated. dtype: ..., #tokens: N, KV size: X GB``."""
    return f"KV Cache is allocated. dtype: {dtype}, #tokens: {num_tokens}, KV size: {kv_gb:.2f} GB"


def log_tp0_summary(
    max_total_num_tokens: int, chunked_prefill_size: int, max_prefill_tokens: int, max_running_requests: int,
    context_len: int, available_gpu_mem_gb: float,
) -> str:
    """scheduler.py TP0 summary line."""
    return (
        f"max_total_num_tokens={max_total_num_tokens}, chunked_prefill_size={chunked_prefill_size}, "
        f"max_prefill_tokens={max_prefill_tokens}, max_running_requests={max_running_requests}, "
        f"context_len={context_len}, available_gpu_mem={available_gpu_mem_gb:.2f} GB"
    )


def log_decode_batch(
    num_running_reqs: int, num_used: int, token_usage: float, accept_len: float | None, accept_rate: float | None,
    gen_throughput: float, num_queue_reqs: int, cuda_graph: bool = False,
) -> str:
    """metrics_reporter.py report_decode_stats; the accept fields appear only with speculation."""
    msg = f"Decode batch, #running-req: {num_running_reqs}, #token: {num_used}, token usage: {token_usage:.2f}, "
    if accept_len is not None and accept_rate is not None:
        msg += f"accept len: {accept_len:.2f}, accept rate: {accept_rate:.2f}, "
    msg += f"cuda graph: {cuda_graph}, gen throughput (token/s): {gen_throughput:.2f}, #queue-req: {num_queue_reqs}"
    return msg


def log_prefill_batch(
    new_seq: int, new_token: int, cached_token: int, token_usage: float, running: int, queue: int,
    input_throughput: float, cuda_graph: bool = False,
) -> str:
    """metrics_reporter.py report_prefill_stats (without the optional parts)."""
    return (
        f"Prefill batch, #new-seq: {new_seq}, #new-token: {new_token}, #cached-token: {cached_token}, "
        f"token usage: {token_usage:.2f}, #running-req: {running}, #queue-req: {queue}, "
        f"#pending-token: 0, cuda graph: {cuda_graph}, input throughput (token/s): {input_throughput:.2f}"
    )


def log_watchdog_timeout(watchdog_timeout: float) -> str:
    """utils/watchdog.py: f"{debug_name} watchdog timeout ({self.watchdog_timeout=}, {self.soft=})"."""
    return f"Scheduler watchdog timeout (self.watchdog_timeout={watchdog_timeout!r}, self.soft=False)"


LOG_SERVER_READY: Final = "The server is fired up and ready to roll!"
LOG_LAUNCH_SIGQUIT: Final = "Received sigquit from a child process. It usually means the child failed."


def log_running_sigquit(signum: int) -> str:
    """tokenizer_manager.py SignalHandler.running_phase_sigquit_handler (frame elided)."""
    return f"SIGQUIT received. signum={signum}, frame=None. It usually means one child failed."


def log_subprocess_crashed(name: str, pid: int, code: int | None) -> str:
    """utils/watchdog.py SubprocessWatchdog."""
    return f"Subprocess {name} (pid={pid}) crashed with exit code {code}. Triggering SIGQUIT for cleanup..."


def log_node_sigterm(node_rank: int) -> str:
    """engine.py: what a node >= 1 logs on SIGTERM."""
    return (
        f"SIGTERM received on node_rank {node_rank}; waiting for the rank-0 ShutdownReq broadcast to stop "
        "the schedulers."
    )


def log_scheduler_exception(message: str) -> str:
    """scheduler.py run_scheduler_process: ``message`` is the whole traceback (``get_exception_traceback()``),
    so the line opens with "Traceback (most recent call last):" and the error is the last of its lines."""
    return f"Scheduler hit an exception: {message}"
