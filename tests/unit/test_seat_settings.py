"""The seat carries its settings (issue 47, item 2): `up` records the spec it resolved in the seat record, and what
runs after `up` (sidecars, the supervisor's decision and its draft-off plan, `prometheus-config`) reads the record,
never the seat file again. Before, each of them called ``load_spec(rec.spec_source)``: an edit of ``seat.yaml``
while the seat ran changed what a healing restart or a restarted sidecar used, silently."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest
import yaml

from sgl_seat.errors import SeatStateError, SpecError
from sgl_seat.launch.actors.supervisor import Supervisor, SupervisorConfig
from sgl_seat.launch.seatrecord.home import HOME_ENV
from sgl_seat.launch.seatrecord.record import (
    RECORD_SCHEMA_VERSION,
    NodeRecord,
    SeatRecord,
    load_record,
    record_path,
    save_record,
)
from sgl_seat.launch.seatrecord.state import SeatState
from sgl_seat.launch.sidecars import context_of, prometheus_config_of
from sgl_seat.spec import SeatSpec, builtin_profiles, builtin_seats_dir, load_spec
from sgl_seat.watchdog import actors

NODE0 = "198.18.0.1"


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv(HOME_ENV, str(tmp_path / "home"))
    return tmp_path / "home"


def _seat_file(tmp_path: Path, **sections: dict[str, Any]) -> Path:
    """local-sim as a file of its own (its planning config by absolute path), ``sections`` merged in."""
    doc: dict[str, Any] = yaml.safe_load((builtin_seats_dir() / "local-sim.yaml").read_text())
    doc["name"] = "kept"
    doc["model"]["config"] = str((builtin_seats_dir() / doc["model"]["config"]).resolve())
    for section, keys in sections.items():
        doc.setdefault(section, {}).update(keys)
    path = tmp_path / "seat.yaml"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


def _edit(path: Path, **sections: dict[str, Any]) -> None:
    doc = yaml.safe_load(path.read_text())
    for section, keys in sections.items():
        doc.setdefault(section, {}).update(keys)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))


def _record(spec: SeatSpec, *, keep_spec: bool = True) -> SeatRecord:
    """The record `up` writes (``keep_spec`` False: as an sgl-seat before schema 3 wrote it, without the spec)."""
    return SeatRecord(name=spec.name, state=SeatState.READY, engine=spec.engine, draft=True, cluster_address="local",
                      namespace="ns", pg_name="pg", spec_source=spec.source,
                      spec=spec.to_json() if keep_spec else None, endpoint=f"http://{NODE0}:31000",
                      plan={"engine": "sim", "http_port": 31000, "slots": 8, "nodes": []},
                      nodes=[NodeRecord(node_rank=0, agent="a0", ip=NODE0)])


@pytest.mark.parametrize("profile", builtin_profiles())
def test_every_shipped_profile_round_trips_through_the_record_exactly(profile: str) -> None:
    """GIVEN a shipped profile, as `up` resolves it (ports moved by --port-base) WHEN recorded, saved as JSON and
    loaded THEN the spec rebuilt from the record is equal to it, field by field (those left out of model_dump too),
    and its JSON is the same."""
    spec = load_spec(profile).with_port_base(43456)
    save_record(_record(spec))
    back = load_record(spec.name).seat_spec()
    assert back == spec and back is not None
    assert back.to_json() == spec.to_json() and back.source == spec.source
    assert json.loads(json.dumps(spec.to_json())) == spec.to_json()  # plain JSON data: no pickle, nothing lost


def test_the_settings_model_dump_leaves_out_are_recorded_too(tmp_path: Path) -> None:
    """GIVEN a spec whose on_hang and remediation budget differ from the defaults (model_dump leaves both out, so that
    a bundle's thresholds stay detector thresholds) THEN the record keeps them, and its rebuilt spec has them."""
    path = _seat_file(tmp_path, watchdog={"on_hang": "rollback-draft", "remediation": {"max": 2, "cooldown_s": 7,
                                                                                      "draft_gather_max": 99}})
    spec = load_spec(str(path))
    assert "on_hang" not in spec.model_dump()["watchdog"]
    save_record(_record(spec))
    back = load_record("kept").seat_spec()
    assert back is not None and back.watchdog.on_hang == "rollback-draft"
    assert (back.watchdog.remediation.max, back.watchdog.remediation.cooldown_s,
            back.watchdog.remediation.draft_gather_max) == (2, 7.0, 99)


def test_an_edit_of_the_seat_file_after_up_changes_nothing_the_seat_reads(tmp_path: Path,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """GIVEN a seat recorded with rowfetch_inflight_s 3, draft tokens 4 and exporter_bind cluster WHEN its file is
    edited (2.0 s, 6 tokens, loopback) and then removed THEN the sidecars' settings, the supervisor's draft shape and
    the scrape config are still those recorded at `up` (before issue 47 each read the edited file, or failed)."""
    path = _seat_file(tmp_path, watchdog={"rowfetch_inflight_s": 3.0, "exporter_bind": "cluster"})
    spec = load_spec(str(path))
    save_record(_record(spec))
    _edit(path, watchdog={"rowfetch_inflight_s": 2.0, "exporter_bind": "loopback"},
          draft={"steps": 5, "draft_tokens": 6})
    assert load_spec(str(path)).draft.draft_tokens == 6  # the edit is a valid spec: the file would be read
    rec = load_record("kept")

    ctx = context_of(rec)
    assert ctx.spec == spec
    # the sidecars' configs (Ray left out: no agent answers, no head address)
    import ray

    def no_actor(*a: Any, **k: Any) -> Any:
        raise ValueError("no such actor")

    monkeypatch.setattr(ray, "get_actor", no_actor)
    monkeypatch.setattr(ray, "get_runtime_context", no_actor)
    ctx = context_of(_with_plan(rec))
    (cfg,) = actors.configs_of(ctx)
    assert cfg.watchdog.rowfetch_inflight_s == 3.0 and cfg.exporter_addr == NODE0
    assert cfg.thresholds == spec.watchdog.model_dump()

    shape = Supervisor(SupervisorConfig(seat="kept", home=str(tmp_path / "home")))._draft_shape(rec)
    assert (shape.slots, shape.draft_tokens) == (8, 4)
    assert prometheus_config_of(rec).targets[0][1].startswith(NODE0)  # exporter_bind cluster, as recorded

    path.unlink()  # nothing reads the file any more
    assert load_record("kept").seat_spec() == spec


def _with_plan(rec: SeatRecord) -> SeatRecord:
    """``rec`` with a one-node filled plan of the sim (what configs_of reads of it)."""
    plan = {"engine": "sim", "http_port": 31000, "slots": 8, "nodes": [
        {"node_rank": 0, "env": {}, "ranks": [{"tp_rank": 0}],
         "command": ["python", "-m", "sglang.launch_server", "--host", "127.0.0.1", "--port", "31000"]}]}
    rec.plan = plan
    return rec


def test_a_record_written_before_the_spec_was_kept_reads_the_file_with_a_warning(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """GIVEN a schema-2 record (no ``spec``: an older sgl-seat's `up`) WHEN loaded THEN it loads; its spec is the file
    read again, as it is now, with a warning that says so; saved back it is schema 3, still without a spec (what the
    file held at `up` is not known)."""
    path = _seat_file(tmp_path, draft={"steps": 3, "draft_tokens": 4})
    save_record(_record(load_spec(str(path)), keep_spec=False))
    doc = json.loads(record_path("kept").read_text())
    del doc["spec"]
    doc["schema_version"] = 2
    record_path("kept").write_text(json.dumps(doc))
    _edit(path, draft={"steps": 5, "draft_tokens": 6})
    rec = load_record("kept")
    with caplog.at_level(logging.WARNING):
        spec = rec.seat_spec()
    assert spec is not None and spec.draft.draft_tokens == 6
    assert "holds no spec" in caplog.text and str(path) in caplog.text
    save_record(rec)
    doc = json.loads(record_path("kept").read_text())
    assert doc["schema_version"] == RECORD_SCHEMA_VERSION == 3 and doc["spec"] is None


@pytest.mark.parametrize("damage", [{"slots": 0}, {"source": "/elsewhere.yaml"}, {"warp": 9}])
def test_a_damaged_recorded_spec_is_found_on_load(tmp_path: Path, damage: dict[str, Any]) -> None:
    """A recorded spec is validated again, as a file is: a damaged one fails the record's load, naming it."""
    save_record(_record(load_spec(str(_seat_file(tmp_path)))))
    doc = json.loads(record_path("kept").read_text())
    doc["spec"].update(damage)
    record_path("kept").write_text(json.dumps(doc))
    with pytest.raises(SeatStateError, match="damaged seat record \\(its spec"):
        load_record("kept")
    with pytest.raises(SpecError):
        SeatSpec.from_json(doc["spec"])
