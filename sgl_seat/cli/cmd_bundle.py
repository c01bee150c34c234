"""`sgl-seat bundle ls|show|verify` here, `pack|unpack|merge` in ``cmd_bundle_files``: thin wrappers over
sgl_seat.forensics."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table
from rich.text import Text

from sgl_seat.cli import cmd_bundle_files
from sgl_seat.cli.common import (
    BundleArg,
    MaxUnpackedOpt,
    PlainJsonOpt,
    console,
    json_refusal,
    print_json,
    styled,
    verdict_text,
    when,
)

# The forensics are imported inside each command (not here): `sgl-seat plan` and `--help` do not pay for them.

app = typer.Typer(help="List, show, verify, pack, unpack and merge forensic bundles.", no_args_is_help=True)


@app.command("ls")
def ls(
    seat: Annotated[str | None, typer.Option("--seat", "-s", help="Only this seat's bundles.")] = None,
    root: Annotated[Path | None, typer.Option("--root", help="Bundles root (default $SGLSEAT_HOME/bundles).")] = None,
    json_out: PlainJsonOpt = False,
) -> None:
    """List bundles, newest first, with trigger, verdict and size (also those of recorded seats whose spec puts
    them elsewhere with bundles.dir)."""
    from sgl_seat.forensics.format.store import list_bundles
    from sgl_seat.launch.seatrecord.record import bundles_dir_for, recorded_bundle_dirs

    seat_dirs = [] if root is not None else [bundles_dir_for(seat)] if seat else recorded_bundle_dirs()
    items = list_bundles(root, seat=seat, seat_dirs=seat_dirs)
    if json_out:
        print_json([s.to_json() for s in items])
        return
    if not items:
        console.print("no bundles")
        return
    t = Table(show_edge=False)
    for c in ("created", "seat", "id", "trigger", "verdict", "size"):
        t.add_column(c)
    for s in items:
        trig = str(s.trigger.get("source") or s.trigger.get("detail") or "-") if s.trigger else "-"
        t.add_row(when(s.created), s.seat, s.bundle_id, trig,
                  Text(f"damaged: {s.error}", style="red") if s.error else verdict_text(s.verdict),
                  f"{s.size_bytes / 1e6:.1f} MB")
    console.print(t)


@app.command("show")
def show(bundle: BundleArg, json_out: PlainJsonOpt = False, max_unpacked_bytes: MaxUnpackedOpt = None) -> None:
    """Show a bundle's manifest: seat, trigger, verdict, versions and files (verifies it first)."""
    from sgl_seat.forensics.format.store import resolve_bundle
    from sgl_seat.forensics.replay.replayer import load_any
    from sgl_seat.launch.seatrecord.record import recorded_bundle_dirs

    b = load_any(resolve_bundle(bundle, seat_dirs=recorded_bundle_dirs()), max_unpacked_bytes=max_unpacked_bytes)
    m = b.manifest
    if json_out:
        print_json(m.to_json())
        return
    console.print(styled("bold", f"bundle {m.bundle_id}", f"  seat {m.seat}  created {when(m.created)}"))
    console.print(f"trigger: {m.trigger}")
    console.print(f"verdict: {verdict_text(None if m.verdict is None else m.verdict.to_json())}")
    if m.verdict is not None:
        for e in m.verdict.evidence:
            console.print(f"  - {e}")
    console.print(f"nodes {list(m.nodes)}  ranks {list(m.ranks)}  history {m.time_end - m.time_start:.0f} s")
    console.print(f"versions: {m.versions}")
    console.print(f"redaction: {m.redaction}")
    t = Table(show_edge=False)
    t.add_column("file")
    t.add_column("bytes", justify="right")
    t.add_column("sha256")
    for name, ent in sorted(m.files.items()):
        t.add_row(name, f"{ent.size:,}", ent.sha256[:16])
    console.print(t)


@app.command("verify")
def verify(bundle: BundleArg, json_out: PlainJsonOpt = False, max_unpacked_bytes: MaxUnpackedOpt = None) -> None:
    """Verify a bundle's manifest, file list, sizes and sha256 digests (exit 2 if anything is off)."""
    from sgl_seat.forensics.format.archive import is_archive
    from sgl_seat.forensics.format.bundle import verify_bundle
    from sgl_seat.forensics.format.store import resolve_bundle
    from sgl_seat.forensics.replay.replayer import load_any
    from sgl_seat.launch.seatrecord.record import recorded_bundle_dirs

    with json_refusal(json_out, bundle):
        path = resolve_bundle(bundle, seat_dirs=recorded_bundle_dirs())
        m = (load_any(path, max_unpacked_bytes=max_unpacked_bytes).manifest if is_archive(path)
             else verify_bundle(path))
    if json_out:
        print_json({"path": str(path), "ok": True, "bundle_id": m.bundle_id, "schema_version": m.schema_version,
                    "files": len(m.files) + 1, "bytes": m.total_size})
        return
    console.print(f"ok: {path} ({len(m.files) + 1} files, {m.total_size:,} bytes, schema_version {m.schema_version})")


app.command("pack")(cmd_bundle_files.pack)
app.command("unpack")(cmd_bundle_files.unpack)
app.command("merge")(cmd_bundle_files.merge)
