"""SGLang 0.5.23's request log (``--log-requests``), reproduced for the sim's node 0.

What SGLang does (``sglang/srt/utils/request_logger.py`` and ``log_utils.py``) and the sim copies:

- ``--log-requests`` turns it on; ``--log-requests-level`` picks what is kept (0: metadata; 1: metadata and
  sampling parameters; 2: also input/output, strings cut to 2048 characters; 3: everything);
  ``--log-requests-format json`` writes one JSON object per line; ``--log-requests-target`` names
  ``stdout`` and/or directories (none: stdout).
- A directory target is a logger writing ``<dir>/<hostname>_<rank>.log`` (the TokenizerManager has no
  torch.distributed group, so the rank is 0) through an hourly ``TimedRotatingFileHandler`` with
  ``backupCount=0``; each line is ``[YYYY-mm-dd HH:MM:SS] <message>``.
- JSON events: ``{"timestamp": <local isoformat>, "event": "request.received", "rid", "obj"}`` when the
  TokenizerManager receives a request, ``{"timestamp", "event": "request.finished", "rid", "obj", "out"}``
  when it finishes (``out.meta_info`` has ``prompt_tokens``, ``completion_tokens``, ``cached_tokens``,
  ``e2e_latency``), and for OpenAI routes, *only at level 2 or more*, ``{"timestamp", "event":
  "request.received.openai", "obj": <the raw OpenAI payload>}`` before conversion.
- Levels 0 and 1 drop ``text``, ``input_ids``, ``input_embeds``, ``image_data``, ``audio_data``,
  ``video_data`` and ``lora_path`` from ``obj`` (level 0 also ``sampling_params``) and ``text``,
  ``output_ids``, ``embedding`` from ``out``: no prompt or output text reaches the log. At level 2 or 3 it
  does, raw, including the OpenAI payload (messages, prompt): the file then holds user text on the node's
  disk, which is why sgl-seat asks for level 1 unless the seat spec opts into ``bundles.raw_prompts``.
- ``SGLANG_LOG_REQUEST_EXCEEDED_MS`` (> 0) logs only finished requests slower than that.

``obj`` is SGLang's ``GenerateReqInput`` as a dict; the sim fills the fields it has (a subset of the ~60,
with the same names and the values SGLang would hold for these requests). The OpenAI payload is the body as
sent, without ``None`` values (SGLang logs its pydantic model, which adds the model's defaults).
"""

from __future__ import annotations

import json
import logging
import os
import socket
import sys
from collections.abc import Mapping, Sequence
from datetime import datetime
from logging.handlers import TimedRotatingFileHandler
from typing import Any

EVENT_RECEIVED = "request.received"
EVENT_RECEIVED_OPENAI = "request.received.openai"
EVENT_FINISHED = "request.finished"
LEVELS = (0, 1, 2, 3)
FORMATS = ("text", "json")
LOGGER_PREFIX = "sglang.srt.utils.request_logger"
LINE_FORMAT = "[%(asctime)s] %(message)s"
LINE_DATEFMT = "%Y-%m-%d %H:%M:%S"
ENV_EXCEEDED_MS = "SGLANG_LOG_REQUEST_EXCEEDED_MS"

_SKIP_IN = frozenset({"text", "input_ids", "input_embeds", "image_data", "audio_data", "video_data", "lora_path"})
_SKIP_OUT = frozenset({"text", "output_ids", "embedding"})


def metadata(level: int) -> tuple[int, frozenset[str], frozenset[str]]:
    """(max_length, skip names of obj, skip names of out) for a level, as ``RequestLogger._compute_metadata``."""
    if level == 0:
        return 1 << 30, _SKIP_IN | {"sampling_params"}, _SKIP_OUT
    if level == 1:
        return 1 << 30, _SKIP_IN, _SKIP_OUT
    if level == 2:
        return 2048, frozenset(), frozenset()
    if level == 3:
        return 1 << 30, frozenset(), frozenset()
    raise ValueError(f"Invalid --log-requests-level: {level}")


def transform(data: Any, max_length: int = 2048, skip: frozenset[str] = frozenset()) -> Any:
    """``_transform_data_for_logging``: long strings and lists keep their two ends around ``"..."``."""
    if isinstance(data, str):
        if len(data) > max_length:
            half = max_length // 2
            return data[:half] + "..." + data[-half:]
        return data
    if isinstance(data, (list, tuple)):
        if len(data) > max_length:
            half = max_length // 2
            return [transform(v, max_length) for v in data[:half]] + ["..."] + [
                transform(v, max_length) for v in data[-half:]]
        return [transform(v, max_length) for v in data]
    if isinstance(data, Mapping):
        return {k: transform(v, max_length) for k, v in data.items() if k not in skip}
    if data is None or isinstance(data, (bool, int, float)):
        return data
    return str(data)


def _truncated_str(data: Any, max_length: int, skip: frozenset[str] = frozenset()) -> str:
    """``_dataclass_to_string_truncated`` for the text format."""
    if isinstance(data, str):
        if len(data) > max_length:
            half = max_length // 2
            return f"{data[:half]!r} ... {data[-half:]!r}"
        return repr(data)
    if isinstance(data, (list, tuple)):
        if len(data) > max_length:
            half = max_length // 2
            return f"{list(data[:half])} ... {list(data[-half:])}"
        return str(list(data))
    if isinstance(data, Mapping):
        return "{" + ", ".join(f"'{k}': {_truncated_str(v, max_length)}" for k, v in data.items()
                               if k not in skip) + "}"
    return str(data)


def _logger(name: str, handler: logging.Handler) -> logging.Logger:
    logger = logging.getLogger(name)
    logger.setLevel(logging.INFO)
    logger.propagate = False
    if not logger.handlers:
        handler.setFormatter(logging.Formatter(LINE_FORMAT, datefmt=LINE_DATEFMT))
        logger.addHandler(handler)
    else:
        handler.close()
    return logger


def log_file_name(rank: int = 0) -> str:
    """The file a directory target writes: ``<hostname>_<rank>.log``."""
    return f"{socket.gethostname()}_{rank}.log"


def create_targets(targets: Sequence[str] | None) -> list[logging.Logger]:
    """``create_log_targets``: stdout when none is given; a directory gets ``<hostname>_0.log``."""
    out: list[logging.Logger] = []
    for t in targets or ("stdout",):
        if t.lower() == "stdout":
            out.append(_logger(f"{LOGGER_PREFIX}.stdout", logging.StreamHandler(sys.stdout)))
            continue
        os.makedirs(t, exist_ok=True)
        name = log_file_name(0)
        handler = TimedRotatingFileHandler(os.path.join(t, name), when="H", backupCount=0, encoding="utf-8")
        out.append(_logger(f"{LOGGER_PREFIX}.file.{t}.{name.removesuffix('.log')}", handler))
    return out


class RequestLog:
    """The sim's ``RequestLogger``: the frontend calls :meth:`received` / :meth:`finished`, the OpenAI
    routes :meth:`received_openai`. Disabled (``enabled`` False): every call returns at once."""

    def __init__(self, *, enabled: bool, level: int = 2, fmt: str = "text", targets: Sequence[str] | None = None,
                 exceeded_ms: float | None = None) -> None:
        self.enabled = enabled
        self.level = level
        self.fmt = fmt
        self.max_length, self.skip_in, self.skip_out = metadata(level)
        self.targets = create_targets(targets) if enabled else []
        self.exceeded_ms = float(os.environ.get(ENV_EXCEEDED_MS) or 0) if exceeded_ms is None else exceeded_ms

    def _emit(self, msg: str) -> None:
        for t in self.targets:
            t.info(msg)

    def _json(self, event: str, data: dict[str, Any]) -> None:
        doc = {"timestamp": datetime.now().isoformat(), "event": event, **data}
        self._emit(json.dumps(doc, ensure_ascii=False))

    def received(self, obj: Mapping[str, Any]) -> None:
        if not self.enabled:
            return
        if self.fmt == "json":
            self._json(EVENT_RECEIVED, {"rid": obj.get("rid"), "obj": transform(obj, self.max_length, self.skip_in)})
        else:
            self._emit(f"Receive: obj=GenerateReqInput({self._fields(obj, self.skip_in)})")

    def received_openai(self, payload: Mapping[str, Any]) -> None:
        """The raw OpenAI payload; SGLang's OpenAI handler calls this only at level 2 or more."""
        if not self.enabled or self.level < 2:
            return
        body = {k: v for k, v in payload.items() if v is not None}
        if self.fmt == "json":
            self._json(EVENT_RECEIVED_OPENAI, {"obj": transform(body, self.max_length)})
        else:
            self._emit(f"Receive OpenAI: obj={_truncated_str(body, self.max_length)}")

    def finished(self, obj: Mapping[str, Any], out: Mapping[str, Any]) -> None:
        if not self.enabled:
            return
        e2e_ms = float((out.get("meta_info") or {}).get("e2e_latency", 0) or 0) * 1000
        if self.exceeded_ms > 0 and e2e_ms < self.exceeded_ms:
            return
        if self.fmt == "json":
            self._json(EVENT_FINISHED, {"rid": obj.get("rid"), "obj": transform(obj, self.max_length, self.skip_in),
                                        "out": transform(out, self.max_length, self.skip_out)})
        else:
            self._emit(f"Finish: obj=GenerateReqInput({self._fields(obj, self.skip_in)}), "
                       f"out={_truncated_str(out, self.max_length, self.skip_out)}")

    def _fields(self, obj: Mapping[str, Any], skip: frozenset[str]) -> str:
        return ", ".join(f"{k}={_truncated_str(v, self.max_length)}" for k, v in obj.items() if k not in skip)

    def close(self) -> None:
        for t in self.targets:
            for h in list(t.handlers):
                if isinstance(h, logging.FileHandler):
                    h.close()


def generate_req_obj(*, rid: str, text: str | None, input_ids: Sequence[int] | None,
                     sampling_params: Mapping[str, Any], stream: bool, log_metrics: bool = True,
                     openai: bool = False) -> dict[str, Any]:
    """A ``GenerateReqInput`` as the TokenizerManager logs it (after normalisation, before tokenisation):
    ``text`` or ``input_ids`` as given, the caller's ``sampling_params``; OpenAI adapters set
    ``return_text_in_logprobs``."""
    return {
        "rid": rid,
        "session_id": None,
        "text": text,
        "input_ids": None if text is not None else list(input_ids or ()),
        "input_embeds": None,
        "image_data": None,
        "video_data": None,
        "audio_data": None,
        "sampling_params": dict(sampling_params),
        "return_logprob": False,
        "logprob_start_len": -1,
        "top_logprobs_num": 0,
        "token_ids_logprob": None,
        "return_text_in_logprobs": openai,
        "stream": stream,
        "log_metrics": log_metrics,
        "return_hidden_states": False,
        "modalities": None,
        "session_params": None,
        "lora_path": None,
        "lora_id": None,
        "custom_logit_processor": None,
        "bootstrap_host": None,
        "bootstrap_port": None,
        "bootstrap_room": None,
        "routed_dp_rank": None,
        "priority": None,
        "extra_key": None,
        "no_logs": False,
        "custom_labels": None,
    }
