"""`sgl-seat engine pack|targets`: an engine environment for a GPU host without a package registry (logic in
``sgl_seat.engines.offline.pack``)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from sgl_seat.cli.common import JsonOpt, console, err_console, print_json

app = typer.Typer(help="Offline engine packages for GPU hosts that have no package registry.", no_args_is_help=True)


@app.command("targets")
def targets(json_out: JsonOpt = False) -> None:
    """The target images a package can be built for."""
    from sgl_seat.engines.offline.packtargets import TARGETS

    if json_out:
        print_json({n: {"description": t.description, "python": t.python, "pins": list(t.pins)}
                    for n, t in TARGETS.items()})
        return
    for n, t in TARGETS.items():
        console.print(f"{n}: {t.description} ({len(t.pins)} pinned wheels, {len(t.trim)} trim rules)")


@app.command("pack")
def pack(
    target: Annotated[str, typer.Option("--target", "-t", help="The target image (`sgl-seat engine targets`).")],
    out: Annotated[Path, typer.Option("--out", "-o", help="Directory for the package: a new one, or an earlier "
                                      "package's (replaced).")]
    = Path("engine-package"),
    cache: Annotated[Path | None, typer.Option("--cache", help="Where fetched wheels are kept between packs "
                                               "(default ~/.cache/sgl-seat/engine-wheels).")] = None,
    split_mb: Annotated[int | None, typer.Option("--split-mb", min=1, help="Cut the archive into parts of at most "
                                                 "this many MiB (for carriers with a size limit).")] = None,
    json_out: JsonOpt = False,
) -> None:
    """Build the target's engine package from registry wheels: pinned, trimmed of what the seat never loads,
    compressed (xz -9), with a manifest of every file's sha256, the versions and what was left out and why; beside
    it hostlayout.py, which lays it out on the host (standard library only) and checks that SGLang imports with
    CUDA. Prints its size."""
    from sgl_seat.engines.offline.pack import pack as build
    from sgl_seat.engines.offline.packtargets import target as find

    cache = cache or Path.home() / ".cache" / "sgl-seat" / "engine-wheels"
    res = build(find(target), out, cache=cache, part_bytes=split_mb * 2**20 if split_mb else None,
                say=lambda s: err_console.print(f"engine pack: {s}", markup=False))
    if json_out:
        print_json(res.to_json())
        return
    console.print(f"{res.directory}/{res.archive}: {res.archive_bytes / 2**20:.1f} MiB "
                  f"({res.unpacked_bytes / 2**20:.1f} MiB unpacked, {res.files} files)"
                  + (f" in {len(res.parts)} parts" if res.parts else "") + f"; manifest {res.directory}/"
                  "engine-package.json")
    for x in res.left_out:
        console.print(f"  left out {x.pattern}: {x.bytes / 2**20:,.1f} MiB ({x.reason})", markup=False)
    console.print(f"on the host: python3 hostlayout.py {res.directory.name} DEST --python <the image's python>")
