"""`.tar.zst` bundle archives: a packed bundle unpacks to the same bytes; a crafted one is refused cleanly.

Archives come from strangers, so each hostile member kind (absolute path, `..`, symlink, hardlink,
device, FIFO, oversize, unlisted, duplicate, zstd garbage) must end in one BundleError, with nothing
written outside the target directory and nothing left inside it.
"""

from __future__ import annotations

import hashlib
import io
import json
import shutil
import tarfile
import time
from pathlib import Path
from typing import Any

import pytest
import zstandard

from sgl_seat.errors import BundleError
from sgl_seat.forensics.format.archive import pack_bundle, unpack_bundle
from sgl_seat.forensics.format.bundle import verify_bundle
from tests.cli_runner import run_cli

ROOT = Path(__file__).resolve().parents[2]
STALL = ROOT / "tests" / "fixtures" / "bundles" / "stall"


def _tree(p: Path) -> dict[str, bytes]:
    return {str(f.relative_to(p)): f.read_bytes() for f in sorted(p.rglob("*")) if f.is_file()}


def _manifest(files: dict[str, bytes], bundle_id: str = "evil") -> bytes:
    doc = {"schema_version": 1, "bundle_id": bundle_id, "seat": "s", "created": 1.0, "trigger": {"t": 1.0},
           "verdict": None, "nodes": [0], "ranks": [0], "time_range": {"start": 0.0, "end": 1.0},
           "files": {n: {"size": len(d), "sha256": hashlib.sha256(d).hexdigest()} for n, d in files.items()}}
    return json.dumps(doc).encode()


def make_tar(members: list[tuple[tarfile.TarInfo, bytes | None]]) -> bytes:
    """A .tar.zst of exactly these members (headers as given, so they can lie)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return zstandard.ZstdCompressor().compress(buf.getvalue())


def reg(name: str, data: bytes, size: int | None = None) -> tuple[tarfile.TarInfo, bytes]:
    info = tarfile.TarInfo(name)
    info.size = len(data) if size is None else size
    return info, data


def special(name: str, kind: bytes, link: str = "") -> tuple[tarfile.TarInfo, None]:
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = link
    return info, None


def test_pack_unpack_roundtrip_is_identical(tmp_path: Path) -> None:
    arc = pack_bundle(STALL, tmp_path / "stall.tar.zst")
    again = pack_bundle(STALL, tmp_path / "again.tar.zst")
    assert arc.read_bytes() == again.read_bytes()  # deterministic archives
    out = unpack_bundle(arc, tmp_path / "into")
    assert out == tmp_path / "into" / "stall"
    assert _tree(out) == _tree(STALL)
    verify_bundle(out)
    with pytest.raises(BundleError, match="already exists"):
        unpack_bundle(arc, tmp_path / "into")
    with pytest.raises(BundleError, match="already exists"):
        pack_bundle(STALL, arc)


GOOD = b'{"t":1.0,"node":0,"values":{}}\n'


def _hostile_cases() -> dict[str, list[tuple[tarfile.TarInfo, bytes | None]]]:
    files = {"metrics.jsonl": GOOD}
    man = _manifest(files)
    ok = reg("evil/manifest.json", man)
    return {
        "absolute path": [reg("/tmp/evil/manifest.json", man)],
        "dotdot": [ok, reg("evil/../../escape.txt", b"x")],
        "dotdot first": [reg("../evil/manifest.json", man)],
        "symlink": [ok, special("evil/metrics.jsonl", tarfile.SYMTYPE, "/etc/passwd")],
        "hardlink": [ok, special("evil/metrics.jsonl", tarfile.LNKTYPE, "evil/manifest.json")],
        "char device": [ok, special("evil/metrics.jsonl", tarfile.CHRTYPE)],
        "block device": [ok, special("evil/metrics.jsonl", tarfile.BLKTYPE)],
        "fifo": [ok, special("evil/metrics.jsonl", tarfile.FIFOTYPE)],
        "oversize member": [ok, reg("evil/metrics.jsonl", GOOD + b"x" * 100)],
        "unlisted member": [ok, reg("evil/metrics.jsonl", GOOD), reg("evil/other.txt", b"x")],
        "duplicate member": [ok, reg("evil/metrics.jsonl", GOOD), reg("evil/metrics.jsonl", GOOD)],
        "second top dir": [ok, reg("other/metrics.jsonl", GOOD)],
        "manifest not first": [reg("evil/metrics.jsonl", GOOD), ok],
        "missing member": [ok],
        "wrong content": [ok, reg("evil/metrics.jsonl", GOOD.replace(b"1.0", b"2.0"))],
        "id mismatch": [reg("evil/manifest.json", _manifest(files, "other")), reg("evil/metrics.jsonl", GOOD)],
        "backslash": [reg("evil\\..\\x", b"x")],
        "bad manifest": [reg("evil/manifest.json", b"{not json"), reg("evil/metrics.jsonl", GOOD)],
        "empty": [],
    }


@pytest.mark.parametrize("case", sorted(_hostile_cases()))
def test_hostile_archives_are_refused_without_side_effects(case: str, tmp_path: Path) -> None:
    """GIVEN a crafted archive WHEN unpacking THEN one BundleError and no file anywhere but the sentinel."""
    arc = tmp_path / "evil.tar.zst"
    arc.write_bytes(make_tar(_hostile_cases()[case]))
    into = tmp_path / "a" / "b" / "into"
    before = _tree(tmp_path)
    with pytest.raises(BundleError):
        unpack_bundle(arc, into)
    assert _tree(tmp_path) == before
    assert list(into.iterdir()) == []
    assert not Path("/tmp/evil/manifest.json").exists()


def test_corrupt_zstd_and_truncated_archive(tmp_path: Path) -> None:
    arc = pack_bundle(STALL, tmp_path / "s.tar.zst")
    data = arc.read_bytes()
    bads = (b"", b"garbage" * 10, data[: len(data) // 2], data[:-7], b"\x28\xb5\x2f\xfd" + data[4:40])
    for i, bad in enumerate(bads):
        p = tmp_path / f"bad{i}.tar.zst"
        p.write_bytes(bad)
        with pytest.raises(BundleError):
            unpack_bundle(p, tmp_path / f"out{i}")
        assert list((tmp_path / f"out{i}").iterdir()) == []


def test_zstd_bomb_is_capped(tmp_path: Path) -> None:
    """A tiny archive whose tar headers decompress to 64 MB is refused once past what the manifest allows."""
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        info, data = reg("evil/manifest.json", _manifest({}))
        info.pax_headers = {"comment": "A" * (64 << 20)}
        tar.addfile(info, io.BytesIO(data))
    arc = tmp_path / "bomb.tar.zst"
    arc.write_bytes(zstandard.ZstdCompressor(level=3).compress(raw.getvalue()))
    assert arc.stat().st_size < 1 << 20
    with pytest.raises(BundleError, match="decompresses to more"):
        unpack_bundle(arc, tmp_path / "into")


def test_cli_unpack_refuses_hostile_archive_without_traceback(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    arc = tmp_path / "evil.tar.zst"
    arc.write_bytes(make_tar(_hostile_cases()["symlink"]))
    rc = run_cli(["bundle", "unpack", str(arc), "--into", str(tmp_path / "into")], monkeypatch)
    err = capsys.readouterr().err
    assert rc == 2 and "link" in err and "Traceback" not in err
    assert list((tmp_path / "into").iterdir()) == []


def test_cli_bundle_commands(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                             capsys: pytest.CaptureFixture[str]) -> None:
    """ls/show/verify/pack/unpack over $SGLSEAT_HOME/bundles/<seat>/<id>/."""
    home = tmp_path / "home"
    monkeypatch.setenv("SGLSEAT_HOME", str(home))
    seat = json.loads((STALL / "manifest.json").read_text())["seat"]
    shutil.copytree(STALL, home / "bundles" / seat / "stall")
    (home / "bundles" / seat / "damaged").mkdir()
    (home / "bundles" / seat / "damaged" / "manifest.json").write_text("{")
    assert run_cli(["bundle", "ls", "--json"], monkeypatch) == 0
    items = json.loads(capsys.readouterr().out)
    assert {i["id"] for i in items} == {"stall", "damaged"}
    stall = next(i for i in items if i["id"] == "stall")
    assert stall["seat"] == seat and stall["verdict"]["rank"] == 3 and stall["created"] > 0
    assert stall["path"].endswith(f"bundles/{seat}/stall")
    assert next(i for i in items if i["id"] == "damaged")["error"]
    assert run_cli(["bundle", "ls"], monkeypatch) == 0
    assert "row-fetch stall" in capsys.readouterr().out
    assert run_cli(["bundle", "verify", "stall"], monkeypatch) == 0
    assert run_cli(["bundle", "show", "stall"], monkeypatch) == 0
    assert "probe.jsonl" in capsys.readouterr().out
    assert run_cli(["bundle", "show", "stall", "--json"], monkeypatch) == 0
    assert json.loads(capsys.readouterr().out)["bundle_id"] == "stall"
    arc = tmp_path / "s.tar.zst"
    assert run_cli(["bundle", "pack", "stall", "-o", str(arc)], monkeypatch) == 0
    assert run_cli(["bundle", "verify", str(arc)], monkeypatch) == 0
    assert run_cli(["bundle", "unpack", str(arc), "--into", str(tmp_path / "u")], monkeypatch) == 0
    assert _tree(tmp_path / "u" / "stall") == _tree(STALL)
    capsys.readouterr()
    assert run_cli(["bundle", "verify", "damaged"], monkeypatch) == 2
    assert run_cli(["bundle", "show", "no-such-bundle"], monkeypatch) == 2
    err = capsys.readouterr().err
    assert "Traceback" not in err and "no bundle at no-such-bundle" in err


# -- the absolute cap (issue 24 item 5) ----------------------------------------------------------------------------

BIG_CLAIM = 3_000_000_000
FILLER = b"\0" * (16 << 20)  # really in the archive, right after the manifest: 16 MiB of zeros, a few KB packed


def _claims_3gb() -> tuple[bytes, int]:
    """A small, self-consistent hostile archive: the manifest lists a real 16 MiB file and one of 3 GB (absent)."""
    man = json.loads(_manifest({"filler.jsonl": FILLER}))
    man["files"]["huge.jsonl"] = {"size": BIG_CLAIM, "sha256": "0" * 64}
    data = json.dumps(man).encode()
    return make_tar([reg("evil/manifest.json", data), reg("evil/filler.jsonl", FILLER)]), len(data) + len(FILLER) \
        + BIG_CLAIM


class _Spy:
    """Records every capped decompressed stream the unpacker opens, to read how far it decompressed."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        from sgl_seat.forensics.format import archive

        self.readers: list[Any] = []
        spy = self

        class Recording(archive._CappedReader):
            def __init__(self, *a: Any, **kw: Any) -> None:
                super().__init__(*a, **kw)
                spy.readers.append(self)

        monkeypatch.setattr(archive, "_CappedReader", Recording)

    @property
    def seen(self) -> int:
        return sum(r.seen for r in self.readers)


def test_archive_claiming_3gb_is_refused_before_a_byte_is_written(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN an archive of a few KB whose manifest claims 3 GB WHEN unpacked with the default cap (2 GiB) THEN an
    ArchiveLimitError says what it claims and how to allow it, nothing is written under the target, and nothing
    past the manifest was decompressed (the 16 MiB member right after it was never read)."""
    from sgl_seat.errors import ArchiveLimitError

    tar, claimed = _claims_3gb()
    arc = tmp_path / "evil.tar.zst"
    arc.write_bytes(tar)
    assert arc.stat().st_size < 64 << 10
    into = tmp_path / "into"
    spy = _Spy(monkeypatch)
    t0 = time.monotonic()
    with pytest.raises(ArchiveLimitError) as exc:
        unpack_bundle(arc, into)
    assert time.monotonic() - t0 < 5  # loose: the real check is the byte count below
    msg = str(exc.value)
    assert f"claims it unpacks to {claimed:,} bytes" in msg and "2,147,483,648 bytes" in msg
    assert f"--max-unpacked-bytes {claimed}" in msg and "nothing was written" in msg
    assert list(into.iterdir()) == []
    assert 0 < spy.seen < 2 << 20, spy.seen  # the manifest and one read-ahead buffer, not the 16 MiB filler


def test_the_spy_sees_decompression_once_the_cap_allows_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN the same archive WHEN the cap is raised above its claim THEN it gets past the cap, decompresses the
    16 MiB member (so the byte count above can tell) and is then refused for its missing 3 GB file, leaving
    nothing behind."""
    tar, claimed = _claims_3gb()
    arc = tmp_path / "evil.tar.zst"
    arc.write_bytes(tar)
    spy = _Spy(monkeypatch)
    with pytest.raises(BundleError, match="missing 1 listed file") as exc:
        unpack_bundle(arc, tmp_path / "into", max_unpacked_bytes=claimed)
    assert "ArchiveLimitError" not in type(exc.value).__name__
    assert spy.seen > len(FILLER)
    assert list((tmp_path / "into").iterdir()) == []


def test_cap_is_inclusive_and_counts_the_manifest(tmp_path: Path) -> None:
    """GIVEN the stall fixture packed WHEN unpacked with a cap of exactly its bytes (manifest included) THEN it
    unpacks; one byte less is refused, and the target holds nothing."""
    from sgl_seat.errors import ArchiveLimitError

    arc = pack_bundle(STALL, tmp_path / "stall.tar.zst")
    exact = sum(f.stat().st_size for f in STALL.rglob("*") if f.is_file())
    with pytest.raises(ArchiveLimitError, match=f"--max-unpacked-bytes {exact} "):
        unpack_bundle(arc, tmp_path / "small", max_unpacked_bytes=exact - 1)
    assert list((tmp_path / "small").iterdir()) == []
    assert _tree(unpack_bundle(arc, tmp_path / "ok", max_unpacked_bytes=exact)) == _tree(STALL)


def test_stream_past_its_claim_stops_and_removes_what_was_written(tmp_path: Path) -> None:
    """GIVEN an archive whose first listed file is honest and whose next tar header decompresses to 64 MB (more
    than the manifest accounts for) WHEN unpacked THEN it is refused at the stream's cap and the file already
    written is removed with the rest."""
    raw = io.BytesIO()
    files = {"metrics.jsonl": GOOD, "logs.jsonl": GOOD}
    with tarfile.open(fileobj=raw, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in (("manifest.json", _manifest(files)), ("metrics.jsonl", GOOD)):
            info, payload = reg(f"evil/{name}", data)
            tar.addfile(info, io.BytesIO(payload))
        info, payload = reg("evil/logs.jsonl", GOOD)
        info.pax_headers = {"comment": "A" * (64 << 20)}
        tar.addfile(info, io.BytesIO(payload))
    arc = tmp_path / "bomb.tar.zst"
    arc.write_bytes(zstandard.ZstdCompressor(level=3).compress(raw.getvalue()))
    into = tmp_path / "into"
    with pytest.raises(BundleError, match="decompresses to more"):
        unpack_bundle(arc, into)
    assert list(into.iterdir()) == []


def test_cli_unpack_and_replay_refuse_the_3gb_claim_and_take_the_flag(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                                       capsys: pytest.CaptureFixture[str]) -> None:
    """GIVEN the 3 GB-claim archive WHEN `bundle unpack` or `replay` opens it THEN exit 2, the message names the
    claim and the flag, no traceback, nothing written; GIVEN an honest archive and a cap below it THEN refused,
    and --max-unpacked-bytes raised THEN accepted."""
    monkeypatch.setenv("SGLSEAT_HOME", str(tmp_path / "home"))
    tar, claimed = _claims_3gb()
    arc = tmp_path / "evil.tar.zst"
    arc.write_bytes(tar)
    for argv in (["bundle", "unpack", str(arc), "--into", str(tmp_path / "into")], ["replay", str(arc)],
                 ["bundle", "verify", str(arc)]):
        assert run_cli(argv, monkeypatch) == 2, argv
        err = capsys.readouterr().err
        assert f"{claimed:,} bytes" in err and "--max-unpacked-bytes" in err and "Traceback" not in err
    assert list((tmp_path / "into").iterdir()) == []
    ok = pack_bundle(STALL, tmp_path / "stall.tar.zst")
    assert run_cli(["replay", str(ok), "--max-unpacked-bytes", "1000", "--json"], monkeypatch) == 2
    assert "over the cap of 1,000 bytes" in capsys.readouterr().err
    assert run_cli(["replay", str(ok), "--max-unpacked-bytes", str(4 << 30), "--json"], monkeypatch) == 0
    assert json.loads(capsys.readouterr().out)
    assert run_cli(["bundle", "unpack", str(ok), "--into", str(tmp_path / "u"), "--max-unpacked-bytes", "1000"],
                   monkeypatch) == 2
    assert run_cli(["bundle", "unpack", str(ok), "--into", str(tmp_path / "u"), "--max-unpacked-bytes",
                    str(4 << 30)], monkeypatch) == 0
    assert _tree(tmp_path / "u" / "stall") == _tree(STALL)
