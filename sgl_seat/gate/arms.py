"""The battery's arms: how each one is brought up and down (or found running).

Arms come from one seat spec: ``baseline`` (draft off), ``candidate`` (draft on), ``hybrid`` (draft on with
``--speculative-adaptive``: the seat's policy ``draft.off_above`` as SGLang's tiers, written by ``sgl-seat tune
draft``, or SGLang's default tiers where the seat has none) and ``control`` (baseline again: the A/A arm whose
spread is the noise floor).

Two ways to get an arm:

- :class:`SeatArms` brings each arm up and down itself through ``sgl_seat.launch`` (a fresh engine per slot, so
  cold TTFT and greedy identity after a restart are measured). Each arm is its own seat name
  (``<seat>-<arm>``), so its bundles and logs stay apart. A spec with ``cluster.address: local`` gets one local
  Ray cluster for the whole battery (engine start-up is then the only per-slot cost).
- :class:`UrlArms` takes the endpoints of seats that are already running; nothing restarts, so the cold gates
  are reported as not measured, and hangs are read only where a bundles directory is given.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import httpx

from sgl_seat.engines import backend_for
from sgl_seat.errors import (
    ArmStartError,
    ClusterError,
    EngineError,
    PreflightError,
    SeatError,
    SeatStateError,
    UsageError,
)
from sgl_seat.gate.design import BASELINE, CANDIDATE, CONTROL, HYBRID
from sgl_seat.launch import teardown
from sgl_seat.launch import up as seat_up
from sgl_seat.launch.host.localcluster import LocalClusterRecord, start_local_cluster, stop_local_cluster
from sgl_seat.launch.seatrecord.record import record_path
from sgl_seat.spec import DraftSpec, SeatSpec

__all__ = ["ArmSession", "Arms", "SeatArms", "UrlArms", "arm_spec", "arm_start_error"]

log = logging.getLogger(__name__)
DRAFT_ON = frozenset({CANDIDATE, HYBRID})


@dataclass(frozen=True, slots=True)
class ArmSession:
    arm: str
    endpoint: str
    model: str
    cold: bool  # a fresh engine start: cold cells are meaningful
    bundles_dir: Path | None
    up_s: float | None = None
    #: Engine starts this slot took (a start that failed is retried once: SeatArms.start).
    starts: int = 1
    #: Why an earlier start of this slot failed (None: the first start served).
    failed_start: str | None = None


class Arms(Protocol):
    restarts: bool

    def start(self, arm: str) -> ArmSession: ...

    def stop(self, session: ArmSession) -> None: ...

    def close(self) -> None: ...

    def describe(self) -> dict[str, Any]: ...


def arm_start_error(arm: str, exc: SeatError, starts: int, *, also: str = "") -> ArmStartError:
    """``exc`` (why arm ``arm``'s `up` failed) as the gate's error: the arm, the node where one is known, the reason
    and its fix; a battery that stops here has no verdict."""
    node = exc.node if isinstance(exc, EngineError) else (
        exc.nodes[0] if isinstance(exc, PreflightError) and exc.nodes else None)
    where = f"node {node}" if node is not None else "the seat"
    tries = "refused before it started" if starts == 0 else "its only start" if starts == 1 else f"{starts} starts"
    return ArmStartError(f"arm {arm} could not start ({where}, {tries}); the battery stopped without a verdict: "
                         + exc.message + (f"\n  {also}" if also else ""),
                         arm=arm, node=node, reason=exc.message.splitlines()[0], fix=exc.fix)


def arm_spec(spec: SeatSpec, arm: str, *, address: str | None = None) -> SeatSpec:
    """The seat spec of one arm: its own name; the battery's cluster; the draft static for the candidate (a seat's
    policy, ``draft.off_above``, is what the hybrid arm gates) and adaptive for the hybrid (the seat's policy
    tiers, or SGLang's default tiers where it has none; an NGRAM draft's policy is its engine's own schedule)."""
    name = f"{spec.name[: 62 - len(arm)]}-{arm}"
    upd: dict[str, Any] = {"name": name}
    if arm == CANDIDATE:
        upd["draft"] = spec.draft.model_copy(update={"adaptive": False, "off_above": None})
    if arm == HYBRID and (spec.draft.algorithm == "NGRAM" or backend_for(spec.engine).policy_is_schedule):
        # A policy that is its engine's own schedule (vLLM's num_speculative_tokens_per_batch_size), and any NGRAM
        # policy: the hybrid is the seat's draft with its off_above, no adaptive tiers (SGLang's take EAGLE only).
        if spec.draft.off_above is None:
            raise UsageError(f"the hybrid arm of seat {spec.name!r} has no policy: its {spec.draft.algorithm} draft "
                             "runs one only with draft.off_above", fix="`sgl-seat tune draft REPORT --seat SEAT` "
                             "writes it from a gate's crossover; or gate baseline,candidate[,control]")
    elif arm == HYBRID:
        try:
            upd["draft"] = DraftSpec.model_validate({**spec.draft.model_dump(), "adaptive": True})
        except ValueError as exc:
            raise UsageError(f"the hybrid arm cannot run on seat {spec.name!r}: {exc}",
                             fix="gate baseline,candidate[,control] only, or an EAGLE/EAGLE3 draft with topk 1",
                             ) from None
    if address is not None:
        upd["cluster"] = spec.cluster.model_copy(update={"address": address})
    return spec.model_copy(update=upd)


class SeatArms:
    """Each slot: ``up`` the arm's seat (draft on or off), measure, ``down``."""

    restarts = True

    def __init__(self, spec: SeatSpec, *, watchdog: bool = True, up_timeout: float = 600.0,
                 say: Callable[[str], None] = lambda _s: None) -> None:
        self.spec, self.watchdog, self.up_timeout, self.say = spec, watchdog, up_timeout, say
        self.cluster: LocalClusterRecord | None = None
        self._address: str | None = None

    def _ensure_cluster(self) -> None:
        if self.spec.cluster.address != "local" or self.cluster is not None:
            return
        c = self.spec.cluster
        self.say(f"starting one local Ray cluster for the battery ({c.nodes} simulated nodes)")
        self.cluster = start_local_cluster(f"{self.spec.name}-gate", nodes=c.nodes, gpus_per_node=c.gpus_per_node,
                                           cpus_per_node=c.cpus_per_node, timeout=180.0)
        self._address = self.cluster.gcs_address

    def start(self, arm: str) -> ArmSession:
        """Bring the arm up. An engine that fails to start is started once more (a battery of hours should not end
        on one flaky start: measured, SGLang 0.5.17's CUDA-graph capture on the H200 failed once in a draft arm's
        start that served on the next; the sim's gloo rendezvous on a loaded machine), and the slot records it.
        `up` has taken the failed start down itself (its record is gone) unless its teardown left something, which
        is taken down here first. A start that trying again cannot mend (preflight: a port held, an interface
        missing; the cluster) is not retried. An arm that does not start is an :class:`ArmStartError`: exit 4, no
        verdict, naming the arm, the node and the reason."""
        opts = seat_up.UpOptions(draft=arm in DRAFT_ON, timeout=self.up_timeout, no_watchdog=not self.watchdog)
        if self.spec.cluster.address == "local":  # every arm on this host: a held port is found before a cluster
            held = seat_up.local_ports_error(arm_spec(self.spec, arm), opts)
            if held is not None:
                raise arm_start_error(arm, held, 0)
        self._ensure_cluster()
        spec = arm_spec(self.spec, arm, address=self._address)
        failed: str | None = None
        for attempt in (1, 2):
            t0 = time.monotonic()
            try:
                rec, _ = seat_up.up(spec, opts)
            except EngineError as exc:
                if attempt == 2:
                    raise arm_start_error(arm, exc, attempt) from exc
                failed = exc.message.splitlines()[0][:500]
                self.say(f"arm {arm}: the engine did not start ({failed}); starting it once more")
                self._take_down_leftovers(arm, spec.name, exc)
                continue
            except (PreflightError, SeatStateError, ClusterError) as exc:
                raise arm_start_error(arm, exc, attempt) from exc
            if not rec.endpoint:
                raise UsageError(f"arm {arm}: `up` returned no endpoint")
            return ArmSession(arm, rec.endpoint.rstrip("/"), spec.model.name, True,
                              Path(rec.bundles_dir) if rec.bundles_dir and self.watchdog else None,
                              time.monotonic() - t0, starts=attempt, failed_start=failed)
        raise AssertionError("unreachable")  # pragma: no cover

    def _take_down_leftovers(self, arm: str, name: str, first: EngineError) -> None:
        """What a failed start's own teardown left (its record kept, FAILED, naming survivors), before the next."""
        if not record_path(name).is_file():
            return
        try:
            teardown.down(name)
        except SeatError as exc:
            raise arm_start_error(arm, first, 1, also=f"what it left could not be taken down: {exc.message}") from exc

    def stop(self, session: ArmSession) -> None:
        teardown.down(arm_spec(self.spec, session.arm).name)

    def close(self) -> None:
        if self.cluster is not None:
            left = stop_local_cluster(pid=self.cluster.pid, create_time=self.cluster.create_time,
                                      known=self.cluster.processes)
            if left:
                log.warning("the battery's local Ray cluster left processes: %s", left)
            self.cluster = None

    def describe(self) -> dict[str, Any]:
        return {"kind": "seat", "seat": self.spec.name, "engine": self.spec.engine, "source": self.spec.source,
                "watchdog": self.watchdog}


def served_model(endpoint: str, timeout: float = 10.0) -> str:
    """The model name a running seat serves (``/v1/models``)."""
    try:
        r = httpx.get(f"{endpoint}/v1/models", timeout=timeout, trust_env=False)
        r.raise_for_status()
        return str(r.json()["data"][0]["id"])
    except (httpx.HTTPError, ValueError, LookupError, TypeError) as exc:
        raise UsageError(f"cannot read the served model from {endpoint}/v1/models: {exc}",
                         fix="check the URL: it is the seat's endpoint, e.g. http://10.0.0.1:30000") from None


class UrlArms:
    """Seats that are already running: nothing is restarted, so cold cells are not measured."""

    restarts = False

    def __init__(self, urls: Mapping[str, str], *, bundles: Mapping[str, Path] | None = None) -> None:
        self.urls = {k: v.rstrip("/") for k, v in urls.items()}
        self.bundles = dict(bundles or {})
        self._models: dict[str, str] = {}

    def start(self, arm: str) -> ArmSession:
        if arm not in self.urls:
            raise UsageError(f"arm {arm} has no URL", fix=f"pass --url {arm}=http://HOST:PORT")
        url = self.urls[arm]
        if arm not in self._models:
            self._models[arm] = served_model(url)
        return ArmSession(arm, url, self._models[arm], False, self.bundles.get(arm))

    def stop(self, session: ArmSession) -> None:
        return None

    def close(self) -> None:
        return None

    def describe(self) -> dict[str, Any]:
        return {"kind": "urls", "urls": dict(self.urls)}


ALL_ARMS = (BASELINE, CANDIDATE, HYBRID, CONTROL)
