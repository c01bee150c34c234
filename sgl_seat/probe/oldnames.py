"""The probe's small fallback for a seat planned by the previous release (issue 49): old ``SGL_SEAT_*`` names.

sgl-seat's variables were renamed from ``SGL_SEAT_*`` to ``SGLSEAT_*`` (SGLang rewrites any ``SGL_*`` to ``SGLANG_*``
with a warning). The probe runs inside the engine and reads its variables from the plan's environment; a plan made by
the previous release carries the old names. For one release :func:`adopt` gives each unset new name the old one's
value, in this process only, quietly (SGLang has already warned about the old names in that engine's log), so such a
seat still probes. Standard library only, like the rest of the probe; ``sgl_seat.envcompat`` is the same rule for
sgl-seat's own processes (with a warning, and the old names removed).
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

NEW_PREFIX = "SGLSEAT_"
OLD_PREFIX = "SGL_SEAT_"


def adopt(environ: MutableMapping[str, str] | None = None) -> list[str]:
    """For each old ``SGL_SEAT_X`` whose ``SGLSEAT_X`` is unset, set it to the old value; return the new names set.

    A new name already set wins; the old names are left in place (the engine's own environment is not ours to trim)."""
    env: MutableMapping[str, str] = os.environ if environ is None else environ
    adopted: list[str] = []
    for old in sorted(k for k in list(env) if k.startswith(OLD_PREFIX)):
        new = NEW_PREFIX + old[len(OLD_PREFIX):]
        if new not in env:
            env[new] = env[old]
            adopted.append(new)
    return adopted


def get(name: str, environ: MutableMapping[str, str] | None = None) -> str | None:
    """``name`` (a new name) from the environment, else its old name's value."""
    env: MutableMapping[str, str] = os.environ if environ is None else environ
    value = env.get(name)
    if value is None and name.startswith(NEW_PREFIX):
        value = env.get(OLD_PREFIX + name[len(NEW_PREFIX):])
    return value
