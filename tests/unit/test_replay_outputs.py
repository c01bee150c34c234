"""Replay outputs: the HTML page (rendered by headless Chromium), speedscope and Chrome-trace exports.

The HTML test runs the real browser where one is installed (``/usr/bin/chromium``; CI installs it with
``apt-get install -y chromium``) and skips with that reason otherwise: the page must render, its one
script must run (it sets ``data-replay-rendered="ok"`` once the three plots exist), and the browser must
log no console error, no CSP violation and no failed load (the page may load nothing from anywhere).
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from sgl_seat.cli.main import main
from sgl_seat.forensics.replay.bundle_html import render_html
from sgl_seat.forensics.replay.exports import chrome_trace, speedscope
from sgl_seat.forensics.replay.replayer import replay_bundle

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "fixtures" / "bundles"
CHROMIUM = next((p for p in ("/usr/bin/chromium", "/usr/bin/chromium-browser", shutil.which("chromium"))
                 if p and Path(p).exists()), None)


def _stalled_fetch() -> dict[str, Any]:
    fetches = replay_bundle(GOLDEN / "stall").to_json()["rowfetch"]["in_flight_fetches"]
    assert len(fetches) == 1
    return dict(fetches[0])


def test_html_is_self_contained_and_escaped() -> None:
    page = render_html(replay_bundle(GOLDEN / "stall"))
    assert page.startswith("<!DOCTYPE html>")
    for pid in ("plot-rowfetch", "plot-timeline", "plot-throughput"):
        assert f'<svg id="{pid}"' in page
    assert not re.search(r"""(src|href)\s*=\s*["']?(https?:)?//""", page), "no external resources"
    assert "Content-Security-Policy" in page and "default-src 'none'" in page
    assert page.count("<script>") == 1
    f = _stalled_fetch()
    assert f"stalled: {f['age_ms'] / 1000:.1f} s at the trigger (gather {f['gather_size']})" in page


def test_html_escapes_hostile_strings(tmp_path: Path) -> None:
    """Frame names and log lines come from the bundle: they must not become markup."""
    result = replay_bundle(GOLDEN / "crash")
    result.analysis.log_tail["1"].append('<script>alert("x")</script><img src=x onerror=alert(1)>')
    page = render_html(result)
    assert "<img src=x" not in page and "&lt;script&gt;alert" in page


def assert_renders_in_chromium(page: Path, workdir: Path) -> str:
    """Open ``page`` in headless Chromium: it must render, its script must run to the end (three plots) and the
    browser must log no console error, CSP violation or failed load. Returns the DOM. (The live-bundle test in
    tests/integration/test_watchdog_seat.py loads this helper too.)"""
    assert CHROMIUM is not None
    profile = workdir / "chromium-profile"
    proc = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={profile}",
         "--enable-logging=stderr", "--v=0", "--dump-dom", page.as_uri()],
        capture_output=True, text=True, timeout=90, check=False)
    dom, log = proc.stdout, proc.stderr
    assert proc.returncode == 0, log[-2000:]
    assert 'data-replay-rendered="ok"' in dom, "the page's script did not run to the end"
    assert dom.count("<svg") >= 3 and 'id="plot-rowfetch"' in dom and 'id="plot-timeline"' in dom
    assert '<span id="render-status">rendered</span>' in dom
    bad = [ln for ln in log.splitlines()
           if re.search(r"CONSOLE|Uncaught|Refused to|Content Security Policy|ERR_FILE_NOT_FOUND|Failed to load", ln)]
    assert not bad, bad
    return dom


NO_CHROMIUM = ("chromium not installed (CI: apt-get update && apt-get install -y chromium); the HTML report's "
               "browser rendering is not checked")


@pytest.mark.skipif(CHROMIUM is None, reason=NO_CHROMIUM)
@pytest.mark.parametrize("name", ["stall", "crash"])
def test_html_renders_in_headless_chromium(name: str, tmp_path: Path) -> None:
    page = tmp_path / f"{name}.html"
    page.write_text(render_html(replay_bundle(GOLDEN / name)))
    assert_renders_in_chromium(page, tmp_path)


def test_speedscope_export() -> None:
    doc = speedscope(replay_bundle(GOLDEN / "stall"))
    assert doc["$schema"] == "https://www.speedscope.app/file-format-schema.json"
    frames = doc["shared"]["frames"]
    names = [p["name"] for p in doc["profiles"]]
    assert names[0].startswith("rank 0") and any(n.startswith("rank 3") for n in names)
    for p in doc["profiles"]:
        assert p["type"] == "sampled" and p["unit"] == "seconds"
        assert len(p["samples"]) == len(p["weights"]) and all(w > 0 for w in p["weights"])
        assert all(0 <= i < len(frames) for s in p["samples"] for i in s)
    r3 = next(p for p in doc["profiles"] if p["name"].startswith("rank 3") and "MainThread" in p["name"])
    last = r3["samples"][-1]
    assert frames[last[-1]]["name"] == "fetch_rows"  # innermost last: speedscope stacks are root first


def test_chrome_trace_export() -> None:
    doc = chrome_trace(replay_bundle(GOLDEN / "stall"))
    ev = doc["traceEvents"]
    assert all({"ph", "pid", "tid"} <= set(e) for e in ev)
    assert all(isinstance(e["ts"], int) and e["ts"] >= 0 for e in ev if "ts" in e)
    inflight = [e for e in ev if e.get("args", {}).get("in_flight")]
    f = _stalled_fetch()
    assert len(inflight) == 1 and inflight[0]["pid"] == 4 and inflight[0]["dur"] == round(f["age_ms"] * 1000)
    assert any(e["ph"] == "i" and "row-fetch stall" in e["name"] for e in ev)
    assert any(e["ph"] == "C" and e["name"] == "throughput tok/s" for e in ev)
    names = {e["args"]["name"] for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
    assert f"rank 3 (node 1, pid {f['pid']})" in names


def test_cli_writes_all_outputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                capsys: pytest.CaptureFixture[str]) -> None:
    out = {k: tmp_path / f"o.{k}" for k in ("html", "ss.json", "trace.json")}
    monkeypatch.setattr(sys, "argv", ["sgl-seat", "replay", str(GOLDEN / "stall"), "--json", "--html",
                                      str(out["html"]), "--speedscope", str(out["ss.json"]), "--chrome-trace",
                                      str(out["trace.json"])])
    with pytest.raises(SystemExit) as ex:
        main()
    assert ex.value.code in (0, None)
    assert json.loads(capsys.readouterr().out)["verdict"]["rank"] == 3
    assert out["html"].read_text().startswith("<!DOCTYPE html>")
    assert json.loads(out["ss.json"].read_text())["profiles"]
    assert json.loads(out["trace.json"].read_text())["traceEvents"]
