"""Probe targets per model family, from the operator asset ``watchdog/probe-targets.yaml``.

Which functions of an engine to probe is engine knowledge, so the backends answer it (their ``probe_family``,
carried by :meth:`~sgl_seat.engines.base.EngineFacts.probe_targets`); the plan reads them (pure: a packaged file,
no environment) to fill ``SGLSEAT_PROBE`` on every node.
In a checkout the file is the top-level ``watchdog/probe-targets.yaml``; a wheel carries it as
``sgl_seat/_assets/watchdog/probe-targets.yaml``. Without either, only the sim's own target is known.
"""

from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path

import yaml

from sgl_seat.errors import PlanError

SIM_FAMILY = "sim"
#: The sim's row fetch: always known, even without the asset (it is our own code).
SIM_TARGETS: tuple[str, ...] = ("sgl_seat.sim.rowfetch:fetch_rows@ids:numel",)


def targets_file() -> Path | None:
    checkout = Path(__file__).resolve().parents[2] / "watchdog" / "probe-targets.yaml"
    if checkout.is_file():
        return checkout
    packaged = Path(str(resources.files("sgl_seat") / "_assets" / "watchdog" / "probe-targets.yaml"))
    return packaged if packaged.is_file() else None


@functools.lru_cache(maxsize=4)
def _load(path: str | None) -> dict[str, tuple[str, ...]]:
    if path is None:
        return {SIM_FAMILY: SIM_TARGETS}
    try:
        doc = yaml.safe_load(Path(path).read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise PlanError(f"{path}: cannot read the probe targets: {exc}", fix="fix or restore the file") from None
    fams = doc.get("families") if isinstance(doc, dict) else None
    if not isinstance(fams, dict) or not all(
        isinstance(k, str) and isinstance(v, list) and all(isinstance(t, str) for t in v) for k, v in fams.items()
    ):
        raise PlanError(f"{path}: 'families' must map a family name to a list of target strings",
                        fix="see the comment at the top of the file")
    return {k: tuple(v) for k, v in fams.items()}


def family_targets(family: str) -> tuple[str, ...]:
    """Targets of ``family`` (``sim`` or an architecture such as ``DeepseekV4ForCausalLM``); () if unknown."""
    path = targets_file()
    return _load(str(path) if path else None).get(family, ())
