"""Request shapes in live bundles: SGLang's request log (the sim's copy of it), the follower, the redacting
recorder, and the capture that writes ``requests.jsonl``.

GIVEN SGLang's JSON request log (``--log-requests --log-requests-format json --log-requests-target DIR``)
WHEN node 0's sidecar follows it THEN a bundle carries the request shapes (arrival, tokens, cache hits,
max_tokens, sampling, finish) redacted by default, with raw text only when the seat opted in.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import re
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from sgl_seat.engines import words_for
from sgl_seat.engines.sglang import REQUEST_LOG_LEVEL, REQUEST_LOG_LEVEL_RAW
from sgl_seat.forensics import read_bundle
from sgl_seat.forensics.format import layout
from sgl_seat.forensics.recording.recorder import RequestRecorder
from sgl_seat.forensics.recording.requestlog import MAX_LINE_BYTES, RequestLogFollower, parse_line
from sgl_seat.plan import Placeholder, build_plan
from sgl_seat.sim.front import reqlog
from sgl_seat.spec import WatchdogSpec, load_spec
from sgl_seat.watchdog.capture import assemble

WORDS = words_for("sglang")

FIN_META = {"id": "r", "finish_reason": {"type": "length", "length": 4}, "prompt_tokens": 12,
            "weight_version": "default", "completion_tokens": 4, "cached_tokens": 0, "e2e_latency": 0.25}


@pytest.fixture(autouse=True)
def _fresh_loggers() -> Any:
    """The request log's loggers are process-wide by name (as SGLang's): close and drop them after each test."""
    yield
    for name in list(logging.root.manager.loggerDict):
        if name.startswith(reqlog.LOGGER_PREFIX):
            lg = logging.getLogger(name)
            for h in list(lg.handlers):
                h.close()
                lg.removeHandler(h)


def _obj(rid: str, *, text: str | None = None, ids: list[int] | None = None, openai: bool = False,
         sp: dict[str, Any] | None = None, stream: bool = False) -> dict[str, Any]:
    return reqlog.generate_req_obj(rid=rid, text=text, input_ids=ids, openai=openai, stream=stream,
                                   sampling_params=sp if sp is not None else {"max_new_tokens": 4})


def _lines(directory: Path) -> list[dict[str, Any]]:
    (f,) = list(directory.glob("*.log"))
    out = []
    for ln in f.read_text().splitlines():
        doc = parse_line(ln)
        assert doc is not None, ln
        out.append(doc)
    return out


# ---- the sim's request log is SGLang's ------------------------------------------------------------


def _sglang_logger() -> Any:
    import importlib

    try:
        mod = importlib.import_module("sglang.srt.utils.request_logger")
    except Exception as exc:  # the parser install (scripts/install-sglang-parser.sh) brings it; CI may not
        pytest.skip(f"sglang's request_logger is not importable here ({type(exc).__name__}: {exc})")
    return mod.RequestLogger


@pytest.mark.parametrize("level", [1, 3])
def test_sim_lines_equal_sglangs_own_logger(level: int, tmp_path: Path) -> None:
    """The same GenerateReqInput and output through SGLang 0.5.23's RequestLogger and the sim's RequestLog give
    the same events, file name and line shape (timestamps aside)."""
    request_logger = _sglang_logger()
    obj = _obj("abc", text="a secret prompt", sp={"max_new_tokens": 4, "temperature": 0.3})
    out = {"text": "xyz", "output_ids": [1, 2, 3, 4], "meta_info": dict(FIN_META, id="abc")}
    payload = {"model": "m", "prompt": "a secret prompt", "max_tokens": 4}
    req_cls = dataclasses.make_dataclass("GenerateReqInput", list(obj))  # SGLang's logger walks dataclass fields
    theirs, ours = tmp_path / "sglang", tmp_path / "sim"
    real = request_logger(True, level, "json", [str(theirs)])
    if level >= 2:  # SGLang's OpenAI handler gates this call on the level itself (serving_base.py)
        real.log_openai_received_request(payload)
    real.log_received_request(req_cls(**obj))
    real.log_finished_request(req_cls(**obj), out)
    sim = reqlog.RequestLog(enabled=True, level=level, fmt="json", targets=[str(ours)])
    sim.received_openai(payload)
    sim.received(obj)
    sim.finished(obj, out)
    assert [p.name for p in theirs.iterdir()] == [p.name for p in ours.iterdir()] == [f"{socket.gethostname()}_0.log"]
    a, b = _lines(theirs), _lines(ours)
    for x in (*a, *b):
        x.pop("timestamp")
    assert a == b
    raw = (ours / reqlog.log_file_name()).read_text()
    assert all(re.match(r"^\[\d{4}-\d\d-\d\d \d\d:\d\d:\d\d\] \{", ln) for ln in raw.splitlines())
    assert ("a secret prompt" in raw) == (level >= 2)


def test_level_1_logs_no_text_and_no_openai_payload(tmp_path: Path) -> None:
    log = reqlog.RequestLog(enabled=True, level=1, fmt="json", targets=[str(tmp_path)])
    log.received_openai({"model": "m", "messages": [{"role": "user", "content": "top secret"}]})
    obj = _obj("r1", ids=[5, 6, 7], openai=True)
    log.received(obj)
    log.finished(obj, {"text": "top secret reply", "output_ids": [1], "meta_info": FIN_META})
    docs = _lines(tmp_path)
    assert [d["event"] for d in docs] == [reqlog.EVENT_RECEIVED, reqlog.EVENT_FINISHED]
    assert "top secret" not in (tmp_path / reqlog.log_file_name()).read_text()
    assert "input_ids" not in docs[0]["obj"] and docs[0]["obj"]["sampling_params"] == {"max_new_tokens": 4}
    assert set(docs[1]["out"]) == {"meta_info"}


def test_level_2_cuts_long_strings_like_sglang() -> None:
    s = "x" * 5000
    cut = reqlog.transform(s, 2048)
    assert cut == "x" * 1024 + "..." + "x" * 1024
    assert reqlog.transform(list(range(3000)), 2048)[1024] == "..."
    with pytest.raises(ValueError):
        reqlog.metadata(4)


def test_plan_asks_node0_for_the_request_log_at_level_1_and_3_with_raw_prompts() -> None:
    spec = load_spec("local-sim")
    plan = build_plan(spec)
    cmd0, cmd1 = plan.nodes[0].command, plan.nodes[1].command
    i = cmd0.index("--log-requests")
    assert list(cmd0[i:]) == ["--log-requests", "--log-requests-level", str(REQUEST_LOG_LEVEL), "--log-requests-format",
                              "json", "--log-requests-target", Placeholder.REQUEST_LOG_DIR.value]
    assert "--log-requests" not in cmd1
    raw = build_plan(spec.model_copy(update={"bundles": spec.bundles.model_copy(update={"raw_prompts": True})}))
    assert raw.nodes[0].command[raw.nodes[0].command.index("--log-requests-level") + 1] == str(REQUEST_LOG_LEVEL_RAW)
    off = build_plan(spec.model_copy(update={"watchdog": WatchdogSpec(enabled=False)}))
    assert "--log-requests" not in off.nodes[0].command


def test_plan_flags_parse_with_sglangs_parser() -> None:
    from tests.contract.sglang_parser import parse_with_sglang_full, sglang_available

    if not sglang_available():
        pytest.skip("sglang's parser is not installed (scripts/install-sglang-parser.sh)")
    node = build_plan(load_spec("local-sim")).fill({Placeholder.NODE0_ADDR: "127.0.0.1",
                                                    Placeholder.REQUEST_LOG_DIR: "/h/logs/s/requests"}).nodes[0]
    f = parse_with_sglang_full(list(node.command[3:])).fields
    assert f["log_requests"] is True and f["log_requests_level"] == 1
    assert f["log_requests_format"] == "json" and list(f["log_requests_target"]) == ["/h/logs/s/requests"]  # type: ignore[call-overload]


# ---- the recorder ---------------------------------------------------------------------------------


def _ev(event: str, t: float, **kw: Any) -> dict[str, Any]:
    from datetime import datetime

    return {"timestamp": datetime.fromtimestamp(t).isoformat(), "event": event, **kw}


def _finished(rid: str, t: float, obj: dict[str, Any], **meta: Any) -> dict[str, Any]:
    return _ev(reqlog.EVENT_FINISHED, t, rid=rid, obj=obj, out={"meta_info": {**FIN_META, "id": rid, **meta}})


def test_level_1_events_become_redacted_shapes_with_the_engines_counts() -> None:
    rec = RequestRecorder(history_s=1e9)
    t0 = 1_800_000_000.0
    sp = {"max_new_tokens": 32, "temperature": 0.7, "sampling_seed": 11, "stop": None, "json_schema": "{...}"}
    a, b, c = _obj("a", sp=sp), _obj("b", sp=sp, openai=True, stream=True), _obj("c", sp=sp)
    health = _obj("HEALTH_CHECK_1")
    for doc in (
        _ev(reqlog.EVENT_RECEIVED, t0, rid="HEALTH_CHECK_1", obj=health),
        _ev(reqlog.EVENT_RECEIVED, t0 + 0.1, rid="a", obj=a),
        _ev(reqlog.EVENT_RECEIVED, t0 + 0.2, rid="b", obj=b),
        _finished("a", t0 + 1.0, a, prompt_tokens=100, completion_tokens=32, cached_tokens=0),
        _finished("b", t0 + 1.5, b, prompt_tokens=120, completion_tokens=30, cached_tokens=64),
        _ev(reqlog.EVENT_RECEIVED, t0 + 2.0, rid="c", obj=c),  # still running at the capture
    ):
        rec.ingest(doc)
    sa, sb, sc = rec.snapshot(now=t0 + 3)
    assert [s.route for s in (sa, sb, sc)] == ["/generate", "/v1/completions", "/generate"]
    assert sa.t == pytest.approx(t0 + 0.1, abs=1e-3) and sa.finished == pytest.approx(t0 + 1.0, abs=1e-3)
    assert (sa.prompt_tokens, sa.output_tokens, sa.max_tokens, sa.tokens_estimated) == (100, 32, 32, False)
    assert sa.sampling == {"temperature": 0.7, "seed": 11} and sb.stream and not sa.stream
    assert (sb.prefix_tokens, sb.shared_prefix_tokens) == (64, 64) and sa.shared_prefix_tokens == 0
    assert sb.prefix_group != sa.prefix_group
    assert sc.finished is None and sc.tokens_estimated and sc.prompt_tokens == 110  # median of the known ones
    for s in (sa, sb, sc):
        assert s.prompt is None and s.prompt_hash == "" and s.prompt_chars == 0
    assert rec.redaction["prompts"] == "redacted"


def test_cache_hits_share_one_prefix_group_so_a_replay_recreates_them() -> None:
    from sgl_seat.forensics.recording.traffic import synth_prompt

    rec = RequestRecorder(history_s=1e9)
    t0 = 1_800_000_000.0
    for i, cached in enumerate((0, 48, 0, 80, 48)):
        o = _obj(f"r{i}")
        rec.ingest(_ev(reqlog.EVENT_RECEIVED, t0 + i, rid=f"r{i}", obj=o))
        rec.ingest(_finished(f"r{i}", t0 + i + 0.5, o, prompt_tokens=100, cached_tokens=cached))
    shapes = rec.snapshot(now=t0 + 10)
    hit = [s for s in shapes if s.prefix_tokens]
    assert len({s.prefix_group for s in hit}) == 1 and len({s.prefix_group for s in shapes}) == 3
    p = [synth_prompt(s, i).split() for i, s in enumerate(shapes)]
    assert p[1][:48] == p[3][:48] == p[4][:48] and p[3][:80] != p[0][:80]


def test_raw_prompts_keep_text_and_match_the_openai_payload(tmp_path: Path) -> None:
    """Level 3 (bundles.raw_prompts): text kept; a chat request's text comes from its OpenAI payload."""
    log = reqlog.RequestLog(enabled=True, level=3, fmt="json", targets=[str(tmp_path)])
    system = "You are a careful assistant. " * 8
    log.received_openai({"model": "m", "messages": [{"role": "user", "content": system + "first"}],
                         "max_tokens": 9})
    chat = _obj("c1", ids=list(range(70)), openai=True, sp={"max_new_tokens": 9})
    log.received(chat)
    log.received({**_obj("g1", text=system + "second"), "rid": "g1"})
    raw = RequestRecorder(raw_prompts=True, history_s=1e9)
    red = RequestRecorder(raw_prompts=False, history_s=1e9)
    for doc in _lines(tmp_path):
        raw.ingest(doc)
        red.ingest(doc)
    c, g = raw.snapshot(now=time.time())
    assert c.route == "/v1/chat/completions" and c.prompt == "user: " + system + "first" and c.prompt_tokens == 70
    assert g.route == "/generate" and g.prompt == system + "second"
    rc, rg = red.snapshot(now=time.time())
    assert rc.prompt is None and rg.prompt is None and rc.prompt_hash and rg.prompt_hash != rc.prompt_hash
    assert "careful" not in json.dumps([s.to_json() for s in red.snapshot(now=time.time())])
    assert raw.redaction["prompts"] == "raw"


# ---- the follower ---------------------------------------------------------------------------------


def _write(path: Path, *docs: dict[str, Any], partial: str = "") -> None:
    with path.open("a", encoding="utf-8") as f:
        for d in docs:
            f.write(f"[2026-01-01 00:00:00] {json.dumps(d)}\n")
        f.write(partial)


def test_follower_reads_new_whole_lines_across_rotation_and_skips_junk(tmp_path: Path) -> None:
    t0 = time.time()
    log = tmp_path / "host_0.log"
    _write(log, _ev(reqlog.EVENT_RECEIVED, t0 - 100, rid="old", obj=_obj("old")))  # before the sidecar: not ours
    rec = RequestRecorder(history_s=1e9)
    fol = RequestLogFollower(tmp_path, rec)
    half = json.dumps(_ev(reqlog.EVENT_RECEIVED, t0, rid="a", obj=_obj("a")))
    _write(log, partial="[2026-01-01 00:00:00] " + half[:40])
    assert fol.poll() == 0
    with log.open("a") as f:
        f.write(half[40:] + "\nnot json at all\n[2026-01-01 00:00:00] {\"event\": \"other\"}\n")
    _write(log, _ev(reqlog.EVENT_RECEIVED, t0 + 1, rid="b", obj=_obj("b")))
    assert fol.poll() == 2 and fol.skipped_lines == 2
    # hourly rotation: a line lands in the old file after our read, then the file is renamed and a new one starts
    _write(log, _ev(reqlog.EVENT_RECEIVED, t0 + 2, rid="c", obj=_obj("c")))
    os.rename(log, tmp_path / "host_0.log.2026-01-01_00")
    _write(log, _ev(reqlog.EVENT_RECEIVED, t0 + 3, rid="d", obj=_obj("d")))
    assert fol.poll() == 2
    # a later file (another engine generation) is read from its start; a link is never followed
    _write(tmp_path / "host_1.log", _ev(reqlog.EVENT_RECEIVED, t0 + 4, rid="e", obj=_obj("e")))
    secret = tmp_path.parent / "elsewhere.log"
    _write(secret, _ev(reqlog.EVENT_RECEIVED, t0 + 5, rid="f", obj=_obj("f")))
    os.symlink(secret, tmp_path / "link.log")
    assert fol.poll() == 1
    assert [s.t for s in rec.snapshot(now=t0 + 10)] == pytest.approx([t0, t0 + 1, t0 + 2, t0 + 3, t0 + 4], abs=1e-3)
    fol.close()


def test_follower_drops_an_overlong_line_and_carries_on(tmp_path: Path) -> None:
    log = tmp_path / "h_0.log"
    log.write_text("")
    rec = RequestRecorder(history_s=1e9)
    fol = RequestLogFollower(tmp_path, rec)
    with log.open("a") as f:
        f.write("[x] {\"event\": \"request.received\", \"pad\": \"" + "y" * (MAX_LINE_BYTES + (1 << 20)))
    for _ in range(3):  # read in budgets of READ_BUDGET bytes
        fol.poll()
    with log.open("a") as f:
        f.write("\"}\n")
    _write(log, _ev(reqlog.EVENT_RECEIVED, time.time(), rid="ok", obj=_obj("ok")))
    assert fol.poll() == 1 and fol.skipped_lines == 1
    assert len(rec.snapshot()) == 1


# ---- capture -------------------------------------------------------------------------------------


def _part(node: int, requests: list[dict[str, Any]] | None, redaction: dict[str, Any]) -> dict[str, Any]:
    return {"node": node, "t": time.time(), "samples": [], "native": [], "probes": [], "metrics": [], "logs": [],
            "processes": [], "process_state": {}, "gpu": None, "log_text": "", "env": {}, "capture": [],
            "versions": {}, "requests": requests, "request_redaction": redaction}


def test_capture_writes_requests_jsonl_and_the_redaction(tmp_path: Path) -> None:
    rec = RequestRecorder(history_s=1e9)
    t0 = time.time() - 5
    o = _obj("a", sp={"max_new_tokens": 8, "temperature": 0.5})
    rec.ingest(_ev(reqlog.EVENT_RECEIVED, t0, rid="a", obj=o))
    rec.ingest(_finished("a", t0 + 1, o, prompt_tokens=33))
    shapes = [s.to_json() for s in rec.snapshot()]
    res = assemble(words=WORDS, seat="s", parts=[_part(0, shapes, rec.redaction), _part(1, None, {})],
                   trigger={"t": time.time()}, trigger_verdict=None, thresholds=WatchdogSpec(), rank_nodes={0: 0, 1: 1},
                   plan=None, dest_root=tmp_path, quota_mb=100)
    assert res.error is None and res.path is not None
    b = read_bundle(Path(res.path))
    assert layout.REQUESTS in b.manifest.files
    assert [r.to_json() for r in b.requests] == shapes and b.requests[0].prompt_tokens == 33
    assert b.manifest.redaction == {"prompts": "redacted", "salt_id": rec.redactor.salt_id, "requests": 1,
                                    "locals": False}
    none = assemble(words=WORDS, seat="s", parts=[_part(0, None, {})], trigger={"t": time.time()}, trigger_verdict=None,
                    thresholds=WatchdogSpec(), rank_nodes={0: 0}, plan=None, dest_root=tmp_path / "n", quota_mb=100)
    assert none.path is not None
    nb = read_bundle(Path(none.path))
    assert layout.REQUESTS not in nb.manifest.files and nb.manifest.redaction["prompts"] == "not captured"
