"""Prefix cache and KV pool: real longest-prefix hits, LRU eviction of unlocked leaves, honest accounting."""

from __future__ import annotations

from sgl_seat.sim.step.batch import DECODE, EXTEND, Batcher, Req
from sgl_seat.sim.step.costmodel import CostModel, SpecShape
from sgl_seat.sim.step.radix import KVPool, RadixCache


def test_match_insert_split() -> None:
    c = RadixCache()
    c.insert([1, 2, 3, 4])
    assert c.match_prefix([1, 2, 3, 4, 5])[0] == 4
    assert c.match_prefix([1, 2, 9])[0] == 2  # splits the node
    c.insert([1, 2, 9, 9])
    assert c.total_size == 6 and c.evictable_size == 6
    assert c.match_prefix([1, 2, 9, 9])[0] == 4
    assert c.match_prefix([7])[0] == 0


def test_locks_protect_and_evict_is_lru() -> None:
    c = RadixCache()
    a = c.insert([1, 1, 1])
    c.insert([2, 2, 2])
    c.insert([3, 3, 3])
    c.lock(a)
    assert c.protected_size == 3 and c.evictable_size == 6
    c.match_prefix([3, 3, 3])  # touch: [2,2,2] is now least recently used
    assert c.evict(1) == 3
    assert c.match_prefix([2, 2, 2])[0] == 0
    assert c.match_prefix([3, 3, 3])[0] == 3
    assert c.evict(100) == 3  # only [3,3,3] is unlocked
    assert c.match_prefix([1, 1, 1])[0] == 3
    c.unlock(a)
    assert c.evictable_size == 3 and c.evict(3) == 3 and c.total_size == 0


def test_pool_make_room_evicts_only_what_it_needs() -> None:
    pool = KVPool(capacity=10, cache=RadixCache())
    pool.cache.insert([1, 2, 3, 4, 5, 6])
    assert pool.free == 4 and pool.available() == 10
    assert pool.make_room(7)
    assert pool.free >= 7
    assert not pool.make_room(11)


def _batcher(capacity: int = 10_000, slots: int = 4, spec: SpecShape | None = None) -> Batcher:
    return Batcher(capacity=capacity, max_running=slots, cost=CostModel(floor_ms=1.0), spec=spec)


def _run(b: Batcher) -> dict[str, dict[str, object]]:
    done: dict[str, dict[str, object]] = {}
    while (plan := b.plan()) is not None:
        for item in b.complete(plan):
            if item["fin"]:
                done[str(item["rid"])] = item
    return done


def test_second_request_hits_the_cache() -> None:
    b = _batcher()
    prompt = list(range(300, 340))
    b.add(Req("a", prompt, 8))
    first = _run(b)["a"]
    b.add(Req("b", [*prompt, 999], 8))
    second = _run(b)["b"]
    assert first["cached"] == 0
    assert second["cached"] == 40
    assert b.pool.hit_rate == 40 / 81
    assert b.pool.used == 0 and b.pool.reserved == 0  # everything released, cache kept
    assert b.pool.cache.total_size > 0


def test_slots_cap_the_running_batch() -> None:
    b = _batcher(slots=2)
    for i in range(5):
        b.add(Req(f"r{i}", [300 + i, 301], 4))
    plan = b.plan()
    assert plan is not None and plan.kind == EXTEND and len(plan.reqs) == 2
    b.complete(plan)
    plan = b.plan()
    assert plan is not None and plan.kind == DECODE and len(plan.reqs) == 2 and plan.gather == 2
    assert len(b.waiting) == 3
    assert len(_run(b)) == 5


def test_kv_pool_limits_admission_and_rejects_the_impossible() -> None:
    b = _batcher(capacity=40, slots=8)
    b.add(Req("big", list(range(300, 330)), 20))  # needs 50 > 40: refused with a message
    b.add(Req("a", list(range(400, 410)), 10))  # 20
    b.add(Req("b", list(range(500, 510)), 10))  # 20
    b.add(Req("c", list(range(600, 610)), 10))  # must wait for room
    plan = b.plan()
    assert plan is not None and [r.rid for r in plan.reqs] == ["a", "b"]
    assert b.rejected and b.rejected[0]["fin"]["type"] == "abort"
    assert "pool holds 40" in b.rejected[0]["fin"]["message"]
    done = {str(i["rid"]) for i in b.complete(plan) if i["fin"]}
    done |= set(_run(b))
    assert done == {"a", "b", "c"}


def test_gather_grows_with_the_draft_and_abort_frees() -> None:
    spec = SpecShape("EAGLE", 3, 1, 4, 0.81)
    b = _batcher(slots=8, spec=spec)
    for i in range(3):
        b.add(Req(f"r{i}", [300 + i], 50))
    b.complete(b.plan())  # type: ignore[arg-type]
    plan = b.plan()
    assert plan is not None and plan.gather == 3 * 4
    item = b.abort("r1")
    assert item is not None and item["fin"]["type"] == "abort"
    assert b.abort("nope") is None
    _run(b)
    assert b.pool.used == 0 and b.pool.reserved == 0


def test_flush_refused_while_busy() -> None:
    b = _batcher()
    b.add(Req("a", [300, 301], 4))
    assert not b.flush_cache()
    _run(b)
    assert b.flush_cache()
    assert b.pool.cache.total_size == 0 and b.pool.hit_rate == 0.0
