"""SGLang 0.5.23's KV pool sizing, re-written for machines without SGLang (the "mirror").

It answers the same question as :mod:`sgl_seat.sizing.ask_sglang` from the same :class:`SizingCase` (node 0's
flags, the planning config, the GPU memory figures) and follows SGLang's code step by step; a contract test
(``tests/contract/test_sizing_mirror.py``) runs both over a grid and fails above 1 % difference. What it covers,
each with the SGLang function it follows (``sglang/srt/...``):

* resolution: DeepSeek-V4 presets (page 256, KV fp8_e4m3, ``swa_full_tokens_ratio`` 0.1 except for
  ``model_type: deepseek_v41``; ``arg_groups/model_overrides/deepseek_v4.py``), chunked prefill by GPU memory
  (``arg_groups/memory_hook.py``), V4.1's refusal of speculative algorithms other than DSpark
  (``arg_groups/deepseek_v4_hook.py``), ``max_speculative_num_draft_tokens`` (adaptive: the largest tier);
* ``KVCacheConfigurator._profile_available_bytes`` / ``resolve_max_num_reqs``
  (``mem_cache/kv_cache_configurator.py``);
* ``DSV4PoolConfigurator`` (``model_executor/pool_configurator.py``) on the FlashMLA V4 layout that non-SM100
  CUDA GPUs use: compressed layers per ratio (4, 128; 1 and 2 through ``kv_source_layer_ids``), the SWA pool by
  ratio or by request cap, the compress-state rings, the EAGLE inflation (T+1)/T, the fixed c128/c2 state;
* ``DefaultPoolConfigurator``: MLA latent or MHA K/V cells, EAGLE/MTP draft layers folded into the cell.

Not covered (raises :class:`MirrorUnsupported`, so the plan says so instead of guessing): the unified-KV and
TRT-LLM DeepSeek-V4 pools, SM100's V4.1 layouts, encoder-replay / DSpark drafts, hybrid sliding-window and
Mamba models, DSA indexers (V3.2), FP4 KV, pipeline/attention-DP/context parallelism.

One module of about 500 lines on purpose: it is one thing, a step-by-step copy of one SGLang code path, kept in
SGLang's order so that a reader can hold it side by side with the source it follows.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

GIB = 1 << 30
_DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "half": 2, "float32": 4, "float": 4}
DSV4_ARCHS = ("DeepseekV4ForCausalLM",)
#: ``DSV4_DEFAULT_SWA_FULL_TOKENS_RATIO`` and the override deepseek_v4.py sets for deepseek_v4.
DSV4_SWA_RATIO = 0.1
#: ``SGLANG_SWA_EVICTION_INTERVAL`` default.
SWA_EVICTION_INTERVAL = 128
#: ``DSV41_INDEX_PAGE_SIZE`` without DeepGEMM's paged sparse MQA logits (what a CPU-side SGLang computes).
DSV41_INDEX_PAGE_SIZE = 64
#: Paged FlashMLA V4 row: 448 fp8 nope + 64 bf16 rope + 8 scale bytes, page stride padded to 576 B.
V4_LAYOUT_BYTES_PER_TOKEN = 584
V4_LAYOUT_PAGE_ALIGN = 576
#: ``SGLANG_DSV4_COMPRESS_STATE_DTYPE`` default float32.
COMPRESS_STATE_DTYPE_BYTES = 4


class MirrorUnsupported(ValueError):
    """The configuration uses a path of SGLang's sizing that the mirror does not follow."""


class SglangWouldRefuse(ValueError):
    """SGLang itself would refuse this configuration; the message is SGLang's (or says whose)."""


@dataclass(frozen=True, slots=True)
class LaunchFlags:
    """The flags of node 0's command line that SGLang's sizing reads."""

    tp_size: int
    dp_size: int
    mem_fraction_static: float
    max_running_requests: int | None
    context_length: int | None
    speculative_algorithm: str | None
    speculative_num_steps: int | None
    speculative_eagle_topk: int | None
    speculative_num_draft_tokens: int | None
    speculative_adaptive: bool
    max_speculative_num_draft_tokens: int | None
    swa_full_tokens_ratio: float | None
    kv_cache_dtype: str
    chunked_prefill_size: int | None
    page_size: int | None
    disable_radix_cache: bool
    max_total_tokens: int | None


def parse_flags(argv: Sequence[str]) -> LaunchFlags:
    """Read the sizing-relevant flags (others are ignored, as SGLang's sizing ignores them)."""
    p = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    p.add_argument("--tp-size", "--tp", type=int, default=1)
    p.add_argument("--dp-size", "--dp", type=int, default=1)
    p.add_argument("--mem-fraction-static", type=float, default=None)
    p.add_argument("--max-running-requests", type=int, default=None)
    p.add_argument("--context-length", type=int, default=None)
    p.add_argument("--speculative-algorithm", default=None)
    p.add_argument("--speculative-num-steps", type=int, default=None)
    p.add_argument("--speculative-eagle-topk", type=int, default=None)
    p.add_argument("--speculative-num-draft-tokens", type=int, default=None)
    p.add_argument("--speculative-adaptive", action="store_true")
    p.add_argument("--swa-full-tokens-ratio", type=float, default=None)
    p.add_argument("--kv-cache-dtype", default="auto")
    p.add_argument("--chunked-prefill-size", type=int, default=None)
    p.add_argument("--page-size", type=int, default=None)
    p.add_argument("--disable-radix-cache", action="store_true")
    p.add_argument("--max-total-tokens", type=int, default=None)
    ns, _ = p.parse_known_args(list(argv))
    if ns.mem_fraction_static is None:
        raise MirrorUnsupported("no --mem-fraction-static: SGLang's automatic fraction is not mirrored")
    if ns.dp_size != 1:
        raise MirrorUnsupported("attention DP is not mirrored")
    ndt = ns.speculative_num_draft_tokens
    return LaunchFlags(
        tp_size=ns.tp_size, dp_size=ns.dp_size, mem_fraction_static=ns.mem_fraction_static,
        max_running_requests=ns.max_running_requests, context_length=ns.context_length,
        speculative_algorithm=ns.speculative_algorithm, speculative_num_steps=ns.speculative_num_steps,
        speculative_eagle_topk=ns.speculative_eagle_topk, speculative_num_draft_tokens=ndt,
        speculative_adaptive=ns.speculative_adaptive,
        # Adaptive keeps the published draft-token count as the bound (topk 1: steps + 1 for the largest tier
        # the config was resolved with), which is what max_speculative_num_draft_tokens() returns here.
        max_speculative_num_draft_tokens=ndt,
        swa_full_tokens_ratio=ns.swa_full_tokens_ratio, kv_cache_dtype=ns.kv_cache_dtype,
        chunked_prefill_size=ns.chunked_prefill_size, page_size=ns.page_size,
        disable_radix_cache=ns.disable_radix_cache, max_total_tokens=ns.max_total_tokens,
    )


@dataclass(frozen=True, slots=True)
class MirrorResult:
    """The same figures the SGLang child reports, from the mirror."""

    max_total_num_tokens: int
    max_running_requests: int
    swa_max_total_num_tokens: int | None
    available_bytes: int
    configurator: str
    bytes_per_token: float
    swa_mode: str | None
    fixed_bytes: int
    resolved: dict[str, Any]


def chunked_prefill_default(gpu_memory_bytes: int) -> int:
    """``handle_gpu_memory_settings``: the chunked-prefill default by GPU memory (MiB thresholds)."""
    mib = gpu_memory_bytes / (1 << 20)
    if mib < 20 * 1024:
        return 2048
    if mib < 60 * 1024:
        return 4096
    if mib < 160 * 1024:
        return 8192
    return 16384


def profile_available_bytes(*, pre_load_bytes: int, free_after_load_bytes: int, mem_fraction: float) -> int:
    """``_profile_available_bytes``: free memory after load minus ``pre * (1 - fraction)``, in SGLang's floats."""
    available_gib = free_after_load_bytes / GIB
    pre_gib = pre_load_bytes / GIB
    rest = available_gib - pre_gib * (1 - mem_fraction)
    if rest <= 0:
        minimum = 1 - available_gib / pre_gib
        raise SglangWouldRefuse(
            f"Loaded weights leave no GPU memory for the KV cache under --mem-fraction-static={mem_fraction}. "
            f"Raise --mem-fraction-static above {math.ceil(minimum * 1000) / 1000:.3f}"
        )
    return int(rest * GIB)


def resolve_max_num_reqs(token_capacity: int, requested: int | None, context_len: int, dp: int = 1) -> int:
    """``KVCacheConfigurator.resolve_max_num_reqs`` (no Mamba)."""
    estimated = max(min(int(token_capacity / context_len * 512), 4096), 2048)
    if requested is not None:
        return min(max(1, requested // dp), token_capacity // 2)
    return min(estimated, token_capacity // 2)


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


def _ceil_align(a: int, b: int) -> int:
    return _ceil_div(a, b) * b


def _v4_paged_bytes_per_token(page_size: int, compress_ratio: int = 0) -> float:
    """``_get_paged_kv_bytes_per_token`` on the V4 layout: page stride padded to the TMA row stride."""
    page = page_size // compress_ratio if compress_ratio else page_size
    raw = page * V4_LAYOUT_BYTES_PER_TOKEN
    return _ceil_div(raw, V4_LAYOUT_PAGE_ALIGN) * V4_LAYOUT_PAGE_ALIGN / page


def _ring_size(ratio: int, num_draft_tokens: int) -> int:
    """``get_compress_state_ring_size`` (online c128 off)."""
    spec = num_draft_tokens > 0
    if ratio == 2:
        return 1 << (num_draft_tokens + 1).bit_length() if spec else 2
    if spec:
        return 16 if ratio == 4 else 256
    return 8 if ratio == 4 else 128


def _sources_by_ratio(ratios: Sequence[int], kv_sources: Sequence[int], layers: int) -> dict[int, list[int]]:
    """``collect_sources_by_ratio``: layers owning compressed storage (all of 4/128, kv sources of 1/2)."""
    stage = range(layers)
    for idx in stage:
        if ratios[idx] not in (0, 1, 2, 4, 128):
            raise MirrorUnsupported(f"compress ratio {ratios[idx]} at layer {idx}")
    out: dict[int, list[int]] = {}
    for ratio in (4, 128, 1, 2):
        if ratio in (1, 2):
            owners = [i for i in kv_sources if i in stage and ratios[i] == ratio]
        else:
            owners = [i for i in stage if ratios[i] == ratio]
        if owners:
            out[ratio] = owners
    return out


@dataclass(frozen=True, slots=True)
class _Dsv4:
    """The constants ``DSV4PoolConfigurator.__init__`` derives, for one case."""

    page: int
    layers: int
    owners: dict[int, list[int]]
    rings: dict[int, int]
    kv_bytes: int
    attn_head_dim: int
    indexer_bytes: int
    low_ratio_index_bytes: int
    bytes_per_swa_token: float
    bytes_per_full_token: float
    swa_ratio: float
    swa_cap_tokens: int | None
    window: int
    requested: int | None
    context_len: int

    def n(self, ratio: int) -> int:
        return len(self.owners.get(ratio, ()))


def _dsv4_setup(cfg: Mapping[str, Any], flags: LaunchFlags, *, page: int, chunked: int, context_len: int) -> _Dsv4:
    layers = int(cfg["num_hidden_layers"])
    ratios = list(cfg.get("compress_ratios") or [])
    if len(ratios) < layers:
        raise SglangWouldRefuse(f"compress_ratios has {len(ratios)} entries for {layers} layers")
    owners = _sources_by_ratio(ratios, list(cfg.get("kv_source_layer_ids") or []), layers)
    rope = int(cfg["qk_rope_head_dim"])
    nope = int(cfg["head_dim"]) - rope
    idx = int(cfg["index_head_dim"])
    window = int(cfg["sliding_window"])
    spec = flags.speculative_algorithm is not None
    ndt = (flags.speculative_num_draft_tokens or 0) if spec else 0
    rings = {r: _ring_size(r, ndt) for r in owners if r != 1}
    if spec:
        for ratio in (4, 128):
            if ratio not in owners:
                continue
            win = ratio * (2 if ratio == 4 else 1)
            pad = rings[ratio] - win + 2 if rings[ratio] > win else 0
            if (flags.max_speculative_num_draft_tokens or 0) > pad:
                raise SglangWouldRefuse(
                    f"speculative_num_draft_tokens={flags.max_speculative_num_draft_tokens} exceeds what the "
                    f"c{ratio} compress state ring can keep resident (ring_size={rings[ratio]} serves at most {pad})"
                )
    kv_bytes = nope + rope * 2 + 8  # one FlashMLA-layout latent slot
    attn_head_dim = nope + rope
    indexer_bytes = idx + idx // 128 * 4
    low_idx = idx // 2 + idx // 32
    operator_ratio = flags.swa_full_tokens_ratio
    if operator_ratio is None and cfg.get("model_type") != "deepseek_v41":
        operator_ratio = DSV4_SWA_RATIO  # deepseek_v4.py's override counts as explicitly set
    swa_ratio = operator_ratio if operator_ratio is not None else DSV4_SWA_RATIO
    requested = max(1, flags.max_running_requests // flags.dp_size) if flags.max_running_requests else None
    tails = 0 if flags.disable_radix_cache or requested is None else 4 * requested
    cap_tokens: int | None = None
    if operator_ratio is None and requested is not None and chunked > 0:
        cap = _swa_request_cap(flags, page=page, window=window, chunked=chunked, requested=requested)
        cap_tokens = _ceil_align(cap + tails * (window + page), page)
    c4_state_ratio = rings.get(4, 0) / page
    c4_state = 2 * 2 * attn_head_dim * COMPRESS_STATE_DTYPE_BYTES
    c4_idx_state = 2 * 2 * idx * COMPRESS_STATE_DTYPE_BYTES
    swa_token = _v4_paged_bytes_per_token(page) * layers + c4_state_ratio * (c4_state + c4_idx_state) * len(
        owners.get(4, ())
    )
    compressed = 0.0
    for ratio, owned in owners.items():
        if ratio in (1, 2):
            per = (_v4_paged_bytes_per_token(page, ratio) + low_idx) / ratio
        elif ratio == 4:
            per = 1 / 4 * _v4_paged_bytes_per_token(page, 4) + 1 / 4 * indexer_bytes
        else:
            per = 1 / 128 * _v4_paged_bytes_per_token(page, 128)
        compressed += per * len(owned)
    full_token = (0 if cap_tokens is not None else swa_ratio) * swa_token + compressed
    if spec:
        infl = (layers + 1) / layers  # the draft worker, as (target + draft) / target
        full_token *= infl
        swa_token *= infl
    return _Dsv4(
        page=page, layers=layers, owners=owners, rings=rings, kv_bytes=kv_bytes, attn_head_dim=attn_head_dim,
        indexer_bytes=indexer_bytes, low_ratio_index_bytes=low_idx, bytes_per_swa_token=swa_token,
        bytes_per_full_token=full_token, swa_ratio=swa_ratio, swa_cap_tokens=cap_tokens, window=window,
        requested=requested, context_len=context_len,
    )


def _swa_request_cap(flags: LaunchFlags, *, page: int, window: int, chunked: int, requested: int) -> int:
    """``compute_swa_request_cap`` (not PD-decode)."""
    draft_tokens = flags.speculative_num_draft_tokens or 1
    trailing = window + SWA_EVICTION_INTERVAL * draft_tokens + page
    if flags.speculative_algorithm is not None:
        raise MirrorUnsupported("request-cap SWA sizing with a speculative draft is not mirrored")
    per_request = trailing + page
    return per_request * requested + 2 * chunked + page


def _dsv4_fixed_bytes(d: _Dsv4, max_reqs: int) -> int:
    slots = max_reqs + 1
    fixed = 0
    if d.n(128):
        ring = d.rings[128]
        rows = _ceil_div(slots * ring + ring + 1, 128) * 128
        fixed += rows * 2 * d.attn_head_dim * COMPRESS_STATE_DTYPE_BYTES * d.n(128)
    if d.n(2):
        ring = d.rings[2]
        rows = _ceil_div(slots * ring + ring + 1, 2) * 2
        fixed += rows * 2 * d.attn_head_dim * 4 * d.n(2)
    return fixed


def _dsv4_padding(d: _Dsv4, full_tokens: int) -> float:
    pad = 0.0
    for ratio in (1, 2):
        n = d.n(ratio)
        if not n:
            continue
        main = d.page * _v4_paged_bytes_per_token(d.page, ratio)
        index_size = (full_tokens + d.page) // ratio
        slots = _ceil_div(index_size + DSV41_INDEX_PAGE_SIZE, DSV41_INDEX_PAGE_SIZE) * DSV41_INDEX_PAGE_SIZE
        pad += (main + (slots - full_tokens // ratio) * d.low_ratio_index_bytes) * n
    return pad


def _dsv4_pool(d: _Dsv4, available: int) -> tuple[int, int | None, int]:
    """``DSV4PoolConfigurator.calculate_pool_sizes``: (full tokens, SWA tokens, fixed bytes)."""
    if d.requested is not None:
        max_reqs = d.requested
    else:
        full = int(available / d.bytes_per_full_token)
        max_reqs = min(max(min(int(full / d.context_len * 512), 4096), 2048), full // 2)
    swa_fixed = 0 if d.swa_cap_tokens is None else d.swa_cap_tokens * d.bytes_per_swa_token
    fixed = _dsv4_fixed_bytes(d, max_reqs) + swa_fixed
    for_tokens = max(available - fixed, 0)
    full_tokens = int(for_tokens / d.bytes_per_full_token) // d.page * d.page
    while full_tokens > 0 and full_tokens * d.bytes_per_full_token + _dsv4_padding(d, full_tokens) > for_tokens:
        full_tokens -= d.page
    if full_tokens <= 0 and d.swa_cap_tokens is not None:
        raise SglangWouldRefuse(
            f"The DSV4 SWA pool cap ({d.swa_cap_tokens} tokens, {swa_fixed / GIB:.2f} GB) leaves no room for the "
            f"full KV pool within the available {available / GIB:.2f} GB. Reduce --max-running-requests"
        )
    if d.swa_cap_tokens is None:
        swa = int(full_tokens * d.swa_ratio) // d.page * d.page
        if d.window + d.page >= swa:
            raise SglangWouldRefuse(
                f"SWA pool ({swa} tokens) cannot hold even one request: the prefill admission floor is "
                f"sliding_window_size ({d.window}) + page_size ({d.page})"
            )
    else:
        swa = d.swa_cap_tokens
    return full_tokens, swa, int(fixed)


#: Dense Llama-family architectures whose parameters :func:`dense_param_bytes` counts (dummy weights are exactly them).
DENSE_LLAMA_ARCHS = ("LlamaForCausalLM", "LlamaForCausalLMEagle")


def dense_param_bytes(cfg: Mapping[str, Any]) -> int:
    """The bytes of a dense Llama-family checkpoint's parameters, as SGLang's model classes declare them.

    Why: a model made from a config and served with ``--load-format dummy`` has no files to read a size from; its
    weights on the GPU are exactly the parameters its class allocates (``llama.py``; ``llama_eagle.py``'s head: the
    first layer without its input norm, the ``fc`` projection of 2 x hidden with bias, no final norm). Other
    architectures raise :class:`MirrorUnsupported`.
    """
    arch = str((cfg.get("architectures") or [""])[0])
    if arch not in DENSE_LLAMA_ARCHS or cfg.get("attention_bias") or cfg.get("mlp_bias"):
        raise MirrorUnsupported(f"{arch or 'this architecture'}: parameters of dummy weights are counted for "
                                f"{', '.join(DENSE_LLAMA_ARCHS)} without biases only")
    h, inter, layers = int(cfg["hidden_size"]), int(cfg["intermediate_size"]), int(cfg["num_hidden_layers"])
    heads = int(cfg["num_attention_heads"])
    head_dim = int(cfg.get("head_dim") or h // heads)
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    vocab = int(cfg["vocab_size"])
    attn = h * heads * head_dim * 2 + h * kv_heads * head_dim * 2  # q and o; k and v
    per_layer = attn + 3 * h * inter + 2 * h  # gate, up, down; two norms
    embed = vocab * h
    head = 0 if cfg.get("tie_word_embeddings") else vocab * h
    if arch == "LlamaForCausalLMEagle":
        params = embed + layers * per_layer - h + 2 * h * h + h + head
    else:
        params = embed + layers * per_layer + h + head
    return params * _DTYPE_BYTES.get(str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"), 2)


def _kv_layer_bytes(cfg: Mapping[str, Any], tp: int, kv_size: int) -> int:
    """One layer's K and V per token on one rank (MHA)."""
    heads = int(cfg["num_attention_heads"])
    head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
    kv_heads = int(cfg.get("num_key_value_heads") or heads)
    return max(1, kv_heads // tp) * 2 * head_dim * kv_size


def _default_cell(cfg: Mapping[str, Any], flags: LaunchFlags,
                  draft_cfg: Mapping[str, Any] | None = None) -> tuple[int, str]:
    """``DefaultPoolConfigurator._compute_cell_size`` (+ the EAGLE/MTP draft layers), and the attention kind.

    A draft with a checkpoint of its own (``draft_cfg``: an EAGLE head, a STANDALONE model) gets its own KV pool of
    the same token count (the engine logs "KV Cache is allocated" once per pool, the same ``#tokens``), so its layers
    join the cell as its own config shapes them."""
    arch = (cfg.get("architectures") or [""])[0]
    layers = int(cfg["num_hidden_layers"])
    dtype = flags.kv_cache_dtype
    if dtype == "auto":
        kv_size = _DTYPE_BYTES.get(str(cfg.get("torch_dtype") or cfg.get("dtype") or "bfloat16"), 2)
    elif dtype in ("fp8_e4m3", "fp8_e5m2", "mxfp8"):
        kv_size = 1
    elif dtype in ("bf16", "bfloat16"):
        kv_size = 2
    else:
        raise MirrorUnsupported(f"--kv-cache-dtype {dtype} is not mirrored")
    if cfg.get("index_topk") or cfg.get("sliding_window") or cfg.get("layer_types"):
        raise MirrorUnsupported(f"{arch}: DSA or sliding-window attention is not mirrored")
    mla = bool(cfg.get("kv_lora_rank")) and arch.startswith("Deepseek")
    if mla:
        cell = (int(cfg["kv_lora_rank"]) + int(cfg["qk_rope_head_dim"])) * layers * kv_size
        kind = "MLA"
    else:
        heads = int(cfg["num_attention_heads"])
        head_dim = int(cfg.get("head_dim") or int(cfg["hidden_size"]) // heads)
        v_head_dim = head_dim
        kv_heads = int(cfg.get("num_key_value_heads") or heads)
        n = max(1, kv_heads // flags.tp_size)
        cell = n * (head_dim + v_head_dim) * layers * kv_size
        kind = "MHA"
    alg = (flags.speculative_algorithm or "").upper()
    if alg in ("EAGLE", "STANDALONE") and draft_cfg is not None and not mla:
        cell += _kv_layer_bytes(draft_cfg, flags.tp_size, kv_size) * int(draft_cfg["num_hidden_layers"])
    elif alg == "NGRAM":
        pass  # no draft model: no draft KV
    elif alg in ("EAGLE", "NEXTN", "STANDALONE"):
        draft_layers = int(cfg.get("num_nextn_predict_layers") or 0)
        if draft_layers <= 0:
            raise MirrorUnsupported("an EAGLE draft with its own checkpoint is not mirrored (MTP drafts are)")
        cell += int(cell * draft_layers / layers)
    elif alg:
        raise MirrorUnsupported(f"speculative algorithm {alg} is not mirrored")
    return cell, kind


def size_case(
    cfg: Mapping[str, Any], argv: Sequence[str], *, gpu_memory_bytes: int, pre_load_bytes: int,
    free_after_load_bytes: int, draft_cfg: Mapping[str, Any] | None = None,
) -> MirrorResult:
    """One case, SGLang's order: resolve, profile, configurator, token constraints, max running requests."""
    flags = parse_flags(argv)
    arch = (cfg.get("architectures") or ["unknown"])[0]
    model_type = str(cfg.get("model_type") or "")
    is_dsv4 = arch in DSV4_ARCHS
    context_len = flags.context_length or int(cfg.get("max_position_embeddings") or 0)
    if context_len <= 0:
        raise MirrorUnsupported("no --context-length and no max_position_embeddings")
    chunked = flags.chunked_prefill_size or chunked_prefill_default(gpu_memory_bytes)
    alg = (flags.speculative_algorithm or "").upper()
    if is_dsv4:
        if model_type == "deepseek_v41" and alg and alg != "DSPARK":
            raise SglangWouldRefuse(
                "DeepSeek-V4.1 does not support speculative decoding other than DSpark yet; disable it to serve "
                "this model."
            )
        if alg and alg != "EAGLE":
            raise MirrorUnsupported(f"{alg} drafts of DeepSeek-V4 are not mirrored")
        if flags.kv_cache_dtype not in ("auto", "fp8_e4m3"):
            raise MirrorUnsupported(f"DeepSeek-V4 with --kv-cache-dtype {flags.kv_cache_dtype} is not mirrored")
        page = flags.page_size or 256
        if page % 128:
            raise SglangWouldRefuse("page_size must be multiple of 128 for compressed attention")
    else:
        page = flags.page_size or 1
    available = profile_available_bytes(
        pre_load_bytes=pre_load_bytes, free_after_load_bytes=free_after_load_bytes,
        mem_fraction=flags.mem_fraction_static,
    )
    resolved: dict[str, Any] = {
        "model_type": model_type, "architecture": arch, "context_len": context_len, "page_size": page,
        "chunked_prefill_size": chunked, "speculative_algorithm": flags.speculative_algorithm,
    }
    if is_dsv4:
        d = _dsv4_setup(cfg, flags, page=page, chunked=chunked, context_len=context_len)
        tokens, swa, fixed = _dsv4_pool(d, available)
        per_token = d.bytes_per_full_token
        name, swa_mode = "DSV4PoolConfigurator", ("cap" if d.swa_cap_tokens is not None else "ratio")
        resolved.update(kv_cache_dtype="fp8_e4m3", swa_full_tokens_ratio=None if swa_mode == "cap" else d.swa_ratio,
                        sliding_window_size=d.window)
    else:
        cell, kind = _default_cell(cfg, flags, draft_cfg)
        tokens = available // cell // page * page
        swa, fixed, per_token = None, 0, float(cell)
        name, swa_mode = "DefaultPoolConfigurator", None
        resolved.update(kv_cache_dtype=flags.kv_cache_dtype, attention=kind)
    if flags.max_total_tokens is not None and flags.max_total_tokens < tokens:
        tokens = flags.max_total_tokens // page * page
    if tokens <= 0:
        raise SglangWouldRefuse(
            "Not enough memory. Please try to increase --mem-fraction-static. "
            f"Current value: mem_fraction_static={flags.mem_fraction_static}"
        )
    max_reqs = resolve_max_num_reqs(tokens, flags.max_running_requests, context_len, flags.dp_size)
    return MirrorResult(
        max_total_num_tokens=int(tokens), max_running_requests=int(max_reqs), swa_max_total_num_tokens=swa,
        available_bytes=available, configurator=name, bytes_per_token=float(per_token), swa_mode=swa_mode,
        fixed_bytes=fixed, resolved=resolved,
    )


def with_flag(argv: Sequence[str], flag: str, value: str) -> list[str]:
    """``argv`` with ``flag`` set to ``value`` (replaced in place, or appended)."""
    out = list(argv)
    if flag in out:
        out[out.index(flag) + 1] = value
    else:
        out += [flag, value]
    return out


def bisect_max(fits: Callable[[int], bool], limit: int) -> int:
    """Largest n in [0, limit] with ``fits(n)``, for a predicate true up to some n and false after."""
    if not fits(1):
        return 0
    lo, hi = 1, limit
    if fits(hi):
        return hi
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if fits(mid):
            lo = mid
        else:
            hi = mid
    return lo


def max_slots_that_fit(
    cfg: Mapping[str, Any], argv: Sequence[str], *, gpu_memory_bytes: int, pre_load_bytes: int,
    free_after_load_bytes: int, limit: int = 4096, draft_cfg: Mapping[str, Any] | None = None,
) -> int:
    """Largest ``--max-running-requests`` that sizes without error and is not reduced (the child's search)."""

    def fits(slots: int) -> bool:
        try:
            got = size_case(cfg, with_flag(argv, "--max-running-requests", str(slots)),
                            gpu_memory_bytes=gpu_memory_bytes, pre_load_bytes=pre_load_bytes,
                            free_after_load_bytes=free_after_load_bytes, draft_cfg=draft_cfg)
        except (SglangWouldRefuse, MirrorUnsupported):
            return False
        return got.max_running_requests == slots

    return bisect_max(fits, limit)
