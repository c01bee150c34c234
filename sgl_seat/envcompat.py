"""This project's environment variables: the prefix ``SGLSEAT_``, and the old ``SGL_SEAT_`` names for one release.

Why the prefix changed (issue 49): SGLang claims ``SGL_``. At import, ``sglang/srt/environ.py`` rewrites every
``SGL_*`` variable to ``SGLANG_*`` with a deprecation warning (0.5.23: ``_handle_deprecated_envs``; 0.5.17:
``_convert_SGL_to_SGLANG``), so an engine started with ``SGL_SEAT_NAME`` opened its log with "Environment variable
SGL_SEAT_NAME is deprecated, please use SGLANG_SEAT_NAME", once per variable and process. ``SGLSEAT_`` starts with
neither ``SGL_`` nor ``SGLANG_``.

For one release the old names still work:

- :func:`migrate` runs when ``sgl_seat`` is imported (the package's ``__init__``: the CLI, the Ray actors, the sim's
  processes, the benches): an old ``SGL_SEAT_X`` with ``SGLSEAT_X`` unset gives ``SGLSEAT_X`` its value, with one
  line on stderr naming both; both set to different values: a line saying ``SGLSEAT_X`` wins. The old name is
  then removed from this process's environment, so the processes it starts (the engine above all) never see it.
- :func:`lookup` reads a name from a recorded environment (a bundle's, a seat record's plan, a live process's
  ``/proc/<pid>/environ``) under either name: what the previous release recorded must still be read.
- The in-engine probe (standard library only, loaded by path) has its own small fallback:
  ``probe/oldnames.py``.

Standard library only, at the layer of ``errors``. The old prefix is spelt only here, in the probe's fallback and in
their tests (and on lines marked ``old-env-name``), so the rename script leaves them alone.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Mapping, MutableMapping
from typing import Final

__all__ = ["NEW_PREFIX", "OLD_PREFIX", "OWN_PREFIXES", "is_own", "lookup", "migrate", "new_name", "old_name"]

#: This project's prefix: neither SGLang's ``SGL_`` nor its ``SGLANG_``.
NEW_PREFIX: Final = "SGLSEAT_"
#: The prefix before issue 49; read (with a warning) for one release.
OLD_PREFIX: Final = "SGL_SEAT_"
#: Every prefix this project's own variables carry (what a user may not set in a host's ``env``).
OWN_PREFIXES: Final = (NEW_PREFIX, OLD_PREFIX)


def is_own(name: str) -> bool:
    """Whether ``name`` is one of this project's variables, under the new or the old prefix."""
    return name.startswith(OWN_PREFIXES)


def new_name(name: str) -> str:
    """``SGL_SEAT_X`` -> ``SGLSEAT_X``; any other name unchanged."""
    return NEW_PREFIX + name[len(OLD_PREFIX):] if name.startswith(OLD_PREFIX) else name


def old_name(name: str) -> str:
    """``SGLSEAT_X`` -> ``SGL_SEAT_X`` (what the previous release called it); any other name unchanged."""
    return OLD_PREFIX + name[len(NEW_PREFIX):] if name.startswith(NEW_PREFIX) else name


def lookup(env: Mapping[str, str], name: str) -> str | None:
    """``env[name]``, else the value under its old name (an environment the previous release recorded), else None.

    ``name`` may be given under either prefix; the new name wins where both are there."""
    new = new_name(name)
    value = env.get(new)
    return value if value is not None else env.get(old_name(new))


def _stderr(line: str) -> None:
    with contextlib.suppress(Exception):  # a closed or missing stderr must not stop the import of sgl_seat
        sys.stderr.write(line + "\n")
        sys.stderr.flush()


def migrate(environ: MutableMapping[str, str] | None = None,
            warn: Callable[[str], None] | None = None) -> list[str]:
    """Move every old ``SGL_SEAT_X`` in ``environ`` (default ``os.environ``) to ``SGLSEAT_X``; return the lines warned.

    Old set, new unset: the new takes the old's value. Both set, same value: quietly the one. Both set, different
    values: the new wins, and a line says so. Either way the old name is removed, so that a process started from
    here (an engine: SGLang would warn about any ``SGL_*``) inherits only the new one. One line per old name, on
    stderr (``warn``), each naming both."""
    env: MutableMapping[str, str] = os.environ if environ is None else environ
    say = _stderr if warn is None else warn
    lines: list[str] = []
    for old in sorted(k for k in list(env) if k.startswith(OLD_PREFIX)):
        new = new_name(old)
        value = env.pop(old)
        if new not in env:
            env[new] = value
            line = (f"sgl-seat: environment variable {old} is deprecated, please use {new} "
                    f"(read as {new}; the old name is read for this release only)")
        elif env[new] != value:
            line = (f"sgl-seat: environment variables {old} and {new} are both set, to different values; "
                    f"{new}={env[new]!r} wins ({old} is the old name: unset it)")
        else:
            continue
        lines.append(line)
        say(line)
    return lines
