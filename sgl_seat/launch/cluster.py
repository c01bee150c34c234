"""The driver's connection to Ray: environment, token auth, and a timeout on every wait.

``ray.init`` retries an unreachable GCS forever (measured with Ray 2.60: still retrying after two
minutes), and ``ray.get`` without a timeout waits forever on a dead node. So connecting first
checks the GCS port with a TCP connect, then runs ``ray.init`` under a deadline, and every call
into an actor goes through :func:`get` with a timeout and translates Ray's errors into
:class:`ClusterError` naming what did not answer. Ray's synchronous calls to the GCS that take no
timeout (``ray.get_actor``, ``get_placement_group``, ``placement_group_table``, resources, actor and
group creation, ``ray.kill``) go through :func:`sgl_seat.deadline.bounded`, so a wedged GCS cannot hang a
command.

On one host Ray must be told not to swap ``127.0.0.1`` for the host's outward address:
``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` has to be in the environment before ``ray`` is imported,
in every process (DESIGN section 8). It is set here for loopback clusters only: on a real cluster
it would make the driver look for its raylet on 127.0.0.1.
"""

from __future__ import annotations

import logging
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from typing import Any

from sgl_seat.deadline import bounded
from sgl_seat.engines import preflight_facts
from sgl_seat.errors import ClusterError

log = logging.getLogger(__name__)

ONE_HOST_ENV = "RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"
_LOOPBACK = ("127.", "localhost", "::1", "[::1]")


def split_address(address: str) -> tuple[str, int]:
    host, sep, port = address.rpartition(":")
    if not sep or not port.isdigit():
        raise ClusterError(f"Ray address {address!r} is not host:port",
                           fix="set cluster.address to 'local', 'auto' or host:port of the head's GCS")
    return host.strip("[]"), int(port)


def is_loopback(address: str) -> bool:
    return address == "local" or address.startswith(_LOOPBACK)


def prepare_env(address: str, token_env: str | None) -> None:
    """Environment Ray reads at import/connect time: one-host mode and token auth."""
    if is_loopback(address):
        os.environ[ONE_HOST_ENV] = "0"
        if "ray" in sys.modules:
            from ray._private import ray_constants

            if ray_constants.ENABLE_RAY_CLUSTER:
                raise ClusterError(
                    f"ray was imported before {ONE_HOST_ENV}=0 was set, so Ray would use this host's outward"
                    " address instead of 127.0.0.1",
                    fix=f"export {ONE_HOST_ENV}=0 before starting Python (or before importing ray)",
                )
    if token_env:
        token = os.environ.get(token_env)
        if not token:
            raise ClusterError(f"cluster.token_env names {token_env}, but {token_env} is not set or empty",
                               fix=f"export {token_env}=<the cluster's Ray auth token> (ray get-auth-token)")
        os.environ["RAY_AUTH_MODE"] = "token"
        os.environ["RAY_AUTH_TOKEN"] = token


def connect(address: str, namespace: str, *, token_env: str | None = None, timeout: float = 30.0) -> None:
    """Connect this process to the Ray cluster at ``address`` (host:port or ``auto``) within ``timeout``."""
    prepare_env(address, token_env)
    deadline = time.monotonic() + timeout
    if address != "auto":
        host, port = split_address(address)
        err = preflight_facts.wait_connectable(host, port, deadline, attempt_timeout=2.0, interval=0.5)
        if err is not None:
            raise ClusterError(f"Ray's GCS at {address} is not reachable ({err}) after {timeout:.0f} s",
                               fix="start the Ray cluster (`ray start --head` on the head node) or fix cluster.address")
    import ray

    if ray.is_initialized():
        ray.shutdown()
    errors_to_stderr()
    box: dict[str, BaseException] = {}

    def _init() -> None:
        try:
            ray.init(address=address, namespace=namespace, logging_level=logging.WARNING, log_to_driver=False,
                     configure_logging=True)
        except BaseException as exc:  # handed to the caller's thread below
            box["error"] = exc

    # ray.init runs in a thread so that it can be given up on; Ray then warns that it cannot install its
    # SIGTERM handler there, which is expected and not for the operator's eyes.
    worker_log = logging.getLogger("ray._private.worker")
    old_level = worker_log.level
    worker_log.setLevel(logging.ERROR)
    t = threading.Thread(target=_init, name="ray-init", daemon=True)
    t.start()
    try:
        t.join(max(1.0, deadline - time.monotonic()))
    finally:
        worker_log.setLevel(old_level)
    if t.is_alive():
        raise ClusterError(f"ray.init(address={address!r}) did not finish within {timeout:.0f} s",
                           fix="check that the address is a Ray GCS and that token auth matches (cluster.token_env)")
    if "error" in box:
        exc = box["error"]
        raise ClusterError(f"cannot connect to Ray at {address}: {type(exc).__name__}: {exc}",
                           fix="check cluster.address and, if the cluster uses token auth, cluster.token_env") from exc


def errors_to_stderr() -> None:
    """Send the cluster's error messages that Ray's driver prints (a node marked dead, say) to stderr.

    Why: a driver prints them from a thread of its own, to stdout, whatever ``log_to_driver`` says; under `--json`
    stdout must carry the JSON alone (`down --json` after a raylet was killed would begin with "(raylet) The node
    with node id ... has been marked dead"). Ray looks the printer up by name at each message, so it is wrapped here
    (once per process) to mark every message an error stream's.
    """
    from ray._private import worker as ray_worker

    orig: Any = ray_worker.print_to_stdstream
    if getattr(orig, "sgl_seat_stderr", False):
        return

    def to_stderr(data: dict[str, Any], ignore_prefix: bool) -> None:
        orig({**data, "is_err": True}, ignore_prefix)

    to_stderr.sgl_seat_stderr = True  # type: ignore[attr-defined]
    ray_worker.print_to_stdstream = to_stderr


class NoAnswer(ClusterError):
    """An actor's node did not answer in time, or Ray reports that node dead: the node, not the engine, is lost."""


def disconnect() -> None:
    import ray

    if ray.is_initialized():
        ray.shutdown()


def get(ref: Any, timeout: float, what: str) -> Any:
    """``ray.get`` with a timeout; Ray's failures become ClusterError naming ``what``."""
    import ray
    from ray.exceptions import ActorUnavailableError, GetTimeoutError, RayActorError, RayTaskError

    try:
        return ray.get(ref, timeout=timeout)
    except GetTimeoutError:
        raise NoAnswer(f"{what} did not answer within {timeout:.0f} s",
                       fix="check the node (`sgl-seat status`), or raise --timeout") from None
    except ActorUnavailableError:  # Ray cannot reach the actor now (its node unreachable), not known dead
        raise NoAnswer(f"{what}: unreachable (ActorUnavailableError)",
                       fix="check the node's host and link; `sgl-seat status` again once it is back") from None
    except RayActorError as exc:
        # Ray's words when the actor's node was lost ("... because its node has died"), not a crashed worker.
        if any(w in str(exc).lower() for w in ("node has died", "node died")):
            raise NoAnswer(f"{what}: its node died ({type(exc).__name__})",
                           fix="check the host and its raylet; `sgl-seat down` stops what it can reach") from None
        raise ClusterError(f"{what}: the actor is gone ({type(exc).__name__})",
                           fix="the node or its agent died; `sgl-seat down` cleans up") from None
    except RayTaskError as exc:
        cause = exc.cause if getattr(exc, "cause", None) is not None else exc
        raise ClusterError(f"{what} failed: {type(cause).__name__}: {cause}",
                           fix="see the node's log (`sgl-seat logs`)") from None


def resources() -> tuple[dict[str, float], dict[str, float]]:
    """(available, total) resources of the cluster, without Ray's per-group bookkeeping keys."""
    import ray

    def clean(d: Mapping[str, float]) -> dict[str, float]:
        return {k: v for k, v in sorted(d.items()) if "_group_" not in k and not k.startswith("node:")}

    # Ray's functions are unannotated; typed aliases keep mypy --strict without an ignore.
    available: Callable[[], Mapping[str, float]] = ray.available_resources
    total: Callable[[], Mapping[str, float]] = ray.cluster_resources
    return (clean(bounded("ray.available_resources()", available)),
            clean(bounded("ray.cluster_resources()", total)))


def format_resources(d: Mapping[str, float]) -> str:
    gib = float(1 << 30)
    parts = []
    for k, v in d.items():
        if k in ("memory", "object_store_memory"):
            parts.append(f"{k}: {v / gib:.1f} GiB")
        else:
            parts.append(f"{k}: {v:g}")
    return "{" + ", ".join(parts) + "}"
