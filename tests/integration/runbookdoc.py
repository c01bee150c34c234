"""Read the runbooks as the runbook test executes them: fenced ``bash`` blocks marked ``run``, ``no-run`` or
``vars``, the ``text`` excerpt shown after a run block, and the rehearsal order from runbooks/README.md.

Why a parser of our own: the runbooks are prose for an on-call operator, and the only way to keep their
commands from going stale is to execute them. The convention is documented in runbooks/README.md
("How the runbooks are written"); this module is its single reader, so the test and the document agree
on one grammar. Anything it does not understand is an error (a bare ``bash`` block, an unknown key, an
``expect`` that the excerpt below the command does not show), never a silent skip.
"""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path

# The section another helper fills with SGLang's own capacity figures: not ours to run or check.
IGNORED_FROM = "## What SGLang computes for the field report's seat"
ORDER_HEADING = "## Rehearsal order"

_FENCE = re.compile(r"^(?P<indent>[ \t]*)```(?P<info>.*)$")
_VAR = re.compile(r"^(?:export\s+)?(?P<name>[A-Z_][A-Z0-9_]*)=")
_LINK = re.compile(r"\]\((?P<file>[a-z0-9-]+\.md)\)")
_SHELLS = ("bash", "sh", "shell", "console")
_KINDS = ("run", "no-run", "vars")
_KEYS = {"run": ("exit", "timeout", "expect"), "no-run": ("reason",), "vars": ()}
DEFAULT_TIMEOUT_S = 120.0


class RunbookError(ValueError):
    """A runbook that breaks the block convention; the message names file and line."""


@dataclass(frozen=True)
class Block:
    """One fenced shell block of a runbook."""

    runbook: str
    line: int  # 1-based line of the opening fence
    kind: str  # run | no-run | vars
    code: str
    exit: int = 0
    timeout: float = DEFAULT_TIMEOUT_S
    expects: tuple[str, ...] = ()
    reason: str | None = None
    excerpt: str | None = None  # the ```text block right after a run block: captured output shown to readers

    @property
    def where(self) -> str:
        return f"runbooks/{self.runbook}:{self.line}"

    def variables(self) -> list[str]:
        """Names a ``vars`` block sets (one ``NAME=value`` per line; comments allowed)."""
        return [m.group("name") for ln in self.code.splitlines() if (m := _VAR.match(ln.strip()))]


def _fail(runbook: str, line: int, why: str) -> RunbookError:
    return RunbookError(f"runbooks/{runbook}:{line}: {why}")


def _info(runbook: str, line: int, info: str) -> tuple[str, dict[str, list[str]]]:
    try:
        words = shlex.split(info)
    except ValueError as exc:
        raise _fail(runbook, line, f"cannot split the fence's info string {info!r}: {exc}") from None
    if len(words) < 2 or words[1] not in _KINDS:
        raise _fail(runbook, line, f"a shell block must be marked `bash run`, `bash no-run reason=\"...\"` or "
                                   f"`bash vars` (got {info!r})")
    kind = words[1]
    opts: dict[str, list[str]] = {}
    for w in words[2:]:
        key, eq, val = w.partition("=")
        if not eq or key not in _KEYS[kind]:
            raise _fail(runbook, line, f"{kind} blocks take {', '.join(_KEYS[kind]) or 'no options'}; got {w!r}")
        opts.setdefault(key, []).append(val)
    return kind, opts


def parse_runbook(path: Path) -> list[Block]:
    """Every shell block of ``path`` in document order, up to :data:`IGNORED_FROM`."""
    name = path.name
    lines = path.read_text().splitlines()
    blocks: list[Block] = []
    pending: Block | None = None  # a run block waiting for its excerpt
    i = 0
    while i < len(lines):
        if lines[i].strip() == IGNORED_FROM:
            break
        m = _FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        start = i + 1
        info = m.group("info").strip()
        indent = len(m.group("indent"))
        body: list[str] = []
        i += 1
        while i < len(lines) and not lines[i].lstrip().startswith("```"):
            # A fence at column 0 keeps its lines as written (a heredoc's YAML indentation is content); an
            # indented fence (in a list item) loses that indentation.
            body.append(lines[i] if indent == 0 else lines[i][indent:] if lines[i][:indent].isspace()
                        else lines[i].lstrip())
            i += 1
        if i >= len(lines):
            raise _fail(name, start, "unclosed code fence")
        i += 1  # past the closing fence
        lang = info.split(" ", 1)[0] if info else ""
        if lang in _SHELLS:
            if lang != "bash":
                raise _fail(name, start, f"use ```bash for commands (got ```{lang})")
            if pending is not None:
                blocks.append(pending)
            kind, opts = _info(name, start, info)
            code = "\n".join(body).strip("\n")
            if not code.strip():
                raise _fail(name, start, "empty shell block")
            if kind == "no-run":
                if not opts.get("reason") or not opts["reason"][0].strip():
                    raise _fail(name, start, 'a no-run block says why: `bash no-run reason="needs a GPU node"`')
                blocks.append(Block(name, start, kind, code, reason=opts["reason"][0]))
                pending = None
            elif kind == "vars":
                blk = Block(name, start, kind, code)
                if not blk.variables():
                    raise _fail(name, start, "a vars block sets NAME=value lines")
                blocks.append(blk)
                pending = None
            else:
                try:
                    exit_code = int(opts.get("exit", ["0"])[-1])
                    timeout = float(opts.get("timeout", [str(DEFAULT_TIMEOUT_S)])[-1])
                except ValueError as exc:
                    raise _fail(name, start, f"exit/timeout: {exc}") from None
                pending = Block(name, start, kind, code, exit=exit_code, timeout=timeout,
                                expects=tuple(opts.get("expect", ())))
            continue
        if lang == "text" and pending is not None:
            excerpt = "\n".join(body)
            missing = [e for e in pending.expects if e not in excerpt]
            if missing:
                raise _fail(name, start, f"the excerpt under the command at line {pending.line} does not show "
                                         f"what the test expects: {missing}")
            blocks.append(Block(pending.runbook, pending.line, "run", pending.code, pending.exit, pending.timeout,
                                pending.expects, excerpt=excerpt))
            pending = None
            continue
        if pending is not None:
            blocks.append(pending)
            pending = None
    if pending is not None:
        blocks.append(pending)
    for b in blocks:
        if b.kind == "run" and b.expects and b.excerpt is None:
            raise _fail(name, b.line, "a command with expect=... is followed by a ```text excerpt that shows it")
    return blocks


def rehearsal_order(readme: Path) -> list[str]:
    """The runbook files listed, in order, under :data:`ORDER_HEADING` of runbooks/README.md."""
    text = readme.read_text()
    if ORDER_HEADING not in text:
        raise RunbookError(f"{readme}: no '{ORDER_HEADING}' section")
    section = text.split(ORDER_HEADING, 1)[1].split("\n## ", 1)[0]
    return [m.group("file") for m in _LINK.finditer(section)]
