"""`sgl-seat bundle ls|show|verify|pack|unpack`: thin wrappers over sgl_seat.forensics."""

from __future__ import annotations

import contextlib
import datetime as _dt
from collections.abc import Iterator
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table
from rich.text import Text

from sgl_seat.cli.common import console, print_json, styled
from sgl_seat.errors import SeatError

# The forensics are imported inside each command (not here): `sgl-seat plan` and `--help` do not pay for them.

app = typer.Typer(help="List, show, verify, pack, unpack and merge forensic bundles.", no_args_is_help=True)

BundleArg = Annotated[str, typer.Argument(help="A bundle directory, a .tar.zst, or a bundle id under $SGL_SEAT_HOME.")]
JsonOpt = Annotated[bool, typer.Option("--json", help="Print JSON.")]
# None: the library's default (sgl_seat.forensics.archive.DEFAULT_MAX_UNPACKED_BYTES), not imported here for speed.
MaxUnpackedOpt = Annotated[int | None, typer.Option(
    "--max-unpacked-bytes", min=1, metavar="BYTES",
    help="Refuse a .tar.zst that would unpack to more than this, whatever its manifest claims, before writing "
         "anything (default 2 GiB: 2147483648).")]


def _when(t: float | None) -> str:
    if t is None:
        return "-"
    return _dt.datetime.fromtimestamp(t, tz=_dt.timezone.utc).strftime("%Y-%m-%d %H:%M:%S UTC")


def _verdict_text(v: dict[str, Any] | None) -> str:
    if not v:
        return "-"
    return f"{v['kind']} rank {v.get('rank')} node {v.get('node')}" + (f" {v['frame']}" if v.get("frame") else "")


@app.command("ls")
def ls(
    seat: Annotated[str | None, typer.Option("--seat", "-s", help="Only this seat's bundles.")] = None,
    root: Annotated[Path | None, typer.Option("--root", help="Bundles root (default $SGL_SEAT_HOME/bundles).")] = None,
    json_out: JsonOpt = False,
) -> None:
    """List bundles, newest first, with trigger, verdict and size (also those of recorded seats whose spec puts
    them elsewhere with bundles.dir)."""
    from sgl_seat.forensics.store import list_bundles
    from sgl_seat.launch.record import bundles_dir_for, recorded_bundle_dirs

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
        t.add_row(_when(s.created), s.seat, s.bundle_id, trig,
                  Text(f"damaged: {s.error}", style="red") if s.error else _verdict_text(s.verdict),
                  f"{s.size_bytes / 1e6:.1f} MB")
    console.print(t)


@app.command("show")
def show(bundle: BundleArg, json_out: JsonOpt = False, max_unpacked_bytes: MaxUnpackedOpt = None) -> None:
    """Show a bundle's manifest: seat, trigger, verdict, versions and files (verifies it first)."""
    from sgl_seat.forensics.replay import load_any
    from sgl_seat.forensics.store import resolve_bundle
    from sgl_seat.launch.record import recorded_bundle_dirs

    b = load_any(resolve_bundle(bundle, seat_dirs=recorded_bundle_dirs()), max_unpacked_bytes=max_unpacked_bytes)
    m = b.manifest
    if json_out:
        print_json(m.to_json())
        return
    console.print(styled("bold", f"bundle {m.bundle_id}", f"  seat {m.seat}  created {_when(m.created)}"))
    console.print(f"trigger: {m.trigger}")
    console.print(f"verdict: {_verdict_text(None if m.verdict is None else m.verdict.to_json())}")
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


@contextlib.contextmanager
def _json_refusal(json_out: bool, path: object) -> Iterator[None]:
    """With --json a refused bundle still gets its JSON answer (``"ok": false``), then the error on stderr."""
    try:
        yield
    except SeatError as exc:
        if json_out:
            print_json({"path": str(path), "ok": False, "error": exc.message})
        raise


def _dir_sizes(root: Path) -> dict[str, int]:
    files = [f for f in root.rglob("*") if f.is_file()]
    return {"files": len(files), "bytes": sum(f.stat().st_size for f in files)}


@app.command("verify")
def verify(bundle: BundleArg, json_out: JsonOpt = False, max_unpacked_bytes: MaxUnpackedOpt = None) -> None:
    """Verify a bundle's manifest, file list, sizes and sha256 digests (exit 2 if anything is off)."""
    from sgl_seat.forensics.archive import is_archive
    from sgl_seat.forensics.bundle import verify_bundle
    from sgl_seat.forensics.replay import load_any
    from sgl_seat.forensics.store import resolve_bundle
    from sgl_seat.launch.record import recorded_bundle_dirs

    with _json_refusal(json_out, bundle):
        path = resolve_bundle(bundle, seat_dirs=recorded_bundle_dirs())
        m = (load_any(path, max_unpacked_bytes=max_unpacked_bytes).manifest if is_archive(path)
             else verify_bundle(path))
    if json_out:
        print_json({"path": str(path), "ok": True, "bundle_id": m.bundle_id, "schema_version": m.schema_version,
                    "files": len(m.files) + 1, "bytes": m.total_size})
        return
    console.print(f"ok: {path} ({len(m.files) + 1} files, {m.total_size:,} bytes, schema_version {m.schema_version})")


@app.command("pack")
def pack(
    bundle: BundleArg,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Archive path (default <bundle>.tar.zst).")]
    = None,
    json_out: JsonOpt = False,
) -> None:
    """Verify a bundle directory and pack it into a .tar.zst."""
    from sgl_seat.forensics.archive import pack_bundle
    from sgl_seat.forensics.store import resolve_bundle
    from sgl_seat.launch.record import recorded_bundle_dirs

    with _json_refusal(json_out, bundle):
        src = resolve_bundle(bundle, seat_dirs=recorded_bundle_dirs())
        out = pack_bundle(src, output)
    if json_out:
        print_json({"path": str(out), "ok": True, "source": str(src), "bytes": out.stat().st_size,
                    "source_bytes": _dir_sizes(src)["bytes"]})
        return
    console.print(f"packed: {out} ({out.stat().st_size:,} bytes)")


@app.command("unpack")
def unpack(
    archive: Annotated[Path, typer.Argument(help="A .tar.zst made by `sgl-seat bundle pack`.")],
    into: Annotated[Path, typer.Option("--into", help="Directory to unpack into (default: the current one).")]
    = Path(),
    json_out: JsonOpt = False,
    max_unpacked_bytes: MaxUnpackedOpt = None,
) -> None:
    """Unpack a bundle archive safely (no links, devices, absolute paths or `..`, at most --max-unpacked-bytes)
    and verify it."""
    from sgl_seat.forensics.archive import unpack_bundle

    with _json_refusal(json_out, archive):
        out = unpack_bundle(archive, into, max_unpacked_bytes=max_unpacked_bytes)
    if json_out:
        print_json({"path": str(out), "ok": True, "archive": str(archive), "archive_bytes": archive.stat().st_size,
                    **_dir_sizes(out)})
        return
    console.print(f"unpacked and verified: {out}")


@app.command("merge")
def merge(
    bundles: Annotated[list[str], typer.Argument(help="The coordinator's bundle first, then the partial ones.")],
    into: Annotated[Path | None, typer.Option("--into", help="Directory for the merged bundle (default: the"
                                              " first bundle's).")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Join the bundles one incident left on both sides of a partition (each node's records from its own)."""
    from sgl_seat.forensics.bundle import verify_bundle
    from sgl_seat.forensics.merge import merge_bundles
    from sgl_seat.forensics.store import resolve_bundle
    from sgl_seat.launch.record import recorded_bundle_dirs

    with _json_refusal(json_out, bundles[0] if bundles else "-"):
        paths = [resolve_bundle(b, seat_dirs=recorded_bundle_dirs()) for b in bundles]
        out = merge_bundles(paths, into if into is not None else paths[0].parent)
        m = verify_bundle(out)
    if json_out:
        print_json({"path": str(out), "ok": True, "nodes": list(m.nodes),
                    "verdict": m.verdict.to_json() if m.verdict else None, "sources": [str(p) for p in paths]})
        return
    console.print(f"merged {len(paths)} bundles into {out} (nodes {', '.join(map(str, m.nodes))})")
