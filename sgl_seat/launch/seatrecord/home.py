"""Where sgl-seat keeps its local state: ``$SGLSEAT_HOME`` (default ``~/.sgl-seat``).

Seat records (``seats/<name>.json``), local-cluster records (``clusters/<seat>.json``) and node logs
(``logs/<seat>/node<r>.log``) live here. Writes go through a temporary file renamed into place so
a reader never sees half a record, even when ``up`` is interrupted mid-write.
"""

from __future__ import annotations

import errno
import json
import os
import tempfile
from pathlib import Path
from typing import Any

from sgl_seat.errors import HomeError

HOME_ENV = "SGLSEAT_HOME"


def seat_home() -> Path:
    """``$SGLSEAT_HOME`` or ``~/.sgl-seat``; read on every call so tests can point it elsewhere."""
    raw = os.environ.get(HOME_ENV)
    return Path(raw).expanduser() if raw else Path.home() / ".sgl-seat"


def ensure_writable(home: Path | None = None) -> Path:
    """Create ``$SGLSEAT_HOME`` if it is missing and prove it takes a write (a small temp file, fsynced and
    removed); raise :class:`HomeError` naming the path and what to do when it does not.

    An actual write, not a look at mode bits: root ignores them, and neither a read-only mount nor a full disk
    shows in them. `up` calls this before anything starts, so a seat is never brought up with nowhere to put its
    record (which `down` needs), its logs or its bundles.
    """
    path = home or seat_home()
    try:
        path.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=".write-check-", dir=path)
        try:
            os.write(fd, b"sgl-seat write check\n")
            os.fsync(fd)
        finally:
            os.close(fd)
            Path(tmp).unlink(missing_ok=True)
    except OSError as exc:
        raise home_error(path, exc, "seat records, node logs and bundles go there") from None
    return path


def home_error(path: Path, exc: OSError, what: str) -> HomeError:
    """The :class:`HomeError` for an OS error writing under ``$SGLSEAT_HOME``: why, in words, and the fix."""
    why = {errno.EROFS: "is on a read-only file system", errno.ENOSPC: "is full",
           errno.EDQUOT: "is over its disk quota", errno.EACCES: "is not writable by this user",
           errno.EPERM: "is not writable by this user"}.get(exc.errno or 0, f"cannot be written ({exc.strerror})")
    return HomeError(
        f"sgl-seat's home {path} {why}: {what}",
        fix=f"free space there or make it writable; or set {HOME_ENV} to a writable directory (e.g. export "
            f"{HOME_ENV}=/var/tmp/sgl-seat) and copy {path}/seats into it",
    )


def seats_dir(home: Path | None = None) -> Path:
    return (home or seat_home()) / "seats"


def clusters_dir(home: Path | None = None) -> Path:
    return (home or seat_home()) / "clusters"


def logs_dir(seat: str, home: Path | None = None) -> Path:
    return (home or seat_home()) / "logs" / seat


def write_json_atomic(path: Path, doc: Any) -> None:
    """Write JSON to ``path`` all at once (temp file in the same directory, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as fh:
            json.dump(doc, fh, indent=2)
            fh.write("\n")
        os.replace(tmp, path)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


def read_json(path: Path) -> Any:
    with path.open(encoding="utf-8") as fh:
        return json.load(fh)


def host_id() -> str:
    """Identity of this machine's running kernel (hostname + boot id).

    Two processes with the same host id can see each other's files and pids: the driver uses it
    to tell node agents on its own host to log under the driver's ``$SGLSEAT_HOME``, and ``down``
    uses it to re-check recorded pids with psutil.
    """
    try:
        boot = Path("/proc/sys/kernel/random/boot_id").read_text(encoding="ascii").strip()
    except OSError:
        boot = "no-boot-id"
    return f"{os.uname().nodename}/{boot}"
