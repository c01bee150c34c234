"""Tokenizer and detokenizer stand-ins, and deterministic greedy token ids.

Why: sgl-seat needs token counts that behave like a real model's (usage, prefix-cache hits, KV use) and
output that is exactly reproducible, without a model. A word is a token: prompt words map to ids (words
of the sim's own vocabulary map back to themselves, others hash into it), and the "model" picks the next
id from a seeded hash of the whole context, so the same context always yields the same continuation,
draft on or off. The vocabulary is pronounceable two-syllable words, so output reads as words.

The model never emits EOS: a request ends at its token limit or at a stop string / stop token id.
With ``flip_near_ties`` set, positions whose hash marks them as a "near tie" pick the runner-up when the
batch holds an odd number of requests: greedy output then depends on batch composition, as it can on
real GPUs.
"""

from __future__ import annotations

import hashlib
import re

PAD_ID = 0
BOS_ID = 1
EOS_ID = 2
ROLE_IDS: dict[str, int] = {"system": 3, "user": 4, "assistant": 5, "tool": 6}
VOCAB_BASE = 256

_ONSETS = ("b", "d", "f", "g", "k", "l", "m", "n", "p", "r", "s", "t", "v", "z", "ch", "sh")
_VOWELS = ("a", "e", "i", "o")
_SYLLABLES = tuple(o + v for o in _ONSETS for v in _VOWELS)  # 64
WORDS: tuple[str, ...] = tuple(a + b for a in _SYLLABLES for b in _SYLLABLES)  # 4096
_WORD_ID = {w: VOCAB_BASE + i for i, w in enumerate(WORDS)}
VOCAB_SIZE = VOCAB_BASE + len(WORDS)

_MASK = (1 << 64) - 1
SEED = 0x5EA7_51D0


def _hash_word(word: str) -> int:
    return int.from_bytes(hashlib.blake2b(word.encode(), digest_size=8).digest(), "little")


def encode(text: str) -> list[int]:
    """Whitespace words -> ids (one token per word)."""
    out = []
    for word in re.findall(r"\S+", text):
        tid = _WORD_ID.get(word)
        out.append(tid if tid is not None else VOCAB_BASE + _hash_word(word) % len(WORDS))
    return out


def chat_ids(messages: list[tuple[str, str]]) -> list[int]:
    """A chat template stand-in: ``<role>`` marker, content words, ..., then the assistant marker."""
    ids = [BOS_ID]
    for role, content in messages:
        ids.append(ROLE_IDS.get(role, ROLE_IDS["user"]))
        ids.extend(encode(content))
    ids.append(ROLE_IDS["assistant"])
    return ids


def decode(ids: list[int]) -> str:
    """ids -> text, each vocabulary word with a leading space; special ids print nothing."""
    return "".join(" " + WORDS[i - VOCAB_BASE] for i in ids if VOCAB_BASE <= i < VOCAB_SIZE)


def mix(h: int, token: int) -> int:
    """Fold one token into a rolling context hash (splitmix64 finaliser)."""
    z = (h ^ ((token + 0x9E3779B97F4A7C15) & _MASK)) & _MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & _MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & _MASK
    return z ^ (z >> 31)


def context_hash(ids: list[int], seed: int = SEED) -> int:
    h = seed
    for t in ids:
        h = mix(h, t)
    return h


def next_token(h: int, *, batch_size: int = 1, flip_near_ties: bool = False) -> int:
    """The greedy next id for a context whose rolling hash is ``h``."""
    top = VOCAB_BASE + h % len(WORDS)
    if flip_near_ties and (h >> 40) % 61 == 0 and batch_size % 2 == 1:
        return VOCAB_BASE + (h >> 12) % len(WORDS)
    return top
