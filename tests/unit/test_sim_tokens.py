"""Greedy output is a pure function of the context: same prompt, same tokens, draft on or off."""

from __future__ import annotations

from sgl_seat.sim.step import tokens
from sgl_seat.sim.step.batch import Batcher, Req
from sgl_seat.sim.step.costmodel import CostModel, SpecShape


def test_vocabulary_words_round_trip() -> None:
    text = " ".join(tokens.WORDS[i] for i in (0, 7, 4095))
    ids = tokens.encode(text)
    assert ids == [tokens.VOCAB_BASE, tokens.VOCAB_BASE + 7, tokens.VOCAB_BASE + 4095]
    assert tokens.decode(ids) == " " + text
    assert tokens.decode([tokens.EOS_ID, tokens.BOS_ID]) == ""


def test_other_words_hash_stably() -> None:
    assert tokens.encode("Hello, world!") == tokens.encode("Hello,   world!")
    assert len(tokens.encode("one two three")) == 3
    assert all(tokens.VOCAB_BASE <= t < tokens.VOCAB_SIZE for t in tokens.encode("x y z"))


def test_chat_template_counts() -> None:
    ids = tokens.chat_ids([("system", "be brief"), ("user", "hi there you")])
    assert ids[0] == tokens.BOS_ID and ids[-1] == tokens.ROLE_IDS["assistant"]
    assert len(ids) == 1 + (1 + 2) + (1 + 3) + 1


def _generate(spec: SpecShape | None, prompt: list[int], n: int, *, flip: bool = False, batch: int = 1) -> list[int]:
    b = Batcher(capacity=100_000, max_running=16, cost=CostModel(floor_ms=1.0), spec=spec, flip_near_ties=flip)
    for i in range(batch):
        b.add(Req(f"r{i}", prompt if i == 0 else [*prompt, 7000 + i], n))
    out: list[int] = []
    while (plan := b.plan()) is not None:
        for item in b.complete(plan):
            if item["rid"] == "r0":
                out += item["ids"]
    return out


def test_same_context_same_tokens_draft_on_or_off() -> None:
    prompt = tokens.encode("the quick brown fox")
    off = _generate(None, prompt, 64)
    on = _generate(SpecShape("EAGLE", 3, 1, 4, 0.81), prompt, 64)
    assert len(off) == 64
    assert off == on == _generate(None, prompt, 64)
    assert off != _generate(None, tokens.encode("the quick brown dog"), 64)
    assert tokens.EOS_ID not in off


def test_near_ties_can_flip_with_batch_composition() -> None:
    prompt = tokens.encode("a b c")
    alone = _generate(None, prompt, 400, flip=True, batch=2)
    crowded = _generate(None, prompt, 400, flip=True, batch=3)
    assert alone == _generate(None, prompt, 400, flip=False, batch=3)  # even batch: no flips
    assert alone != crowded  # odd batch: some near-tie positions pick the runner-up


def test_stop_strings_and_ids() -> None:
    prompt = tokens.encode("stop test")
    full = _generate(None, prompt, 20)
    word = tokens.decode([full[5]]).strip()
    b = Batcher(capacity=10_000, max_running=4, cost=CostModel(floor_ms=1.0))
    b.add(Req("s", prompt, 20, stop=(word,)))
    b.add(Req("t", prompt, 20, stop_token_ids=frozenset({full[3]})))
    fins = {}
    while (plan := b.plan()) is not None:
        for item in b.complete(plan):
            if item["fin"]:
                fins[item["rid"]] = item
    assert fins["s"]["fin"] == {"type": "stop", "matched": word} and fins["s"]["ct"] <= 6
    assert fins["t"]["fin"] == {"type": "stop", "matched": full[3]} and fins["t"]["ct"] == 4
