"""The record cache: absorbs repeated writes to a key until the next commit or an eviction.

One byte budget per task (`RecordCache`), shared by all caching stores of the task, as Kafka Streams'
ThreadCache is shared by the stores of a stream thread: a task with one hot store and one cold one
spends its memory where the writes are, and the knob the notebook turns (`cache_bytes`) means one
thing. Each store keeps its own LRU (an OrderedDict, O(1) move/evict); when the task is over budget
the store being written evicts its least recently used entries, as ThreadCache.maybeEvict does.

Forwarding downstream (to the change-logging layer, hence the changelog) happens only for dirty
entries: at `flush()` in the order keys first became dirty since the last flush, and at eviction one
entry at a time (the changelog needs no order across keys inside one commit: restoration applies a
commit group as a whole). A thousand writes to one key between commits become one changelog record.
Reads hit the cache first; a miss reads below and caches the value as a clean entry.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Iterator, Optional

from statekit.stores.api import KV, SortedKeys, StoreBase, merge_overlay

_MISS = object()
ENTRY_OVERHEAD = 64  # rough bytes of bookkeeping per entry (dict slots, links), counted in budget


class RecordCache:
    """The byte budget of one task's record cache (shared by its CachingStores)."""

    __slots__ = ("max_bytes", "used", "stores")

    def __init__(self, max_bytes: int) -> None:
        self.max_bytes = int(max_bytes)
        self.used = 0
        self.stores: list = []

    def stats(self) -> dict:
        return {"max_bytes": self.max_bytes, "bytes": self.used,
                "entries": sum(len(s._entries) for s in self.stores),
                "dirty": sum(len(s._dirty) for s in self.stores)}


class CachingStore(StoreBase):
    def __init__(self, inner, cache: Optional[RecordCache] = None, max_bytes: int = 10 << 20) -> None:
        self.name = inner.name
        self.inner = inner
        self.cache = cache if cache is not None else RecordCache(max_bytes)
        self.cache.stores.append(self)
        self._entries: OrderedDict = OrderedDict()
        self._keys = SortedKeys(self._entries)
        self._dirty: dict = {}
        self.hits = 0
        self.misses = 0
        self.evictions = 0
        self.forwarded = 0
        self.flushes = 0
        self._inner_get = inner.get
        self._inner_put = inner.put

    # -- reads -----------------------------------------------------------------------------
    def get(self, key: bytes) -> Optional[bytes]:
        e = self._entries
        v = e.get(key, _MISS)
        if v is not _MISS:
            self.hits += 1
            e.move_to_end(key)
            return v
        self.misses += 1
        v = self._inner_get(key)
        if v is not None:
            e[key] = v
            self._keys.added(key)
            size = len(key) + len(v) + ENTRY_OVERHEAD
            c = self.cache
            c.used += size
            if c.used > c.max_bytes:
                self._evict()
        return v

    def scan(self, lo: Optional[bytes] = None, hi: Optional[bytes] = None) -> Iterator[KV]:
        e = self._entries
        keys = self._keys.keys_in(lo, hi)
        lower = self.inner.scan(lo, hi)
        if not keys:
            return lower
        return merge_overlay([(k, e[k]) for k in keys], lower)

    def approximate_count(self) -> int:
        """Below's count, corrected by the dirty entries: a dirty value for a key below adds
        nothing, a dirty tombstone of a key below removes one, a tombstone of an absent key
        nothing. Exact when the layer below is (one point read below per dirty entry)."""
        e = self._entries
        get = self._inner_get
        n = self.inner.approximate_count()
        for k in self._dirty:
            n += (e[k] is not None) - (get(k) is not None)
        return max(n, 0)

    # -- writes ----------------------------------------------------------------------------
    def put(self, key: bytes, value: Optional[bytes]) -> None:
        e = self._entries
        old = e.get(key, _MISS)
        e[key] = value
        self._dirty[key] = None
        if old is _MISS:
            self._keys.added(key)
            delta = len(key) + ENTRY_OVERHEAD + (0 if value is None else len(value))
        else:
            e.move_to_end(key)
            delta = (0 if value is None else len(value)) - (0 if old is None else len(old))
        c = self.cache
        c.used += delta
        if c.used > c.max_bytes:
            self._evict()

    def delete(self, key: bytes) -> Optional[bytes]:
        old = self.get(key)
        self.put(key, None)
        return old

    def _evict(self) -> None:
        c = self.cache
        e = self._entries
        dirty = self._dirty
        while c.used > c.max_bytes and e:
            k, v = e.popitem(last=False)
            self._keys.removed()
            c.used -= len(k) + ENTRY_OVERHEAD + (0 if v is None else len(v))
            self.evictions += 1
            if k in dirty:
                del dirty[k]
                self.forwarded += 1
                self._inner_put(k, v)

    def flush(self) -> None:
        """Forward every dirty entry downstream (first-dirtied first); entries stay, now clean,
        except tombstones, which leave the cache."""
        dirty = self._dirty
        if dirty:
            e = self._entries
            put = self._inner_put
            tomb = []
            for k in dirty:
                v = e[k]
                put(k, v)
                if v is None:
                    tomb.append(k)
            self.forwarded += len(dirty)
            dirty.clear()
            for k in tomb:
                del e[k]
                self._keys.removed()
                self.cache.used -= len(k) + ENTRY_OVERHEAD
        self.flushes += 1
        self.inner.flush()

    def clear(self) -> None:
        """Drop every entry, dirty ones too (rollback to the last commit)."""
        self.cache.used -= self.bytes
        self._entries.clear()
        self._dirty.clear()
        self._keys.reset()

    def close(self) -> None:
        self.inner.close()

    # -- observation -----------------------------------------------------------------------
    @property
    def bytes(self) -> int:
        """Bytes this store's entries count against the task budget (computed: not on the hot
        path)."""
        return sum(len(k) + ENTRY_OVERHEAD + (0 if v is None else len(v))
                   for k, v in self._entries.items())

    @property
    def dirty_count(self) -> int:
        return len(self._dirty)

    def stats(self) -> dict:
        return {"hits": self.hits, "misses": self.misses, "evictions": self.evictions,
                "dirty": len(self._dirty), "entries": len(self._entries), "bytes": self.bytes,
                "forwarded": self.forwarded, "flushes": self.flushes,
                "task_cache_bytes": self.cache.used, "task_cache_max_bytes": self.cache.max_bytes}
