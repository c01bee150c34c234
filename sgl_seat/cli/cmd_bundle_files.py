"""`sgl-seat bundle pack|unpack|merge`: bundles as files to move, over ``sgl_seat.forensics.format``."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from sgl_seat.cli.common import BundleArg, MaxUnpackedOpt, PlainJsonOpt, console, dir_sizes, json_refusal, print_json


def pack(
    bundle: BundleArg,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Archive path (default <bundle>.tar.zst).")]
    = None,
    json_out: PlainJsonOpt = False,
) -> None:
    """Verify a bundle directory and pack it into a .tar.zst."""
    from sgl_seat.forensics.format.archive import pack_bundle
    from sgl_seat.forensics.format.store import resolve_bundle
    from sgl_seat.launch.seatrecord.record import recorded_bundle_dirs

    with json_refusal(json_out, bundle):
        src = resolve_bundle(bundle, seat_dirs=recorded_bundle_dirs())
        out = pack_bundle(src, output)
    if json_out:
        print_json({"path": str(out), "ok": True, "source": str(src), "bytes": out.stat().st_size,
                    "source_bytes": dir_sizes(src)["bytes"]})
        return
    console.print(f"packed: {out} ({out.stat().st_size:,} bytes)")


def unpack(
    archive: Annotated[Path, typer.Argument(help="A .tar.zst made by `sgl-seat bundle pack`.")],
    into: Annotated[Path, typer.Option("--into", help="Directory to unpack into (default: the current one).")]
    = Path(),
    json_out: PlainJsonOpt = False,
    max_unpacked_bytes: MaxUnpackedOpt = None,
) -> None:
    """Unpack a bundle archive safely (no links, devices, absolute paths or `..`, at most --max-unpacked-bytes)
    and verify it."""
    from sgl_seat.forensics.format.archive import unpack_bundle

    with json_refusal(json_out, archive):
        out = unpack_bundle(archive, into, max_unpacked_bytes=max_unpacked_bytes)
    if json_out:
        print_json({"path": str(out), "ok": True, "archive": str(archive), "archive_bytes": archive.stat().st_size,
                    **dir_sizes(out)})
        return
    console.print(f"unpacked and verified: {out}")


def merge(
    bundles: Annotated[list[str], typer.Argument(help="The coordinator's bundle first, then the partial ones.")],
    into: Annotated[Path | None, typer.Option("--into", help="Directory for the merged bundle (default: the"
                                              " first bundle's).")] = None,
    json_out: PlainJsonOpt = False,
) -> None:
    """Join the bundles one incident left on both sides of a partition (each node's records from its own)."""
    from sgl_seat.forensics.format.bundle import verify_bundle
    from sgl_seat.forensics.format.merge import merge_bundles
    from sgl_seat.forensics.format.store import resolve_bundle
    from sgl_seat.launch.seatrecord.record import recorded_bundle_dirs

    with json_refusal(json_out, bundles[0] if bundles else "-"):
        paths = [resolve_bundle(b, seat_dirs=recorded_bundle_dirs()) for b in bundles]
        out = merge_bundles(paths, into if into is not None else paths[0].parent)
        m = verify_bundle(out)
    if json_out:
        print_json({"path": str(out), "ok": True, "nodes": list(m.nodes),
                    "verdict": m.verdict.to_json() if m.verdict else None, "sources": [str(p) for p in paths]})
        return
    console.print(f"merged {len(paths)} bundles into {out} (nodes {', '.join(map(str, m.nodes))})")
