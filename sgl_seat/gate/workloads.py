"""The battery's workloads and gates, loaded from ``workloads.yaml`` (data, not code), and the prompts they send.

Why data: the ship rule is the operator's (the field report set it before its first run: aggregate at 64 >= 95 %
of baseline, cold TTFT within a bound, the prefix hit rate held). Changing a threshold or a sweep level is an
edit to a YAML file that a reviewer reads, never a code change. ``quick`` overrides ``full`` section by section.

Prompts are words drawn from a seeded generator: the same seed gives the same battery on every arm, so the
arms see identical traffic. A word is about one token on the sim (exactly one) and on real tokenizers (roughly);
the client reads what was served from ``usage``, never from these counts.
"""

from __future__ import annotations

import random
from importlib import resources
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sgl_seat.errors import UsageError

__all__ = ["Battery", "GateRule", "load_battery", "prompt_words", "sweep_prompt"]

SCHEMA_VERSION = 1
METRICS = ("sweep_output_tok_s", "cold_ttft_s", "prefix_hit_rate_warm", "kv_pool_tokens", "hangs",
           "max_running_requests", "single_stream_tok_s")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Greedy(_Strict):
    prompts: int = Field(ge=1, le=1000)
    prompt_tokens: int = Field(default=64, ge=1)
    max_tokens: int = Field(ge=1)


class Sweep(_Strict):
    levels: list[int] = Field(min_length=1)
    requests_per_client: int = Field(ge=1)
    prompt_tokens: int = Field(ge=1)
    max_tokens: int = Field(ge=1)
    #: ``words``: random words (a draft that copies from the prompt finds little); ``copy``: the words, then an ask to
    #: repeat them (what an n-gram draft is accepted on). A trained model answers the second as users' copy tasks go.
    #: ``chatml``: users' requests of four kinds in turn (a list to copy, a question, code, a story; about
    #: ``prompt_tokens`` words of list or topic), framed in the ChatML template (``<|im_start|>user ...``: SmolLM2's and
    #: Qwen's) and sent as text, so a chat model answers them as its users are answered: what a draft trained on the
    #: model's own answers (an EAGLE head) is accepted on. Only for a model whose template is ChatML.
    style: Literal["words", "copy", "chatml"] = "words"
    #: As users are served: a temperature above 0 and ``ignore_eos: false`` (requests may end before max_tokens;
    #: throughput still counts the tokens served). Default greedy with ignore_eos: every arm runs each to max_tokens.
    temperature: float = Field(default=0.0, ge=0.0, le=2.0)
    ignore_eos: bool = True


class ColdTTFT(_Strict):
    prompt_tokens: int = Field(ge=1)
    max_tokens: int = Field(default=8, ge=1)


class Prefix(_Strict):
    groups: int = Field(ge=1)
    prompts_per_group: int = Field(ge=1)
    system_tokens: int = Field(ge=1)
    question_tokens: int = Field(ge=1)
    max_tokens: int = Field(ge=1)
    passes: int = Field(ge=2, description="The first pass is the cold one, reported apart.")
    concurrency: int = Field(ge=1)


class GateRule(_Strict):
    """One row of the ship rule."""

    name: str = Field(pattern=r"^[a-z0-9_]{1,64}$")
    metric: Literal["sweep_output_tok_s", "cold_ttft_s", "prefix_hit_rate_warm", "kv_pool_tokens", "hangs",
                    "max_running_requests", "single_stream_tok_s"]
    at: int | None = Field(default=None, ge=1, description="The sweep level (sweep metrics only).")
    threshold: float = Field(ge=0)
    higher_is_better: bool


class Battery(_Strict):
    runs: int = Field(ge=1, le=100)
    seed: int = 1
    greedy: Greedy
    sweep: Sweep
    cold_ttft: ColdTTFT
    prefix: Prefix
    gates: list[GateRule] = Field(min_length=1)

    def levels(self) -> list[int]:
        return sorted(set(self.sweep.levels))

    def with_runs(self, runs: int | None, seed: int | None = None) -> Battery:
        upd: dict[str, Any] = {}
        if runs is not None:
            upd["runs"] = runs
        if seed is not None:
            upd["seed"] = seed
        return self.model_copy(update=upd)


def _default_path() -> Path:
    return Path(str(resources.files("sgl_seat.gate") / "workloads.yaml"))


def load_battery(*, quick: bool = False, path: Path | None = None) -> Battery:
    """The battery of ``path`` (default: the shipped ``workloads.yaml``), ``quick`` merged over ``full``."""
    src = path or _default_path()
    try:
        doc = yaml.safe_load(src.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise UsageError(f"cannot read the gate workloads {src}: {exc}", fix="check the file") from None
    if not isinstance(doc, dict) or doc.get("schema_version") != SCHEMA_VERSION or "full" not in doc:
        raise UsageError(f"{src}: not a gate workloads file (schema_version {SCHEMA_VERSION} with a 'full' block)",
                         fix="start from sgl_seat/gate/workloads.yaml")
    raw: dict[str, Any] = dict(doc["full"])
    if quick:
        for key, val in (doc.get("quick") or {}).items():
            raw[key] = {**raw.get(key, {}), **val} if isinstance(val, dict) else val
    try:
        battery = Battery.model_validate(raw)
    except ValidationError as exc:
        err = sorted(exc.errors(), key=lambda e: e["type"] != "extra_forbidden")[0]  # a misspelling first
        where = ".".join(str(p) for p in err["loc"])
        raise UsageError(f"{src}: {where}: {err['msg']}", fix="fix that field of the workloads file") from None
    for g in battery.gates:
        if g.metric == "sweep_output_tok_s" and g.at not in battery.levels():
            raise UsageError(f"{src}: gate {g.name} reads the sweep at {g.at}, which is not a sweep level "
                             f"{battery.levels()}", fix="add the level to sweep.levels or change the gate's 'at'")
    return battery


def sweep_prompt(style: str, seed: int | str, n: int, *, tag: str) -> str:
    """A sweep prompt of about ``n`` words in ``style`` (:class:`Sweep`), the same on every arm."""
    words = prompt_words(seed, n, tag=tag)
    if style == "copy":
        return f"Repeat these words exactly, in the same order: {words}\nRepeated:"
    if style == "chatml":
        return chatml(chat_request(seed, n, tag=tag))
    return words


# Other topics than engines/eaglehead.py trains its head on: the gate's requests are of the same kinds, not the same.
_TOPICS = ("the sun", "earthquakes", "ants", "the telephone", "snow", "football", "cheese", "trains", "the brain",
           "bridges", "deserts", "radio", "coffee", "whales", "magnets", "clocks")
_CODE = ("finds the largest number in a list", "checks if a word is a palindrome", "computes a factorial",
         "removes duplicates from a list", "converts Celsius to Fahrenheit", "counts the vowels in a string")
_STORY = ("a cat who wants to fly", "an old clock that stops time", "a boy who finds a secret door",
          "a whale that sings to ships", "a tiny town on a cloud", "a knight who is afraid of horses")


_OPENERS = ("Tell me", "Explain", "Give three facts")


def chatml(text: str) -> str:
    """A user's ``text`` in the ChatML template, the assistant's turn next (SmolLM2's template)."""
    return f"<|im_start|>user\n{text}<|im_end|>\n<|im_start|>assistant\n"


def _question(opener: str, topic: str) -> str:
    return f"{opener} about {topic}."


def _code(task: str) -> str:
    return f"Write a Python function that {task}, with a short test."


def _story(subject: str) -> str:
    return f"Write a short story about {subject}."


def chat_texts() -> dict[str, list[str]]:
    """Every request :func:`chat_request` can make of the question, code and story kinds (a list's words vary)."""
    return {"question": [_question(o, t) for o in _OPENERS for t in _TOPICS], "code": [_code(x) for x in _CODE],
            "story": [_story(x) for x in _STORY]}


def chat_request(seed: int | str, n: int, *, tag: str) -> str:
    """A user's request of one of four kinds (chosen by ``tag``'s seed): a list of ``n`` words to copy, a question,
    code, a story; deterministic in (``seed``, ``tag``)."""
    rng = random.Random(f"{seed}:{tag}:chat")  # noqa: S311 (reproducible prompts, not secrets)
    kind = rng.randrange(4)
    if kind == 0:
        return f"Repeat this list exactly, one item per line: {', '.join(prompt_words(seed, n, tag=tag).split())}"
    if kind == 1:
        return _question(rng.choice(_OPENERS), rng.choice(_TOPICS))
    if kind == 2:
        return _code(rng.choice(_CODE))
    return _story(rng.choice(_STORY))


def prompt_words(seed: int | str, n: int, *, tag: str) -> str:
    """``n`` words, deterministic in (``seed``, ``tag``): the same prompt on every arm."""
    rng = random.Random(f"{seed}:{tag}")  # noqa: S311 (reproducible prompts, not secrets)
    syll = ("ba", "de", "fi", "go", "ku", "la", "me", "ni", "po", "ru", "sa", "te", "vi", "zo")
    return " ".join(rng.choice(syll) + rng.choice(syll) for _ in range(n))
