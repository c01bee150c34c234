"""The offline engine package: its trim rules, its manifest, and the host's layout step reading it back.

Why: the package is what an air-gapped GPU host gets instead of a registry, so what it leaves out must be exactly
what the rules say (a rule that matches nothing fails the build: the wheels moved a file), every file must be
checked on the host before anything imports it, and a part damaged in transit must stop the layout, not the engine.
The registry is the seam: ``pip_fetch`` and ``pip_layout`` are replaced by a synthetic site here (the real build,
from registry wheels, is `sgl-seat engine pack --target h200-sglang-0.5.17`; docs/gpu-validation.md gives its size).
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from sgl_seat.engines.offline import hostlayout, pack
from sgl_seat.engines.offline.packtargets import TARGETS, PackTarget, TrimRule
from sgl_seat.errors import UsageError

H200 = TARGETS["h200-sglang-0.5.17"]

#: Files of the real wheels the seat needs at run time (sglang-gpu.md: the EAGLE v2 worker imports flashmla_ops and
#: deep_gemm's _C.so when it captures the draft-extend graph; sm90's common_ops are Hopper's kernels).
NEEDED = ("sgl_kernel/sm90/common_ops.abi3.so", "sgl_kernel/flashmla_ops.abi3.so", "deep_gemm/_C.so",
          "sgl_kernel/__init__.py", "sglang/srt/entrypoints/http_server.py", "xgrammar/libxgrammar_bindings.so",
          "flashinfer/__init__.py", "sglang/srt/server_args.py", "tokenizers/tokenizers.abi3.so")
#: Files the lean package leaves out, one per rule.
LEFT_OUT = ("sgl_kernel/flash_ops.abi3.so", "sgl_kernel/sm100/common_ops.abi3.so",
            "sgl_kernel/infllm_ops.cpython-310-x86_64-linux-gnu.so", "xgrammar/lib/libxgrammar.a",
            "sglang/multimodal_gen/runtime/x.py", "sglang/test/test_utils.py",
            "sglang/srt/grpc/_core.cpython-312-x86_64-linux-gnu.so", "deep_gemm/include/deep_gemm/x.cuh",
            "flashinfer/data/cutlass/include/cutlass/x.h", "flashinfer/data/cccl/cub/x.cuh")


def _site(root: Path, names: tuple[str, ...]) -> Path:
    for i, rel in enumerate(names):
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(f"{rel} {i}\n".encode() * (i + 1))
    return root


def test_the_h200_rules_leave_out_what_they_say_and_keep_what_the_seat_loads(tmp_path: Path) -> None:
    site = _site(tmp_path / "site", NEEDED + LEFT_OUT)
    left = pack.trim(site, H200.trim)
    assert [x.pattern for x in left] == [r.pattern for r in H200.trim]
    assert all(x.files == 1 and x.bytes > 0 and x.reason for x in left), left
    assert sorted(p.relative_to(site).as_posix() for p in site.rglob("*") if p.is_file()) == sorted(NEEDED)


def test_a_rule_that_matches_nothing_fails_the_build(tmp_path: Path) -> None:
    site = _site(tmp_path / "site", NEEDED)
    with pytest.raises(UsageError, match=r"flash_ops.*matches nothing"):
        pack.trim(site, H200.trim)


def test_every_h200_pin_is_exact_and_names_the_engine_the_target_says() -> None:
    assert len(H200.pins) == len({p.split("==")[0] for p in H200.pins}) == 41
    assert all("==" in p for p in H200.pins)
    assert "sglang==0.5.17" in H200.pins and "sglang-kernel==0.4.5" in H200.pins
    assert H200.python == "3.12" and "manylinux_2_34_x86_64" in H200.platforms


def _target(tmp_path: Path, check: str) -> PackTarget:
    return PackTarget(name="unit", description="a synthetic target", python="3.12", platforms=("linux_x86_64",),
                      pins=("a==1", "b==2"), trim=(TrimRule("big", "not loaded"),), check=check,
                      env={"PYTHONPATH": "{site}", "UNIT_CACHE_DIR": "{site}/../cache"})


def _fake_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    def layout(t: PackTarget, wheels: Path, site: Path) -> None:
        _site(site, ("a/__init__.py", "a-1.dist-info/METADATA", "b/data.bin", "b-2.dist-info/METADATA", "big/x.so"))
        (site / "b" / "data.bin").write_bytes(DATA)  # incompressible: the archive splits into parts
        (site / "a" / "__init__.py").write_text("VALUE = 42\n")

    monkeypatch.setattr(pack, "pip_fetch", lambda t, wheels, say: None)
    monkeypatch.setattr(pack, "pip_layout", layout)


DATA = b"".join(hashlib.sha256(str(i).encode()).digest() for i in range(2000))
CHECK = "import json, a; print(json.dumps({'value': a.VALUE}))"


def test_pack_writes_a_manifest_of_every_file_and_parts_the_host_joins(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_registry(monkeypatch)
    res = pack.pack(_target(tmp_path, CHECK), tmp_path / "pkg", cache=tmp_path / "cache", part_bytes=4096)
    doc = json.loads((tmp_path / "pkg" / pack.MANIFEST).read_text())
    assert doc["schema_version"] == 1 and doc["kind"] == "sgl-seat-engine-package" and doc["target"] == "unit"
    assert set(doc["files"]) == {"a/__init__.py", "a-1.dist-info/METADATA", "b/data.bin", "b-2.dist-info/METADATA"}
    assert doc["versions"] == {"a": "1", "b": "2"}
    assert doc["left_out"] == [{"pattern": "big", "reason": "not loaded", "files": 1, "bytes": 55}]
    assert doc["files"]["a/__init__.py"] == {"sha256": hashlib.sha256(b"VALUE = 42\n").hexdigest(), "size": 11}
    assert len(res.parts) >= 2 and all(p["size"] <= 4096 for p in res.parts)
    assert sum(p["size"] for p in res.parts) == doc["archive"]["size"] == res.archive_bytes
    assert not (tmp_path / "pkg" / res.archive).exists()  # only its parts travel
    assert (tmp_path / "pkg" / "hostlayout.py").read_text() == Path(hostlayout.__file__).read_text()

    dest = tmp_path / "host"
    assert hostlayout.main([str(tmp_path / "pkg"), str(dest), "--python", sys.executable, "--json"]) == 0
    assert (dest / "site" / "b" / "data.bin").read_bytes() == DATA
    assert not (dest / "site" / "big").exists()
    env = (dest / "env.sh").read_text()
    assert f'export PYTHONPATH="{(dest / "site").resolve()}"' in env
    # DEST/bin/python stands in for an engine environment's interpreter: the package importable, a caller's
    # PYTHONPATH (the seat's probe boot directory) still first.
    first = tmp_path / "boot"
    first.mkdir()
    out = subprocess.run([str(dest / "bin" / "python"), "-c", "import a, sys; print(a.VALUE, sys.path[1])"],
                         env={"PATH": os.environ["PATH"], "PYTHONPATH": str(first)}, capture_output=True, text=True,
                         timeout=60, check=True).stdout.split()
    assert out == ["42", str(first)]


def test_the_host_step_runs_the_targets_check_and_reports_it(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    _fake_registry(monkeypatch)
    pack.pack(_target(tmp_path, CHECK), tmp_path / "pkg", cache=tmp_path / "cache")
    capsys.readouterr()
    assert hostlayout.main([str(tmp_path / "pkg"), str(tmp_path / "host"), "--python", sys.executable, "--json"]) == 0
    report = json.loads(capsys.readouterr().out)
    assert report["check"] == {"value": 42} and report["target"] == "unit"
    assert (tmp_path / "host" / "cache").is_dir()  # a *_DIR the target names is made for it


@pytest.mark.parametrize(("damage", "said"), [
    ("part", "damaged in transit"),
    ("manifest-version", "schema_version 2"),
    ("check", "the target's check failed"),
])
def test_the_host_step_refuses_a_damaged_or_foreign_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                            capsys: pytest.CaptureFixture[str], damage: str,
                                                            said: str) -> None:
    _fake_registry(monkeypatch)
    check = "import sys; sys.exit('no CUDA')" if damage == "check" else CHECK
    res = pack.pack(_target(tmp_path, check), tmp_path / "pkg", cache=tmp_path / "cache", part_bytes=4096)
    manifest = tmp_path / "pkg" / pack.MANIFEST
    if damage == "part":
        p = tmp_path / "pkg" / res.parts[1]["name"]
        p.write_bytes(b"x" + p.read_bytes()[1:])
    elif damage == "manifest-version":
        manifest.write_text(manifest.read_text().replace('"schema_version": 1', '"schema_version": 2'))
    capsys.readouterr()
    assert hostlayout.main([str(tmp_path / "pkg"), str(tmp_path / "host"), "--python", sys.executable, "--json"]) == 1
    out = json.loads(capsys.readouterr().out)
    assert said in out["error"], out
    if damage != "check":
        assert not (tmp_path / "host" / "site").exists()  # nothing unpacked from a package that failed its checks


def test_the_seat_package_shares_the_engine_packages_versions_and_carries_sgl_seat() -> None:
    seat = TARGETS["h200-seat-py312"]
    engine = {p.split("==")[0]: p for p in H200.pins}
    shared = [p for p in seat.pins if p.split("==")[0] in engine]
    assert len(shared) >= 10 and all(engine[p.split("==")[0]] == p for p in shared), shared
    assert any(p.startswith("ray==") for p in seat.pins) and seat.from_checkout and not H200.from_checkout
    assert len(seat.pins) == len({p.split("==")[0] for p in seat.pins})
    assert "ray.init(" in seat.check and "import sglang" in H200.check


def test_a_target_built_from_the_checkout_lays_out_its_own_wheel(tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """The seat's target carries sgl-seat itself: its wheel is built from this checkout and counted with the pins."""
    seen: list[list[str]] = []
    monkeypatch.setattr(pack, "_run", lambda argv: seen.append(argv))
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    for name in ("a-1-py3-none-any.whl", "sgl_seat-0.1.0-py3-none-any.whl"):
        (wheels / name).write_bytes(b"")
    t = PackTarget(name="unit", description="", python="3.12", platforms=("linux_x86_64",), pins=("a==1",),
                   from_checkout=True)
    pack.pip_layout(t, wheels, tmp_path / "site")
    assert sorted(Path(a).name for a in seen[-1] if a.endswith(".whl")) == ["a-1-py3-none-any.whl",
                                                                           "sgl_seat-0.1.0-py3-none-any.whl"]
    (wheels / "sgl_seat-0.1.0-py3-none-any.whl").unlink()
    with pytest.raises(UsageError, match="1 wheels found"):
        pack.pip_layout(t, wheels, tmp_path / "site")


def test_pack_never_empties_a_directory_that_is_not_a_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    _fake_registry(monkeypatch)
    keep = tmp_path / "work"
    keep.mkdir()
    (keep / "notes.txt").write_text("mine")
    with pytest.raises(UsageError, match="not empty and holds no engine package"):
        pack.pack(_target(tmp_path, CHECK), keep, cache=tmp_path / "cache")
    assert (keep / "notes.txt").read_text() == "mine"
    pack.pack(_target(tmp_path, CHECK), tmp_path / "pkg", cache=tmp_path / "cache")
    pack.pack(_target(tmp_path, CHECK), tmp_path / "pkg", cache=tmp_path / "cache")  # an earlier package: replaced
    assert (tmp_path / "pkg" / pack.MANIFEST).is_file()
