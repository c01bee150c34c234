"""Recorded request shapes as columns: what ``replay`` loads from a bundle's ``requests.jsonl``.

Why columns: a one-hour bundle records ~20,000 request shapes. Checking each line with
:meth:`RequestShape.from_json` and building a frozen 15-field record per line cost ~0.2 s of replay's 2 s budget
(issue 15), and the analysis reads five fields of them. So :func:`decode_request_table` checks the lines field
by field (one pass in C per field over every line) and keeps the columns; a :class:`RequestShape` is built only
when one is asked for (re-driving traffic). Where the field checks do not accept every line as plainly
well-typed, the whole file goes through ``from_json`` line by line instead, which gives the records, or the
error, that reading gave before; the columns are then taken from those records.

A :class:`RequestTable` is a ``Sequence[RequestShape]``, so code that reads records keeps working.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from typing import IO, Any

import numpy as np
import numpy.typing as npt

from sgl_seat.core.columns import F64, Mask, RowsOnDemand
from sgl_seat.forensics.format.codec import iter_json_lines, records_from_parsed
from sgl_seat.forensics.format.redact import RequestShape

__all__ = ["RequestTable", "decode_request_table"]

#: RequestShape's fields, in its constructor's order.
_FIELDS = ("t", "route", "prompt_chars", "prompt_tokens", "prompt_hash", "prefix_group", "shared_prefix_chars",
           "max_tokens", "sampling", "stream", "tokens_estimated", "output_tokens", "finished", "prompt",
           "prefix_tokens")
_INT, _NUM, _STR, _BOOL = frozenset({int}), frozenset({int, float}), frozenset({str}), frozenset({bool})
_NONE = type(None)


def _ints(v: Sequence[int]) -> npt.NDArray[Any]:
    """int64 where every value fits (always, but for a hostile file), else Python ints in an object array."""
    try:
        return np.array(v, dtype=np.int64)
    except OverflowError:
        return np.array(v, dtype=object)


class RequestTable(RowsOnDemand[RequestShape]):
    """Request shapes as columns: ``t`` and ``finished`` (NaN where None) as floats, ``prompt_tokens`` and
    ``prefix_group`` as integers, ``has_prompt`` where the raw text was kept; records on demand."""

    __slots__ = ("_cols", "_records", "finished", "has_prompt", "prefix_group", "prompt_tokens", "t")

    def __init__(self, cols: dict[str, list[Any]] | None = None, *,
                 records: Sequence[RequestShape] | None = None) -> None:
        """``cols``: every field's values, already checked to be what ``from_json`` returns for them (the
        decoder's fast path); or ``records``. Neither: an empty table."""
        self._records = list(records) if records is not None else None
        if self._records is not None:
            cols = {f: [getattr(r, f) for r in self._records] for f in ("t", "prompt_tokens", "prefix_group",
                                                                        "finished", "prompt")}
        self._cols = cols if records is None else None
        c = cols or {f: [] for f in _FIELDS}
        self.t: F64 = np.array(c["t"], dtype=np.float64)
        self.finished: F64 = np.array(c["finished"], dtype=np.float64)  # None -> NaN
        self.prompt_tokens = _ints(c["prompt_tokens"])
        self.prefix_group = _ints(c["prefix_group"])
        self.has_prompt: Mask = np.array([p is not None for p in c["prompt"]], dtype=np.bool_)

    @classmethod
    def of(cls, requests: Iterable[RequestShape]) -> RequestTable:
        """``requests`` as a table (itself where it already is one)."""
        return requests if isinstance(requests, RequestTable) else cls(records=list(requests))

    def record(self, i: int) -> RequestShape:
        if self._records is not None:
            return self._records[i]
        assert self._cols is not None
        c = self._cols
        fin = c["finished"][i]
        return RequestShape(
            t=float(c["t"][i]), route=c["route"][i], prompt_chars=c["prompt_chars"][i],
            prompt_tokens=c["prompt_tokens"][i], prompt_hash=c["prompt_hash"][i], prefix_group=c["prefix_group"][i],
            shared_prefix_chars=c["shared_prefix_chars"][i], max_tokens=c["max_tokens"][i], sampling={},
            stream=c["stream"][i], tokens_estimated=c["tokens_estimated"][i], output_tokens=c["output_tokens"][i],
            finished=None if fin is None else float(fin), prompt=c["prompt"][i], prefix_tokens=c["prefix_tokens"][i])

    def __len__(self) -> int:
        return len(self.t)

    def __repr__(self) -> str:
        return f"RequestTable({len(self)} requests)"


def _plain_columns(docs: list[Any]) -> dict[str, list[Any]] | None:
    """Every field's column where each line is a plainly well-typed RequestShape (the writer's own output):
    exactly the values ``from_json`` keeps, so the records built from them equal its records. None at the first
    doubt (the caller then lets ``from_json`` judge each line)."""
    if not docs or set(map(type, docs)) != {dict}:
        return None
    cols = {f: [d.get(f) for d in docs] for f in _FIELDS}
    types = {f: set(map(type, v)) for f, v in cols.items()}
    if not (types["route"] <= _STR and types["prompt_hash"] <= _STR and types["prompt"] <= {str, _NONE}):
        return None
    if not all(r.startswith("/") and len(r) <= 256 for r in set(cols["route"])):
        return None
    if max(map(len, cols["prompt_hash"])) > 128:
        return None
    for f in ("prompt_chars", "prompt_tokens", "prefix_group", "shared_prefix_chars"):
        if not types[f] <= _INT or min(cols[f]) < 0:
            return None
    for f in ("max_tokens", "output_tokens", "prefix_tokens"):
        if not types[f] <= {int, _NONE}:
            return None
    if min((x for x in cols["prefix_tokens"] if x is not None), default=0) < 0:
        return None
    # sampling: from_json keeps ``d.get("sampling") or {}`` (checked); only the empty case is plain here.
    if not types["sampling"] <= {dict, _NONE} or any(cols["sampling"]):
        return None
    if not types["stream"] <= _BOOL | {_NONE} or not types["tokens_estimated"] <= _BOOL | {_NONE}:
        return None
    # A missing flag reads as False (``d.get(flag, False)``); a null one is refused by from_json.
    for f in ("stream", "tokens_estimated"):
        if _NONE in types[f]:
            if any(f in d and d[f] is None for d in docs):
                return None
            cols[f] = [x is True for x in cols[f]]
    if not types["t"] <= _NUM or not types["finished"] <= _NUM | {_NONE}:
        return None
    try:  # an int beyond a float's range: from_json's float() raises (and reading fails as it did before)
        if not all(map(math.isfinite, cols["t"])) or not all(map(math.isfinite, (
                x for x in cols["finished"] if type(x) is int))):
            return None
    except OverflowError:
        return None
    return cols


def decode_request_table(stream: IO[bytes], name: str) -> RequestTable:
    """``requests.jsonl`` as a :class:`RequestTable`: checked by columns where every line is plain, else line by line
    through ``RequestShape.from_json`` (same records, same errors naming the line)."""
    parsed = list(iter_json_lines(stream, name, fast=True))
    cols = _plain_columns([obj for _, obj in parsed])
    if cols is not None:
        return RequestTable(cols)
    return RequestTable(records=records_from_parsed(parsed, RequestShape.from_json, name))
