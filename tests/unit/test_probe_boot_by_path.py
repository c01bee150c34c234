"""The probe loads by path into an engine interpreter that has no sgl-seat: the route of watchdog/boot/sitecustomize.py.

A child ``python -S -I`` (no site: neither sgl-seat's install nor torch nor numpy on its path; isolated: no
PYTHONPATH, no script directory) imports the real ``sitecustomize`` from the boot directory with ``SGLSEAT_PROBE``
set. Its ``from sgl_seat import probe`` fails there, so it loads the probe package from its directory as
``sgl_seat_probe`` (its modules import each other relatively); the target, imported after, is wrapped by the import
hook and its call lands in the ring (read here, by the installed package's reader). The in-engine import stays
standard-library only: neither torch nor numpy is in the child's ``sys.modules`` afterwards. Once per writer.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from sgl_seat import probe
from sgl_seat.watchdog import boot_dir

CHILD = textwrap.dedent("""
    import json, os, sys
    boot, targets_dir = sys.argv[1], sys.argv[2]
    sys.path.insert(0, boot)
    import sitecustomize  # what site would run at start-up in an engine with the boot directory on PYTHONPATH
    probe = sys.modules.get("sgl_seat_probe")
    pending = probe.installed() if probe is not None else None
    sys.path.insert(0, targets_dir)
    import boot_target
    boot_target.fetch_rows(None, [1, 2, 3])
    print(json.dumps({
        "by_path": probe is not None and probe.__file__.endswith(os.path.join("probe", "__init__.py")),
        "sgl_seat_imported": sorted(m for m in sys.modules if m == "sgl_seat" or m.startswith("sgl_seat.")),
        "parts": sorted(m for m in sys.modules if m.startswith("sgl_seat_probe.")),
        "pending": pending, "installed": probe.installed() if probe is not None else None,
        "wrapped": getattr(boot_target.fetch_rows, "__sgl_seat_probe__", None),
        "writer": probe.native_state() if probe is not None else None,
        "ring": probe.ring_file() if probe is not None else None,
        "torch": "torch" in sys.modules, "numpy": "numpy" in sys.modules,
    }), flush=True)
    os._exit(0)  # like a killed engine: no atexit, the ring stays for the reader here
""")


@pytest.mark.parametrize("writer", ["native", "python"])
def test_sitecustomize_loads_the_probe_package_by_path_without_sgl_seat(writer: str, tmp_path: Path) -> None:
    if writer == "native" and probe.writer._native() is None:
        pytest.skip(f"no C writer here: {probe.native_state()}")  # test_native_writer_builds_here says why
    targets_dir = tmp_path / "targets"
    targets_dir.mkdir()
    (targets_dir / "boot_target.py").write_text("def fetch_rows(table, ids):\n    return len(ids)\n")
    rings = tmp_path / "rings"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLSEAT_")}
    env.update({probe.ENV_TARGETS: "boot_target:fetch_rows@ids", probe.ENV_DIR: str(rings),
                probe.ENV_NATIVE: "auto" if writer == "native" else "0"})
    if os.environ.get(probe.ENV_NATIVE_CACHE):
        env[probe.ENV_NATIVE_CACHE] = os.environ[probe.ENV_NATIVE_CACHE]
    proc = subprocess.run([sys.executable, "-S", "-I", "-c", CHILD, boot_dir(), str(targets_dir)], env=env,
                          capture_output=True, text=True, timeout=180, cwd=tmp_path, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["by_path"], out
    assert out["sgl_seat_imported"] == [], "the child had no sgl-seat: the probe came by path, not by import"
    assert out["parts"] == ["sgl_seat_probe.beat", "sgl_seat_probe.fault", "sgl_seat_probe.gpu", "sgl_seat_probe.graph",
                            "sgl_seat_probe.guard", "sgl_seat_probe.installer", "sgl_seat_probe.native",
                            "sgl_seat_probe.oldnames", "sgl_seat_probe.ring", "sgl_seat_probe.targets",
                            "sgl_seat_probe.writer"], out["parts"]
    assert out["pending"] == {"boot_target:fetch_rows@ids": "pending"}
    assert out["installed"] == {"boot_target:fetch_rows@ids": "installed"}
    assert out["wrapped"] == "boot_target:fetch_rows"
    assert out["writer"].startswith("native (" if writer == "native" else "python ("), out["writer"]
    assert out["torch"] is False and out["numpy"] is False, "the in-engine import is standard-library only"
    assert "sgl-seat probe" not in proc.stderr, proc.stderr  # nothing warned: no failed ring, build or wrap
    (ring,) = probe.list_rings(str(rings)).values()
    assert ring == out["ring"]
    recs = probe.read_ring(ring, node=0)
    assert [(r.target, r.gather_size, r.end is not None) for r in recs] == [("boot_target:fetch_rows", 3, True)]


REHEARSAL_CHILD = textwrap.dedent("""
    import json, os, sys, time
    boot, targets_dir = sys.argv[1], sys.argv[2]
    sys.path.insert(0, boot)
    import sitecustomize
    probe = sys.modules["sgl_seat_probe"]
    sys.path.insert(0, targets_dir)
    import boot_target
    took = []
    for ids in ([1], [1, 2, 3, 4], [1, 2]):
        t0 = time.monotonic()
        boot_target.fetch_rows(None, ids)
        took.append(time.monotonic() - t0)
    print(json.dumps({"took": took, "fault": probe.fault.state(), "ring": probe.ring_file(),
                      "gate": boot_target.fetch_rows.__wrapped__.__code__.co_name,
                      "sgl_seat_imported": sorted(m for m in sys.modules if m.startswith("sgl_seat."))}), flush=True)
    os._exit(0)
""")


@pytest.mark.parametrize("writer", ["native", "python"])
def test_a_launch_time_rehearsal_fault_stalls_a_call_of_a_by_path_probe(writer: str, tmp_path: Path) -> None:
    """The rehearsal gate loads by path with the rest of the probe: in a child without sgl-seat, the launch-time
    fault ``after_calls=1,for_s=1`` stalls the second call for about a second, announced on stderr, and while it
    stalls this process reads that call in flight in the child's ring; afterwards the call ended, timed ~1 s."""
    if writer == "native" and probe.writer._native() is None:
        pytest.skip(f"no C writer here: {probe.native_state()}")
    targets_dir = tmp_path / "targets"
    targets_dir.mkdir()
    (targets_dir / "boot_target.py").write_text("def fetch_rows(table, ids):\n    return len(ids)\n")
    rings = tmp_path / "rings"
    env = {k: v for k, v in os.environ.items() if not k.startswith("SGLSEAT_")}
    env.update({probe.ENV_TARGETS: "boot_target:fetch_rows@ids", probe.ENV_DIR: str(rings),
                probe.ENV_NATIVE: "auto" if writer == "native" else "0", probe.ENV_RANK: "1",
                probe.ENV_REHEARSAL: "1",
                probe.ENV_FAULTS: "probe-stall:rank=0,for_s=9;probe-stall:after_calls=1,for_s=1"})  # rank 0: not here
    if os.environ.get(probe.ENV_NATIVE_CACHE):
        env[probe.ENV_NATIVE_CACHE] = os.environ[probe.ENV_NATIVE_CACHE]
    proc = subprocess.Popen([sys.executable, "-S", "-I", "-c", REHEARSAL_CHILD, boot_dir(), str(targets_dir)],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path)
    try:
        assert proc.stderr is not None
        err: list[str] = []
        while not any("sgl-seat rehearsal:" in line for line in err):
            line = proc.stderr.readline()
            assert line, f"the child ended without a stall: {''.join(err)}"
            err.append(line)
        (ring,) = probe.list_rings(str(rings)).values()
        infl = [(r.gather_size, r.rank) for r in probe.read_ring(ring, node=0) if r.end is None]
        out_text, rest = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    stderr = "".join(err) + rest
    assert proc.returncode == 0, stderr[-3000:]
    assert infl == [(4, 1)], infl  # the stalled call, in flight while it stalls
    assert stderr.count("sgl-seat rehearsal:") == 1, stderr
    assert "sgl-seat rehearsal: probe-stall on rank 1 (node -1) in boot_target:fetch_rows, gather 4, for 1 s\n" \
        in stderr, stderr
    assert "sgl-seat probe" not in stderr, stderr  # nothing warned
    out = json.loads(out_text.strip().splitlines()[-1])
    assert out["sgl_seat_imported"] == [] and out["gate"] == "rehearsal_gate"
    took = out["took"]
    assert took[0] < 0.5 and took[2] < 0.5 and 0.99 <= took[1] < 5, took
    assert out["fault"]["fired"] == ["env:1"] and [a["id"] for a in out["fault"]["armed"]] == ["env:0"]
    assert out["ring"] == ring
    recs = probe.read_ring(ring, node=0)
    assert [(r.gather_size, r.end is not None) for r in recs] == [(1, True), (4, True), (2, True)]
    assert recs[1].end is not None and recs[1].end - recs[1].start >= 0.99
