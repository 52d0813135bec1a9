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

from collections import OrderedDict, deque
from itertools import repeat as _repeat
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
        out = list(map(e.get, keys, _repeat(_MISS, len(keys)))) if e else None
        if out is None or out.count(_MISS) == len(out):   # none cached (a build's new keys)
            out = self.inner.get_many(keys)
            self.misses += len(keys)
            if out.count(None) == len(out):
                return out                   # nor found below: nothing to keep, nothing to move
            miss = range(len(keys))
        else:
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
                self._evict_bulk(len(new))
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
        """A bulk write of distinct keys (an aggregation applied per key: each key's one value of
        the batch) goes through at once — below to the change-logging layer and the store, one
        record per key — so the cache has nothing to absorb; it keeps serving reads: a key it
        holds takes the new value, and new keys are kept (clean) while they fit without evicting.
        What a commit writes and what the changelog restores are those of one put after the
        other."""
        self.inner.put_many(keys, values)
        self.forwarded += len(keys)
        e = self._entries
        c = self.cache
        if e and not e.keys().isdisjoint(keys):
            dirty = self._dirty
            delta = 0
            move = e.move_to_end
            for k, v in zip(keys, values):
                old = e.get(k, _MISS)
                if old is _MISS:
                    continue
                dirty.pop(k, None)              # the value below is this one now
                if v is None:
                    del e[k]
                    self._keys.removed()
                    delta -= len(k) + ENTRY_OVERHEAD + (0 if old is None else len(old))
                else:
                    e[k] = v
                    move(k)
                    delta += len(v) - (0 if old is None else len(old))
            c.used += delta
            self._bytes += delta
            new = [i for i, k in enumerate(keys) if k not in e and values[i] is not None]
            keys = [keys[i] for i in new]
            values = [values[i] for i in new]
        elif None in values:
            keep = [i for i, v in enumerate(values) if v is not None]
            keys = [keys[i] for i in keep]
            values = [values[i] for i in keep]
        if not keys:
            return
        add = sum(map(len, keys)) + sum(map(len, values)) + ENTRY_OVERHEAD * len(keys)
        if c.used + add <= c.max_bytes:         # new keys stay for later reads while they fit
            e.update(zip(keys, values))
            self._keys.added_many(keys)
            c.used += add
            self._bytes += add

    def _evict_bulk(self, written: int) -> None:
        """`_evict` after a bulk write: when it must drop many entries (a batch of new keys bigger
        than the cache pushes out the last batch's), the oldest entries go in one cut — the
        same entries `_evict` would drop, in the same order, without a Python step per entry."""
        e = self._entries
        if len(e) < 2048 or written < 1024:
            return self._evict()
        import numpy as np

        c = self.cache
        excess = c.used - c.max_bytes
        keys = list(e)
        values = list(e.values())
        sizes = np.fromiter(map(len, keys), np.int64, len(keys)) + ENTRY_OVERHEAD
        if None in values:
            sizes += np.fromiter((0 if v is None else len(v) for v in values), np.int64, len(values))
        else:
            sizes += np.fromiter(map(len, values), np.int64, len(values))
        n = int(np.searchsorted(np.cumsum(sizes), excess, side="left")) + 1
        n = min(n, len(keys))
        if n < 256:                          # a few: the plain walk
            return self._evict()
        dropped = int(sizes[:n].sum())
        dirty = self._dirty
        gone = keys[:n]
        if dirty:
            fk = [k for k in gone if k in dirty]
            if fk:
                for k in fk:
                    del dirty[k]
                fv = [e[k] for k in fk]
                self.forwarded += len(fk)
                self.inner.put_many(fk, fv)
        deque(map(e.__delitem__, gone), 0)   # oldest first: C calls, no Python step per entry
        self._keys.removed(n)
        c.used -= dropped
        self._bytes -= dropped
        self.evictions += n

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
