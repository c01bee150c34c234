"""Probe targets: what to wrap (a module's function or a class's method) and which argument is the gather.

Target syntax (comma-separated in ``SGLSEAT_PROBE``)::

    module:function[@arg[:mode]]        e.g. sgl_seat.sim.rowfetch:fetch_rows@ids
    module:Class.method[@arg[:mode]]    e.g. sglang.srt.layers.engram:EngramEmbedding.forward@indices:numel
    module.function[@arg[:mode]]        (dotted: the module is everything before the last dot)

``arg`` is a parameter name or a 0-based position (``self`` counts); ``mode`` is ``len`` (default),
``numel`` (``obj.numel()``), ``dim0`` (``obj.shape[0]``) or ``none``; or ``graph``: the target replays a captured
CUDA graph and ``arg`` is its shape key (``FullCudaGraphBackend.replay@shape_key:graph``, see :mod:`.graph`);
or ``link``: the target is a graph backend's constructor and ``arg`` names its runner
(``FullCudaGraphBackend.__init__@cuda_graph_runner:link``, see :func:`.graph.make_runner_link`).
Without ``@``, the first parameter named ``ids``, ``indices``, ``hash_ids`` or ``input_ids`` is measured with ``len``.

Why ``link``: a graph replay's token count needs the backend's runner (``self._cuda_graph_runner``, whose
``captured_req_width`` is the draft's tokens per request in a verify graph). SGLang 0.5.23's backends keep it;
0.5.17's (``FullCudaGraphBackend``, ``BreakableCudaGraphBackend``) take it in ``__init__`` and drop it, so every
replay would count requests, not tokens. A link target sets ``self._cuda_graph_runner`` to that argument after the
constructor returns, only where the instance has none: on 0.5.23 it changes nothing. It writes no ring slot, is
never timed nor put behind the rehearsal gate, and never raises into the engine.

Why a module of its own: parsing a target and finding its sized parameter are pure (no ring, no import of the
target), shared by the writer (which sizes each call) and the installer (which finds the target).
"""

from __future__ import annotations

import inspect
import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

_SIZE_PARAMS = ("ids", "indices", "hash_ids", "input_ids")
_MODES = ("len", "numel", "dim0", "none")
#: The mode of a graph-replay target (its wrapper is :func:`.graph.make_graph_wrapper`, not the writer's).
GRAPH_MODE = "graph"
#: The mode of a backend constructor whose named argument becomes ``self._cuda_graph_runner`` where it is missing
#: (its wrapper is :func:`.graph.make_runner_link`: no ring slot, no timing, no rehearsal gate).
LINK_MODE = "link"
#: The mode of a heartbeat target (its wrapper is :func:`.beat.make_beat_wrapper`): a call inside each step of work
#: (a decoder layer) whose start is written as an instant record, at most one per :data:`.beat.BEAT_EVERY_S`;
#: not timed, no gather size, no rehearsal gate. Its records carry the name ``module:qualname@beat``.
BEAT_MODE = "beat"
#: What a heartbeat target's name ends with in the ring's target table and in every record (the watchdog's core
#: tells beats from timed calls by it: ``sgl_seat.core.columns.BEAT_SUFFIX``, held equal by a unit test).
BEAT_SUFFIX = "@beat"


@dataclass(frozen=True)
class TargetSpec:
    """One parsed target: where it lives and how to size its gather."""

    raw: str
    module: str
    qualname: str
    size_arg: str | int | None
    mode: str

    @property
    def name(self) -> str:
        """What the ring's target table and the records carry: ``module:qualname`` (``...@beat`` for a heartbeat)."""
        return f"{self.module}:{self.qualname}" + (BEAT_SUFFIX if self.beat else "")

    @property
    def graph_replay(self) -> bool:
        """The target replays a captured CUDA graph (mode ``graph``)."""
        return self.mode == GRAPH_MODE

    @property
    def beat(self) -> bool:
        """The target is a heartbeat (mode ``beat``): its calls say the process goes round, nothing is timed."""
        return self.mode == BEAT_MODE

    @property
    def runner_link(self) -> bool:
        """The target is a graph backend's constructor whose argument ``size_arg`` is linked as its runner."""
        return self.mode == LINK_MODE


def parse_target(raw: str) -> TargetSpec:
    """Parse one target; ValueError with the reason when it is malformed."""
    text = raw.strip()
    path, at, size = text.partition("@")
    if ":" in path:
        module, _, qual = path.partition(":")
    else:
        module, _, qual = path.rpartition(".")
    ident = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$")
    if not module or not qual or not ident.match(module) or not ident.match(qual):
        raise ValueError(f"probe target {raw!r}: expected module:function or module.function")
    size_arg: str | int | None = None
    mode = "len"
    if size:
        arg, _, m = size.partition(":")
        if m:
            if m not in (*_MODES, GRAPH_MODE, LINK_MODE, BEAT_MODE):
                raise ValueError(f"probe target {raw!r}: size mode {m!r} is not one of "
                                 f"{(*_MODES, GRAPH_MODE, LINK_MODE, BEAT_MODE)}")
            mode = m
        if arg.isdigit():
            size_arg = int(arg)
        elif re.match(r"^[A-Za-z_][A-Za-z0-9_]*$", arg):
            size_arg = arg
        elif arg:
            raise ValueError(f"probe target {raw!r}: {arg!r} is neither a parameter name nor a position")
    elif at:
        mode = "none"  # "target@": time it, no gather size
    if mode == BEAT_MODE and size_arg is not None:
        raise ValueError(f"probe target {raw!r}: a heartbeat has no gather size (write it module:qualname@:beat)")
    if mode == LINK_MODE and size_arg is None:
        raise ValueError(f"probe target {raw!r}: a link names the runner's parameter (@cuda_graph_runner:link)")
    return TargetSpec(raw=text, module=module, qualname=qual, size_arg=size_arg, mode=mode)


def parse_targets(value: str) -> list[TargetSpec]:
    return [parse_target(p) for p in value.split(",") if p.strip()]


def _size_position(fn: Callable[..., Any], spec: TargetSpec) -> tuple[int, str | None]:
    """(position, keyword name) of the sized argument; (-1, None) when there is none."""
    try:
        params = list(inspect.signature(fn).parameters.values())
    except (TypeError, ValueError):
        params = []
    names = [p.name for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD)]
    if spec.mode == "none":
        return -1, None
    if isinstance(spec.size_arg, int):
        return spec.size_arg, names[spec.size_arg] if spec.size_arg < len(names) else None
    if isinstance(spec.size_arg, str):
        pos = names.index(spec.size_arg) if spec.size_arg in names else 1 << 30
        return pos, spec.size_arg
    for cand in _SIZE_PARAMS:
        if cand in names:
            return names.index(cand), cand
    kw_only = [p.name for p in params if p.kind == p.KEYWORD_ONLY]
    for cand in _SIZE_PARAMS:
        if cand in kw_only:
            return 1 << 30, cand
    return -1, None

