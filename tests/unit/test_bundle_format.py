"""Bundle format: atomic writing, quota rotation, strict reading, the JSON Schema, scrubbing and redaction.

The watchdog writes bundles with ``write_bundle`` and replay trusts nothing it reads back, so these tests
pin both directions: what is written is complete or absent, and what is read is exactly what was written.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import jsonschema
import pytest

from sgl_seat.core.records import (
    EngineProcess,
    Frame,
    LogLine,
    MetricsPoint,
    ProbeRecord,
    StackSample,
    ThreadStack,
    Verdict,
    VerdictKind,
)
from sgl_seat.errors import BundleError
from sgl_seat.forensics import (
    Redactor,
    encode_env,
    encode_logs,
    encode_probe_records,
    encode_records,
    encode_stack_samples,
    encode_text,
    read_bundle,
    rotate_bundles,
    scrub_env,
    scrub_json,
    scrub_text,
    verify_bundle,
    write_bundle,
)
from sgl_seat.forensics.format import bundle as bundle_mod
from sgl_seat.forensics.format import layout
from sgl_seat.forensics.format.codec import ProbeTable, decode_probe_records, decode_stack_samples
from sgl_seat.forensics.format.manifest import BundleVersionError
from sgl_seat.forensics.format.redact import RequestShape
from sgl_seat.forensics.format.store import list_bundles

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "fixtures" / "bundles"
SCHEMA = json.loads((ROOT / "forensics" / "bundle.schema.json").read_text())

F1 = Frame("fetch_rows", "/opt/sgl_seat/sim/rowfetch.py", 88)
F2 = Frame("event_loop", "/opt/sgl_seat/sim/scheduler.py", 211)
FN = Frame("clock_nanosleep", "libc.so.6", 0, "/usr/lib/libc.so.6", True)


def _samples() -> list[StackSample]:
    th = ThreadStack(1, "MainThread", False, False, (FN, F1, F2))
    return [StackSample(t=100.0 + i, node=1, pid=7, title="sglang::scheduler_TP3_EP3", rank=3, native=i == 2,
                        threads=(th, ThreadStack(2, None, True, False, (F2,)))) for i in range(3)]


def _probes() -> list[ProbeRecord]:
    return [ProbeRecord(1, 3, 7, 1, i, "sgl_seat.sim.rowfetch.fetch_rows", 100.0 + i, None if i == 4 else 100.5 + i,
                        8 << i) for i in range(5)] + [ProbeRecord(0, 0, 5, 1, 1, "x.y", 99.0, 99.1, 3)]


def _fields(**over: object) -> dict[str, object]:
    v = Verdict(VerdictKind.ROWFETCH_STALL, 3, 1, F1.label, 104.0, ("late",), (0, 1, 2))
    d: dict[str, object] = {"seat": "s1", "trigger": {"t": 104.0, "source": "detector"}, "verdict": v.to_json(),
                            "nodes": [0, 1], "ranks": [0, 1, 2, 3], "time_range": {"start": 100.0, "end": 105.0},
                            "created": 105.0}
    d.update(over)
    return d


def _files() -> dict[str, bytes]:
    red = Redactor(salt=b"s")
    return {
        layout.STACKS: encode_stack_samples(_samples()),
        layout.PROBE: encode_probe_records(_probes()),
        layout.METRICS: encode_records([MetricsPoint(100.0, 0, {"sglang:num_running_reqs": 3.0})]),
        layout.PROCESSES: encode_records([EngineProcess(1, 7, "sglang::scheduler_TP3_EP3", 3, True)]),
        layout.LOGS: encode_logs([LogLine(100.0, 1, "hello token=abcdef123")]),
        layout.ENV: encode_env({1: {"HF_TOKEN": "hf_" + "a" * 30, "PATH": "/bin"}}),
        layout.REQUESTS: encode_records([red.shape(t=100.0, route="/v1/completions", prompt="hi " * 50,
                                                   prompt_tokens=None, max_tokens=8)]),
        layout.log_file(1): encode_text("line one\nAuthorization: Bearer abcdefghijklmnop\n"),
        layout.gpu_file(1): b"nvidia-smi -q output\n",
    }


def test_roundtrip_gives_back_the_same_records(tmp_path: Path) -> None:
    """GIVEN records written with the encoders WHEN read back THEN every record is equal, secrets are gone."""
    path = write_bundle(tmp_path, "b1", _fields(), _files(), quota_mb=100)
    assert path == tmp_path / "b1"
    b = read_bundle(path)
    assert b.stacks == _samples()
    assert sorted(b.probes, key=lambda r: (r.node, r.seq)) == sorted(_probes(), key=lambda r: (r.node, r.seq))
    assert [r.seq for r in b.probes.in_flight()] == [4]
    assert b.manifest.verdict is not None and b.manifest.verdict.rank == 3
    assert b.env[1]["HF_TOKEN"].startswith("<redacted")
    assert "abcdefghijklmnop" not in b.log_text[1] and "abcdef123" not in b.logs[0].text
    assert b.gpu[1].startswith("nvidia-smi")
    assert b.requests[0].prompt is None and b.requests[0].prompt_chars == 150
    # Frames and identical thread stacks are shared, not copied per sample.
    assert b.stacks[0].threads[0] is b.stacks[1].threads[0]


def test_written_manifest_matches_the_json_schema(tmp_path: Path) -> None:
    """The committed JSON Schema and the writer agree (golden and fresh manifests validate)."""
    jsonschema.Draft202012Validator.check_schema(SCHEMA)
    path = write_bundle(tmp_path, "b1", _fields(), _files(), quota_mb=100)
    for m in (path / "manifest.json", GOLDEN / "stall" / "manifest.json", GOLDEN / "crash" / "manifest.json"):
        jsonschema.validate(json.loads(m.read_text()), SCHEMA)


def test_write_is_atomic_on_failure(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN a disk that fails mid-write WHEN writing THEN BundleWriteError, no bundle under its own name, and
    the part written kept as `.incomplete-b1` with INCOMPLETE.json listing what is missing (issue 24); `bundle ls`
    does not take it for a bundle, and the quota removes it before any complete one."""
    calls = {"n": 0}
    real = bundle_mod._write_file

    def flaky(path: Path, data: bytes) -> None:
        calls["n"] += 1
        if calls["n"] == 4:  # the marker, two files, then the third fails
            raise OSError(28, "No space left on device")
        real(path, data)

    monkeypatch.setattr(bundle_mod, "_write_file", flaky)
    with pytest.raises(bundle_mod.BundleWriteError, match="No space left") as err:
        write_bundle(tmp_path, "b1", _fields(), _files(), quota_mb=100)
    names = list(_files())
    assert err.value.reason == "disk-full" and err.value.written == names[:2]
    assert err.value.missing == [*names[2:], layout.MANIFEST] and err.value.marker
    assert [p.name for p in tmp_path.iterdir()] == [".incomplete-b1"]
    left = tmp_path / ".incomplete-b1"
    assert err.value.path == left and not (left / layout.MANIFEST).exists() and not (left / names[2]).exists()
    marker = json.loads((left / layout.INCOMPLETE).read_text())
    assert marker["missing"] == err.value.missing and marker["errno"] == "ENOSPC" and marker["state"] == "failed"
    with pytest.raises(BundleError):
        verify_bundle(left)
    assert list_bundles(tmp_path) == []
    monkeypatch.setattr(bundle_mod, "_write_file", real)
    write_bundle(tmp_path, "b2", _fields(created=2000.0), _files(), quota_mb=100)
    assert rotate_bundles(tmp_path, 0, keep=tmp_path / "b2") == [left]  # counted against the quota, removed
    assert [p.name for p in tmp_path.iterdir()] == ["b2"]


def test_failed_writes_on_a_disk_that_stays_full_do_not_pile_up(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN a disk that fails every capture at its manifest WHEN three captures fail in a row under a quota they
    exceed THEN only the newest partial directory is kept: what a failed capture keeps counts against the quota."""
    real = bundle_mod._write_file

    def no_manifest(path: Path, data: bytes) -> None:
        if path.name == layout.MANIFEST:
            raise OSError(28, "No space left on device")
        real(path, data)

    monkeypatch.setattr(bundle_mod, "_write_file", no_manifest)
    for i in range(3):
        with pytest.raises(bundle_mod.BundleWriteError):
            write_bundle(tmp_path, f"b{i}", _fields(created=1000.0 + i), _files(), quota_mb=0)
    assert [p.name for p in tmp_path.iterdir()] == [".incomplete-b2"]


def test_write_refuses_bad_ids_names_and_existing(tmp_path: Path) -> None:
    for bad in ("../x", "a/b", ".hidden", ""):
        with pytest.raises(BundleError):
            write_bundle(tmp_path, bad, _fields(), {}, quota_mb=1)
    for bad_name in ("../x", "/abs", "manifest.json", "INCOMPLETE.json", "a/../../b", ".dot"):
        with pytest.raises(BundleError):
            write_bundle(tmp_path, "ok", _fields(), {bad_name: b""}, quota_mb=1)
    write_bundle(tmp_path, "ok", _fields(), {}, quota_mb=1)
    with pytest.raises(BundleError, match="already exists"):
        write_bundle(tmp_path, "ok", _fields(), {}, quota_mb=1)


def test_write_validates_the_manifest_before_touching_disk(tmp_path: Path) -> None:
    with pytest.raises(BundleError, match="time_range"):
        write_bundle(tmp_path, "b", _fields(time_range={"start": 5.0, "end": 1.0}), {}, quota_mb=1)
    with pytest.raises(BundleError, match="verdict"):
        write_bundle(tmp_path, "b", _fields(verdict={"kind": "nope", "t": 1.0}), {}, quota_mb=1)
    assert not (tmp_path / "b").exists()


def test_plan_is_scrubbed(tmp_path: Path) -> None:
    plan = {"nodes": [{"env": {"HF_TOKEN": "hf_" + "x" * 30, "NCCL_IB_HCA": "mlx5"},
                       "argv": ["--api-key", "sekrit-value", "--tp", "4"]}]}
    b = read_bundle(write_bundle(tmp_path, "b", _fields(plan=plan), {}, quota_mb=1))
    text = json.dumps(b.manifest.plan)
    assert "hf_xxx" not in text and "mlx5" in text and "--tp" in text


def test_quota_rotates_oldest_and_keeps_newest(tmp_path: Path) -> None:
    """GIVEN bundles over the quota WHEN a new one is written THEN the oldest go, the newest stays."""
    big = {"blob.bin": os.urandom(400 * 1024)}
    for i in range(4):
        write_bundle(tmp_path, f"b{i}", _fields(created=1000.0 + i), big, quota_mb=1)
    left = sorted(p.name for p in tmp_path.iterdir())
    assert left == ["b2", "b3"]
    # A single bundle over the quota is kept (losing the newest capture would defeat the watchdog).
    write_bundle(tmp_path, "huge", _fields(created=2000.0), {"blob.bin": os.urandom(1200 * 1024)}, quota_mb=1)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["huge"]


def test_rotate_cleans_stale_temp_dirs(tmp_path: Path) -> None:
    stale = tmp_path / ".tmp-x-123"
    stale.mkdir()
    os.utime(stale, (1, 1))
    fresh = tmp_path / ".tmp-y-456"
    fresh.mkdir()
    removed = rotate_bundles(tmp_path, 10)
    assert stale in removed and not stale.exists() and fresh.exists()


def test_verify_refuses_extra_files_links_and_mismatches(tmp_path: Path) -> None:
    path = write_bundle(tmp_path, "b", _fields(), _files(), quota_mb=100)
    verify_bundle(path)
    (path / "extra.txt").write_text("x")
    with pytest.raises(BundleError, match="not listed"):
        verify_bundle(path)
    (path / "extra.txt").unlink()
    target = path / layout.METRICS
    data = target.read_bytes()
    target.unlink()
    os.symlink("/etc/hostname", target)
    with pytest.raises(BundleError, match="link"):
        verify_bundle(path)
    target.unlink()
    target.write_bytes(data + b"\n")
    with pytest.raises(BundleError, match=r"larger|bytes"):
        verify_bundle(path)
    target.write_bytes(data[:-1] + b"X")
    with pytest.raises(BundleError, match="sha256"):
        verify_bundle(path)


def test_unknown_schema_major_is_a_version_error(tmp_path: Path) -> None:
    path = write_bundle(tmp_path, "b", _fields(), {}, quota_mb=1)
    doc = json.loads((path / "manifest.json").read_text())
    doc["schema_version"] = 2
    (path / "manifest.json").write_text(json.dumps(doc))
    with pytest.raises(BundleVersionError, match="schema_version 2"):
        read_bundle(path)


def test_unknown_top_level_keys_are_kept_and_ignored(tmp_path: Path) -> None:
    path = write_bundle(tmp_path, "b", _fields(future_field={"x": 1}), {}, quota_mb=1)
    assert read_bundle(path).manifest.extra == {"future_field": {"x": 1}}


def test_codecs_accept_plain_record_lines() -> None:
    """Hand-written bundles (one to_json() per line) load too, not only the compact encodings."""
    import io

    s = _samples()[0]
    got = decode_stack_samples(io.BytesIO((json.dumps(s.to_json()) + "\n").encode()), "stacks.jsonl")
    assert got == [s]
    p = _probes()[4]
    table = decode_probe_records(io.BytesIO((json.dumps(p.to_json()) + "\n").encode()), "probe.jsonl")
    assert list(table) == [p] and table[0] == p and table[-1] == p and table[0:1] == [p]
    assert list(ProbeTable.from_records([p])) == [p]


@pytest.mark.parametrize(("text", "gone", "kept"), [
    ("Authorization: Bearer abcdefghijklmnop", "abcdefghijklmnop", "Authorization"),
    ("export HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz0123", "hf_abc", "export"),
    ("key AKIAIOSFODNN7EXAMPLE here", "AKIAIOSFODNN7EXAMPLE", "here"),
    ("ghp_abcdefghijklmnopqrstuvwxyzABCDEFGHIJ", "ghp_abc", ""),
    ("url https://bob:pa55word@host/x", "pa55word", "bob"),
    ("--api-key s3cr3t-value --tp 4", "s3cr3t", "--tp 4"),
    ("password=hunter22 next", "hunter22", "next"),
    ("jwt eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFUP0THsR8U", "eyJ", "jwt"),
    ("blob 0123456789abcdef0123456789abcdef0123456789abcdef", "0123456789abcdef0123", "blob"),
    ("-----BEGIN RSA PRIVATE KEY-----\nMIIEow\n-----END RSA PRIVATE KEY-----", "MIIEow", ""),
    ("sk-proj-abcdefghijklmnopqrstuvwxyz", "abcdefghijklmnop", ""),
])
def test_scrub_text_removes_secrets(text: str, gone: str, kept: str) -> None:
    out = scrub_text(text)
    assert gone not in out and "<redacted:" in out and kept in out


@pytest.mark.parametrize("text", [
    "[TP0] Decode batch, #running-req: 7, #token: 900, token usage: 0.20, accept len: 2.21",
    '  File "/usr/lib/python3/site-packages/sglang/srt/managers/scheduler.py", line 1021, in event_loop',
    "--tokenizer-path /models/DeepSeek-V4 --tp 4 --dist-init-addr 10.0.0.1:5000",
    "sglang::scheduler_TP3_EP3",
])
def test_scrub_text_keeps_diagnostics(text: str) -> None:
    assert scrub_text(text) == text


def test_scrub_env_and_json_by_name() -> None:
    env = scrub_env({"AWS_SECRET_ACCESS_KEY": "abc", "NCCL_SOCKET_IFNAME": "eth0", "MY_PASSWORD": "x",
                     "TOKENIZERS_PARALLELISM": "false", "EMPTY_TOKEN": ""})
    assert env["AWS_SECRET_ACCESS_KEY"].startswith("<redacted") and env["MY_PASSWORD"].startswith("<redacted")
    assert env["NCCL_SOCKET_IFNAME"] == "eth0" and env["TOKENIZERS_PARALLELISM"] == "false"
    doc = scrub_json({"a": [{"api_key": "zzz", "n": 3, "auth": {"nested": "v"}}]})
    assert doc["a"][0]["api_key"].startswith("<redacted") and doc["a"][0]["n"] == 3


def test_redaction_keeps_shape_and_prefix_structure() -> None:
    """Redacted requests keep lengths, a salted hash and which prompts share a prefix, never the text."""
    red = Redactor(salt=b"salt")
    system = "You are a helpful assistant. " * 10
    a = red.shape(t=1.0, route="/v1/completions", prompt=system + "question one", prompt_tokens=80, max_tokens=16)
    b = red.shape(t=2.0, route="/v1/completions", prompt=system + "another question", prompt_tokens=82,
                  max_tokens=16)
    c = red.shape(t=3.0, route="/v1/completions", prompt="unrelated " * 40, prompt_tokens=None, max_tokens=16)
    assert a.prompt is None and b.prompt is None
    assert a.prefix_group == b.prefix_group != c.prefix_group
    assert b.shared_prefix_chars == 256 and a.shared_prefix_chars == 0
    assert c.tokens_estimated and c.prompt_tokens == 100
    assert a.prompt_hash != b.prompt_hash
    assert Redactor(salt=b"salt").hash_text("x") == red.hash_text("x") != Redactor(salt=b"other").hash_text("x")
    assert RequestShape.from_json(b.to_json()) == b
    raw = Redactor(raw_prompts=True, salt=b"s").shape(t=1.0, route="/generate", prompt="hello", prompt_tokens=1,
                                                      max_tokens=1)
    assert raw.prompt == "hello"


def test_request_recorder_redacts_and_bounds() -> None:
    """The seat-side recorder keeps shapes (lengths, prefix groups, max_tokens, sampling), not prompts."""
    import io

    from sgl_seat.forensics.format.codec import decode_records
    from sgl_seat.forensics.recording.recorder import RequestRecorder

    rec = RequestRecorder(salt=b"s", capacity=3, history_s=100)
    system = "system prompt shared by all " * 5
    h0 = rec.observe("/v1/chat/completions", {"messages": [{"role": "system", "content": system},
                                                           {"role": "user", "content": "one"}],
                                              "max_completion_tokens": 64, "temperature": 0.2, "stream": True}, t=10.0)
    rec.observe("/v1/chat/completions", {"messages": [{"role": "system", "content": system},
                                                      {"role": "user", "content": [{"type": "text", "text": "two"}]}],
                                         "max_tokens": 32}, t=11.0)
    rec.observe("/generate", {"text": "hello there", "sampling_params": {"max_new_tokens": 8, "top_k": 5}}, t=12.0)
    rec.finish(h0, output_tokens=40, prompt_tokens=55, t=13.0)
    shapes = rec.snapshot(now=20.0)
    a, b, c = shapes
    assert a.prompt is None and a.prompt_tokens == 55 and not a.tokens_estimated and a.output_tokens == 40
    assert a.max_tokens == 64 and a.stream and a.sampling == {"temperature": 0.2}
    assert a.prefix_group == b.prefix_group and b.shared_prefix_chars > 0
    assert c.route == "/generate" and c.max_tokens == 8 and c.sampling == {"top_k": 5}
    rec.observe("/v1/completions", {"prompt": "x"}, t=13.0)
    assert len(rec.snapshot(now=20.0)) == 3  # bounded
    assert len(rec.snapshot(now=112.5)) == 1  # history window
    back = decode_records(io.BytesIO(rec.encode(now=20.0)), RequestShape.from_json, "requests.jsonl")
    assert back == rec.snapshot(now=20.0)
    assert rec.redaction["prompts"] == "redacted"


def test_scrub_lines_is_scrub_text_of_each_line() -> None:
    """The capture scrubs log lines in one joined pass (scrub_lines): it must give what scrub_text gives line by line,
    including lines whose secret a pattern could join to the next line, and a key at a line's end."""
    import random

    from sgl_seat.forensics.format.scrub import scrub_lines

    pieces = ["Authorization: Bearer abcdefghijklmnop", "export HF_TOKEN=hf_abcdefghijklmnopqrstuvwxyz0123",
              "password=hunter22 next", "[TP0] Decode batch, #running-req: 7, #token: 900", "token:", "12345678",
              "-----BEGIN RSA PRIVATE KEY-----", "MIIEowIBAAKCAQEA", "-----END RSA PRIVATE KEY-----", "api_key:",
              "  hunter2hunter2", "url https://bob:pa55word@host/x", "Bearer", "tokenizer_token = abcdefgh", "",
              "blob 0123456789abcdef0123456789abcdef0123456789abcdef", "sglang::scheduler_TP3_EP3 ok", "x" * 45]
    rng = random.Random(7)
    for _ in range(200):
        lines = [rng.choice(pieces) for _ in range(rng.randint(0, 12))]
        if rng.random() < 0.5:
            lines = [ln + "\n" for ln in lines]  # encode_text keeps each line's end
        assert scrub_lines(lines) == [scrub_text(ln) for ln in lines], lines


def test_probe_columns_encode_as_their_records_do() -> None:
    """A capture encodes its merged probe columns directly: the same bytes as the records they hold."""
    from sgl_seat.core.columns import ProbeColumns
    from sgl_seat.core.records import ProbeRecord
    from sgl_seat.forensics.format.codec import encode_probe_records

    recs = [ProbeRecord(node=n, rank=r, pid=100 + r, thread=1, seq=i, target="t:f", start=1000.0 + i,
                        end=None if i % 7 == 6 else 1000.5 + i, gather_size=i % 40, gpu=(r == 1 and i % 2 == 0),
                        gpu_start=1000.1 + i if r == 1 and i % 2 == 0 else None, gpu_end=None,
                        graph_key=(i % 3 if r == 2 else None))
            for i in range(60) for n, r in ((0, 0), (0, 1), (1, 2))]
    assert encode_probe_records(ProbeColumns.from_records(recs)) == encode_probe_records(recs)
    halves = ProbeColumns.concat([ProbeColumns.from_records(recs[:90]), ProbeColumns.from_records(recs[90:])])
    assert encode_probe_records(halves) == encode_probe_records(list(halves))
    assert encode_probe_records(ProbeColumns()) == encode_probe_records([]) == b""
