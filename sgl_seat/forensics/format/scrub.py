"""Secrets scrubbing for everything a bundle copies from a node: environment, argv, plan, log text.

A bundle travels (laptops, tickets, chat), so it must not carry the credentials the seat ran with.
Two nets, because either alone misses things: by *name* (an env var or JSON key that says TOKEN, KEY,
SECRET, PASSWORD, ...: its whole value goes) and by *value* (text that looks like a bearer token, an AWS
key, a Hugging Face or GitHub token, a JWT, a private key block, credentials in a URL, a long hex or
base64 blob). Scrubbing errs towards removing too much: a lost value costs a question, a leaked one
costs a rotation. The replacement says what was removed and how long it was, never any of its characters.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Mapping, Sequence
from typing import Any

from sgl_seat import envcompat

__all__ = ["is_secret_name", "scrub_env", "scrub_json", "scrub_lines", "scrub_text"]

_SECRET_NAME = re.compile(
    r"(TOKEN|KEY|SECRET|PASSW|PASSWD|PASS|PWD|CREDENTIAL|AUTH|COOKIE|SESSION|PRIVATE|SIGNATURE|CERT|DSN)",
    re.IGNORECASE,
)
# Names that contain a secret-ish word but hold no secret and matter for a diagnosis.
_NOT_SECRET_NAMES = frozenset({
    "PASSWORD_STORE_DIR", "SSH_AUTH_SOCK", "KEYTIMEOUT", "XAUTHORITY", "GPG_AGENT_INFO", "TOKENIZERS_PARALLELISM",
    "SGLSEAT_TOKENIZER", envcompat.old_name("SGLSEAT_TOKENIZER"), "MAX_TOKENS",  # and its name in older bundles
})

# (kind, pattern); the first group, where present, is kept (e.g. the "Bearer " or "user:").
_VALUE_PATTERNS: tuple[tuple[str, re.Pattern[str]], ...] = (
    ("private-key", re.compile(r"-----BEGIN [A-Z ]*PRIVATE KEY-----.*?(?:-----END [A-Z ]*PRIVATE KEY-----|\Z)",
                               re.DOTALL)),
    ("bearer", re.compile(r"((?:[Bb]earer|[Bb]asic|[Tt]oken)\s+)[A-Za-z0-9._~+/=-]{8,}")),
    ("url-userinfo", re.compile(r"(\b[a-zA-Z][a-zA-Z0-9+.-]*://[^/\s:@]+:)[^/\s@]+(?=@)")),
    ("jwt", re.compile(r"\beyJ[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}\.[A-Za-z0-9_-]{5,}")),
    ("aws-access-key", re.compile(r"\b(?:AKIA|ASIA|AIDA|AROA|AGPA|ANPA|ANVA|AIPA)[0-9A-Z]{16}\b")),
    ("hf-token", re.compile(r"\bhf_[A-Za-z0-9]{20,}")),
    ("github-token", re.compile(r"\b(?:gh[pousr]_[A-Za-z0-9]{20,}|github_pat_[A-Za-z0-9_]{20,})")),
    ("openai-key", re.compile(r"\bsk-(?:proj-|ant-)?[A-Za-z0-9_-]{20,}")),
    ("slack-token", re.compile(r"\bxox[abposr]-[A-Za-z0-9-]{10,}")),
    ("google-key", re.compile(r"\bAIza[0-9A-Za-z_-]{35}")),
    # key=value / key: value where the key names a secret; a bare number after a *token* key is a count
    # (SGLang logs "#token: 900"), after a password key it is still a password. A match starts at the secret word,
    # not at the start of the key that holds it: what is removed (after group 1) is the same, and a leading
    # [A-Za-z0-9_.-]* tried at every position made this pattern most of a capture's scrubbing time.
    ("assignment", re.compile(
        r"((?:secret|passw(?:or)?d|api[_-]?key|access[_-]?key|auth|credential)"
        r"[A-Za-z0-9_.-]*[\"']?\s*[=:]\s*[\"']?)(?!(?:[Bb]earer|[Bb]asic|[Tt]oken)\s)[^\s\"',;&]{4,}",
        re.IGNORECASE)),
    ("assignment", re.compile(
        r"(token(?!izer)[A-Za-z0-9_.-]*[\"']?\s*[=:]\s*[\"']?)"
        r"(?!(?:[Bb]earer|[Bb]asic|[Tt]oken)\s)(?![0-9.]+(?:[\s\"',;&]|$))[^\s\"',;&]{4,}", re.IGNORECASE)),
    ("flag", re.compile(r"(--?[A-Za-z0-9-]*(?:token(?!izer)|secret|passw(?:or)?d|api-key|apikey|access-key|auth)"
                        r"[A-Za-z0-9-]*[ \t]+)(?!-)\S+", re.IGNORECASE)),
    ("hex", re.compile(r"(?<![A-Za-z0-9])[0-9a-fA-F]{40,}(?![A-Za-z0-9])")),
    ("base64", re.compile(r"(?<![A-Za-z0-9+/=_-])(?=[A-Za-z0-9+/_-]*[0-9])(?=[A-Za-z0-9+/_-]*[a-z])"
                          r"(?=[A-Za-z0-9+/_-]*[A-Z])[A-Za-z0-9+/_-]{40,}={0,2}(?![A-Za-z0-9+/=_-])")),
)

#: Patterns that cannot match a text holding none of these literals (a substring test costs microseconds where the
#: pattern's scan of a 256 KB log tail costs milliseconds).
_NEEDLES: dict[str, tuple[str, ...]] = {
    "private-key": ("BEGIN",), "jwt": ("eyJ",), "aws-access-key": ("AKIA", "ASIA", "AIDA", "AROA", "AGPA", "ANPA",
                                                                  "ANVA", "AIPA"),
    "hf-token": ("hf_",), "github-token": ("gh", "github_pat_"), "openai-key": ("sk-",), "slack-token": ("xox",),
    "google-key": ("AIza",), "url-userinfo": ("://",),
}

#: A cheap test before running every pattern: most log lines carry no candidate at all.
_CANDIDATE = re.compile(r"[A-Za-z0-9+/_=-]{20,}|BEGIN|://|[=:]|token|secret|passw|key|auth|bearer|basic",
                        re.IGNORECASE)


def is_secret_name(name: str) -> bool:
    """Whether a variable or key name says its value is a secret."""
    return name.upper() not in _NOT_SECRET_NAMES and bool(_SECRET_NAME.search(name))


def _mark(kind: str, n: int) -> str:
    return f"<redacted:{kind}:{n}>"


def scrub_text(text: str) -> str:
    """Replace secret-looking substrings of free text (logs, argv, process titles) with a marker.

    Every pattern runs over the original text and the spans to remove are merged before replacing, so
    one pattern's marker is never re-matched by another and overlapping matches never leak a tail.
    """
    if not text or not _CANDIDATE.search(text):
        return text
    spans = _spans(text)
    if not spans:
        return text
    spans.sort()
    return _apply(text, spans)


def _spans(text: str) -> list[tuple[int, int, str]]:
    """(start, end, kind) of every secret-looking substring of ``text``, by every pattern, unmerged."""
    spans: list[tuple[int, int, str]] = []
    for kind, pat in _VALUE_PATTERNS:
        needles = _NEEDLES.get(kind)
        if needles is not None and not any(x in text for x in needles):
            continue
        for m in pat.finditer(text):
            if kind == "base64" and m.group(0).count("/") >= 2:
                continue  # a file path (stack frames, log lines), not a blob
            start = m.end(1) if pat.groups else m.start()
            if m.end() > start:
                spans.append((start, m.end(), kind))
    return spans


def scrub_lines(lines: Sequence[str]) -> list[str]:
    """:func:`scrub_text` of each line, the same result, in one pass of every pattern over all the lines joined.

    Why it is the same: a pattern that matches inside one line matches at the same place in the lines joined by
    newlines (its anchors and boundaries see a newline where a line began or ended), so a line with no match in
    the joined text has none alone; the lines where the joined text has a match, which may also be a match across
    lines, are scrubbed one by one. Why: a capture scrubs thousands of log lines, and the patterns' per-call
    overhead, line by line, was most of its writing time.
    """
    joined = "\n".join(lines)
    if not joined or not _CANDIDATE.search(joined):
        return list(lines)
    starts: list[int] = []
    pos = 0
    for ln in lines:
        starts.append(pos)
        pos += len(ln) + 1
    hit: set[int] = set()
    for a, b, _ in _spans(joined):
        hit.update(range(bisect.bisect_right(starts, a) - 1, bisect.bisect_right(starts, max(a, b - 1))))
    return [scrub_text(ln) if i in hit else ln for i, ln in enumerate(lines)]


def _apply(text: str, spans: list[tuple[int, int, str]]) -> str:
    out: list[str] = []
    pos = 0
    cur_s, cur_e, cur_k = spans[0]
    for s, e, k in spans[1:]:
        if s <= cur_e:
            cur_e = max(cur_e, e)
            continue
        out.append(text[pos:cur_s] + _mark(cur_k, cur_e - cur_s))
        pos = cur_e
        cur_s, cur_e, cur_k = s, e, k
    out.append(text[pos:cur_s] + _mark(cur_k, cur_e - cur_s))
    out.append(text[cur_e:])
    return "".join(out)


def scrub_env(env: Mapping[str, str]) -> dict[str, str]:
    """An environment with secret-named values removed and secret-looking values scrubbed."""
    out: dict[str, str] = {}
    for name, value in env.items():
        value = str(value)
        out[name] = _mark("by-name", len(value)) if is_secret_name(name) and value else scrub_text(value)
    return out


def scrub_json(obj: Any) -> Any:
    """A JSON value with secret-named keys' values removed and every string scrubbed (plan, manifest)."""
    if isinstance(obj, dict):
        return {k: (_mark("by-name", len(str(v))) if isinstance(k, str) and is_secret_name(k)
                    and isinstance(v, (str, int, float)) and not isinstance(v, bool) and str(v) else scrub_json(v))
                for k, v in obj.items()}
    if isinstance(obj, list):
        return [scrub_json(v) for v in obj]
    if isinstance(obj, str):
        return scrub_text(obj)
    return obj
