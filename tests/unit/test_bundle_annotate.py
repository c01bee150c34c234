"""forensics.annotate: a complete bundle gains its remediation in the manifest, and nothing else changes."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from sgl_seat.errors import BundleError
from sgl_seat.forensics.format.annotate import annotate
from sgl_seat.forensics.format.bundle import read_bundle, verify_bundle, write_bundle
from tests.unit.test_bundle_format import SCHEMA, _fields, _files

jsonschema = pytest.importorskip("jsonschema")

REMEDIATION = {"action": "rollback-draft", "started": 1000.5, "engines_stopped": 1002.0, "serving_again": 1011.25,
               "outcome": "serving"}


def test_an_annotated_bundle_verifies_reads_the_same_records_and_carries_the_remediation(tmp_path: Path) -> None:
    path = write_bundle(tmp_path, "b1", _fields(), _files(), quota_mb=100)
    before = read_bundle(path)
    files_before = {p.name: p.read_bytes() for p in path.rglob("*") if p.is_file() and p.name != "manifest.json"}
    m = annotate(path, "remediation", REMEDIATION)
    assert m.extra["remediation"] == REMEDIATION
    assert verify_bundle(path).extra["remediation"] == REMEDIATION
    after = read_bundle(path)
    assert after.stacks == before.stacks and after.manifest.files == before.manifest.files
    assert {p.name: p.read_bytes() for p in path.rglob("*") if p.is_file() and p.name != "manifest.json"} \
        == files_before
    jsonschema.validate(json.loads((path / "manifest.json").read_text()), SCHEMA)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["b1"]  # no temporary file left beside it
    annotate(path, "remediation", {**REMEDIATION, "outcome": "failed"})  # a later step replaces it
    assert verify_bundle(path).extra["remediation"]["outcome"] == "failed"


def test_only_a_named_key_and_only_an_undamaged_bundle(tmp_path: Path) -> None:
    path = write_bundle(tmp_path, "b1", _fields(), _files(), quota_mb=100)
    with pytest.raises(BundleError, match="not a key"):
        annotate(path, "verdict", {"kind": "forged"})
    victim = next(p for p in path.rglob("*") if p.is_file() and p.name != "manifest.json")
    victim.write_bytes(victim.read_bytes() + b"x")
    manifest = (path / "manifest.json").read_bytes()
    with pytest.raises(BundleError):
        annotate(path, "remediation", REMEDIATION)
    assert (path / "manifest.json").read_bytes() == manifest
