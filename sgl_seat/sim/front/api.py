"""Request parsing and response shapes of node 0's API, as SGLang 0.5.23 spells them. Pure functions.

Why hand-written checks instead of SGLang's pydantic models: the sim needs a small subset, and each bad
request must get one clear 4xx JSON error (OpenAI routes: SGLang's ``ErrorResponse`` body; ``/generate``:
``{"error": {"message": ...}}``), never a traceback. Generation parameters the sim cannot honour are
refused rather than ignored (``n`` > 1); sampling knobs that do not change a greedy stand-in
(``temperature``, ``top_p``, ...) are accepted and ignored.

Token limits when a request gives none: ``/v1/completions`` 16 (SGLang's ``CompletionRequest.max_tokens``
default), ``/generate`` 128 (``SamplingParams.max_new_tokens``). Chat has no default in SGLang (it runs to
EOS or the context length); the sim's model never emits EOS, so chat gets 128 too.
"""

from __future__ import annotations

import json
import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from sgl_seat.sim.contract import OPENAI_OBJECTS
from sgl_seat.sim.step import tokens

DEFAULT_MAX_NEW_TOKENS = 128
DEFAULT_COMPLETION_MAX_TOKENS = 16


class ApiError(Exception):
    def __init__(self, message: str, status: int = 400) -> None:
        super().__init__(message)
        self.message = message
        self.status = status


@dataclass(frozen=True, slots=True)
class GenParams:
    input_ids: list[int]
    max_new_tokens: int
    stream: bool
    stop: tuple[str, ...] = ()
    stop_token_ids: tuple[int, ...] = ()
    include_usage: bool = False
    model: str = "default"
    rid: str | None = None
    # What the request log (sgl_seat.sim.front.reqlog) records as GenerateReqInput: the text as given (None when the
    # request came as token ids, or as chat messages, which SGLang templates into input_ids), the
    # sampling_params SGLang holds, and whether an OpenAI adapter built it.
    text: str | None = None
    sampling_params: dict[str, Any] = field(default_factory=dict)
    openai: bool = False


def parse_json(body: bytes) -> dict[str, Any]:
    if not body.strip():
        raise ApiError("The request body is empty; send a JSON object.")
    try:
        obj = json.loads(body)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise ApiError(f"The request body is not valid JSON: {e}") from None
    if not isinstance(obj, dict):
        raise ApiError(f"The request body must be a JSON object, not {type(obj).__name__}.")
    return obj


def _int(obj: dict[str, Any], key: str, default: int | None) -> int | None:
    v = obj.get(key)
    if v is None:
        return default
    if isinstance(v, bool) or not isinstance(v, int):
        raise ApiError(f"{key} must be an integer, got {json.dumps(v)}.")
    if v < 0:
        raise ApiError(f"{key} must be at least 0, got {v}.")
    return v


def _bool(obj: dict[str, Any], key: str) -> bool:
    v = obj.get(key, False)
    if v is None:
        return False
    if not isinstance(v, bool):
        raise ApiError(f"{key} must be true or false, got {json.dumps(v)}.")
    return v


def _stop(v: Any) -> tuple[str, ...]:
    if v is None:
        return ()
    if isinstance(v, str):
        return (v,) if v else ()
    if isinstance(v, list) and all(isinstance(s, str) for s in v):
        return tuple(s for s in v if s)
    raise ApiError("stop must be a string or a list of strings.")


def _stop_ids(v: Any) -> tuple[int, ...]:
    if v is None:
        return ()
    if isinstance(v, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in v):
        return tuple(v)
    raise ApiError("stop_token_ids must be a list of integers.")


def _n(obj: dict[str, Any]) -> None:
    n = obj.get("n", 1)
    if n not in (None, 1):
        raise ApiError(f"n={json.dumps(n)}: the sim engine returns one choice per request; send n=1.")


def _include_usage(obj: dict[str, Any]) -> bool:
    so = obj.get("stream_options")
    if so is None:
        return False
    if not isinstance(so, dict):
        raise ApiError("stream_options must be an object.")
    return bool(so.get("include_usage", False))


def check_context(input_len: int, max_new: int, context_len: int) -> None:
    if input_len + max_new > context_len:
        raise ApiError(
            f"Requested token count exceeds the model's maximum context length of {context_len} tokens. "
            f"You requested a total of {input_len + max_new} tokens: {input_len} tokens from the input messages "
            f"and {max_new} tokens for the completion. Please reduce the number of tokens in the input messages "
            "or the completion to fit within the limit."
        )


def parse_completion(obj: dict[str, Any]) -> GenParams:
    if "prompt" not in obj:
        raise ApiError("Missing required field 'prompt'.")
    prompt = obj["prompt"]
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
        prompt = prompt[0]
    if isinstance(prompt, str):
        ids = tokens.encode(prompt)
    elif isinstance(prompt, list) and prompt and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt):
        ids = list(prompt)
    else:
        raise ApiError("prompt must be a string, a list with one string, or a non-empty list of token ids.")
    if not ids:
        raise ApiError("prompt is empty.")
    _n(obj)
    max_new = _int(obj, "max_tokens", DEFAULT_COMPLETION_MAX_TOKENS)
    assert max_new is not None
    return GenParams(
        input_ids=ids, max_new_tokens=max_new, stream=_bool(obj, "stream"), stop=_stop(obj.get("stop")),
        stop_token_ids=_stop_ids(obj.get("stop_token_ids")), include_usage=_include_usage(obj),
        model=str(obj.get("model") or "default"), text=prompt if isinstance(prompt, str) else None,
        sampling_params=openai_sampling_params(obj, max_new), openai=True,
    )


def _content(msg: dict[str, Any], i: int) -> str:
    c = msg.get("content")
    if c is None:
        return ""
    if isinstance(c, str):
        return c
    if isinstance(c, list):
        parts = []
        for p in c:
            if not isinstance(p, dict) or p.get("type") != "text" or not isinstance(p.get("text"), str):
                raise ApiError(f"messages[{i}].content: only text parts are supported by the sim engine.")
            parts.append(p["text"])
        return " ".join(parts)
    raise ApiError(f"messages[{i}].content must be a string or a list of text parts.")


def parse_chat(obj: dict[str, Any]) -> GenParams:
    if "messages" not in obj:
        raise ApiError("Missing required field 'messages'.")
    msgs = obj["messages"]
    if not isinstance(msgs, list) or not msgs:
        raise ApiError("messages must be a non-empty list of {role, content} objects.")
    pairs = []
    for i, m in enumerate(msgs):
        if not isinstance(m, dict) or not isinstance(m.get("role"), str):
            raise ApiError(f"messages[{i}] must be an object with a string 'role'.")
        pairs.append((m["role"], _content(m, i)))
    _n(obj)
    max_new = _int(obj, "max_completion_tokens", None)
    if max_new is None:
        max_new = _int(obj, "max_tokens", DEFAULT_MAX_NEW_TOKENS)
    assert max_new is not None
    return GenParams(
        input_ids=tokens.chat_ids(pairs), max_new_tokens=max_new, stream=_bool(obj, "stream"),
        stop=_stop(obj.get("stop")), stop_token_ids=_stop_ids(obj.get("stop_token_ids")),
        include_usage=_include_usage(obj), model=str(obj.get("model") or "default"),
        sampling_params=openai_sampling_params(obj, max_new), openai=True,
    )


def parse_generate(obj: dict[str, Any]) -> GenParams:
    text, ids = obj.get("text"), obj.get("input_ids")
    if (text is None) == (ids is None):
        raise ApiError("Either text or input_ids should be provided (exactly one of them).")
    if text is not None:
        if not isinstance(text, str):
            raise ApiError("text must be a string (batched requests are not supported by the sim engine).")
        input_ids = tokens.encode(text)
    else:
        if not (isinstance(ids, list) and all(isinstance(t, int) and not isinstance(t, bool) for t in ids)):
            raise ApiError("input_ids must be a list of integers (batched requests are not supported).")
        input_ids = list(ids)
    if not input_ids:
        raise ApiError("The input is empty.")
    sp = obj.get("sampling_params") or {}
    if not isinstance(sp, dict):
        raise ApiError("sampling_params must be an object.")
    try:
        max_new = _int(sp, "max_new_tokens", DEFAULT_MAX_NEW_TOKENS)
    except ApiError as e:
        raise ApiError(e.message.replace("max_new_tokens", "sampling_params.max_new_tokens")) from None
    assert max_new is not None
    rid = obj.get("rid")
    if rid is not None and not isinstance(rid, str):
        raise ApiError("rid must be a string.")
    return GenParams(
        input_ids=input_ids, max_new_tokens=max_new, stream=_bool(obj, "stream"), stop=_stop(sp.get("stop")),
        stop_token_ids=_stop_ids(sp.get("stop_token_ids")), rid=rid, text=text, sampling_params=dict(sp),
    )


#: (OpenAI field, SGLang sampling_params key, CompletionRequest default) in ``_build_sampling_params`` order.
_OPENAI_SAMPLING: tuple[tuple[str, str, Any], ...] = (
    ("temperature", "temperature", 1.0), ("min_tokens", "min_new_tokens", 0), ("stop", "stop", None),
    ("stop_token_ids", "stop_token_ids", None), ("top_p", "top_p", 1.0), ("top_k", "top_k", -1),
    ("min_p", "min_p", 0.0), ("presence_penalty", "presence_penalty", 0.0),
    ("frequency_penalty", "frequency_penalty", 0.0), ("repetition_penalty", "repetition_penalty", 1.0),
    ("n", "n", 1), ("ignore_eos", "ignore_eos", False), ("skip_special_tokens", "skip_special_tokens", True),
    ("seed", "sampling_seed", None),
)


def openai_sampling_params(obj: dict[str, Any], max_new: int) -> dict[str, Any]:
    """The ``sampling_params`` SGLang's OpenAI adapters build (``_build_sampling_params``), for the request log."""
    out: dict[str, Any] = {}
    for src, dst, default in _OPENAI_SAMPLING:
        v = obj.get(src, default)
        out[dst] = default if v is None else v
        if dst == "temperature":
            out["max_new_tokens"] = max_new
    return out


# --- responses ---------------------------------------------------------------------------------------------
def new_id(prefix: str = "") -> str:
    return prefix + uuid.uuid4().hex


def openai_error(message: str, status: int = 400, err_type: str | None = None) -> dict[str, Any]:
    """SGLang's ``ErrorResponse`` body."""
    from http import HTTPStatus

    return {
        "object": OPENAI_OBJECTS["ErrorResponse"],
        "message": message,
        "type": err_type or HTTPStatus(status).phrase,
        "param": None,
        "code": status,
    }


def native_error(message: str) -> dict[str, Any]:
    """``/generate``'s error body (``_create_error_response``)."""
    return {"error": {"message": message}}


def finish_reason(fin: dict[str, Any] | None) -> tuple[str | None, str | int | None]:
    """SGLang finish_reason dict -> OpenAI (finish_reason, matched_stop)."""
    if not fin:
        return None, None
    kind = str(fin.get("type"))
    if kind == "stop":
        return "stop", fin.get("matched")
    return kind, None


def usage(prompt: int, completion: int, cached: int, *, cache_report: bool) -> dict[str, Any]:
    u: dict[str, Any] = {
        "prompt_tokens": prompt,
        "total_tokens": prompt + completion,
        "completion_tokens": completion,
        "prompt_tokens_details": {"cached_tokens": cached} if cache_report else None,
        "reasoning_tokens": 0,
    }
    return u


def completion_body(*, rid: str, model: str, text: str, fin: dict[str, Any] | None, usage_: dict[str, Any],
                    created: int | None = None) -> dict[str, Any]:
    reason, matched = finish_reason(fin)
    return {
        "id": rid,
        "object": OPENAI_OBJECTS["CompletionResponse"],
        "created": created or int(time.time()),
        "model": model,
        "choices": [{"index": 0, "text": text, "logprobs": None, "finish_reason": reason, "matched_stop": matched}],
        "usage": usage_,
    }


def completion_chunk(*, rid: str, model: str, text: str, fin: dict[str, Any] | None, created: int,
                     usage_: dict[str, Any] | None = None, no_choices: bool = False) -> dict[str, Any]:
    reason, matched = finish_reason(fin)
    choices = [] if no_choices else [
        {"index": 0, "text": text, "logprobs": None, "finish_reason": reason, "matched_stop": matched}
    ]
    return {"id": rid, "object": "text_completion", "created": created, "model": model, "choices": choices,
            "usage": usage_}


def chat_body(*, rid: str, model: str, text: str, fin: dict[str, Any] | None, usage_: dict[str, Any],
              created: int | None = None) -> dict[str, Any]:
    reason, matched = finish_reason(fin)
    return {
        "id": rid,
        "object": OPENAI_OBJECTS["ChatCompletionResponse"],
        "created": created or int(time.time()),
        "model": model,
        "choices": [{
            "index": 0,
            "message": {"role": "assistant", "content": text, "reasoning_content": None},
            "logprobs": None,
            "finish_reason": reason,
            "matched_stop": matched,
        }],
        "usage": usage_,
    }


def chat_chunk(*, rid: str, model: str, created: int, role: str | None = None, content: str | None = None,
               fin: dict[str, Any] | None = None, usage_: dict[str, Any] | None = None,
               no_choices: bool = False) -> dict[str, Any]:
    reason, matched = finish_reason(fin)
    choices = [] if no_choices else [{
        "index": 0,
        "delta": {"role": role, "content": content, "reasoning_content": None},
        "logprobs": None,
        "finish_reason": reason,
        "matched_stop": matched,
    }]
    return {"id": rid, "object": OPENAI_OBJECTS["ChatCompletionStreamResponse"], "created": created, "model": model,
            "choices": choices, "usage": usage_}


def sse(obj: dict[str, Any] | str) -> bytes:
    data = obj if isinstance(obj, str) else json.dumps(obj, separators=(",", ":"))
    return f"data: {data}\n\n".encode()
