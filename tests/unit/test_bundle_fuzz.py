"""Fuzzing the bundle loader and the archive unpacker: >10,000 generated hostile inputs, seeded.

A bundle is untrusted input (DESIGN section 6). Whatever the damage (truncated files, flipped bytes,
wrong checksums, unknown schema majors, huge fields, missing files, hostile tar members), reading must
end either in a loaded bundle or in exactly one BundleError that names what is wrong: never another
exception, never a write outside the target directory. Mutations are drawn from a fixed seed, so a
failure reproduces; the case index is in the assertion message.

Counts (kept fast by mutating one small bundle in place and restoring it after each case):
file mutations with the manifest left alone 4,000; file mutations re-signed into the manifest (so the
decoders, not the checksums, meet the damage) 2,500; manifest mutations 2,000; hostile archives 1,400;
CLI replays 100 (10,000 seeded cases); plus 150 examples for each hypothesis property below.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import os
import random
import shutil
import sys
import tarfile
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import zstandard
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sgl_seat.cli.main import main
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
    write_bundle,
)
from sgl_seat.forensics.format import layout
from sgl_seat.forensics.format.archive import pack_bundle, unpack_bundle
from sgl_seat.forensics.format.codec import decode_probe_records, decode_records, decode_stack_samples, loads_document
from sgl_seat.forensics.format.manifest import Manifest
from sgl_seat.forensics.format.redact import RequestShape
from sgl_seat.forensics.replay.replayer import replay_bundle
from tests.tiers import full_tier

#: Cases per mutation test: the full tier's soak-length counts; the CI tier a fifth of them (each family still meets
#: every mutator and file many times over), and a third of the property tests' examples. Alone on an idle 2-core box
#: the module took 83 s in the full tier and 25 s in the CI tier (2026-12-06); 220 s in a loaded CI run.
_SCALE = 1 if full_tier() else 5
N_FILE, N_RESIGNED, N_MANIFEST, N_TAR, N_CLI = 4000 // _SCALE, 2500 // _SCALE, 2000 // _SCALE, 1400 // _SCALE, 100

F_FETCH = Frame("fetch_rows", "/opt/sgl_seat/sim/rowfetch.py", 88)
F_AR = Frame("all_reduce", "/usr/lib/python3/site-packages/torch/distributed/distributed_c10d.py", 2806)
F_LOOP = Frame("event_loop", "/opt/sgl_seat/sim/scheduler.py", 211)


def make_tiny(dest: Path) -> Path:
    """A small but complete bundle: 4 ranks, 3 samples each, 24 probe records, metrics, logs, requests."""
    samples = []
    for i in range(3):
        for r in range(4):
            top = F_FETCH if r == 3 else F_AR
            samples.append(StackSample(t=10.0 + i, node=r // 2, pid=100 + r, title=f"sglang::scheduler_TP{r}_EP{r}",
                                       rank=r, native=False,
                                       threads=(ThreadStack(1, "MainThread", True, True, (top, F_LOOP)),)))
    probes = [ProbeRecord(r // 2, r, 100 + r, 1, i, "sgl_seat.sim.rowfetch.fetch_rows", 9.0 + i * 0.5,
                          None if (r == 3 and i == 5) else 9.0 + i * 0.5 + 0.001 * (i + 1), 16 << (i % 4))
               for r in range(4) for i in range(6)]
    metrics = [MetricsPoint(10.0 + i, 0, {"sglang:num_running_reqs": 8.0, "sglang:generation_tokens_total": 100.0})
               for i in range(3)]
    procs = [EngineProcess(r // 2, 100 + r, f"sglang::scheduler_TP{r}_EP{r}", r, True) for r in range(4)]
    red = Redactor(salt=b"fuzz")
    reqs = [red.shape(t=9.0 + i, route="/v1/completions", prompt="word " * (20 + i), prompt_tokens=20 + i,
                      max_tokens=8) for i in range(3)]
    files = {
        layout.STACKS: encode_stack_samples(samples),
        layout.NATIVE_STACKS: encode_stack_samples(samples[-4:]),
        layout.PROBE: encode_probe_records(probes),
        layout.METRICS: encode_records(metrics),
        layout.PROCESSES: encode_records(procs),
        layout.LOGS: encode_logs([LogLine(10.0, 0, "decode batch #running-req: 8")]),
        layout.ENV: encode_env({0: {"PATH": "/bin"}, 1: {"PATH": "/bin"}}),
        layout.REQUESTS: encode_records(reqs),
        layout.log_file(0): encode_text("log line\n"),
        layout.gpu_file(1): b"gpu\n",
        layout.process_state_file(0): b'[{"pid": 100}]\n',
    }
    v = Verdict(VerdictKind.ROWFETCH_STALL, 3, 1, F_FETCH.label, 12.0, ("x",), (0, 1, 2))
    return write_bundle(dest, "tiny", {
        "seat": "fuzz", "created": 13.0, "trigger": {"t": 12.0}, "verdict": v.to_json(), "nodes": [0, 1],
        "ranks": [0, 1, 2, 3], "rank_nodes": {"0": 0, "1": 0, "2": 1, "3": 1},
        "time_range": {"start": 9.0, "end": 13.0}, "thresholds": {"rowfetch_inflight_s": 2.0},
    }, files, quota_mb=10)


# ---- byte mutations ------------------------------------------------------------------------------


def _huge_field(rng: random.Random, data: bytes) -> bytes:
    kind = rng.randrange(5)
    if kind == 0:
        return data.replace(b'"', b'"' + b"A" * rng.choice((10_000, 10_000, 10_000, 2_000_000)), 1)
    if kind == 1:
        return data.replace(b"1", b"9" * rng.choice((5_000, 50_000)), 1)
    if kind == 2:
        return b"[" * rng.choice((10_000, 10_000, 100_000)) + data
    if kind == 3:
        return data.replace(b"1.0", b"NaN", 1).replace(b"9.0", b"Infinity", 1)
    return data + b'{"sample": {"threads": [' + b'{"frames": [0]},' * 5_000 + b"{}]}}\n"


MUTATORS: list[Callable[[random.Random, bytes], bytes]] = [
    lambda rng, d: d[: rng.randrange(len(d))] if d else b"x",  # truncate
    lambda rng, d: (lambda i: d[:i] + bytes([d[i] ^ (1 << rng.randrange(8))]) + d[i + 1:])(rng.randrange(len(d)))
    if d else b"\x00",  # flip one bit
    lambda rng, d: (lambda i: d[:i] + bytes([rng.randrange(256)]) + d[i + 1:])(rng.randrange(max(1, len(d)))),
    lambda rng, d: (lambda i: d[:i] + rng.randbytes(rng.randrange(1, 40)) + d[i:])(rng.randrange(max(1, len(d)))),
    lambda rng, d: (lambda i, j: d[:i] + d[j:])(*sorted((rng.randrange(max(1, len(d))),
                                                         rng.randrange(max(1, len(d)))))),  # cut a range
    lambda rng, d: b"",  # emptied
    lambda rng, d: d + d,  # duplicated
    _huge_field,
    lambda rng, d: d.replace(b":", b":" + rng.choice((b"null", b"true", b'"s"', b"[]", b"{}", b"-1")), 1),
    lambda rng, d: b"\n".join(rng.sample(d.split(b"\n"), len(d.split(b"\n")))),  # shuffled lines
    lambda rng, d: d.replace(b"{", b"[", 1),
    lambda rng, d: d.decode("utf-8", "replace").replace("a", "\u00e9", 3).encode("latin-1", "replace"),
]


class Workspace:
    """One tiny bundle on disk; each case mutates files in place and ``restore`` puts the originals back."""

    def __init__(self, root: Path) -> None:
        self.path = make_tiny(root)
        self.orig = {p.relative_to(self.path).as_posix(): p.read_bytes()
                     for p in self.path.rglob("*") if p.is_file()}
        self.manifest = json.loads(self.orig["manifest.json"])
        self.names = sorted(n for n in self.orig if n != "manifest.json")

        self.touched: set[str] = set()

    def write(self, name: str, data: bytes) -> None:
        self.touched.add(name)
        (self.path / name).write_bytes(data)

    def remove(self, name: str) -> None:
        self.touched.add(name)
        (self.path / name).unlink()

    def resign(self, name: str, data: bytes) -> None:
        doc = {**self.manifest, "files": {**self.manifest["files"],
                                          name: {"size": len(data), "sha256": hashlib.sha256(data).hexdigest()}}}
        self.write("manifest.json", json.dumps(doc).encode())

    def restore(self) -> None:
        for name in self.touched:
            (self.path / name).write_bytes(self.orig[name])
        self.touched.clear()


@pytest.fixture(scope="module")
def fast_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A scratch directory on tmpfs where there is one: the cases are small-file I/O, ~20x faster there."""
    shm = Path("/dev/shm")
    if shm.is_dir() and os.access(shm, os.W_OK):
        d = Path(tempfile.mkdtemp(prefix="sgl-seat-fuzz-", dir=shm))
        yield d
        shutil.rmtree(d, ignore_errors=True)
    else:
        yield tmp_path_factory.mktemp("fuzz")


@pytest.fixture(scope="module")
def ws(fast_dir: Path) -> Workspace:
    return Workspace(fast_dir / "ws")


def _outcome(path: Path) -> BundleError | None:
    try:
        read_bundle(path)
    except BundleError as exc:
        return exc
    return None


def test_tiny_bundle_loads_and_replays(ws: Workspace) -> None:
    r = replay_bundle(ws.path)
    assert r.verdict is not None and r.verdict.rank == 3 and r.analysis.rowfetch["in_flight"] == 1


def test_file_mutations_fail_the_checksum(ws: Workspace) -> None:
    """Any changed byte in a listed file, manifest untouched: one BundleError naming the file."""
    rng = random.Random(61)
    for case in range(N_FILE):
        name = rng.choice(ws.names)
        data = MUTATORS[rng.randrange(len(MUTATORS))](rng, ws.orig[name])
        if rng.random() < 0.05:
            ws.remove(name)  # missing file
            want = "missing"
        else:
            ws.write(name, data)
            want = "sha256" if len(data) == len(ws.orig[name]) else ""
        err = _outcome(ws.path)
        ws.restore()
        if data == ws.orig[name] and want != "missing":
            assert err is None, case
            continue
        assert err is not None, f"case {case}: {name} mutated but accepted"
        assert name in str(err) and want in str(err), f"case {case}: {err}"


def test_resigned_mutations_meet_the_decoders(ws: Workspace) -> None:
    """Damaged content with a matching checksum: the decoders load it or give one BundleError (file:line)."""
    rng = random.Random(62)
    failures = 0
    for case in range(N_RESIGNED):
        name = rng.choice(ws.names)
        data = MUTATORS[rng.randrange(len(MUTATORS))](rng, ws.orig[name])
        ws.write(name, data)
        ws.resign(name, data)
        try:
            err = _outcome(ws.path)
        except Exception as exc:  # the point: nothing but BundleError may escape
            pytest.fail(f"case {case}: {name}: {type(exc).__name__}: {exc}")
        finally:
            ws.restore()
        if err is not None:
            failures += 1
            assert name in str(err), f"case {case}: {err}"
    assert failures > N_RESIGNED // 2  # most damage is detected, not silently loaded


def _manifest_mutation(rng: random.Random, doc: dict[str, Any]) -> bytes:
    doc = json.loads(json.dumps(doc))
    junk: list[Any] = [None, True, -1, 0, 2**70, 1.5, "x", "A" * 100_000, [], {}, [1, "a"], {"a": {"b": []}}]
    k = rng.randrange(11)
    if k == 0:
        doc.pop(rng.choice(sorted(doc)))
    elif k == 1:
        doc[rng.choice(sorted(doc))] = rng.choice(junk)
    elif k == 2:
        doc["schema_version"] = rng.choice([0, 2, 3, 99, -1, "1", 1.0, None])
    elif k == 3:
        name = rng.choice(sorted(doc["files"]))
        doc["files"][name][rng.choice(["size", "sha256"])] = rng.choice([*junk, 10**12, "0" * 64, 0])
    elif k == 4:
        doc["files"][rng.choice(["../x", "/etc/passwd", "a/../../b", ".hidden", "a\\b", "x" * 300, "a//b"])] = {
            "size": 1, "sha256": "0" * 64}
    elif k == 5:
        doc["verdict"] = rng.choice([*junk, {"kind": "bogus", "t": 1}, {"kind": "row-fetch stall"}])
    elif k == 6:
        doc["trigger"] = rng.choice([*junk, {"t": "x"}, {"a" * 200: 1}, {"x": [1]}])
    elif k == 7:
        doc["time_range"] = rng.choice([*junk, {"start": 5, "end": 1}, {"start": "a", "end": 1}])
    elif k == 8:
        doc[rng.choice(["nodes", "ranks"])] = rng.choice([*junk, list(range(100_000)), [-1]])
    elif k == 9:
        doc["rank_nodes"] = rng.choice([*junk, {"x": 1}, {"1": -1}, {"1" * 20: 0}])
    else:
        raw = json.dumps(doc).encode()
        return MUTATORS[rng.randrange(len(MUTATORS))](rng, raw)
    return json.dumps(doc).encode()


def test_manifest_mutations(ws: Workspace) -> None:
    """Damaged manifests (wrong types, unknown majors, hostile names, huge values): load or one BundleError."""
    rng = random.Random(63)
    for case in range(N_MANIFEST):
        ws.write("manifest.json", _manifest_mutation(rng, ws.manifest))
        try:
            err = _outcome(ws.path)
        except Exception as exc:
            pytest.fail(f"case {case}: {type(exc).__name__}: {exc}")
        finally:
            ws.restore()
        if err is not None:
            assert "manifest" in str(err) or "bundle" in str(err), f"case {case}: {err}"


# ---- hostile archives ----------------------------------------------------------------------------

# Every hostile name points into the test's sandbox, never at the real /etc or /tmp: absolute names are the
# sandbox's absolute paths, and ``into`` lies three levels below it, deeper than any ``..`` chain climbs.


def _random_archive(rng: random.Random, good: dict[str, bytes], sandbox: Path) -> bytes:
    names = [n for n in good if n != "manifest.json"]
    members: list[tuple[tarfile.TarInfo, bytes | None]] = []
    order = ["manifest.json", *rng.sample(names, len(names))]
    for i, n in enumerate(order):
        if rng.random() < 0.25:
            continue  # missing member
        data = good[n]
        name = f"tiny/{n}"
        info = tarfile.TarInfo(name)
        r = rng.random()
        if r < 0.12:
            info.name = rng.choice([f"{sandbox}/escape/{n}", f"tiny/../../escape/{n}", "../x", "tiny/../../../etc/x",
                                    f"{sandbox}/etc/passwd", "tiny\\..\\x", "", "./", "tiny/./../y", "C:/x",
                                    "other/x"])
        elif r < 0.30:
            info.type = rng.choice([tarfile.SYMTYPE, tarfile.LNKTYPE, tarfile.CHRTYPE, tarfile.BLKTYPE,
                                    tarfile.FIFOTYPE, tarfile.DIRTYPE, tarfile.CONTTYPE])
            info.linkname = rng.choice([f"{sandbox}/escape/t", "../../x", "tiny/manifest.json",
                                        f"{sandbox}/etc/passwd"])
            members.append((info, None))
            continue
        elif r < 0.45:
            data = MUTATORS[rng.randrange(len(MUTATORS))](rng, data)
        elif r < 0.5:
            members.append((tarfile.TarInfo(name), b""))  # duplicate, empty
        info.size = len(data)
        if i == 0 and rng.random() < 0.05:
            info.pax_headers = {"comment": "C" * rng.choice((1000, 9_000_000))}
        members.append((info, data))
    if rng.random() < 0.1:
        members.append((tarfile.TarInfo("tiny/extra.bin"), b""))
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=rng.choice([tarfile.PAX_FORMAT, tarfile.GNU_FORMAT])) as tar:
        for info, data in members:
            try:
                tar.addfile(info, io.BytesIO(data) if data is not None and info.isreg() else None)
            except (ValueError, tarfile.TarError):
                continue
    raw = buf.getvalue()
    if rng.random() < 0.1:
        raw = MUTATORS[rng.randrange(len(MUTATORS))](rng, raw)
    return zstandard.ZstdCompressor(level=1).compress(raw)


def test_hostile_archives(ws: Workspace, fast_dir: Path) -> None:
    """Random member lists (escapes, links, devices, lies about sizes, corruption): a verified bundle or one
    BundleError, nothing anywhere outside ``into``, nothing left in ``into`` after a refusal."""
    rng = random.Random(64)
    tmp_path = fast_dir / "tar"
    sandbox = tmp_path / "sandbox"
    into = sandbox / "a" / "b" / "into"
    into.mkdir(parents=True)
    arc = tmp_path / "a.tar.zst"
    accepted = 0
    for case in range(N_TAR):
        arc.write_bytes(_random_archive(rng, ws.orig, sandbox))
        try:
            out = unpack_bundle(arc, into)
        except BundleError:
            assert list(into.iterdir()) == [], case
            continue
        except Exception as exc:
            pytest.fail(f"case {case}: {type(exc).__name__}: {exc}")
        accepted += 1
        assert out == into / "tiny"
        read_bundle(out)
        shutil.rmtree(out)
    assert sorted(p.relative_to(tmp_path).as_posix() for p in tmp_path.rglob("*")) == [
        "a.tar.zst", "sandbox", "sandbox/a", "sandbox/a/b", "sandbox/a/b/into"]
    assert accepted < N_TAR // 2


def test_every_hostile_name_resolves_inside_the_sandbox(ws: Workspace, fast_dir: Path) -> None:
    """Where a naive unpacker (one that trusts names) would write each escaping member: outside ``into`` but
    inside the sandbox, so the tree check above sees any break-out and nothing can touch the real /etc."""
    sandbox = fast_dir / "naive" / "sandbox"
    into = sandbox / "a" / "b" / "into"
    rng = random.Random(64)
    where: dict[str, Path] = {}  # member name or link target -> the path it names
    for _ in range(300):
        raw = zstandard.ZstdDecompressor().decompress(_random_archive(rng, ws.orig, sandbox), max_output_size=1 << 26)
        with contextlib.suppress(tarfile.TarError), tarfile.open(fileobj=io.BytesIO(raw)) as tar:
            for m in tar.getmembers():
                path = os.path.normpath(into / m.name)
                where[m.name] = Path(path)
                if m.linkname:  # relative to the link's own directory
                    where[m.linkname] = Path(os.path.normpath(Path(path).parent / m.linkname))
    escapes = {n: p for n, p in where.items() if not p.is_relative_to(into)}
    assert {"tiny/../../../etc/x", f"{sandbox}/etc/passwd", "../../x"} <= set(escapes), sorted(escapes)
    assert all(p.is_relative_to(sandbox) for p in escapes.values()), escapes


def test_cli_replay_of_damaged_bundles_exits_cleanly(ws: Workspace, monkeypatch: pytest.MonkeyPatch,
                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """Through the CLI: non-zero exit, the error on stderr, no traceback."""
    rng = random.Random(65)
    for case in range(N_CLI):
        name = rng.choice([*ws.names, "manifest.json"])
        data = MUTATORS[rng.randrange(len(MUTATORS))](rng, ws.orig[name])
        if data == ws.orig[name]:
            continue
        ws.write(name, data)
        monkeypatch.setattr(sys, "argv", ["sgl-seat", "replay", str(ws.path), "--json"])
        code: int | None = 0
        try:
            main()
        except SystemExit as exc:
            code = int(exc.code or 0)
        finally:
            ws.restore()
        err = capsys.readouterr().err
        assert code == 2 and "error:" in err and "Traceback" not in err, f"case {case}: {code} {err}"


def test_packed_tiny_bundle_roundtrips(ws: Workspace, tmp_path: Path) -> None:
    arc = pack_bundle(ws.path, tmp_path / "t.tar.zst")
    assert read_bundle(unpack_bundle(arc, tmp_path / "u")).manifest.bundle_id == "tiny"


# ---- properties ----------------------------------------------------------------------------------

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda kids: st.lists(kids, max_size=5) | st.dictionaries(st.text(max_size=10), kids, max_size=5),
    max_leaves=30)
record_keys = st.sampled_from(["t", "node", "pid", "rank", "title", "threads", "frames", "frame_id", "frame",
                               "sample", "probe_block", "seq", "start", "end", "gather_size", "target", "thread",
                               "values", "name", "filename", "line", "native", "route", "prompt_hash"])
json_objects = st.dictionaries(record_keys, json_values, max_size=8)
FAST = settings(max_examples=150 if full_tier() else 50, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@FAST
@given(st.lists(json_objects | json_values, max_size=6))
def test_decoders_take_any_json_lines(lines: list[Any]) -> None:
    data = "\n".join(json.dumps(x) for x in lines).encode()
    decoders: list[Callable[[io.BytesIO], object]] = [
        lambda f: decode_stack_samples(f, "stacks.jsonl"),
        lambda f: decode_probe_records(f, "probe.jsonl"),
        lambda f: decode_records(f, MetricsPoint.from_json, "metrics.jsonl"),
        lambda f: decode_records(f, RequestShape.from_json, "requests.jsonl"),
    ]
    for dec in decoders:
        with contextlib.suppress(BundleError):
            dec(io.BytesIO(data))


@FAST
@given(st.binary(max_size=400))
def test_decoders_take_any_bytes(data: bytes) -> None:
    for dec in (lambda f: decode_stack_samples(f, "s"), lambda f: decode_probe_records(f, "p")):
        with contextlib.suppress(BundleError):
            dec(io.BytesIO(data))
    with contextlib.suppress(BundleError):
        Manifest.from_json(loads_document(data, "manifest.json"))


@FAST
@given(json_objects)
def test_manifest_parser_takes_any_object(doc: dict[str, Any]) -> None:
    base = json.loads(json.dumps({"schema_version": 1, "bundle_id": "b", "seat": "s", "created": 1.0,
                                  "trigger": {"t": 1.0}, "verdict": None, "nodes": [], "ranks": [],
                                  "time_range": {"start": 0, "end": 1}, "files": {}}))
    base.update(doc)
    with contextlib.suppress(BundleError):
        Manifest.from_json(base)


frames = st.builds(Frame, name=st.text(min_size=1, max_size=12), filename=st.text(max_size=20),
                   line=st.integers(0, 10**6), module=st.none() | st.text(max_size=8), native=st.booleans())
threads = st.builds(ThreadStack, thread_id=st.integers(0, 2**40), name=st.none() | st.text(max_size=8),
                    active=st.booleans(), owns_gil=st.booleans(), frames=st.lists(frames, max_size=6).map(tuple))
stack_samples = st.builds(StackSample, t=st.floats(0, 2e9), node=st.integers(0, 64), pid=st.integers(1, 2**22),
                          title=st.text(max_size=20), rank=st.none() | st.integers(0, 512), native=st.booleans(),
                          threads=st.lists(threads, max_size=3).map(tuple), error=st.none() | st.text(max_size=10))
probe_records = st.builds(ProbeRecord, node=st.integers(0, 8), rank=st.integers(0, 8), pid=st.integers(1, 99),
                          thread=st.integers(0, 9), seq=st.integers(0, 2**40), target=st.sampled_from(["a.b", "c"]),
                          start=st.floats(0, 2e9), end=st.none() | st.floats(0, 2e9), gather_size=st.integers(0, 2**20))


@FAST
@given(st.lists(stack_samples, max_size=5), st.lists(probe_records, max_size=20))
def test_encodings_roundtrip(samples: list[StackSample], probes: list[ProbeRecord]) -> None:
    assert decode_stack_samples(io.BytesIO(encode_stack_samples(samples)), "s") == samples
    got = list(decode_probe_records(io.BytesIO(encode_probe_records(probes)), "p"))
    assert sorted(got, key=repr) == sorted(probes, key=repr)
