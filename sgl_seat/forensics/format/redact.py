"""Prompt and output redaction: keep the *shape* of traffic, not its words.

A hang is diagnosed and re-driven from request shapes: when each request came, how long its prompt
was (characters and tokens), which earlier prompts it shared a prefix with and for how long (the radix
cache and the row-fetch gather sizes depend on that), its max_tokens and sampling parameters. None of
that needs the text. So a request is recorded as a :class:`RequestShape` with a salted hash of the text
(equal prompts stay recognisable inside one seat's bundles, unguessable outside it) and the raw text
only when the seat spec sets ``bundles.raw_prompts: true``.

Shared prefixes are found with a chain of block hashes (the radix-cache idea): the prompt is cut into
fixed-size character blocks, block i's key hashes blocks 0..i, and the deepest key already seen names
the earlier prompt it shares a prefix with and the shared length (to block granularity).
"""

from __future__ import annotations

import hashlib
import hmac
import math
import secrets
from dataclasses import dataclass, field
from typing import Any

from sgl_seat.core.records import RecordError

__all__ = ["PrefixTracker", "Redactor", "RequestShape", "salt_id"]

#: Characters per prefix block: about 16 tokens of English, the granularity of the recorded prefix length.
PREFIX_BLOCK_CHARS = 64
#: Blocks hashed per prompt: prefixes longer than this (~256 KiB) are recorded as this long.
MAX_PREFIX_BLOCKS = 4096
#: Prefix keys remembered before the oldest are forgotten (bounded memory on a long-running seat).
MAX_PREFIX_KEYS = 200_000


def salt_id(salt: bytes) -> str:
    """A public name for a salt: bundles with the same salt_id have comparable prompt hashes."""
    return hashlib.sha256(b"sgl-seat salt id\0" + salt).hexdigest()[:12]


def _num(d: dict[str, Any], key: str, *, optional: bool = False, integer: bool = False) -> Any:
    v = d.get(key)
    if v is None:
        if optional:
            return None
        raise RecordError(f"missing field {key!r}")
    ok = type(v) is int if integer else type(v) in (int, float)
    if not ok:
        raise RecordError(f"field {key!r}: expected {'an integer' if integer else 'a number'}")
    return v


@dataclass(frozen=True, slots=True)
class RequestShape:
    """One request as recorded before a trigger: enough to re-drive it, nothing of its content by default.

    ``t`` is the arrival time (epoch seconds); ``prefix_group`` is the id of the first prompt of its
    shared-prefix family and ``shared_prefix_chars`` how much of it this prompt shares (0: none).
    ``prompt_tokens`` is the engine's count where known, else an estimate (chars / 4, or for a request
    whose text was never seen the median of the others) and ``tokens_estimated`` says so.
    ``prefix_tokens`` is the engine's own count of prompt tokens it found in its prefix cache
    (SGLang's ``cached_tokens``) where known. ``prompt_hash`` is empty when the text was never seen (SGLang's
    request log at level 0-1 has none). ``prompt`` is the raw text only when the operator opted in.
    """

    t: float
    route: str
    prompt_chars: int
    prompt_tokens: int
    prompt_hash: str
    prefix_group: int
    shared_prefix_chars: int
    max_tokens: int | None
    sampling: dict[str, float | int | bool | str] = field(default_factory=dict)
    stream: bool = False
    tokens_estimated: bool = False
    output_tokens: int | None = None
    finished: float | None = None
    prompt: str | None = None
    prefix_tokens: int | None = None

    @property
    def shared_prefix_tokens(self) -> int:
        """Prompt tokens shared with earlier prompts: the engine's cache count, else from the text's prefix."""
        if self.prefix_tokens is not None:
            return min(self.prefix_tokens, self.prompt_tokens)
        if self.prompt_chars <= 0:
            return 0
        return round(self.prompt_tokens * self.shared_prefix_chars / self.prompt_chars)

    def to_json(self) -> dict[str, Any]:
        return {"t": self.t, "route": self.route, "prompt_chars": self.prompt_chars,
                "prompt_tokens": self.prompt_tokens, "prompt_hash": self.prompt_hash,
                "prefix_group": self.prefix_group, "shared_prefix_chars": self.shared_prefix_chars,
                "max_tokens": self.max_tokens, "sampling": dict(self.sampling), "stream": self.stream,
                "tokens_estimated": self.tokens_estimated, "output_tokens": self.output_tokens,
                "finished": self.finished, "prompt": self.prompt, "prefix_tokens": self.prefix_tokens}

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> RequestShape:
        if not isinstance(d, dict):
            raise RecordError("expected an object")
        route, phash, prompt = d.get("route"), d.get("prompt_hash"), d.get("prompt")
        if not isinstance(route, str) or not route.startswith("/") or len(route) > 256:
            raise RecordError("field 'route' must be a URL path such as /v1/completions")
        if not isinstance(phash, str) or len(phash) > 128:
            raise RecordError("field 'prompt_hash' must be a short string")
        if prompt is not None and not isinstance(prompt, str):
            raise RecordError("field 'prompt' must be a string or null")
        sampling = d.get("sampling") or {}
        if not isinstance(sampling, dict) or not all(
            isinstance(k, str) and isinstance(v, (int, float, bool, str)) for k, v in sampling.items()
        ):
            raise RecordError("field 'sampling' must map names to numbers, booleans or strings")
        for flag in ("stream", "tokens_estimated"):
            if not isinstance(d.get(flag, False), bool):
                raise RecordError(f"field {flag!r} must be a boolean")
        ints = {k: _num(d, k, integer=True) for k in ("prompt_chars", "prompt_tokens", "prefix_group",
                                                      "shared_prefix_chars")}
        if any(v < 0 for v in ints.values()):
            raise RecordError("lengths and prefix_group must not be negative")
        t = float(_num(d, "t"))
        fin = _num(d, "finished", optional=True)
        if not math.isfinite(t):
            raise RecordError("field 't' must be finite")
        return cls(
            t=t, route=route, prompt_hash=phash, prompt=prompt, sampling=dict(sampling),
            stream=bool(d.get("stream", False)), tokens_estimated=bool(d.get("tokens_estimated", False)),
            max_tokens=_num(d, "max_tokens", optional=True, integer=True),
            output_tokens=_num(d, "output_tokens", optional=True, integer=True),
            prefix_tokens=_nonneg(_num(d, "prefix_tokens", optional=True, integer=True), "prefix_tokens"),
            finished=None if fin is None else float(fin), **ints,
        )


def _nonneg(v: int | None, key: str) -> int | None:
    if v is not None and v < 0:
        raise RecordError(f"field {key!r} must not be negative")
    return v


class PrefixTracker:
    """Assigns each prompt its shared-prefix family and shared length, from salted block-chain hashes."""

    def __init__(self, salt: bytes) -> None:
        self._salt = salt
        self._keys: dict[bytes, int] = {}  # chain key -> prefix group (insertion order = age)
        self._next_group = 0

    def new_group(self) -> int:
        """A fresh prefix group with no text behind it (a request whose prompt was never seen)."""
        g = self._next_group
        self._next_group += 1
        return g

    def observe(self, text: str) -> tuple[int, int]:
        """(prefix_group, shared_prefix_chars) of ``text`` against every prompt observed before it."""
        h = hmac.new(self._salt, b"prefix\0", hashlib.sha256)
        keys: list[bytes] = []
        group: int | None = None
        shared_blocks = 0
        nblocks = min(len(text) // PREFIX_BLOCK_CHARS, MAX_PREFIX_BLOCKS)
        for i in range(nblocks):
            h.update(text[i * PREFIX_BLOCK_CHARS:(i + 1) * PREFIX_BLOCK_CHARS].encode("utf-8", "surrogatepass"))
            key = h.copy().digest()[:16]
            keys.append(key)
            g = self._keys.get(key)
            if g is not None and shared_blocks == i:
                group, shared_blocks = g, i + 1
        if group is None:
            group = self._next_group
            self._next_group += 1
        for key in keys:
            self._keys.setdefault(key, group)
        while len(self._keys) > MAX_PREFIX_KEYS:
            del self._keys[next(iter(self._keys))]
        return group, shared_blocks * PREFIX_BLOCK_CHARS


class Redactor:
    """Turns a request into a RequestShape; holds the salt, which never goes into a bundle."""

    def __init__(self, *, raw_prompts: bool = False, salt: bytes | None = None) -> None:
        self.raw_prompts = raw_prompts
        self.salt = salt if salt is not None else secrets.token_bytes(32)
        self.prefixes = PrefixTracker(self.salt)

    @property
    def salt_id(self) -> str:
        return salt_id(self.salt)

    def hash_text(self, text: str) -> str:
        return hmac.new(self.salt, text.encode("utf-8", "surrogatepass"), hashlib.sha256).hexdigest()[:32]

    def shape(self, *, t: float, route: str, prompt: str | None, prompt_tokens: int | None, max_tokens: int | None,
              sampling: dict[str, float | int | bool | str] | None = None, stream: bool = False,
              output_tokens: int | None = None, finished: float | None = None,
              prefix_tokens: int | None = None) -> RequestShape:
        """The shape of one request; ``prompt`` None: its text was never seen (no hash, a group of its own)."""
        if prompt is None:
            group, shared, text = self.prefixes.new_group(), 0, ""
        else:
            (group, shared), text = self.prefixes.observe(prompt), prompt
        est = prompt_tokens is None
        return RequestShape(
            t=t, route=route, prompt_chars=len(text),
            prompt_tokens=max(1, math.ceil(len(text) / 4)) if est or prompt_tokens is None else prompt_tokens,
            prompt_hash=self.hash_text(text) if prompt is not None else "", prefix_group=group,
            shared_prefix_chars=shared, max_tokens=max_tokens, sampling=dict(sampling or {}), stream=stream,
            tokens_estimated=est, output_tokens=output_tokens, finished=finished,
            prompt=prompt if self.raw_prompts else None, prefix_tokens=prefix_tokens,
        )
