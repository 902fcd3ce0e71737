"""Paged KV cache block pool with vLLM V1's prefix cache, kept as counts where identity
cannot matter.

vLLM's ``BlockPool`` keeps every free block in one LRU queue: allocation pops from the head
(evicting the cached hash a block may still carry), freeing appends to the tail, and a
request frees its blocks in reverse order so its tail blocks are evicted first. A prefix hit
on a free cached block takes it out of the middle of the queue.

Blocks that carry no reusable hash are interchangeable, so a run of them is stored as one
integer; only content-hashed prompt blocks (requests that arrive with token ids) are
individual objects. The free queue is therefore a deque of ``int`` runs and
:class:`CachedBlock` entries; allocation and freeing cost O(runs touched), not O(blocks).

Deviation from vLLM (documented): blocks of generated tokens, and prompt blocks of requests
given only as lengths, carry no hash here. vLLM hashes them too, which can only ever hit for
the *same* request after a preemption; the simulator recomputes those in full.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence

__all__ = ["CachedBlock", "KVCache", "block_hashes"]


class CachedBlock:
    """A full prompt block registered under its content hash."""

    __slots__ = ("free_gen", "hash", "ref")

    def __init__(self, h: int) -> None:
        self.hash = h
        self.ref = 1
        self.free_gen = 0  # bumped when leaving the free queue; stale queue entries are skipped


def block_hashes(token_ids: Sequence[int], block_size: int) -> list[int]:
    """Chained hashes of the full blocks of a prompt (vLLM hashes parent hash + block tokens)."""
    out: list[int] = []
    parent = 0
    for i in range(len(token_ids) // block_size):
        parent = hash((parent, tuple(token_ids[i * block_size : (i + 1) * block_size])))
        out.append(parent)
    return out


class KVCache:
    """Block accounting for one engine. ``num_free`` counts every block a new allocation may
    take, evictable cached blocks included (as vLLM's ``get_num_free_blocks``)."""

    __slots__ = ("_queue", "cache", "caching", "num_blocks", "num_free")

    _queue: deque[int | tuple[CachedBlock, int]]

    def __init__(self, num_blocks: int, enable_caching: bool) -> None:
        self.num_blocks = num_blocks
        self.num_free = num_blocks
        self.caching = enable_caching
        self.cache: dict[int, CachedBlock] = {}
        # entries: int (a run of anonymous free blocks) or (CachedBlock, free_gen)
        self._queue = deque([num_blocks] if num_blocks else ())

    @property
    def usage(self) -> float:
        return 1.0 - self.num_free / self.num_blocks if self.num_blocks else 0.0

    # -- allocation ----------------------------------------------------------------
    def take(self, n: int) -> None:
        """Pop ``n`` blocks from the head of the free queue (caller checked ``num_free``)."""
        self.num_free -= n
        q = self._queue
        while n:
            head = q[0]
            if isinstance(head, int):
                if head > n:
                    q[0] = head - n
                    return
                q.popleft()
                n -= head
            else:
                q.popleft()
                blk, gen = head
                if blk.free_gen != gen or blk.ref:
                    continue  # stale entry: the block left the queue through a prefix hit
                blk.free_gen += 1
                del self.cache[blk.hash]  # evict
                n -= 1

    def lookup(self, hashes: Sequence[int], max_blocks: int) -> list[CachedBlock]:
        """Longest cached prefix of ``hashes`` (at most ``max_blocks``): the computed blocks."""
        hits: list[CachedBlock] = []
        cache = self.cache
        for h in hashes[:max_blocks]:
            blk = cache.get(h)
            if blk is None:
                break
            hits.append(blk)
        return hits

    @staticmethod
    def evictable(hits: Sequence[CachedBlock]) -> int:
        """Hit blocks that sit in the free queue; touching them lowers ``num_free``."""
        return sum(1 for b in hits if b.ref == 0)

    def touch(self, hits: Sequence[CachedBlock]) -> None:
        for b in hits:
            if b.ref == 0:
                b.free_gen += 1  # invalidates its queue entry
                self.num_free -= 1
            b.ref += 1

    def register(self, h: int) -> CachedBlock | None:
        """A block just became full with content hash ``h``: cache it unless an identical block
        is cached already (then the new one stays anonymous, as vLLM keeps the first)."""
        if not self.caching or h in self.cache:
            return None
        blk = CachedBlock(h)
        self.cache[h] = blk
        return blk

    # -- freeing -------------------------------------------------------------------
    def free(self, anon: int, hashed: Sequence[CachedBlock]) -> None:
        """Free a request's blocks: its block table is ``hashed`` followed by ``anon``
        anonymous blocks; reverse order puts the tail first in the eviction queue."""
        q = self._queue
        if anon:
            self.num_free += anon
            if q and isinstance(q[-1], int):
                q[-1] += anon
            else:
                q.append(anon)
        for b in reversed(hashed):
            b.ref -= 1
            if b.ref == 0:
                self.num_free += 1
                q.append((b, b.free_gen))
