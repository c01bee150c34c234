"""One encoding of a bundle's records into files (forensics.encode.encode_bundle), used by the live capture and
by the golden-fixture builder: reading a golden bundle and encoding its records again gives its files back,
byte for byte, so a fixture is encoded exactly as a live bundle is."""

from __future__ import annotations

from pathlib import Path

import pytest

from sgl_seat.forensics import encode_bundle, read_bundle
from sgl_seat.forensics.format import layout

BUNDLES = Path(__file__).resolve().parents[1] / "fixtures" / "bundles"


@pytest.mark.parametrize("name", ["stall", "crash"])
def test_a_golden_bundle_encodes_back_to_its_own_files(name: str) -> None:
    src = BUNDLES / name
    b = read_bundle(src)
    files = encode_bundle(
        stacks=b.stacks, native_stacks=b.native_stacks, probes=b.probes, metrics=b.metrics, processes=b.processes,
        logs=b.logs, env=b.env, requests=b.requests if layout.REQUESTS in b.manifest.files else None,
        log_text=b.log_text, process_state=b.process_state, gpu=b.gpu)
    on_disk = {str(p.relative_to(src)): p.read_bytes() for p in src.rglob("*") if p.is_file()}
    on_disk.pop(layout.MANIFEST)
    assert sorted(files) == sorted(on_disk) == sorted(b.manifest.files)
    for fname, data in files.items():
        assert data == on_disk[fname], fname


def test_no_request_log_means_no_requests_file_and_an_empty_one_means_an_empty_file() -> None:
    base = {"stacks": [], "native_stacks": [], "probes": [], "metrics": [], "processes": [], "logs": [], "env": {}}
    assert layout.REQUESTS not in encode_bundle(**base)  # type: ignore[arg-type]
    assert encode_bundle(**base, requests=[])[layout.REQUESTS] == b""  # type: ignore[arg-type]
    per_node = encode_bundle(**base, log_text={1: "x\n"}, process_state={1: {}}, gpu={})  # type: ignore[arg-type]
    assert {layout.log_file(1), layout.process_state_file(1)} <= set(per_node)
    assert layout.gpu_file(1) not in per_node
