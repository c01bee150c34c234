"""A ring its process is still creating (empty, or zero-filled before the magic that goes last) or one removed as
the process exits is not a read error: the soak counted such races at seat restarts as ring read errors.
A file that is a ring of nothing this reader knows still is one."""

from __future__ import annotations

import os
from pathlib import Path

from sgl_seat import probe
from sgl_seat.watchdog.sources import ProbeReader


def test_rings_being_created_are_skipped_and_garbage_is_an_error(tmp_path: Path) -> None:
    d = str(tmp_path)
    Path(probe.ring_path(d, 101)).write_bytes(b"")  # O_CREAT done, ftruncate not yet
    Path(probe.ring_path(d, 102)).write_bytes(bytes(probe.HEADER_BYTES + 4096))  # sized, magic not yet written
    reader = ProbeReader(d, node=0)
    assert reader.read({101: 0, 102: 1}, now=0.0) == []
    assert reader.errors == 0
    Path(probe.ring_path(d, 103)).write_bytes(b"NOTARING" + bytes(probe.HEADER_BYTES + 4096))
    assert reader.read({103: 2}, now=0.0) == []
    assert reader.errors == 1


def test_a_ring_removed_between_listing_and_reading_is_no_error(tmp_path: Path, monkeypatch) -> None:  # type: ignore[no-untyped-def]
    d = str(tmp_path)
    path = probe.ring_path(d, 104)
    monkeypatch.setattr(probe, "list_rings", lambda directory: {104: path})  # listed, then gone at exit
    assert not os.path.exists(path)
    reader = ProbeReader(d, node=0)
    assert reader.read({104: 0}, now=0.0) == []
    assert reader.errors == 0
