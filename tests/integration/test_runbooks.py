"""Every command of every runbook, executed in rehearsal order against a local-sim seat, so a CLI change that
breaks a runbook fails CI.

The convention (runbooks/README.md, "How the runbooks are written"): ```bash run blocks are executed with
``bash`` (``set -euo pipefail``, variables a block sets kept for the rest of that runbook), their exit status
compared with ``exit=`` (default 0), and each ``expect="..."`` looked up in their combined stdout and stderr;
```bash no-run reason="..." blocks (nvidia-smi, a real Ray cluster, SGLang-only log lines) are counted and
listed, never executed; ```bash vars blocks are the operator's settings, for which the test supplies its own.
The order comes from the README's "Rehearsal order"; each runbook starts where the one before it left the seat.

The seat: launch/seats/local-sim.yaml under another name, ports 30500-30516 (HTTP, admins, dist-init, the
sidecar exporters), ``SGLSEAT_HOME`` in a tmp dir, and ``cluster.address`` pointing at one two-node local Ray
cluster that this module starts once (GCS on the first free port of 30590-30599) and stops at the end: the
runbooks' `up`s then cost engine start-up only, and the seats run the way an operator's do (an existing
cluster, ``address: auto``).
The spec arms the rehearsal fault that watchdog-fired.md describes (``sim.faults``: a row-fetch stall on rank 3
for gathers of 128 rows or more, once per engine start); the short requests of the other runbooks never
reach it. Nothing may be left behind: every engine group, agent and sidecar that was ever under the cluster is
checked by pid after the cluster is stopped, and every shell a block ran must leave no process in its group.

Wall time on a 2-core box: 3.2-3.4 min at load average 3-4, 4.5-5 min while other suites load it (6-9); the
three successful `up`s and the failing one are most of it.

``RUNBOOK_TRANSCRIPT=path`` appends each command and its output to ``path`` (to refresh the runbooks' excerpts).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
import yaml
from launchutil import LOCAL_SIM, REPO, Proc, alive, descendants, in_groups, run_cli, seat_processes, wait_until
from runbookdoc import Block, RunbookError, parse_runbook, rehearsal_order

from sgl_seat.launch.host.localcluster import start_local_cluster, stop_local_cluster
from sgl_seat.netports import free_block

RUNBOOKS = REPO / "runbooks"
NAME = "runbook-seat"
# Below Linux's ephemeral range (32768-60999): a fixed port in it can be taken at random as the local port of
# any outgoing connection (Ray's, gloo's, an HTTP client's), which made preflight refuse it once in CI.
HTTP = 30500  # +2 node 0 admin, +5 dist-init, +10/+12 node 1 and its admin, +15/+16 the sidecar exporters
GCS_PORTS = range(30590, 30600)  # the first one free
STALL = "rowfetch-stall:rank=3,gather_ge=128,for_s=30"  # the rehearsal fault of watchdog-fired.md
TRANSCRIPT_ENV = "RUNBOOK_TRANSCRIPT"
_SHELL_NOISE = frozenset({"PWD", "OLDPWD", "SHLVL", "_", "BASHOPTS", "SHELLOPTS"})

ORDER = rehearsal_order(RUNBOOKS / "README.md")
#: The CI tier runs the runbooks the README sends an operator to (enable-draft, watchdog-fired, node-unreachable) and
#: bring-up.md, the seat they start from; the full tier runs every runbook (README, "The tests"). Either way in
#: rehearsal order, each from the seat the one before it left.
CI_RUNBOOKS = frozenset({"bring-up.md", "enable-draft.md", "watchdog-fired.md", "node-unreachable.md"})
RUNBOOK_PARAMS = [r if r in CI_RUNBOOKS else pytest.param(r, marks=pytest.mark.slow) for r in ORDER]


def _all_runbooks() -> list[str]:
    return sorted(p.name for p in RUNBOOKS.glob("*.md") if p.name != "README.md")


# -- the document, without a seat -------------------------------------------------------------------------


def test_every_runbook_is_in_the_rehearsal_order_once() -> None:
    """GIVEN runbooks/*.md WHEN the README's rehearsal order is read THEN it lists each runbook exactly once, so no
    runbook's commands escape the executed test below."""
    assert sorted(ORDER) == _all_runbooks() and len(ORDER) == len(set(ORDER)), (ORDER, _all_runbooks())


def test_blocks_follow_the_convention_and_name_only_known_variables() -> None:
    """GIVEN every runbook WHEN its blocks are parsed THEN each shell block is marked run / no-run (with a reason) /
    vars, every expect is shown in the excerpt under its command, every variable a vars block sets is one the test
    supplies, and every runbook has commands that run. The not-executed commands are listed."""
    not_run: list[str] = []
    for name in ORDER:
        blocks = parse_runbook(RUNBOOKS / name)
        assert [b for b in blocks if b.kind == "run"], f"{name}: no command is executed"
        for b in blocks:
            if b.kind == "vars":
                unknown = set(b.variables()) - set(_VARS)
                assert not unknown, f"{b.where}: the test does not supply {sorted(unknown)}"
            if b.kind == "no-run":
                not_run.append(f"{b.where}: {b.reason}")
    print(f"{len(not_run)} runbook commands are not executed on a CPU-only box:\n  " + "\n  ".join(not_run))


def test_the_parser_refuses_what_would_escape_the_test(tmp_path: Path) -> None:
    """GIVEN runbooks with a bare bash block, a no-run without a reason, or an expect the excerpt does not show
    WHEN parsed THEN each is refused with file and line (so a runbook cannot silently stop being executed)."""
    cases = {  # file: (text, the line the error must name)
        "bare.md": ("# x\n\n```bash\nsgl-seat status\n```\n", 3),
        "noreason.md": ("# x\n\n```bash no-run\nnvidia-smi\n```\n", 3),
        "unshown.md": ('# x\n\n```bash run expect="READY"\nsgl-seat status\n```\n\n```text\nFAILED\n```\n', 7),
        "noexcerpt.md": ('# x\n\n```bash run expect="READY"\nsgl-seat status\n```\n', 3),
        "unknown.md": ("# x\n\n```bash run retries=3\nsgl-seat status\n```\n", 3),
    }
    for fname, (text, line) in cases.items():
        (tmp_path / fname).write_text(text)
        with pytest.raises(RunbookError, match=rf"runbooks/{fname}:{line}:"):
            parse_runbook(tmp_path / fname)
    (tmp_path / "ok.md").write_text(
        '# x\n\n```bash run exit=2 expect="refused"\nfalse\n```\n\n```text\nrefused\n```\n'
        "\n## What SGLang computes for the field report's seat\n<!-- x -->\n```bash\nx\n```\n"
    )
    (b,) = parse_runbook(tmp_path / "ok.md")
    assert (b.kind, b.exit, b.expects, b.excerpt) == ("run", 2, ("refused",), "refused")


# -- the runbooks, executed -----------------------------------------------------------------------------------

_VARS = ("SEAT", "NAME", "ENDPOINT", "INCIDENT")


@dataclass
class Rig:
    """The module's seat environment: its cluster, home, spec, the variables the runbooks use, what ran."""

    home: Path
    work: Path
    env: dict[str, str]
    holder: int
    holder_pgid: int
    seen: list[Proc] = field(default_factory=list)
    failed: str | None = None
    transcript: Path | None = None


def _spec(path: Path, address: str) -> Path:
    doc: dict[str, Any] = yaml.safe_load(LOCAL_SIM.read_text())
    doc["name"] = NAME
    doc["cluster"]["address"] = address
    doc["network"]["http_port"] = HTTP
    doc["network"]["dist_init_port"] = HTTP + 5
    if doc["model"].get("config"):  # the profile's planning config, wherever the profile points it
        doc["model"]["config"] = str((LOCAL_SIM.parent / doc["model"]["config"]).resolve())
    doc.setdefault("sim", {})["faults"] = [STALL]
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path


@pytest.fixture(scope="module")
def rig(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Rig]:
    tmp = tmp_path_factory.mktemp("runbooks")
    home, work = tmp / "home", tmp / "work"
    work.mkdir()
    os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] = "0"
    port = free_block(GCS_PORTS, reuse=False) or 0
    rec = start_local_cluster(NAME, nodes=2, gpus_per_node=2, cpus_per_node=3, timeout=180,
                              record=tmp / "cluster.json", port=port)
    assert rec.gcs_address
    spec = _spec(work / f"{NAME}.yaml", rec.gcs_address)
    venv_bin = str(Path(sys.executable).parent)
    env = {
        **os.environ,
        "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER": "0",
        "SGLSEAT_HOME": str(home),
        "NO_COLOR": "1",
        "COLUMNS": "200",
        "PATH": f"{venv_bin}{os.pathsep}{os.environ.get('PATH', '')}",
        "NO_PROXY": "127.0.0.1,localhost",
        "no_proxy": "127.0.0.1,localhost",
        "SEAT": str(spec),
        "NAME": NAME,
        "ENDPOINT": f"http://127.0.0.1:{HTTP}",
        "INCIDENT": str(tmp / "incident"),
    }
    raw = os.environ.get(TRANSCRIPT_ENV)
    r = Rig(home=home, work=work, env=env, holder=rec.pid, holder_pgid=os.getpgid(rec.pid),
            transcript=Path(raw) if raw else None)
    try:
        yield r
    finally:
        leftover = ""
        if (home / "seats" / f"{NAME}.json").exists():  # a runbook failed with the seat up: take it down
            down = run_cli(["down", NAME], home, timeout=240)
            leftover = f"the seat was still recorded (down: rc {down.returncode})"
        r.seen += descendants(rec.pid) + seat_processes(NAME)
        strays = [p for p in descendants(rec.pid) if p.pgid != r.holder_pgid] + seat_processes(NAME)
        survivors = stop_local_cluster(pid=rec.pid, create_time=rec.create_time, known=rec.processes)
        assert strays == [], f"engine processes left under the cluster: {strays}"
        assert survivors == [], survivors
        assert wait_until(lambda: alive(r.seen) == [], 10.0), f"processes left behind: {alive(r.seen)}"
        rings = Path(f"/dev/shm/sgl-seat-{NAME}")  # the probe rings of our seat name
        left_rings = rings.exists()
        shutil.rmtree(rings, ignore_errors=True)
        assert r.failed or not left_rings, "probe rings left in /dev/shm after the last `down`"
        assert r.failed or not leftover, leftover  # the last runbook takes the seat down itself


@dataclass(frozen=True)
class Ran:
    rc: int
    output: str
    env: dict[str, str]
    seconds: float


def _run(block: Block, env: dict[str, str], cwd: Path, dump: Path) -> Ran:
    """``block`` in a fresh bash (its own process group); the exported variables it leaves, for the next block."""
    script = f'set -euo pipefail -a\ntrap \'env -0 > "{dump}"\' EXIT\n{block.code}\n'
    dump.unlink(missing_ok=True)
    t0 = time.monotonic()
    proc = subprocess.Popen(["bash", "-c", script], env=env, cwd=cwd, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, text=True, start_new_session=True)
    try:
        out, _ = proc.communicate(timeout=block.timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, _ = proc.communicate()
        pytest.fail(f"{block.where}: still running after {block.timeout:.0f} s\n$ {block.code}\n{out[-3000:]}")
    left = in_groups([proc.pid])
    if left:
        os.killpg(proc.pid, signal.SIGKILL)
        pytest.fail(f"{block.where}: the command left processes behind: {left}")
    new_env = dict(env)
    if dump.exists():
        for item in dump.read_bytes().split(b"\0"):
            key, eq, val = item.decode(errors="replace").partition("=")
            if eq and key not in _SHELL_NOISE and not key.startswith("BASH_"):
                new_env[key] = val
    return Ran(proc.returncode, out, new_env, time.monotonic() - t0)


def _log(rig: Rig, block: Block, ran: Ran) -> None:
    if rig.transcript is None:
        return
    with rig.transcript.open("a") as f:
        f.write(f"\n### {block.where}  rc {ran.rc}  {ran.seconds:.1f} s\n$ {block.code}\n{ran.output}")


@pytest.mark.integration
@pytest.mark.parametrize("runbook", RUNBOOK_PARAMS)
def test_runbook_commands_run_on_the_local_sim_seat(runbook: str, rig: Rig) -> None:
    """GIVEN the seat as the runbooks before this one left it WHEN each `run` command of this runbook is executed
    in order THEN it exits as the runbook says and its output holds each expected excerpt."""
    if rig.failed:
        pytest.skip(f"an earlier runbook failed ({rig.failed}); this one starts from the seat it would have left")
    blocks = parse_runbook(RUNBOOKS / runbook)
    env = dict(rig.env)
    ran = 0
    t0 = time.monotonic()
    rig.failed = runbook  # cleared on success
    for block in blocks:
        if block.kind != "run":
            continue
        res = _run(block, env, rig.work, rig.work / ".env-dump")
        _log(rig, block, res)
        shown = f"$ {block.code}\n--- rc {res.rc} after {res.seconds:.1f} s ---\n{res.output[-4000:]}"
        assert res.rc == block.exit, f"{block.where}: exit {res.rc}, the runbook says {block.exit}\n{shown}"
        for want in block.expects:
            assert want in res.output, f"{block.where}: the output lacks {want!r}\n{shown}"
        env = res.env
        ran += 1
    rig.seen += descendants(rig.holder) + seat_processes(NAME)
    rig.failed = None
    skipped = [b for b in blocks if b.kind == "no-run"]
    print(f"{runbook}: {ran} commands ran in {time.monotonic() - t0:.0f} s; {len(skipped)} not executed: "
          + "; ".join(f"line {b.line} ({b.reason})" for b in skipped))
