"""The engine's own parent, outside Ray: a small stdlib-only process that starts the engine, reaps it and writes its
exit status, so that the engine does not die with the Ray worker that asked for it.

Why (issue 24, item 3, "engines keep serving where they can"): a Ray worker that exits, as every worker of a node
does once its raylet is gone (killed, or after the GCS has been unreachable for Ray's reconnect timeout), kills its
*direct* child processes, whatever their session (measured on the two-namespace cluster: the node agent's engines
died with its raylet, and a keeper started as the sidecar's child died with the sidecar). Started through this
host, the engine is the node agent's grandchild: the host's first process exits as soon as the engine runs, the
second (the engine's parent) is then a child of init (or of the host's subreaper), and Ray has no child to kill.

Layout of ``DIR`` (the agent's, one per node and start):

- ``spec.json``: ``{"schema_version": 1, "argv": [...], "env": {...}}``, written by the agent (owner only), read
  and removed here (the engine's environment never crosses a command line, and this process does not carry the
  seat's name in its own environment, so it is never taken for one of the seat's engine processes);
- ``started.json``: ``{"schema_version": 1, "pid": engine pid, "parent": this host's pid}`` once the engine runs,
  or ``{"schema_version": 1, "error": ...}``;
- ``exit.json``: ``{"schema_version": 1, "returncode": N}`` (``subprocess``'s: negative for a signal) once the
  engine has exited.

``schema_version`` is :data:`HOST_SCHEMA_VERSION`, the three files' major: each reader (this host for ``spec.json``,
:mod:`~sgl_seat.launch.host.processgroups` for the other two) refuses another one, and reads a file without it
(written by the release before, e.g. for an engine started before an upgrade) as version 1. A ``spec.json`` refused
here is a ``started.json`` with its ``error``: no engine is started.

The engine runs in a session of its own (pgid = its pid), as every engine does
(:mod:`~sgl_seat.launch.host.processgroups`). This process never signals anything. Run as a script by path with
``python -I``: it imports nothing of sgl-seat, so its version check is its own.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

SPEC = "spec.json"
STARTED = "started.json"
EXIT = "exit.json"
#: The layout of SPEC, STARTED and EXIT; only a change that older readers cannot read bumps it.
HOST_SCHEMA_VERSION = 1
#: Seconds the first process waits for the engine to be started before it gives up (an exec takes milliseconds).
START_WAIT_S = 30.0


def _write(directory: str, name: str, doc: dict[str, object]) -> None:
    tmp = os.path.join(directory, f".{name}")
    with open(tmp, "w") as fh:
        json.dump({"schema_version": HOST_SCHEMA_VERSION, **doc}, fh)
    os.replace(tmp, os.path.join(directory, name))


def version_refusal(path: str, doc: object) -> str | None:
    """Why ``doc`` (the JSON of ``path``) is not read here, or None: another ``schema_version`` than
    HOST_SCHEMA_VERSION (a file without one is version 1). The words of sgl-seat's FormatVersionError, which this
    script cannot import. A ``doc`` that is not an object is left to its reader's own check (it may hold an
    environment, not to be repeated in an error)."""
    if not isinstance(doc, dict):
        return None
    found = doc.get("schema_version", 1)
    if type(found) is int and found == HOST_SCHEMA_VERSION:  # not isinstance: JSON's true would pass as 1
        return None
    return (f"{path}: schema_version {found!r} is not one this sgl-seat reads (it reads {HOST_SCHEMA_VERSION}; a "
            "file without schema_version is 1); fix: the node agent that wrote it runs another sgl-seat version "
            "than this engine host (sgl-seat changed under a running seat): bring the seat up again with one "
            "sgl-seat version on every node")


def _host(directory: str) -> int:
    """The engine's parent: start it, say so, reap it, write its status."""
    for s in (signal.SIGHUP, signal.SIGINT):  # it must outlive its first process and its caller's terminal
        signal.signal(s, signal.SIG_IGN)
    try:
        with open(os.path.join(directory, SPEC)) as fh:
            spec = json.load(fh)
        os.unlink(os.path.join(directory, SPEC))  # first: a refused spec's environment is not left on disk either
        refused = version_refusal(os.path.join(directory, SPEC), spec)
        if refused:
            _write(directory, STARTED, {"error": refused})
            return 1
        proc = subprocess.Popen([str(a) for a in spec["argv"]], env={str(k): str(v) for k, v in spec["env"].items()},
                                stdin=subprocess.DEVNULL, start_new_session=True, close_fds=True,
                                restore_signals=True)
    except Exception as exc:
        _write(directory, STARTED, {"error": f"{type(exc).__name__}: {exc}"})
        return 1
    _write(directory, STARTED, {"pid": proc.pid, "parent": os.getpid()})
    while True:
        try:
            rc = proc.wait()
            break
        except InterruptedError:  # pragma: no cover - retried by Python itself since PEP 475
            continue
    _write(directory, EXIT, {"returncode": rc})
    return 0


def main(argv: list[str]) -> int:
    if len(argv) != 1:
        print("usage: python -I enginehost.py DIR", file=sys.stderr)
        return 2
    directory = argv[0]
    if os.fork():  # the first process: wait until the engine runs (or could not start), then exit
        deadline = time.monotonic() + START_WAIT_S
        path = os.path.join(directory, STARTED)
        while not os.path.exists(path) and time.monotonic() < deadline:
            time.sleep(0.005)
        os._exit(0 if os.path.exists(path) else 1)
    os._exit(_host(directory))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
