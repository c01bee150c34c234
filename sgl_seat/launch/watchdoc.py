"""The `watch` document: every sidecar's snapshot, the seat's bundles and its healing, as one plain JSON value.

It reads from the seat's record, the sidecars (named Ray actors, with timeouts) and the bundles on disk;
``sgl_seat.cli.watchview`` draws it and ``cmd_watch`` loops and prints.
"""

from __future__ import annotations

import time
from typing import Any

WATCH_SCHEMA_VERSION = 1


def collect(name: str, *, timeout: float = 10.0, connected: bool = False,
            unreachable: str | None = None) -> dict[str, Any]:
    """One watch document for seat ``name`` (connects to Ray unless ``connected``).

    ``unreachable``: the caller already failed to reach the seat's cluster (this error); the document says so
    and lists the bundles on disk without waiting on the cluster again.
    """
    from sgl_seat.forensics.format.store import bundles_in
    from sgl_seat.launch import cluster
    from sgl_seat.launch.seatrecord.record import bundles_dir_of, load_record
    from sgl_seat.watchdog.actors import snapshots

    rec = load_record(name)
    doc: dict[str, Any] = {"schema_version": WATCH_SCHEMA_VERSION, "seat": rec.name, "t": time.time(),
                           "state": rec.state.value, "endpoint": rec.endpoint, "nodes": [], "error": None}
    if rec.no_watchdog:
        doc["error"] = "the seat was started with --no-watchdog: no sidecars"
    elif not rec.gcs_address:
        doc["error"] = "the seat has no Ray cluster address (not up?)"
    elif unreachable is not None:
        doc["error"] = unreachable
    else:
        try:
            if not connected:
                cluster.connect(rec.gcs_address, rec.namespace, token_env=rec.token_env, timeout=timeout)
            doc["nodes"] = snapshots(rec.name, rec.namespace, len(rec.nodes), timeout=timeout)
        except Exception as exc:
            doc["error"] = f"{type(exc).__name__}: {exc}".splitlines()[0][:300]
    doc["bundles"] = [b.to_json() for b in bundles_in(bundles_dir_of(rec))]
    # Healing by policy, as the seat's supervisor writes it into the record (a remediation in progress shows here
    # as it happens: pending, engines stopped, serving again).
    from sgl_seat.launch.status import remediation_status

    doc["remediation"] = remediation_status(rec, time.time()) if rec.on_hang != "capture" or rec.remediations \
        else None
    return doc
