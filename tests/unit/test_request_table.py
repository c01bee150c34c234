"""Request shapes as columns (issue 15.4): ``requests.jsonl`` loads into a RequestTable that gives the records, and
the errors, that decoding each line with ``RequestShape.from_json`` gave; the report's request summary over the
columns is the one the per-record loop computed.

Why: replay built and checked 20,000 frozen records per one-hour bundle (~0.2 s of its 2 s budget) to read five
fields. The table checks lines field by field and falls back to ``from_json`` line by line at any doubt, so these
tests feed it the writer's own lines and lines that are each wrong (or unusual but valid) in one field.
"""

from __future__ import annotations

import io
import random
from typing import Any

import pytest

from sgl_seat.core.stats import percentile
from sgl_seat.errors import BundleError
from sgl_seat.forensics.format.codec import decode_records, dumps_line, encode_records
from sgl_seat.forensics.format.redact import RequestShape
from sgl_seat.forensics.format.request_table import RequestTable, decode_request_table
from sgl_seat.forensics.replay import analysis

T0 = 1_800_000_000.0


def _shapes(n: int, seed: int) -> list[RequestShape]:
    rng = random.Random(seed)
    return [RequestShape(t=T0 + i * rng.random(), route=rng.choice(("/v1/completions", "/generate")),
                         prompt_chars=rng.randrange(0, 5000), prompt_tokens=rng.randrange(1, 1200),
                         prompt_hash=f"{rng.getrandbits(128):032x}", prefix_group=rng.randrange(0, 30),
                         shared_prefix_chars=rng.randrange(0, 500), max_tokens=rng.choice((None, 16, 256)),
                         stream=rng.random() < 0.5, tokens_estimated=rng.random() < 0.5,
                         output_tokens=rng.choice((None, 7)),
                         finished=rng.choice((None, T0 + 5.0 * rng.random(), T0 + 50.0)),
                         prompt=rng.choice((None, "hello")), prefix_tokens=rng.choice((None, 0, 12)))
            for i in range(n)]


def _both(data: bytes) -> tuple[Any, Any]:
    """(the table's records or error text, the per-line decoder's records or error text)."""
    out = []
    for decode in (lambda f: list(decode_request_table(f, "requests.jsonl")),
                   lambda f: decode_records(f, RequestShape.from_json, "requests.jsonl")):
        try:
            out.append(decode(io.BytesIO(data)))
        except BundleError as exc:
            out.append(str(exc))
    return out[0], out[1]


def test_writer_lines_load_as_columns_with_the_same_records() -> None:
    shapes = _shapes(300, 1)
    table = decode_request_table(io.BytesIO(encode_records(shapes)), "requests.jsonl")
    assert table._cols is not None  # the column path, not the per-line fallback
    assert list(table) == shapes and table[-1] == shapes[-1] and table[1:3] == shapes[1:3]
    assert len(decode_request_table(io.BytesIO(b""), "requests.jsonl")) == 0


#: One line's change: a field removed (None), set, or its JSON text replaced; each either valid (from_json keeps it,
#: maybe differently from the writer's form) or refused.
VARIANTS: list[tuple[str, Any]] = [
    ("stream", None), ("tokens_estimated", None), ("sampling", {"temperature": 0.5}), ("sampling", []),
    ("sampling", None), ("sampling", {"x": [1]}), ("stream", 1), ("stream", "yes"), ("prompt_chars", True),
    ("prompt_chars", 3.0), ("prompt_chars", -1), ("prefix_group", None), ("prefix_tokens", -2),
    ("prefix_tokens", 2.0), ("max_tokens", 1.5), ("output_tokens", False), ("t", 7), ("t", True), ("t", "1"),
    ("finished", 5), ("finished", "x"), ("route", "v1"), ("route", "/" + "a" * 300), ("prompt_hash", "h" * 129),
    ("prompt_hash", None), ("prompt", 5), ("t", "drop"), ("stream", "drop"), ("extra_field", 1),
]


@pytest.mark.parametrize(("field", "value"), VARIANTS, ids=[f"{f}={v!r}"[:40] for f, v in VARIANTS])
def test_each_odd_line_reads_as_from_json_reads_it(field: str, value: Any) -> None:
    docs = [s.to_json() for s in _shapes(5, 2)]
    if value == "drop":
        del docs[3][field]
    else:
        docs[3][field] = value
    got, want = _both("".join(dumps_line(d) + "\n" for d in docs).encode())
    assert got == want


@pytest.mark.parametrize(("field", "text"), [("t", b"1e400"), ("t", b"1" + b"0" * 400), ("finished", b"1e400"),
                                           ("finished", b"1" + b"0" * 400)])
def test_numbers_beyond_a_float_fail_or_load_as_before(field: str, text: bytes) -> None:
    doc = _shapes(1, 3)[0].to_json() | {field: 12345.5}
    line = dumps_line(doc).encode().replace(b"12345.5", text) + b"\n"
    outcome = []
    for decode in (lambda f: list(decode_request_table(f, "r")),
                   lambda f: decode_records(f, RequestShape.from_json, "r")):
        try:
            outcome.append(decode(io.BytesIO(line)))
        except (BundleError, OverflowError) as exc:
            outcome.append((type(exc), str(exc)))
    assert outcome[0] == outcome[1]


def _ref_summary(reqs: list[RequestShape], trig: float) -> dict[str, Any]:
    """The report's request summary as the per-record loop computed it (the last commit before the table)."""
    before = [r for r in reqs if r.t <= trig + 1e-9]
    open_at = [r for r in before if r.finished is None or r.finished > trig]
    toks = sorted(r.prompt_tokens for r in before)
    return {"recorded": len(reqs), "before_trigger": len(before), "open_at_trigger": len(open_at),
            "prompt_tokens_p50": int(percentile(toks, 50)) if toks else None,
            "prompt_tokens_max": toks[-1] if toks else None, "prefix_groups": len({r.prefix_group for r in before}),
            "redacted": all(r.prompt is None for r in before)}


def test_request_summary_over_columns_is_the_record_summary() -> None:
    for seed in range(40):
        shapes = _shapes(random.Random(seed).randrange(0, 60), seed)
        trig = T0 + random.Random(seed + 100).choice((-1.0, 3.0, 20.0, 100.0))
        decoded = decode_request_table(io.BytesIO(encode_records(shapes)), "requests.jsonl")
        for table in (decoded, RequestTable.of(shapes)):
            assert analysis._requests_before(table, trig) == _ref_summary(shapes, trig), f"seed {seed}"
