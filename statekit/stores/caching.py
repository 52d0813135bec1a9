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
        self._bytes = 0            # what this store's entries count against the task budget
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
            self._bytes += size
            if c.used > c.max_bytes:
                self._evict()
        return v

    def get_many(self, keys: list) -> list:
        """`get` of distinct keys in bulk: cached values, the misses from below in one bulk read;
        entries, LRU order and byte count as one get after the other (evictions once all are
        in, as `put_many`)."""
        e = self._entries
        if not e:
            out = self.inner.get_many(keys)
            self.misses += len(keys)
            if out.count(None) == len(out):
                return out                   # nothing cached, nothing found: nothing to keep
            miss = range(len(keys))
        else:
            out = [e.get(k, _MISS) for k in keys]
            miss = [i for i, v in enumerate(out) if v is _MISS]
            self.misses += len(miss)
            self.hits += len(keys) - len(miss)
            if miss:
                for i, v in zip(miss, self.inner.get_many([keys[i] for i in miss])):
                    out[i] = v
        move = e.move_to_end
        added = 0
        new = []
        for k, v in zip(keys, out):
            if k in e:
                move(k)
            elif v is not None:
                e[k] = v
                new.append(k)
                added += len(k) + len(v) + ENTRY_OVERHEAD
        if new:
            self._keys.added_many(new)
            c = self.cache
            c.used += added
            self._bytes += added
            if c.used > c.max_bytes:
                self._evict()
        return out

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
        self._bytes += delta
        if c.used > c.max_bytes:
            self._evict()

    def put_many(self, keys: list, values: list) -> None:
        """`put` of distinct keys in bulk: the same entries, dirty marks, LRU order and byte count
        as one put after the other when the task's cache holds them all; otherwise the evictions
        come once the whole write is in (forwarded below in one bulk write), so other entries may
        go early — the committed state and what the changelog restores are the same."""
        e = self._entries
        dirty = self._dirty
        vbytes = (sum(len(v) for v in values if v is not None) if None in values
                  else sum(map(len, values)))
        if not e or e.keys().isdisjoint(keys):
            self._keys.added_many(keys)
            delta = sum(map(len, keys)) + ENTRY_OVERHEAD * len(keys) + vbytes
        else:
            old = [e.get(k, _MISS) for k in keys]
            new = [k for k, o in zip(keys, old) if o is _MISS]
            self._keys.added_many(new)
            delta = (sum(map(len, new)) + ENTRY_OVERHEAD * len(new) + vbytes
                     - sum(len(o) for o in old if o is not _MISS and o is not None))
            if len(new) < len(keys):      # an overwrite moves its key to the end, in write order
                for k in keys:
                    e.pop(k, None)
        e.update(zip(keys, values))
        dirty.update(dict.fromkeys(keys))
        c = self.cache
        c.used += delta
        self._bytes += delta
        if c.used > c.max_bytes:
            self._evict()

    def delete(self, key: bytes) -> Optional[bytes]:
        old = self.get(key)
        self.put(key, None)
        return old

    def _evict(self) -> None:
        """Drop least recently used entries until the task is within budget; the dirty ones among
        them go below (to the changelog and the store) in one bulk write."""
        c = self.cache
        e = self._entries
        dirty = self._dirty
        pop = e.popitem
        fk, fv = [], []
        n = 0
        used = c.used
        while used > c.max_bytes and e:
            k, v = pop(last=False)
            n += 1
            used -= len(k) + ENTRY_OVERHEAD + (0 if v is None else len(v))
            if k in dirty:
                del dirty[k]
                fk.append(k)
                fv.append(v)
        self._bytes -= c.used - used
        c.used = used
        self._keys.removed(n)
        self.evictions += n
        if fk:
            self.forwarded += len(fk)
            if len(fk) == 1:
                self._inner_put(fk[0], fv[0])
            else:
                self.inner.put_many(fk, fv)

    def flush(self) -> None:
        """Forward every dirty entry downstream (first-dirtied first, in one bulk write); entries
        stay, now clean, except tombstones, which leave the cache."""
        dirty = self._dirty
        if dirty:
            e = self._entries
            keys = list(dirty)
            values = [e[k] for k in keys]
            if len(keys) == 1:
                self._inner_put(keys[0], values[0])
            else:
                self.inner.put_many(keys, values)
            self.forwarded += len(dirty)
            dirty.clear()
            if None in values:
                for k, v in zip(keys, values):
                    if v is None:
                        del e[k]
                        self._keys.removed()
                        self.cache.used -= len(k) + ENTRY_OVERHEAD
                        self._bytes -= len(k) + ENTRY_OVERHEAD
        self.flushes += 1
        self.inner.flush()

    def clear(self) -> None:
        """Drop every entry, dirty ones too (rollback to the last commit)."""
        self.cache.used -= self._bytes
        self._bytes = 0
        self._entries.clear()
        self._dirty.clear()
        self._keys.reset()

    def close(self) -> None:
        self.inner.close()

    # -- observation -----------------------------------------------------------------------
    @property
    def bytes(self) -> int:
        """Bytes this store's entries count against the task budget."""
        return self._bytes

    @property
    def dirty_count(self) -> int:
        return len(self._dirty)

    def stats(self) -> dict:
        return {"hits": self.hits, "misses": self.misses, "evictions": self.evictions,
                "dirty": len(self._dirty), "entries": len(self._entries), "bytes": self.bytes,
                "forwarded": self.forwarded, "flushes": self.flushes,
                "task_cache_bytes": self.cache.used, "task_cache_max_bytes": self.cache.max_bytes}
