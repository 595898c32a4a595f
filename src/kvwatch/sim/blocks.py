"""The paged KV cache of one simulated engine: vLLM's block pool with its prefix cache (pure).

``usable_blocks`` blocks of ``block_size`` tokens (the pool minus vLLM's null block). A request holds blocks for
the tokens whose KV is computed. With prefix caching, full prompt blocks are keyed by the trace's prefix hashes
and shared: a block that no request holds any more stays cached but evictable, and counts as free, as in vLLM;
allocation takes never-cached blocks first, then evicts cached ones least recently freed first.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from typing import Protocol

from kvwatch.sim.config import Request

PrefixKey = tuple[int, int]  # (the trace's prefix hash id, token offset inside the span it covers)


class Holder(Protocol):
    """What the pool reads and updates of a request holding blocks (the scheduler's per-request state)."""

    prompt: int
    generated: int
    computed: int
    held: int
    keys: list[Hashable]
    registered: int
    prefix_keys: Sequence[Hashable]


class BlockPool:
    """Free blocks, cached prefix blocks and their reference counts."""

    __slots__ = ("block_size", "cache_refs", "evictable", "free_plain")

    def __init__(self, usable_blocks: int, block_size: int) -> None:
        self.block_size = block_size
        self.free_plain = usable_blocks  # free blocks that hold no cached prefix
        self.cache_refs: dict[Hashable, int] = {}  # prefix key -> number of running requests holding it
        self.evictable: OrderedDict[Hashable, None] = OrderedDict()  # cached keys no request holds, LRU first

    @property
    def free_blocks(self) -> int:
        return self.free_plain + len(self.evictable)

    def allocate(self, n: int) -> None:
        """Take ``n`` blocks: never-cached ones first, then evict least recently used cached blocks."""
        take = min(n, self.free_plain)
        self.free_plain -= take
        for _ in range(n - take):
            key, _ = self.evictable.popitem(last=False)
            del self.cache_refs[key]

    def release(self, req: Holder) -> None:
        """Give back every block ``req`` holds (preempted or finished)."""
        # Reverse order, as vLLM frees: a prefix's tail blocks are evicted before its head.
        for key in reversed(req.keys):
            refs = self.cache_refs[key] - 1
            self.cache_refs[key] = refs
            if refs == 0:
                self.evictable[key] = None
        self.free_plain += req.held - len(req.keys)
        req.held = 0
        req.keys = []

    def register_prefix(self, req: Holder) -> None:
        """Prompt blocks that just became full become shareable (only then, as vLLM caches full blocks)."""
        full = min(req.computed // self.block_size, len(req.prefix_keys))
        for i in range(req.registered, full):
            key = req.prefix_keys[i]
            if key not in self.cache_refs:  # else computed twice concurrently: this copy stays private
                self.cache_refs[key] = 1
                req.keys.append(key)
        req.registered = max(req.registered, full)

    def prefix_hits(self, req: Holder) -> int:
        """Leading prompt blocks already cached; the last prompt token is always recomputed."""
        limit = min(len(req.prefix_keys), (req.prompt + req.generated - 1) // self.block_size)
        hits = 0
        while hits < limit and req.prefix_keys[hits] in self.cache_refs:
            hits += 1
        return hits

    def evictable_among(self, keys: Sequence[Hashable]) -> int:
        """How many of ``keys`` are cached but held by no one: pinning them takes them out of the free count."""
        return sum(1 for k in keys if k in self.evictable)

    def pin(self, keys: Sequence[Hashable]) -> None:
        """A newly admitted request takes a reference on its prefix hits."""
        for key in keys:
            if key in self.evictable:
                del self.evictable[key]
            self.cache_refs[key] = self.cache_refs.get(key, 0) + 1


def prefix_keys(request: Request, block_size: int, hash_block_tokens: int) -> tuple[PrefixKey, ...]:
    """Cache key of each full prompt block: the trace's prefix hash covering it and the offset inside it.

    Mooncake's ``hash_ids`` are prefix hashes (same id means same prefix up to there), so the pair
    identifies a block's content and its whole prefix, like vLLM's chained block hash.
    """
    keys = []
    for i in range(request.prompt_tokens // block_size):
        start = i * block_size
        h = start // hash_block_tokens
        if h >= len(request.hash_ids):
            break
        keys.append((request.hash_ids[h], start % hash_block_tokens))
    return tuple(keys)
