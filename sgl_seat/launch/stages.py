"""Stages of `up` and `down`: each timed, reported as it starts and ends, and kept with its outcome.

A :class:`Reporter` receives stage boundaries (the CLI prints them, the bench times them, the demo shows
them); :class:`Stages` times one stage at a time and keeps the :class:`StageTimes` that `up` and `down`
return.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any, Protocol

#: A stage's outcome: done, done with something the operator should know (e.g. no watchdog), or raised.
OK, WARN, FAILED = "ok", "warn", "failed"


class Reporter(Protocol):
    """Receives stage boundaries (the CLI prints them; the bench times them)."""

    def start(self, stage: str, detail: str) -> None: ...

    def finish(self, stage: str, seconds: float, detail: str, status: str = OK) -> None: ...


class NullReporter:
    def start(self, stage: str, detail: str) -> None:
        pass

    def finish(self, stage: str, seconds: float, detail: str, status: str = OK) -> None:
        pass


@dataclass(frozen=True, slots=True)
class Stage:
    name: str
    seconds: float
    detail: str = ""
    status: str = OK

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "seconds": round(self.seconds, 3), "status": self.status, "detail": self.detail}


@dataclass(slots=True)
class StageTimes:
    """Each stage in order (`up`'s and `down`'s result; the bench's raw data)."""

    records: list[Stage] = field(default_factory=list)

    @property
    def stages(self) -> list[tuple[str, float]]:
        return [(r.name, r.seconds) for r in self.records]

    def total(self) -> float:
        return sum(r.seconds for r in self.records)

    def warnings(self) -> list[Stage]:
        return [r for r in self.records if r.status != OK]


class Stages:
    def __init__(self, reporter: Reporter) -> None:
        self.reporter = reporter
        self.times = StageTimes()

    @contextlib.contextmanager
    def stage(self, name: str, detail: str = "") -> Iterator[dict[str, str]]:
        """Time one stage; the body may set ``note["detail"]`` and ``note["status"]`` (WARN)."""
        note: dict[str, str] = {"detail": "", "status": OK}
        self.reporter.start(name, detail)
        t0 = time.monotonic()
        try:
            yield note
        except BaseException as exc:
            self._done(name, t0, note["detail"] or f"{type(exc).__name__}: {exc}".splitlines()[0], FAILED)
            raise
        self._done(name, t0, note["detail"], note["status"])

    def _done(self, name: str, t0: float, detail: str, status: str) -> None:
        rec = Stage(name, time.monotonic() - t0, detail, status)
        self.times.records.append(rec)
        self.reporter.finish(name, rec.seconds, detail, status)
