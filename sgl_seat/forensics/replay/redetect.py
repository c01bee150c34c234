"""Re-running the live watchdog's detectors over a loaded bundle.

The live sidecar and ``replay`` must reach the same verdict from the same records (DESIGN section 3),
so replay does not judge a hang itself: it rebuilds the observation the capture judged (the bundle holds
exactly the records the capture merged) and calls the watchdog's own ``detect()`` with the thresholds and
the evaluation time the manifest recorded. This module is the one place that knows that mapping.
"""

from __future__ import annotations

from pydantic import ValidationError

from sgl_seat.core.detect import detect, thresholds_from
from sgl_seat.core.isolation import checks_from_json
from sgl_seat.core.nodeloss import loss_verdict
from sgl_seat.core.observation import Observation
from sgl_seat.core.records import Verdict
from sgl_seat.core.warning import PreHangWarning, WarningRule, first_warning
from sgl_seat.forensics.format.bundle import Bundle
from sgl_seat.forensics.format.extras import learned_of, why_missing, words_of
from sgl_seat.spec import WatchdogSpec

__all__ = ["WARNING_LOOKBACK_S", "first_warning_before", "learned_of", "observation_of", "rerun_detectors",
           "thresholds_of", "why_missing"]

#: How far before the trigger replay looks for the pre-hang warning (one evaluation a second, as a sidecar ticks).
WARNING_LOOKBACK_S = 120.0


def observation_of(bundle: Bundle) -> Observation:
    """What the detectors saw at capture: the Python stack history (not the capture-time dumps), every probe
    record, the metrics, the log lines, the processes, the rank -> node map and the thresholds the nodes had
    learned (the manifest's ``learned``; a bundle without it, or with one that does not parse, is judged by the
    fixed thresholds, as it was written before they were learned)."""
    b, m = bundle, bundle.manifest
    return Observation.of(samples=b.stacks, probes=b.probes, metrics=b.metrics, logs=b.logs, processes=b.processes,
                          rank_nodes=m.rank_nodes, learned=learned_of(bundle), words=words_of(bundle))


def thresholds_of(bundle: Bundle) -> WatchdogSpec:
    """The thresholds the detectors judge this bundle by: the manifest's (``thresholds_from``), or the watchdog's
    defaults where they do not validate (then :func:`rerun_detectors` says so and re-derives no verdict). The one
    source of replay's thresholds: the report's stall threshold is this one's, as the detectors' is."""
    try:
        return thresholds_from(bundle.manifest.thresholds)
    except ValidationError:
        return WatchdogSpec()


def rerun_detectors(bundle: Bundle) -> tuple[Verdict | None, str | None]:
    """(replayed verdict, None), or (None, why there is none) when the detectors find nothing or cannot run."""
    m = bundle.manifest
    now = m.verdict.t if m.verdict is not None else m.trigger_t
    try:
        thresholds = thresholds_from(m.thresholds)
    except ValidationError as exc:
        return None, f"the manifest's thresholds are not valid watchdog thresholds ({exc.error_count()} errors)"
    v = detect(observation_of(bundle), thresholds, now)
    # The same rule as the capture (watchdog.capture.assemble): a node isolated by its own evidence, else a missing
    # node, comes first.
    lv = loss_verdict(m.rank_nodes, m.nodes, now, checks=checks_from_json(m.extra.get("self_check")),
                      why=why_missing(bundle), partial=v)
    if lv is not None:
        return lv, None
    if v is None:
        return None, "the detectors find no hang in these records (the capture was manual or its trigger came " \
                     "from outside them)"
    return v, None


def first_warning_before(bundle: Bundle) -> PreHangWarning | None:
    """The first pre-hang warning (:mod:`sgl_seat.core.warning`) the bundle's row-fetch history raises in the
    ``WARNING_LOOKBACK_S`` before the trigger, under the manifest's stall threshold; None if none."""
    m = bundle.manifest
    trig = m.verdict.t if m.verdict is not None else m.trigger_t
    try:
        rule = WarningRule.for_stall(thresholds_from(m.thresholds).rowfetch_inflight_s)
    except ValidationError:  # as the detectors: no valid thresholds, the rule's own defaults
        rule = WarningRule()
    return first_warning(bundle.probes, max(m.time_start, trig - WARNING_LOOKBACK_S), trig, rule=rule)
