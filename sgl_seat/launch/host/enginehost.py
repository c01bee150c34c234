"""The engine's own parent, outside Ray: a small stdlib-only process that starts the engine, reaps it and writes its
exit status, so that the engine does not die with the Ray worker that asked for it.

Why (issue 24, item 3, "engines keep serving where they can"): a Ray worker that exits, as every worker of a node
does once its raylet is gone (killed, or after the GCS has been unreachable for Ray's reconnect timeout), kills its
*direct* child processes, whatever their session (measured on the two-namespace cluster: the node agent's engines
died with its raylet, and a keeper started as the sidecar's child died with the sidecar). Started through this
host, the engine is the node agent's grandchild: the host's first process exits as soon as the engine runs, the
second (the engine's parent) is then a child of init (or of the host's subreaper), and Ray has no child to kill.

Layout of ``DIR`` (the agent's, one per node and start):

- ``spec.json``: ``{"argv": [...], "env": {...}}``, written by the agent (owner only), read and removed here
  (the engine's environment never crosses a command line, and this process does not carry the seat's name in its
  own environment, so it is never taken for one of the seat's engine processes);
- ``started.json``: ``{"pid": engine pid, "parent": this host's pid}`` once the engine runs, or ``{"error": ...}``;
- ``exit.json``: ``{"returncode": N}`` (``subprocess``'s: negative for a signal) once the engine has exited.

The engine runs in a session of its own (pgid = its pid), as every engine does (``launch/procs``). This process
never signals anything. Run as a script by path with ``python -I``: it imports nothing of sgl-seat.
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
#: Seconds the first process waits for the engine to be started before it gives up (an exec takes milliseconds).
START_WAIT_S = 30.0


def _write(directory: str, name: str, doc: dict[str, object]) -> None:
    tmp = os.path.join(directory, f".{name}")
    with open(tmp, "w") as fh:
        json.dump(doc, fh)
    os.replace(tmp, os.path.join(directory, name))


def _host(directory: str) -> int:
    """The engine's parent: start it, say so, reap it, write its status."""
    for s in (signal.SIGHUP, signal.SIGINT):  # it must outlive its first process and its caller's terminal
        signal.signal(s, signal.SIG_IGN)
    try:
        with open(os.path.join(directory, SPEC)) as fh:
            spec = json.load(fh)
        os.unlink(os.path.join(directory, SPEC))
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
