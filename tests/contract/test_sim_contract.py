"""Every name the sim engine claims to share with SGLang 0.5.23 exists in SGLang's source, spelled the same.

The names come from ``sgl_seat.sim.contract`` (the sim builds its routes, fields, metrics, titles and log
lines from that module). Sources are read, never imported: the installed ``sglang`` package
(``tests/contract/sglang_parser.sglang_source_root``), else an unpacked 0.5.23 wheel at ``/tmp/sgl/src/sglang``;
without either the tests skip and say why (under ``CI=true`` they fail).
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

from sgl_seat.sim import contract
from sgl_seat.sim.front import api

pytestmark = pytest.mark.contract

FALLBACK = Path("/tmp/sgl/src/sglang")


def _root() -> Path | None:
    try:
        from tests.contract.sglang_parser import sglang_source_root

        root = sglang_source_root()
        if (root / "srt").is_dir():
            return root
    except Exception:  # not installed, or the helper is missing: try the unpacked wheel
        pass
    return FALLBACK if (FALLBACK / "srt").is_dir() else None


ROOT = _root()
if ROOT is None:
    from tests.contract.conftest import in_ci

    if in_ci():  # CI must run the contract tests: a missing SGLang fails them there
        raise RuntimeError("CI=true and SGLang 0.5.23's source is not available (scripts/install-sglang-parser.sh)")
    pytest.skip("SGLang 0.5.23's source is not available: install it with scripts/install-sglang-parser.sh "
                f"(or unpack the wheel at {FALLBACK})", allow_module_level=True)
assert ROOT is not None


@functools.cache
def _tree(rel: str) -> ast.Module:
    return ast.parse((ROOT / rel).read_text(encoding="utf-8"))


@functools.cache
def _text(rel: str) -> str:
    return (ROOT / rel).read_text(encoding="utf-8")


def _func(rel: str, name: str) -> ast.AST:
    for node in ast.walk(_tree(rel)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and node.name == name:
            return node
    raise AssertionError(f"{rel}: no function {name}")


def _strings(node: ast.AST) -> set[str]:
    return {n.value for n in ast.walk(node) if isinstance(n, ast.Constant) and isinstance(n.value, str)}


@functools.cache
def _templates(rel: str) -> tuple[str, ...]:
    """Every string literal of a file; f-strings with \\x00 where a value is formatted in."""
    out = []
    for n in ast.walk(_tree(rel)):
        if isinstance(n, ast.JoinedStr):
            out.append("".join(v.value if isinstance(v, ast.Constant) else "\x00" for v in n.values))
        elif isinstance(n, ast.Constant) and isinstance(n.value, str):
            out.append(n.value)
    return tuple(out)


def _in_templates(rel: str, fragment: str) -> bool:
    return any(fragment in t for t in _templates(rel))


def _class_fields(rel: str) -> dict[str, set[str]]:
    """class -> annotated field names, including those of base classes in the same module."""
    own: dict[str, set[str]] = {}
    bases: dict[str, list[str]] = {}
    for n in ast.walk(_tree(rel)):
        if isinstance(n, ast.ClassDef):
            own[n.name] = {
                s.target.id for s in n.body if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name)
            }
            bases[n.name] = [b.id for b in n.bases if isinstance(b, ast.Name)]

    def all_fields(c: str, seen: frozenset[str] = frozenset()) -> set[str]:
        out = set(own.get(c, set()))
        for b in bases.get(c, []):
            if b not in seen:
                out |= all_fields(b, seen | {c})
        return out

    return {c: all_fields(c) for c in own}


# --- version ------------------------------------------------------------------------------------------------------
def test_source_is_sglang_0_5_23() -> None:
    assert f"'{contract.SGLANG_VERSION}'" in _text("_version.py")


# --- routes -------------------------------------------------------------------------------------------------------
def _decorated_routes(node: ast.AST) -> set[tuple[str, str]]:
    out: set[tuple[str, str]] = set()
    for n in ast.walk(node):
        if not isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        for d in n.decorator_list:
            if not (isinstance(d, ast.Call) and isinstance(d.func, ast.Attribute) and d.args
                    and isinstance(d.args[0], ast.Constant) and isinstance(d.args[0].value, str)):
                continue
            path, kind = d.args[0].value, d.func.attr
            if kind in ("get", "post", "put", "delete"):
                out.add((kind.upper(), path))
            elif kind == "api_route":
                for kw in d.keywords:
                    if kw.arg == "methods" and isinstance(kw.value, ast.List):
                        out |= {(str(m.value), path) for m in kw.value.elts if isinstance(m, ast.Constant)}
    return out


def test_node0_routes_exist_with_their_methods() -> None:
    served = _decorated_routes(_tree("srt/entrypoints/http_server.py"))
    for method, path in contract.ROUTES:
        if path == contract.METRICS_ROUTE:
            continue
        assert (method, path) in served, f"SGLang 0.5.23 has no {method} {path}"
    for _, path in contract.SIM_ONLY_ROUTES:
        assert not any(p == path for _, p in served), f"{path} is SGLang's: the sim must not claim it as its own"


def test_metrics_route_is_sglangs_prometheus_mount() -> None:
    assert 'Mount("/metrics"' in _text("srt/utils/common.py")
    assert "add_prometheus_middleware(app)" in _text("srt/entrypoints/http_server.py")
    assert ("GET", contract.METRICS_ROUTE) in contract.ROUTES


def test_dummy_health_server_routes() -> None:
    served = _decorated_routes(_func("srt/utils/common.py", "launch_dummy_health_check_server"))
    assert set(contract.DUMMY_ROUTES) == served
    assert "add_prometheus_middleware" in ast.unparse(_func("srt/utils/common.py", "launch_dummy_health_check_server"))


# --- JSON fields --------------------------------------------------------------------------------------------------
def test_server_info_fields() -> None:
    found = (
        _strings(_func("srt/managers/scheduler.py", "get_init_info"))
        | _strings(_func("srt/entrypoints/http_server.py", "server_info"))
        | _strings(_func("srt/utils/common.py", "build_server_info"))
    )
    for key in contract.SERVER_INFO_FIELDS:
        assert key in found, f"/server_info has no {key!r}"
    assert contract.SIM_ONLY_SERVER_INFO_KEY not in found


def test_server_args_fields_are_real_serverargs_fields() -> None:
    fields: set[str] = set()
    for path in sorted((ROOT / "srt/arg_groups/fields").glob("*.py")):
        for cls_fields in _class_fields(str(path.relative_to(ROOT))).values():
            fields |= cls_fields
    for name in contract.SERVER_ARGS_FIELDS:
        assert name in fields, f"ServerArgs has no field {name!r}"


def test_internal_state_and_memory_usage_fields() -> None:
    state = _strings(_tree("srt/managers/scheduler_components/internal_state.py"))
    for key in contract.INTERNAL_STATE_FIELDS:
        assert key in state, f"internal_states[] has no {key!r}"
    mem = _strings(_func("srt/managers/scheduler_components/memory_usage.py", "build_memory_usage"))
    for key in contract.MEMORY_USAGE_FIELDS:
        assert key in mem, f"memory_usage has no {key!r}"


def test_model_info_fields() -> None:
    found = _strings(_func("srt/entrypoints/http_server.py", "model_info"))
    for key in contract.MODEL_INFO_FIELDS:
        assert key in found, f"/model_info has no {key!r}"


def test_generate_output_and_meta_info_fields() -> None:
    found = _strings(_tree("srt/managers/tokenizer_manager.py"))
    for key in (*contract.GENERATE_OUTPUT_FIELDS, *contract.META_INFO_FIELDS):
        assert key in found, f"/generate output has no {key!r}"
    # Finish reasons: {"type": "length", "length": N} and {"type": "stop", "matched": ...}.
    reasons = _strings(_tree("srt/managers/schedule_batch.py"))
    assert {"type", "length", "stop", "matched", "abort"} <= reasons


def test_generate_request_and_sampling_fields() -> None:
    gen = _class_fields("srt/managers/io_struct.py")["GenerateReqInput"]
    for key in contract.GENERATE_REQUEST_FIELDS:
        assert key in gen, f"GenerateReqInput has no {key!r}"
    sp = _class_fields("srt/sampling/sampling_params.py")["SamplingParams"]
    for key in contract.SAMPLING_PARAM_FIELDS:
        assert key in sp, f"SamplingParams has no {key!r}"


def test_openai_fields_and_object_names() -> None:
    classes = _class_fields("srt/entrypoints/openai/protocol.py")
    for cls, fields in contract.OPENAI_FIELDS.items():
        assert cls in classes, f"protocol.py has no class {cls}"
        for f in fields:
            assert f in classes[cls], f"{cls} has no field {f!r}"
    defaults: dict[str, str] = {}
    for n in ast.walk(_tree("srt/entrypoints/openai/protocol.py")):
        if isinstance(n, ast.ClassDef):
            for s in n.body:
                if (isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name) and s.target.id == "object"
                        and isinstance(s.value, ast.Constant)):
                    defaults[n.name] = str(s.value.value)
    for cls, obj in contract.OPENAI_OBJECTS.items():
        assert defaults.get(cls) == obj, f"{cls}.object is {defaults.get(cls)!r}, the sim says {obj!r}"
    owned = [s for s in ast.walk(_tree("srt/entrypoints/openai/protocol.py"))
             if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name) and s.target.id == "owned_by"]
    assert any(isinstance(s.value, ast.Constant) and s.value.value == contract.MODEL_OWNED_BY for s in owned)


def test_openai_defaults_match() -> None:
    """The sim's token-limit default for completions is SGLang's ``CompletionRequest.max_tokens``."""
    for n in ast.walk(_tree("srt/entrypoints/openai/protocol.py")):
        if isinstance(n, ast.ClassDef) and n.name == "CompletionRequest":
            for s in n.body:
                if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name) and s.target.id == "max_tokens":
                    assert isinstance(s.value, ast.Constant) and s.value.value == api.DEFAULT_COMPLETION_MAX_TOKENS
    sp = [s for s in ast.walk(_tree("srt/sampling/sampling_params.py"))
          if isinstance(s, ast.AnnAssign) and isinstance(s.target, ast.Name) and s.target.id == "max_new_tokens"]
    assert any(isinstance(s.value, ast.Constant) and s.value.value == api.DEFAULT_MAX_NEW_TOKENS for s in sp)


def test_error_shapes_and_messages() -> None:
    http = "srt/entrypoints/http_server.py"
    assert '{"error": {"message": str(e)}}' in ast.unparse(_func(http, "_create_error_response")).replace("'", '"')
    assert _in_templates(http, "Unsupported Media Type: Only 'application/json' is allowed")
    assert _in_templates("srt/managers/tokenizer_manager.py",
                         "Requested token count exceeds the model's maximum context length of ")
    assert _in_templates("srt/sampling/sampling_params.py", "max_new_tokens must be at least 0, got ")
    err = api.openai_error("m", 400)
    assert set(err) == set(contract.OPENAI_FIELDS["ErrorResponse"])


# --- metrics ------------------------------------------------------------------------------------------------------
def _metric_calls() -> dict[str, ast.Call]:
    out = {}
    for n in ast.walk(_tree("srt/observability/metrics_collector.py")):
        if isinstance(n, ast.Call):
            for kw in n.keywords:
                if kw.arg == "name" and isinstance(kw.value, ast.Constant) and isinstance(kw.value.value, str):
                    out[kw.value.value] = n
    return out


def test_metric_names_kinds_and_labels() -> None:
    calls = _metric_calls()
    kinds = {
        **{m: "Gauge" for m in contract.SCHEDULER_GAUGES},
        **{m: "Counter" for m in (*contract.SCHEDULER_COUNTERS, *contract.TOKENIZER_COUNTERS)},
        **{m: "Histogram" for m in contract.TOKENIZER_HISTOGRAMS},
    }
    extras = {**contract.SCHEDULER_GAUGES, **contract.SCHEDULER_COUNTERS, **contract.TOKENIZER_COUNTERS,
              **contract.TOKENIZER_HISTOGRAMS}
    for name in contract.METRIC_NAMES:
        assert name in calls, f"SGLang 0.5.23 has no metric {name}"
        call = calls[name]
        assert isinstance(call.func, ast.Name) and call.func.id == kinds[name], f"{name} is not a {kinds[name]}"
        labels = next((ast.unparse(kw.value) for kw in call.keywords if kw.arg == "labelnames"), "")
        for extra in extras[name]:
            assert f"'{extra}'" in labels, f"{name} has no label {extra!r} ({labels})"
        for other in ("is_streaming", "cache_source"):
            if other not in extras[name]:
                assert f"'{other}'" not in labels, f"{name} has label {other!r} the sim leaves out"
    for name in contract.SIM_ONLY_METRICS:
        assert not name.startswith("sglang:") and name not in calls


def test_metric_base_labels() -> None:
    mc = "srt/observability/metrics_collector.py"
    dict_keys = [
        tuple(k.value for k in n.keys if isinstance(k, ast.Constant))
        for n in ast.walk(_tree(mc)) if isinstance(n, ast.Dict)
    ]
    assert contract.SCHEDULER_LABELS in dict_keys
    tok = _func(mc, "tokenizer_metric_labels")
    assert contract.TOKENIZER_LABELS in [
        tuple(k.value for k in n.keys if isinstance(k, ast.Constant)) for n in ast.walk(tok) if isinstance(n, ast.Dict)
    ]
    assert contract.ENGINE_TYPE in _strings(_tree("srt/disaggregation/utils.py"))
    assert contract.CACHE_SOURCE_DEVICE in _strings(_tree(mc))


# --- titles -------------------------------------------------------------------------------------------------------
def test_process_titles() -> None:
    sched = _text("srt/managers/scheduler.py")
    assert "setproctitle.setproctitle(f\"sglang::scheduler{prefix.replace(' ', '_')}\")" in sched
    assert contract.SCHEDULER_TITLE_PREFIX == "sglang::scheduler"
    assert 'prefix += f" TP{shown_tp}"' in sched and 'prefix += f" EP{shown_moe_ep}"' in sched
    assert sched.index('prefix += f" TP{shown_tp}"') < sched.index('prefix += f" EP{shown_moe_ep}"')
    assert contract.scheduler_prefix(2, 2, 4, 4) == " TP2 EP2"
    assert f'setproctitle.setproctitle("{contract.DETOKENIZER_TITLE}")' in _text(
        "srt/managers/detokenizer_manager.py")
    assert f'format = f"{contract.LOG_FORMAT.replace("{prefix}", "{maybe_ms}{prefix}")}"' in _text(
        "srt/utils/common.py")
    assert f'datefmt="{contract.LOG_DATEFMT}"' in _text("srt/utils/common.py")


# --- log lines ----------------------------------------------------------------------------------------------------
S = 987654321  # an integer no source contains


def _pieces(line: str, *values: str) -> list[str]:
    """The literal text of a sim log line: split at the values it formats in, and at ", " separators
    (SGLang builds its lines from several f-strings, each ending in ", ")."""
    parts = [line]
    for v in (*values, ", "):
        parts = [p for chunk in parts for p in chunk.split(v)]
    return [p for p in parts if p.strip()]


def _literal_somewhere(rel: str, piece: str) -> bool:
    """In a string literal of ``rel``, where a formatted value may also be empty (``{iter_msg}``)."""
    return any(piece in t or piece in t.replace("\x00", "") for t in _templates(rel))


LOG_CASES = [
    # (file, sim line, values the sim formats in, words SGLang formats in from a constant of that file)
    ("srt/managers/scheduler.py", contract.log_tp0_summary(S, S, S, S, S, 1.25), (str(S), "1.25"),
     ("available_gpu_mem",)),
    ("srt/managers/scheduler_components/metrics_reporter.py",
     contract.log_decode_batch(S, S, 0.5, 2.5, 0.75, 3.5, S).replace(f"#token: {S}, token usage: 0.50, ", ""),
     (str(S), "0.50", "2.50", "0.75", "3.50", "False"), ("cuda graph",)),
    ("srt/managers/scheduler_components/metrics_reporter.py",
     contract.log_prefill_batch(S, S, S, 0.5, S, S, 3.5).replace("token usage: 0.50, ", ""),
     (str(S), "3.50", "False", "0"), ("cuda graph",)),
    ("srt/managers/scheduler_components/pool_stats_observer.py", f"#token: {S}, token usage: 0.50",
     (str(S), "0.50"), ()),
    ("srt/mem_cache/memory_pool.py", contract.log_kv_allocated(S, 1.25, "DT"), (str(S), "1.25", "DT"),
     ("KV Cache", "is allocated")),
    ("srt/entrypoints/http_server.py", contract.LOG_SERVER_READY, (), ()),
    ("srt/entrypoints/engine.py", contract.LOG_LAUNCH_SIGQUIT, (), ()),
    ("srt/entrypoints/engine.py", contract.log_node_sigterm(S), (str(S),), ()),
    ("srt/utils/watchdog.py", contract.log_subprocess_crashed("NAME", S, S), ("NAME", str(S)), ()),
    ("srt/managers/tokenizer_manager.py", contract.log_running_sigquit(S), (str(S), "None"), ()),
    ("srt/managers/scheduler.py", contract.log_scheduler_exception("MSG"), ("MSG",), ()),
]


@pytest.mark.parametrize(("rel", "line", "values", "constants"), LOG_CASES)
def test_log_line_pieces(rel: str, line: str, values: tuple[str, ...], constants: tuple[str, ...]) -> None:
    for word in constants:
        assert word in _strings(_tree(rel)), f"{rel}: no constant {word!r}"
    for piece in _pieces(line, *values, *constants):
        assert _literal_somewhere(rel, piece), f"{rel}: SGLang logs no {piece!r} (sim line: {line!r})"


def test_kv_and_watchdog_lines() -> None:
    line = contract.log_watchdog_timeout(300.0)
    assert line == "Scheduler watchdog timeout (self.watchdog_timeout=300.0, self.soft=False)"
    assert 'f"{self.debug_name} watchdog timeout "' in _text("srt/utils/watchdog.py")
    assert 'f"({self.watchdog_timeout=}, {self.soft=})"' in _text("srt/utils/watchdog.py")
    assert 'debug_name="Scheduler"' in _text("srt/managers/scheduler_components/invariant_checker.py")
    assert _in_templates("srt/entrypoints/http_server.py",
                         "Health check failed. Server couldn't get a response from detokenizer for last ")
