"""`sgl-seat replay BUNDLE`: diagnose a hang bundle offline, export it, or re-drive its traffic."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated, Any

import typer

from sgl_seat.cli.common import MaxUnpackedOpt, console, print_json
from sgl_seat.errors import BundleError, UsageError


def _write(path: Path, text: str) -> None:
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise BundleError(f"cannot write {path}: {exc.strerror or exc}", fix="choose a writable path") from None


def _dump(doc: Any) -> str:
    return json.dumps(doc, separators=(",", ":"), ensure_ascii=False) + "\n"


def replay(
    bundle: Annotated[str, typer.Argument(help="A bundle directory, a .tar.zst, or a bundle id.")],
    json_out: Annotated[bool, typer.Option("--json", help="Print the report as JSON.")] = False,
    html: Annotated[Path | None, typer.Option("--html", help="Write a self-contained HTML report here.")] = None,
    speedscope_out: Annotated[Path | None, typer.Option("--speedscope", help="Write a speedscope profile here.")]
    = None,
    chrome_out: Annotated[Path | None, typer.Option("--chrome-trace", help="Write Chrome/Perfetto trace JSON here.")]
    = None,
    traffic: Annotated[bool, typer.Option("--traffic", help="Re-drive the recorded requests against --target.")]
    = False,
    target: Annotated[str | None, typer.Option("--target", help="OpenAI-compatible base URL for --traffic.")] = None,
    speed: Annotated[float, typer.Option("--speed", help="Arrival-time scale for --traffic (2 = twice as fast).")]
    = 1.0,
    max_requests: Annotated[int, typer.Option("--max-requests", min=1, help="At most this many requests.")] = 500,
    max_seconds: Annotated[float, typer.Option("--max-seconds", min=1, help="Stop the traffic after this long.")]
    = 300.0,
    target_seat: Annotated[str | None, typer.Option("--target-seat", help="Seat whose new bundles mean 'reproduced' "
                                                    "(default: the bundle's seat).")] = None,
    watch_grace: Annotated[float, typer.Option("--watch-grace", min=0, help="Seconds to keep looking for a new "
                                               "bundle after the traffic ends.")] = 10.0,
    max_unpacked_bytes: MaxUnpackedOpt = None,
) -> None:
    """Verify a bundle, re-run the watchdog's detectors and report the hang: which rank lags and where,
    row-fetch latency by gather size, and what the seat was doing. With --traffic, re-send its requests."""
    # The library is imported here, not at module level: other commands do not pay for the forensics.
    from sgl_seat.forensics.format.store import resolve_bundle
    from sgl_seat.forensics.recording.traffic import replay_traffic
    from sgl_seat.forensics.replay.bundle_html import render_html
    from sgl_seat.forensics.replay.bundle_text import print_report
    from sgl_seat.forensics.replay.exports import chrome_trace, speedscope
    from sgl_seat.forensics.replay.replayer import replay_bundle
    from sgl_seat.launch.seatrecord.record import bundles_dir_for, recorded_bundle_dirs

    if traffic and not target:
        raise UsageError("--traffic needs --target", fix="e.g. --target http://127.0.0.1:30000")
    result = replay_bundle(resolve_bundle(bundle, seat_dirs=recorded_bundle_dirs()),
                           max_unpacked_bytes=max_unpacked_bytes)
    if html is not None:
        _write(html, render_html(result))
    if speedscope_out is not None:
        _write(speedscope_out, _dump(speedscope(result)))
    if chrome_out is not None:
        _write(chrome_out, _dump(chrome_trace(result)))
    doc = result.to_json()
    if traffic and target:
        seat = target_seat or result.bundle.manifest.seat
        tr = replay_traffic(result.bundle.requests, target, speed=speed, max_requests=max_requests,
                            max_seconds=max_seconds, watch_dir=bundles_dir_for(seat), watch_grace_s=watch_grace)
        doc["traffic"] = tr.to_json()
    if json_out:
        print_json(doc)
        return
    print_report(result, console)  # piped: as wide as its lines, not cut at 80 columns
    if "traffic" in doc:
        t = doc["traffic"]
        rep = {True: "REPRODUCED: the target captured " + ", ".join(t["new_bundles"]),
               False: "not reproduced: no new bundle", None: "reproduction unknown"}[t["reproduced"]]
        console.print(f"traffic: sent {t['sent']}/{t['planned']} to {t['target']} in {t['duration_s']:.1f} s "
                      f"(ok {t['ok']}, failed {t['failed']}, timed out {t['timed_out']}); {rep}")
    for label, p in (("html", html), ("speedscope", speedscope_out), ("chrome trace", chrome_out)):
        if p is not None:
            console.print(f"wrote {label}: {p}")
