"""Run SGLang's own command-line parser on a generated launch command.

This parses the flags that follow ``python3 -m sglang.launch_server`` (or
``sglang serve``) with SGLang 0.5.23's real parser:
``ServerArgs.add_cli_args(parser)`` + ``ServerArgs.from_cli_args(ns)`` from
``sglang.srt.server_args``. It mirrors ``prepare_server_args`` (``--config``
merging, the radix-eviction-policy marker) but leaves out its side effects
(``logging.basicConfig(force=True)``, ``_launch_command``).

Scope: syntax only. Unknown flags, ambiguous prefixes (argparse
``allow_abbrev``), bad choices and bad types are caught. Semantic rules
(EP/TP rewrites, speculative all-or-none asserts, ...) run in
``ServerArgs.resolve_once()``, which needs a GPU or ``--device`` plus the
model's ``config.json``; this module does not call it.

Needs sglang installed with ``scripts/install-sglang-parser.sh`` (CPU torch,
real triton, sglang ``--no-deps`` plus small import deps). All sglang imports
are lazy, so importing this module is cheap and never fails.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import functools
import importlib
import importlib.util
import io
import pathlib
from typing import Any

__all__ = [
    "FIELDS_OF_INTEREST",
    "SglangParseError",
    "SglangParseResult",
    "SglangUnavailableError",
    "parse_with_sglang",
    "parse_with_sglang_full",
    "sglang_available",
    "sglang_source_root",
    "sglang_version",
]

#: ServerArgs fields the launch-command generator is expected to set.
FIELDS_OF_INTEREST: tuple[str, ...] = (
    "model_path",
    "tp_size",
    "ep_size",
    "dp_size",
    "pp_size",
    "nnodes",
    "node_rank",
    "dist_init_addr",
    "dist_timeout",
    "mem_fraction_static",
    "max_running_requests",
    "context_length",
    "watchdog_timeout",
    "enable_metrics",
    "host",
    "port",
    "trust_remote_code",
    "device",
    "served_model_name",
    "speculative_algorithm",
    "speculative_draft_model_path",
    "speculative_num_steps",
    "speculative_eagle_topk",
    "speculative_num_draft_tokens",
    "moe_a2a_backend",
)

_PROG = "sglang serve"  # what prepare_server_args() uses


class SglangUnavailableError(RuntimeError):
    """sglang.srt.server_args cannot be imported in this interpreter."""


class SglangParseError(ValueError):
    """SGLang's parser rejected the argv (argparse would have exited).

    ``message`` is argparse's own last stderr line, e.g.
    ``"sglang serve: error: unrecognized arguments: --bogus"``; ``stderr`` is
    everything it printed (usage included); ``exit_code`` is the SystemExit
    code (2 for errors, 0 for ``--help``).
    """

    def __init__(self, argv: list[str], message: str, stderr: str, exit_code: int | str | None) -> None:
        super().__init__(f"sglang rejected argv {argv!r}: {message}")
        self.argv = list(argv)
        self.message = message
        self.stderr = stderr
        self.exit_code = exit_code


@dataclasses.dataclass(frozen=True)
class SglangParseResult:
    """Everything a successful parse produced."""

    fields: dict[str, object]  # every ServerArgs field that the parser knows
    namespace: dict[str, object]  # the raw argparse namespace
    stderr: str  # what parsing printed, e.g. deprecation warnings
    server_args: Any  # the raw, unresolved ServerArgs record


@functools.lru_cache(maxsize=1)
def _import_server_args() -> Any:
    try:
        # import_module keeps mypy --strict quiet whether or not sglang is installed
        server_args_module = importlib.import_module("sglang.srt.server_args")
    except Exception as exc:  # ImportError, or e.g. a broken triton stub
        raise SglangUnavailableError(
            f"cannot import sglang.srt.server_args ({type(exc).__name__}: {exc}); run scripts/install-sglang-parser.sh"
        ) from exc
    return server_args_module.ServerArgs


def sglang_available() -> bool:
    """True if SGLang's ServerArgs parser can be imported here."""
    try:
        _import_server_args()
    except SglangUnavailableError:
        return False
    return True


def sglang_version() -> str | None:
    """The installed sglang distribution version, or None."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sglang")
    except PackageNotFoundError:
        return None


def sglang_source_root() -> pathlib.Path:
    """Directory of the installed ``sglang`` package (for source greps).

    Does not import sglang. Raises SglangUnavailableError if not installed.
    """
    spec = importlib.util.find_spec("sglang")
    if spec is None or not spec.submodule_search_locations:
        raise SglangUnavailableError("sglang is not installed; run scripts/install-sglang-parser.sh")
    return pathlib.Path(next(iter(spec.submodule_search_locations))).resolve()


def _record_field_names(server_args_cls: Any, ns: argparse.Namespace) -> list[str]:
    try:
        arg_utils = importlib.import_module("sglang.srt.arg_groups.arg_utils")
        names = [f.name for f in arg_utils.record_fields(server_args_cls)]
    except Exception:
        names = []
    if not names:  # fall back to what the parser produced
        names = list(vars(ns))
    return names


def parse_with_sglang_full(argv: list[str]) -> SglangParseResult:
    """Parse ``argv`` (flags only) with SGLang's parser; keep everything."""
    server_args_cls = _import_server_args()
    argv = [str(a) for a in argv]

    captured = io.StringIO()
    try:
        with contextlib.redirect_stderr(captured), contextlib.redirect_stdout(captured):
            parser = argparse.ArgumentParser(prog=_PROG)
            server_args_cls.add_cli_args(parser)
            if "--config" in argv:  # same as prepare_server_args()
                merger_module = importlib.import_module("sglang.srt.utils.server_args_config_parser")
                argv = merger_module.ConfigArgumentMerger(parser).merge_config_with_args(argv)
            ns = parser.parse_args(argv)
            ns._radix_eviction_policy_explicitly_set = any(
                a == "--radix-eviction-policy" or a.startswith("--radix-eviction-policy=") for a in argv
            )
            server_args = server_args_cls.from_cli_args(ns)
    except SystemExit as exc:
        text = captured.getvalue()
        lines = [ln for ln in text.strip().splitlines() if ln.strip()]
        errors = [ln for ln in lines if ": error: " in ln]
        if errors:
            message = errors[-1]
        elif exc.code == 0:  # --help / --version: not a launch command
            message = "argparse exited with code 0 (help/version requested)"
        else:
            message = (lines or [f"argparse exited with code {exc.code}"])[-1]
        raise SglangParseError(argv, message.strip(), text, exc.code) from None

    fields: dict[str, object] = {}
    for name in _record_field_names(server_args_cls, ns):
        try:
            fields[name] = getattr(server_args, name)
        except AttributeError:
            continue
    return SglangParseResult(
        fields=fields,
        namespace=dict(vars(ns)),
        stderr=captured.getvalue(),
        server_args=server_args,
    )


def parse_with_sglang(argv: list[str]) -> dict[str, object]:
    """Parse the flags after ``python3 -m sglang.launch_server``.

    Returns every ServerArgs field as it stands before resolution (so
    defaults appear as SGLang's raw defaults, e.g. ``None`` for
    ``mem_fraction_static`` when not given); all names in
    ``FIELDS_OF_INTEREST`` are guaranteed present.

    Raises SglangParseError (never SystemExit) with argparse's message if the
    parser rejects the argv, and SglangUnavailableError if sglang is missing.
    """
    fields = parse_with_sglang_full(argv).fields
    missing = [f for f in FIELDS_OF_INTEREST if f not in fields]
    if missing:  # an SGLang upgrade renamed something: say so loudly
        raise SglangUnavailableError(f"sglang {sglang_version()} ServerArgs lacks fields {missing}")
    return fields
