"""One error hierarchy for everything a user can get wrong or the environment can refuse.

Every error that reaches the CLI is a :class:`SeatError`: the CLI prints ``str(err)`` (which
already says what to change) and exits with ``err.exit_code``; no traceback is shown for these.
Anything else escaping is a bug and keeps its traceback.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any


class SeatError(Exception):
    """Base of every user-facing error. ``fix`` says what to change; ``exit_code`` is the CLI's."""

    exit_code: int = 1

    def __init__(self, message: str, *, fix: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix

    def __str__(self) -> str:
        if self.fix:
            return f"{self.message}\n  fix: {self.fix}"
        return self.message


class UsageError(SeatError):
    """Bad command-line input (exit 2, like argparse and click)."""

    exit_code = 2


class SpecError(UsageError):
    """A seat spec that cannot be loaded or validated; names file, line and field."""

    def __init__(
        self,
        message: str,
        *,
        path: str | None = None,
        line: int | None = None,
        field: str | None = None,
        fix: str | None = None,
    ) -> None:
        where = path or "<seat spec>"
        if line is not None:
            where = f"{where}:{line}"
        head = f"{where}: {field}: {message}" if field else f"{where}: {message}"
        super().__init__(head, fix=fix)
        self.path = path
        self.line = line
        self.field = field


class TopologyError(SpecError):
    """Parallel sizes that do not fit the cluster shape."""


class CapacityError(SpecError):
    """A configuration that cannot boot: the numbers that do not fit are in the message."""


class PlanError(SpecError):
    """A plan that cannot be built or filled at apply time."""


class ClusterError(SeatError):
    """Ray could not be reached, placed on, or answered too late."""


class PreflightError(SeatError):
    """A node failed a check before its engine started. ``nodes``: the node ranks that failed."""

    def __init__(self, message: str, *, fix: str | None = None, nodes: tuple[int, ...] = ()) -> None:
        super().__init__(message, fix=fix)
        self.nodes = nodes


class SeatStateError(SeatError):
    """The seat is not in a state that allows the request (e.g. already up)."""


class TuneRefused(SeatError):
    """A gate report that supports no draft policy (``sgl-seat tune draft``): nothing was written (exit 3, the
    gate's INCONCLUSIVE: a pipeline must not read it as done)."""

    exit_code = 3


class EngineError(SeatError):
    """The engine process failed or answered badly. ``node``: the node rank whose engine failed first, where one
    did (None: the seat as a whole, e.g. not READY in time)."""

    def __init__(self, message: str, *, fix: str | None = None, node: int | None = None) -> None:
        super().__init__(message, fix=fix)
        self.node = node


class NoVerdictError(SeatError):
    """The gate's battery could not run to a verdict (an arm that did not start, a cluster that failed): exit 4,
    apart from every verdict's status (0 SHIP, 1 DO_NOT_SHIP, 3 INCONCLUSIVE) and the usage error's 2, so that a
    pipeline never reads a failed battery as a decision. ``directory``: the battery's, where its finished cells are
    (``gate --resume`` runs the rest)."""

    exit_code = 4
    directory: str | None = None


class ArmStartError(NoVerdictError):
    """An arm of the gate's battery that could not be brought up: which arm, on which node (None: the seat as a
    whole), and why."""

    def __init__(self, message: str, *, arm: str, node: int | None, reason: str, fix: str | None = None) -> None:
        super().__init__(message, fix=fix)
        self.arm = arm
        self.node = node
        self.reason = reason


class BundleError(SeatError):
    """A forensic bundle that is missing, damaged, hostile or of an unknown schema."""

    exit_code = 2


class ArchiveLimitError(BundleError):
    """A bundle archive that would unpack to more than the caller's cap (``--max-unpacked-bytes``).

    Apart from BundleError because it is the one refusal an operator may overrule: the archive may be honest and
    large, and raising the cap is the fix; every other archive refusal means a damaged or hostile archive.
    """


class HomeError(SeatError):
    """``$SGLSEAT_HOME`` (seat records, logs, bundles) cannot be written: read-only, full, or not permitted."""


class FormatVersionError(SeatError):
    """A file of sgl-seat's own (a spool, a status or config file) whose ``schema_version`` this sgl-seat does not
    read: written by another sgl-seat version (one installed under a running seat), or not by sgl-seat at all.

    ``schema_version`` is the format's major, an integer: a change that older readers still read (a new optional
    key) keeps it, and a reader refuses any other value rather than guess at a layout it does not know.
    """

    def __init__(self, path: str, found: object, reads: int, *, fix: str) -> None:
        super().__init__(f"{path}: schema_version {found!r} is not one this sgl-seat reads (it reads {reads}; a file "
                         "without schema_version is 1)", fix=fix)
        self.path = path
        self.found = found
        self.reads = reads

    @classmethod
    def check(cls, path: object, doc: Mapping[str, Any], reads: int, *, fix: str) -> None:
        """Refuse ``doc`` (a file's JSON object) unless its ``schema_version`` is ``reads``. A file without one was
        written before its format carried one (by the release before, e.g. for a seat brought up before an
        upgrade): it is version 1."""
        found = doc.get("schema_version", 1)
        if type(found) is not int or found != reads:  # not isinstance: JSON's true would pass as 1
            raise cls(str(path), found, reads, fix=fix)
