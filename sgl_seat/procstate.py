"""A process's (or a thread's) state as the kernel reports it: one reader of ``/proc/PID/stat`` for everyone.

The state is the one letter after the command name in ``/proc/PID/stat`` (``R`` running, ``S`` sleeping, ``D`` disk
sleep, ``T`` stopped, ``t`` tracing stop, ``Z`` zombie, ``X`` dead, ...). It is read in one small read with no
other parsing, because the watchdog asks it of every engine process every poll and a stopped process must be
readable unchanged. The command name sits in parentheses and may itself hold ``)``, so the letter is found after
the *last* one. A thread id works as well as a process id (``/proc/TID`` exists for every thread).

Linux only; standard library only, so every layer may ask.
"""

from __future__ import annotations

from typing import Final

__all__ = ["STATE_NAMES", "pid_state", "state_name"]

#: The names psutil gives the letters (``psutil.Process.status()`` on Linux), for states shown to a person.
STATE_NAMES: Final = {
    "R": "running", "S": "sleeping", "D": "disk-sleep", "T": "stopped", "t": "tracing-stop", "Z": "zombie",
    "X": "dead", "x": "dead", "K": "wake-kill", "W": "waking", "I": "idle", "P": "parked",
}


def pid_state(pid: int) -> str | None:
    """The state letter of ``pid`` from /proc/PID/stat, None if the process is gone (or /proc cannot be read)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as fh:
            data = fh.read(512)
    except OSError:
        return None
    end = data.rfind(b")")
    return data[end + 2:end + 3].decode("ascii", "replace") if end > 0 else None


def state_name(pid: int) -> str | None:
    """The state of ``pid`` by name (running, sleeping, disk-sleep, stopped, zombie, ...; ``?`` for a letter
    without one), None if the process is gone."""
    letter = pid_state(pid)
    return None if letter is None else STATE_NAMES.get(letter, "?")
