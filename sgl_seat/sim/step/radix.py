"""A radix-style prefix cache over token ids, with the KV pool accounting SGLang reports.

Why a real tree: the gate battery compares prefix-cache hit rates draft on and off, and a smaller KV pool
(draft on) must evict more and hit less. So hits are real longest-prefix matches, entries are evicted
least-recently-used leaf first when the pool runs short, and locked paths (prefixes of running requests)
are never evicted. Sizes are in tokens, as SGLang's ``max_total_num_tokens`` is.
"""

from __future__ import annotations

import heapq
import itertools
from dataclasses import dataclass, field

_clock = itertools.count()


@dataclass(eq=False, slots=True)
class Node:
    key: list[int]
    parent: Node | None
    children: dict[int, Node] = field(default_factory=dict)
    lock_ref: int = 0
    last_access: int = 0


class RadixCache:
    """Token-id radix tree. ``evictable_size`` counts tokens in unlocked nodes."""

    def __init__(self, *, disabled: bool = False) -> None:
        self.disabled = disabled
        self.root = Node(key=[], parent=None, lock_ref=1)
        self.total_size = 0
        self.evictable_size = 0

    def reset(self) -> None:
        self.root = Node(key=[], parent=None, lock_ref=1)
        self.total_size = 0
        self.evictable_size = 0

    @property
    def protected_size(self) -> int:
        return self.total_size - self.evictable_size

    def match_prefix(self, ids: list[int]) -> tuple[int, Node]:
        """Longest cached prefix of ``ids``: (length, deepest node). Splits a node on a partial match."""
        node = self.root
        matched = 0
        if self.disabled:
            return 0, node
        node.last_access = next(_clock)
        while matched < len(ids):
            child = node.children.get(ids[matched])
            if child is None:
                break
            n = _common(child.key, ids, matched)
            child.last_access = next(_clock)
            if n < len(child.key):
                child = self._split(child, n)
                matched += n
                node = child
                break
            matched += n
            node = child
        return matched, node

    def insert(self, ids: list[int]) -> Node:
        """Insert ``ids`` (extending the cached prefix); return the node that ends it."""
        if self.disabled:
            return self.root
        matched, node = self.match_prefix(ids)
        if matched < len(ids):
            rest = list(ids[matched:])
            new = Node(key=rest, parent=node, last_access=next(_clock))
            node.children[rest[0]] = new
            self.total_size += len(rest)
            self.evictable_size += len(rest)
            node = new
        return node

    def lock(self, node: Node) -> None:
        """Protect the path root..node (a running request uses it)."""
        while node is not self.root and node is not None:
            if node.lock_ref == 0:
                self.evictable_size -= len(node.key)
            node.lock_ref += 1
            node = node.parent  # type: ignore[assignment]

    def unlock(self, node: Node) -> None:
        while node is not self.root and node is not None:
            node.lock_ref -= 1
            if node.lock_ref == 0:
                self.evictable_size += len(node.key)
            node = node.parent  # type: ignore[assignment]

    def evict(self, num_tokens: int) -> int:
        """Free at least ``num_tokens`` from unlocked leaves, least recently used first; return freed."""
        if num_tokens <= 0:
            return 0
        leaves = [(n.last_access, id(n), n) for n in self._nodes() if not n.children and n.lock_ref == 0]
        heapq.heapify(leaves)
        freed = 0
        while freed < num_tokens and leaves:
            _, _, leaf = heapq.heappop(leaves)
            parent = leaf.parent
            assert parent is not None
            del parent.children[leaf.key[0]]
            freed += len(leaf.key)
            self.total_size -= len(leaf.key)
            self.evictable_size -= len(leaf.key)
            if parent is not self.root and not parent.children and parent.lock_ref == 0:
                heapq.heappush(leaves, (parent.last_access, id(parent), parent))
        return freed

    def _split(self, child: Node, n: int) -> Node:
        """Cut ``child`` after ``n`` tokens; the new upper node keeps the child's locks."""
        parent = child.parent
        assert parent is not None
        upper = Node(key=child.key[:n], parent=parent, lock_ref=child.lock_ref, last_access=child.last_access)
        parent.children[upper.key[0]] = upper
        child.key = child.key[n:]
        child.parent = upper
        upper.children[child.key[0]] = child
        return upper  # sizes unchanged: the tokens moved between two nodes of equal lock state

    def _nodes(self) -> list[Node]:
        out: list[Node] = []
        stack = list(self.root.children.values())
        while stack:
            n = stack.pop()
            out.append(n)
            stack.extend(n.children.values())
        return out


def _common(key: list[int], ids: list[int], start: int) -> int:
    n = 0
    limit = min(len(key), len(ids) - start)
    while n < limit and key[n] == ids[start + n]:
        n += 1
    return n


@dataclass(slots=True)
class KVPool:
    """The pool in tokens: the tree's cached tokens plus running requests' private (uncached) tokens.

    ``reserved`` holds back room for tokens running requests have not generated yet, so admission never
    over-commits (SGLang retracts instead; the sim keeps it simple and admits conservatively).
    """

    capacity: int
    cache: RadixCache
    private: int = 0
    reserved: int = 0
    hit_tokens: int = 0
    prompt_tokens: int = 0

    @property
    def used(self) -> int:
        """Tokens held by requests (SGLang's ``num_used_tokens``: not counting evictable cache)."""
        return self.cache.protected_size + self.private

    @property
    def free(self) -> int:
        return self.capacity - self.cache.total_size - self.private

    def available(self) -> int:
        """Tokens a new request could take (free + evictable - reserved)."""
        return self.free + self.cache.evictable_size - self.reserved

    def make_room(self, need: int) -> bool:
        if self.available() < need:
            return False
        short = need + self.reserved - self.free
        if short > 0:
            self.cache.evict(short)
        return True

    @property
    def token_usage(self) -> float:
        return self.used / self.capacity if self.capacity else 0.0

    @property
    def hit_rate(self) -> float:
        return self.hit_tokens / self.prompt_tokens if self.prompt_tokens else 0.0
