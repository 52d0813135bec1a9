"""What each layer adds: the cache's collapsing, eviction and stats, the changelog's records and
tombstones, the merged view over cache + overlay + RocksDB, metrics, rollback."""
from __future__ import annotations

import pytest

from statekit.errors import StatekitError
from statekit.stores import (CachingStore, ChangeLoggingStore, MemoryStore, MeteredStore,
                             RecordCache, RecordingSink, StoreSpec)
from statekit.stores.caching import ENTRY_OVERHEAD


def bspec(name="s", **kw):
    return StoreSpec(name, key_serde="bytes", value_serde="bytes", **kw)


def test_cache_collapses_1000_writes_into_one_changelog_record(make_task, backend):
    stores, db, sink = make_task(StoreSpec("s", backend=backend))
    s = stores["s"]
    for i in range(1000):
        s.put("k", i)
    assert sink.records == []
    assert db.pending_count() == 0  # nothing reached the inner store either
    db.flush()
    assert sink.records == [("s", b'"k"', b"999")]
    db.commit({"batch": 1})
    assert s.get("k") == 999
    assert db.read_meta() == {"batch": 1}


def test_eviction_is_lru_and_forwards_dirty_entries_in_order(make_task):
    size = 2 + 10 + ENTRY_OVERHEAD
    stores, db, sink = make_task(bspec(), cache_bytes=3 * size)
    s = stores["s"]
    for k in [b"k0", b"k1", b"k2"]:
        s.put(k, b"v" * 10)
    assert sink.records == []
    assert s.get(b"k0") == b"v" * 10  # k0 becomes most recently used
    s.put(b"k3", b"w" * 10)           # evicts k1, the least recently used
    s.put(b"k4", b"x" * 10)           # evicts k2
    assert sink.records == [("s", b"k1", b"v" * 10), ("s", b"k2", b"v" * 10)]
    cache = s.inner
    assert cache.evictions == 2
    assert cache.stats()["entries"] == 3 and cache.stats()["bytes"] == 3 * size
    s.put(b"k0", b"y" * 10)           # rewrite of an already dirty key keeps its place in line
    db.flush()
    assert [k for _, k, _ in sink.records[2:]] == [b"k0", b"k3", b"k4"]
    assert sink.records[2] == ("s", b"k0", b"y" * 10)
    assert cache.dirty_count == 0


def test_clean_entries_are_evicted_silently(make_task):
    size = 2 + 10 + ENTRY_OVERHEAD
    stores, db, sink = make_task(bspec(), cache_bytes=2 * size)
    s = stores["s"]
    s.put(b"a1", b"1" * 10)
    s.put(b"a2", b"2" * 10)
    db.flush()
    db.commit()
    sink.clear()
    s.put(b"a3", b"3" * 10)  # evicts clean a1: no record
    s.put(b"a4", b"4" * 10)  # evicts clean a2: no record
    assert sink.records == []
    assert s.inner.evictions == 2
    assert s.get(b"a1") == b"1" * 10  # a miss served from RocksDB...
    assert s.inner.misses == 1
    assert sink.records == [("s", b"a3", b"3" * 10)]  # ...whose caching evicted dirty a3


def test_cache_stats_hits_misses_bytes(make_task):
    stores, db, _ = make_task(bspec())
    s = stores["s"]
    s.put(b"k", b"v")
    assert s.get(b"k") == b"v"
    assert s.get(b"nope") is None
    st = s.inner.stats()
    assert (st["hits"], st["misses"], st["dirty"], st["entries"]) == (1, 1, 1, 1)
    assert st["bytes"] == 1 + 1 + ENTRY_OVERHEAD == st["task_cache_bytes"]
    assert s.metrics()["cache"]["hits"] == 1


def test_tombstones_reach_the_changelog_and_rocksdb(make_task, backend):
    stores, db, sink = make_task(bspec(backend=backend))
    s = stores["s"]
    s.put(b"old", b"1")
    db.flush()
    db.commit()
    sink.clear()
    assert s.delete(b"old") == b"1"
    s.put(b"new", b"2")
    s.delete(b"new")
    assert s.get(b"old") is None and s.get(b"new") is None
    db.flush()
    assert sink.records == [("s", b"old", None), ("s", b"new", None)]
    assert s.inner.stats()["entries"] == 0  # tombstones leave the cache once flushed
    db.commit()
    assert list(s.all()) == []
    if backend == "rocksdb":
        assert list(db.items("s")) == []


def test_range_merges_cache_overlay_and_rocksdb(make_task, backend):
    stores, db, sink = make_task(bspec(backend=backend))
    s = stores["s"]
    for k in [b"a", b"b", b"c", b"d"]:
        s.put(k, b"committed-" + k)
    db.flush()
    db.commit()
    # overlay (flushed, not committed): delete b, overwrite c, new e
    s.delete(b"b")
    s.put(b"c", b"overlay-c")
    s.put(b"e", b"overlay-e")
    db.flush()
    # cache (dirty): delete d, overwrite a, new f, and overwrite+delete of overlay's e
    s.delete(b"d")
    s.put(b"a", b"cache-a")
    s.put(b"f", b"cache-f")
    s.put(b"e", None)
    expected = [(b"a", b"cache-a"), (b"c", b"overlay-c"), (b"f", b"cache-f")]
    assert list(s.all()) == expected
    assert list(s.range(b"b", b"e")) == [(b"c", b"overlay-c")]
    assert list(s.range(b"a", b"a")) == [(b"a", b"cache-a")]
    assert list(s.prefix_scan(b"f")) == [(b"f", b"cache-f")]
    assert list(s.inner.inner.all()) == [(b"a", b"committed-a"), (b"c", b"overlay-c"),
                                         (b"d", b"committed-d"), (b"e", b"overlay-e")]
    if backend == "rocksdb":  # RocksDB itself still holds exactly the last commit
        assert [k for k, _ in db.items("s")] == [b"a", b"b", b"c", b"d"]
    db.flush()
    db.commit()
    assert list(s.all()) == expected
    if backend == "rocksdb":
        assert list(db.items("s")) == expected


def test_iterating_while_writing_is_safe(make_task, backend):
    stores, db, _ = make_task(bspec(backend=backend))
    s = stores["s"]
    for i in range(20):
        s.put(b"k%02d" % i, b"v")
    db.flush()
    db.commit()
    for i in range(0, 20, 2):
        s.put(b"k%02d" % i, b"new")
    seen = []
    for k, v in s.all():
        seen.append(k)
        s.delete(k)
        s.put(k + b"x", b"after")
    assert seen == [b"k%02d" % i for i in range(20)]


def test_shared_budget_evicts_from_the_store_being_written(make_task):
    size = 2 + 10 + ENTRY_OVERHEAD
    stores, db, sink = make_task(bspec("a"), bspec("b"), cache_bytes=4 * size)
    a, b = stores["a"], stores["b"]
    for i in range(3):
        a.put(b"a%d" % i, b"v" * 10)
    b.put(b"b0", b"v" * 10)
    assert a.inner.cache is b.inner.cache and a.inner.cache.used == 4 * size
    b.put(b"b1", b"v" * 10)  # over budget: b evicts its own LRU (b0), a keeps its entries
    assert sink.records == [("b", b"b0", b"v" * 10)]
    assert a.inner.stats()["entries"] == 3
    assert a.inner.cache.used == 4 * size


def test_commit_refuses_unflushed_cache(make_task):
    stores, db, _ = make_task(StoreSpec("s"))
    stores["s"].put("k", 1)
    with pytest.raises(StatekitError, match="unflushed cache entries in store 's'"):
        db.commit({"batch": 1})
    db.flush()
    db.commit({"batch": 1})


def test_discard_rolls_back_to_last_commit(make_task, backend):
    stores, db, sink = make_task(StoreSpec("s", backend=backend))
    s = stores["s"]
    s.put("a", 1)
    db.flush()
    db.commit({"batch": 1})
    s.put("a", 2)
    s.put("b", 2)
    db.flush()
    s.put("c", 3)
    s.delete("a")
    db.discard()
    assert list(s.all()) == [("a", 1)]
    assert s.inner.dirty_count == 0 and db.pending_count() == 0
    assert s.inner.cache.used == 0
    db.commit({"batch": 1})
    assert list(s.all()) == [("a", 1)]


def test_changelogging_layer_records_what_it_forwards():
    sink = RecordingSink()
    inner = MemoryStore("m")
    s = ChangeLoggingStore(inner, sink)
    s.put(b"k", b"1")
    assert s.put_if_absent(b"k", b"2") == b"1"
    assert s.put_if_absent(b"j", b"3") is None
    assert s.delete(b"k") == b"1"
    s.delete(b"never")
    assert sink.records == [("m", b"k", b"1"), ("m", b"j", b"3"), ("m", b"k", None),
                            ("m", b"never", None)]
    assert list(inner.all()) == [(b"j", b"3")]
    assert sink.for_store("m")[0] == (b"k", b"1")


def test_logging_and_caching_can_be_switched_off(make_task):
    stores, db, sink = make_task(StoreSpec("nolog", logging=False), StoreSpec("nocache", caching=False))
    stores["nolog"].put("k", 1)
    stores["nocache"].put("k", 1)
    stores["nocache"].put("k", 2)
    assert sink.records == [("nocache", b'"k"', b"1"), ("nocache", b'"k"', b"2")]
    db.flush()
    assert len(sink.records) == 2
    assert isinstance(stores["nolog"].inner, CachingStore)
    assert not isinstance(stores["nolog"].inner.inner, ChangeLoggingStore)


def test_cache_bytes_zero_means_no_cache(make_task):
    stores, db, sink = make_task(StoreSpec("s"), cache_bytes=0)
    assert isinstance(stores["s"].inner, ChangeLoggingStore)


def test_metered_counts_operations():
    m = MeteredStore(CachingStore(MemoryStore("m"), RecordCache(1 << 20)), "str", "int64")
    m.put("a", 1)
    m.put("b", 2)
    m.get("a")
    m.put_if_absent("a", 5)
    m.delete("b")
    list(m.range("a", "z"))
    list(m.all())
    m.flush()
    met = m.metrics()
    assert {op: met[op]["count"] for op in ("put", "get", "put_if_absent", "delete", "range",
                                            "all", "flush", "prefix_scan")} == {
        "put": 2, "get": 1, "put_if_absent": 1, "delete": 1, "range": 1, "all": 1, "flush": 1,
        "prefix_scan": 0}
    assert met["put"]["total_ms"] > 0 and met["put"]["avg_us"] > 0
    assert met["store"] == "m" and met["cache"]["hits"] >= 1


def test_task_stats_and_commit_stats(make_task):
    stores, db, _ = make_task(StoreSpec("s"))
    stores["s"].put("a", 1)
    db.flush()
    st = db.commit({"batch": 3})
    assert st["records"] == 1 and st["bytes"] > 0 and st["ms"] >= 0
    assert db.stats()["s"]["put"]["count"] == 1
    assert db.persistent("s") is True
