"""guard.reader_thread: a GPU reader is stopped and joined at the interpreter's exit, never left to finalization
(where a reader inside a torch CUDA query aborted the process on an H200: docs/gpu-validation.md, issue 25)."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

CODE = textwrap.dedent("""
    import sys, threading
    from sgl_seat.probe.guard import reader_thread
    stop = threading.Event()
    def run():
        while not stop.wait(0.01):
            pass
        open(sys.argv[1], "w").write("stopped by its owner at exit")
    reader_thread(run, "sgl-seat-probe-test", stop)
    print("main done")
""")


def test_a_reader_still_running_when_main_ends_is_stopped_and_joined_before_finalization(tmp_path: Path) -> None:
    """GIVEN a daemon reader that only ends when its stop event is set WHEN the main thread returns THEN the reader
    saw its stop and finished its own last step (a daemon left to finalization never would), and the exit is 0."""
    out = tmp_path / "reader.txt"
    res = subprocess.run([sys.executable, "-c", CODE, str(out)], capture_output=True, text=True, timeout=60)
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip() == "main done"
    assert out.read_text() == "stopped by its owner at exit"
