"""The sizing cache returns SGLang's earlier answer only for the very same inputs, and starts no child then."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from sgl_seat.sizing import SGLANG_VERSION, SizingCase
from sgl_seat.sizing import ask_sglang as sizing_sglang
from sgl_seat.sizing import cache as sizing_cache


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SGLSEAT_HOME", str(tmp_path / "home"))
    monkeypatch.delenv(sizing_cache.CACHE_ENV, raising=False)
    for k in [k for k in os.environ if k.startswith("SGLANG_")]:
        monkeypatch.delenv(k)
    return tmp_path / "home"


def _model(tmp_path: Path, cfg: dict[str, Any]) -> Path:
    d = tmp_path / "model"
    d.mkdir(exist_ok=True)
    (d / "config.json").write_text(json.dumps(cfg))
    return d


def _case(model_dir: Path, *, slots: int = 8, case_id: str = "draft-off") -> SizingCase:
    return SizingCase(case_id=case_id, argv=("--model-path", str(model_dir), "--max-running-requests", str(slots)),
                      gpu_memory_bytes=96 << 30, pre_load_bytes=90 << 30, free_after_load_bytes=20 << 30)


def test_key_follows_every_input(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    d = _model(tmp_path, {"model_type": "deepseek_v4", "num_hidden_layers": 43})
    base = sizing_cache.case_key(_case(d).to_json(), fingerprint="f1")
    assert sizing_cache.case_key(_case(d, case_id="other").to_json(), fingerprint="f1") == base  # id is a label
    assert sizing_cache.case_key(_case(d, slots=9).to_json(), fingerprint="f1") != base
    assert sizing_cache.case_key(_case(d).to_json(), fingerprint="f2") != base
    moved = tmp_path / "elsewhere"
    d.rename(moved)
    assert sizing_cache.case_key(_case(moved).to_json(), fingerprint="f1") == base  # content, not the path
    (moved / "config.json").write_text(json.dumps({"model_type": "deepseek_v4", "num_hidden_layers": 44}))
    assert sizing_cache.case_key(_case(moved).to_json(), fingerprint="f1") != base
    (moved / "config.json").write_text(json.dumps({"model_type": "deepseek_v4", "num_hidden_layers": 43}))
    assert sizing_cache.case_key(_case(moved).to_json(), fingerprint="f1") == base
    monkeypatch.setenv("SGLANG_ENABLE_DSV41_ENGRAM_HOST_TABLE", "1")
    assert sizing_cache.case_key(_case(moved).to_json(), fingerprint="f1") != base


def test_store_load_and_off(home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert sizing_cache.load("k") is None
    sizing_cache.store("k", {"ok": True, "max_total_num_tokens": 123}, sglang_version="0.5.23", stubs=["torchvision"])
    got = sizing_cache.load("k")
    assert got is not None and got["result"]["max_total_num_tokens"] == 123 and got["stubs"] == ["torchvision"]
    (home / "cache" / "sizing" / "bad.json").write_text("{not json")
    assert sizing_cache.load("bad") is None
    monkeypatch.setenv(sizing_cache.CACHE_ENV, "off")
    assert sizing_cache.cache_dir() is None and sizing_cache.load("k") is None


class _FakeWorker:
    """Stands in for the SGLang child at its one seam (``ask``): counts what it is asked."""

    def __init__(self) -> None:
        self.asked: list[str] = []
        self.hello = {"sglang_version": SGLANG_VERSION, "stubs": []}

    def ask(self, cases: list[SizingCase], timeout_s: float) -> list[dict[str, Any]]:
        self.asked += [c.case_id for c in cases]
        return [{"id": c.case_id, "ok": True, "max_total_num_tokens": 1000 + len(c.argv[-1])} for c in cases]


def test_size_with_sglang_asks_only_for_misses(home: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    fake = _FakeWorker()
    monkeypatch.setattr(sizing_sglang, "installed_version", lambda: SGLANG_VERSION)
    monkeypatch.setattr(sizing_cache, "sglang_fingerprint", lambda: "fp")
    monkeypatch.setattr(sizing_sglang, "_worker", lambda python=None: fake)
    d = _model(tmp_path, {"model_type": "deepseek_v4"})
    first = sizing_sglang.size_with_sglang([_case(d, slots=8), _case(d, slots=32, case_id="draft-on")])
    assert fake.asked == ["draft-off", "draft-on"] and first.cached == 0
    second = sizing_sglang.size_with_sglang([_case(d, slots=8, case_id="again"), _case(d, slots=64)])
    assert fake.asked == ["draft-off", "draft-on", "draft-off"]  # only the new slot count was asked
    assert second.cached == 1
    assert second.results[0] == {**first.results[0], "id": "again"}
    monkeypatch.setenv(sizing_cache.CACHE_ENV, "off")
    sizing_sglang.size_with_sglang([_case(d, slots=8)])
    assert fake.asked[-1] == "draft-off" and len(fake.asked) == 4
