"""A blocking call under a deadline: what every Ray call without a timeout of its own goes through.

Ray's synchronous calls to the GCS (``ray.get_actor``, ``get_placement_group``, ``placement_group_table``,
resources, actor and group creation, ``ray.kill``) take no timeout, so a wedged GCS would hang a command.
:func:`bounded` runs such a call in a daemon thread and gives up after a deadline with a
:class:`~sgl_seat.errors.ClusterError` naming it. It lives below every package that talks to Ray
(``sgl_seat.launch`` and ``sgl_seat.watchdog``) and imports nothing but :mod:`sgl_seat.errors`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, TypeVar

from sgl_seat.errors import ClusterError

__all__ = ["RAY_CALL_TIMEOUT", "bounded"]

T = TypeVar("T")

#: Deadline of one Ray call that has no timeout of its own (see :func:`bounded`).
RAY_CALL_TIMEOUT = 30.0


def bounded(what: str, fn: Callable[..., T], *args: Any, timeout: float | None = None, **kwargs: Any) -> T:
    """``fn(*args, **kwargs)`` (a Ray call without a timeout of its own) under a deadline.

    It runs in a daemon thread; past ``timeout`` (default :data:`RAY_CALL_TIMEOUT`) a ClusterError names
    ``what`` and the thread is left behind (the process is a short-lived command). The call's own result or
    exception (e.g. ``ValueError`` for a missing actor) is handed back unchanged.
    """
    limit = RAY_CALL_TIMEOUT if timeout is None else timeout
    box: dict[str, Any] = {}

    def run() -> None:
        try:
            box["value"] = fn(*args, **kwargs)
        except BaseException as exc:  # handed to the caller's thread below
            box["error"] = exc

    t = threading.Thread(target=run, name=f"ray-call {what}"[:60], daemon=True)
    t.start()
    t.join(limit)
    if t.is_alive():
        raise ClusterError(f"Ray did not answer {what} within {limit:.0f} s (is the cluster's GCS wedged?)",
                           fix="check the Ray head node (its gcs_server process and log), then run the command again")
    if "error" in box:
        raise box["error"]
    value: T = box["value"]
    return value
