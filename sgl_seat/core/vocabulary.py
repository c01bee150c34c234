"""An engine's own words for what the watchdog, replay and the gate read: :class:`EngineWords`.

Every engine names its processes and metrics its own way (SGLang's ``sglang::scheduler_TP1`` and
``sglang:num_running_reqs``). The detectors and reports ask by meaning (the process that runs a rank, the running
requests), and the engine's backend (``sgl_seat.engines``) answers with its words: each backend has one
``EngineWords``, the live sidecar and a capture put it on the :class:`~sgl_seat.core.observation.Observation`, replay
takes the bundle's engine's. So no module outside ``engines/`` spells an engine's title or metric.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

#: ``..._TP3`` / ``..._TP3_EP3``: the rank a rank process's title names, whichever engine.
_TITLE_RANK = re.compile(r"_TP(\d+)(?:_|$)")


@dataclass(frozen=True, slots=True)
class EngineWords:
    """One engine's names. Metric names are the ``/metrics`` sample names; ``""`` (or ``()``) where the engine has
    none, so what reads it finds nothing rather than another engine's figure."""

    #: The engine backend's name (``sglang``, ``sim``, ``vllm``).
    engine: str = ""
    #: Prefix of every title the engine gives its helper processes (``sglang::``); the main process has none.
    title_prefix: str = ""
    #: Prefix of the title of a process that runs one rank (``sglang::scheduler``): the watchdog's subjects.
    rank_title: str = ""
    #: Titles of the engine's other known processes, by the kind the watchdog shows (``detokenizer``).
    helper_titles: tuple[tuple[str, str], ...] = ()
    #: Prefix every metric of the engine's has (``sglang:``): what a sidecar keeps of ``/metrics``.
    metric_prefix: str = ""
    #: Gauge: requests running now.
    running: str = ""
    #: Gauge: requests waiting in the engine's queue.
    queued: str = ""
    #: Gauge: share of the KV pool in use (0..1).
    kv_usage: str = ""
    #: Counter: output tokens generated.
    generated: str = ""
    #: Gauge: the engine's own output tokens per second, where it reports one.
    gen_throughput: str = ""
    #: Gauge: mean accepted tokens per verify step, where the engine reports one.
    accept_length: str = ""
    #: Counters (and slowly moving gauges) whose change means the engine made progress.
    progress: tuple[str, ...] = ()
    #: Counter: prompt tokens.
    prompt_tokens: str = ""
    #: Counter: prompt tokens served from the prefix cache.
    cached_tokens: str = ""
    #: Counter: the draft's verify steps (generated / verify steps = accepted tokens per step).
    verify_steps: str = ""
    #: Counter: requests finished.
    requests: str = ""
    #: A metric whose non-zero value says every figure on the page is synthetic (a stand-in engine's).
    synthetic_marker: str = ""
    #: What the engine's own hang watchdog logs when it fires (SGLang's ``--watchdog-timeout``); "" where none is known.
    hang_log_line: str = ""
    #: An info gauge and its label that hold the engine's KV pool in tokens, for an engine without SGLang's
    #: ``/server_info`` (vLLM's ``cache_config_info{kv_cache_size_tokens=...}``).
    pool_info: tuple[str, str] = ("", "")

    def is_rank_process(self, title: str) -> bool:
        """Whether ``title`` is the title of a process that runs a rank."""
        return bool(self.rank_title) and title.startswith(self.rank_title)

    def is_engine_title(self, title: str) -> bool:
        """Whether ``title`` is one the engine gives its helper processes (a rank's or another)."""
        return bool(self.title_prefix) and title.startswith(self.title_prefix)

    def rank_of_title(self, title: str) -> int | None:
        """``..._TP3_EP3`` -> 3; a rank process without TP in its title (one rank) is rank 0; else None."""
        m = _TITLE_RANK.search(title)
        if m and self.is_engine_title(title):
            return int(m.group(1))
        return 0 if self.is_rank_process(title) else None

    def kind_of_title(self, title: str) -> str:
        """``scheduler`` (a rank's process), a helper's kind, ``other`` (another of the engine's titles), ``main``."""
        if self.is_rank_process(title):
            return "scheduler"
        for prefix, kind in self.helper_titles:
            if title.startswith(prefix):
                return kind
        return "other" if self.is_engine_title(title) else "main"

    def helper_title(self, kind: str) -> str | None:
        """The title of the engine's helper process of ``kind`` (``detokenizer``), if it has one."""
        return next((prefix for prefix, k in self.helper_titles if k == kind), None)

    def short_title(self, title: str) -> str:
        """``title`` without the engine's title prefix (``scheduler_TP1``)."""
        return title.removeprefix(self.title_prefix) if self.title_prefix else title


#: No engine's words: what an :class:`~sgl_seat.core.observation.Observation` built without them reads by (nothing).
NO_WORDS = EngineWords()
