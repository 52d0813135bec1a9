"""Bulk reads and writes (get_many / put_many) through every layer of a store stack equal the same
operations one key at a time where it matters: the same values read, the same committed contents,
a changelog that restores the same state after every commit. (A bulk write goes through the cache
at once — each key's one value of a batch has nothing to absorb — so the changelog's records come
in another order, and the cache holds other entries; bulk reads keep the cache's entries and LRU
order as one get after the other.) The cache's byte count is what its entries weigh."""
from __future__ import annotations

import random

import pytest

from statekit.stores import RecordingSink, StoreSpec, build_stores
from statekit.stores.caching import ENTRY_OVERHEAD


def _stack(tmp_path, tag, cache_bytes, backend="rocksdb"):
    sink = RecordingSink()
    stores, db = build_stores([StoreSpec("s", key_serde="bytes", value_serde="bytes",
                                         backend=backend)],
                              str(tmp_path / tag), sink, cache_bytes=cache_bytes, sync=False)
    return stores["s"].inner, db, sink


def _cache_of(db):
    return db._caches.get("s")


def _ops(seed):
    rnd = random.Random(seed)
    keys = [f"k{i:03d}".encode() for i in range(60)]
    ops = []
    for _ in range(40):
        if rnd.random() < 0.4:
            ops.append(("get", rnd.sample(keys, rnd.randint(1, 30))))
        elif rnd.random() < 0.9:
            ks = rnd.sample(keys, rnd.randint(1, 30))
            vs = [None if rnd.random() < 0.1 else bytes(rnd.randrange(256) for _ in
                                                         range(rnd.randint(0, 40))) for _ in ks]
            ops.append(("put", ks, vs))
        else:
            ops.append(("commit",))
    ops.append(("commit",))
    return ops


def _run(inner, db, sink, ops, bulk):
    reads, snapshots = [], []
    for op in ops:
        if op[0] == "get":
            reads.append(inner.get_many(op[1]) if bulk else [inner.get(k) for k in op[1]])
        elif op[0] == "put":
            if bulk:
                inner.put_many(op[1], op[2])
            else:
                for k, v in zip(op[1], op[2]):
                    inner.put(k, v)
        else:
            db.flush()
            db.commit({"batch": len(reads)})
            latest = dict((k, v) for _s, k, v in sink.records)   # what a restore would rebuild
            snapshots.append(({k: v for k, v in latest.items() if v is not None},
                              dict(inner.scan())))
    return reads, snapshots


@pytest.mark.parametrize("seed", range(6))
@pytest.mark.parametrize("cache_bytes", [0, 600, 1 << 20])
@pytest.mark.parametrize("backend", ["rocksdb", "memory"])
def test_bulk_equals_one_key_at_a_time(tmp_path, seed, cache_bytes, backend):
    ops = _ops(seed)
    a = _stack(tmp_path, "one", cache_bytes, backend)
    b = _stack(tmp_path, "bulk", cache_bytes, backend)
    try:
        (reads_a, snaps_a), (reads_b, snaps_b) = _run(*a, ops, bulk=False), _run(*b, ops, bulk=True)
        assert reads_a == reads_b
        assert snaps_a == snaps_b
        for restored, stored in snaps_b:
            assert restored == stored                    # the changelog restores the store
        ca, cb = _cache_of(a[1]), _cache_of(b[1])
        if ca is not None:
            for c in (ca, cb):   # the byte count kept as we go is what the entries weigh
                assert c.bytes == c.cache.used == sum(
                    len(k) + ENTRY_OVERHEAD + (0 if v is None else len(v))
                    for k, v in c._entries.items())
    finally:
        a[1].close()
        b[1].close()


def test_multiget_in_key_order_answers_in_the_asked_order(tmp_path):
    inner, db, _sink = _stack(tmp_path, "mg", 0)
    try:
        keys = [f"key-{i:05d}".encode() for i in range(500)]
        inner.put_many(keys[::2], [k[::-1] for k in keys[::2]])
        db.flush()
        db.commit({"batch": 0})
        ask = list(reversed(keys)) + [b"missing"]
        want = [None if int(k[4:] or b"1") % 2 else k[::-1] for k in ask[:-1]] + [None]
        assert inner.get_many(ask) == want
    finally:
        db.close()


# -- the commit writes a batch's keys in key order, reusing the sorted list of its MultiGet ------

def _rocks(tmp_path, tag):
    from statekit.stores.rocksdb import RocksDBStore

    top, db, _sink = _stack(tmp_path, tag, cache_bytes=0)
    s = top
    while not isinstance(s, RocksDBStore):
        s = s.inner
    return s, db


def test_a_first_commit_into_an_empty_store_counts_and_orders_its_keys(tmp_path):
    """A build's first batch reads nothing from an empty store; its keys are sorted there once
    and written in that order, and the count is the number of keys."""
    store, db = _rocks(tmp_path, "empty")
    keys = [b"k%04d" % i for i in random.Random(3).sample(range(5000), 300)]
    assert store.recount() == 0 and store.get_many(keys) == [None] * 300
    order, written = store._write_keys, []
    store._write_keys = lambda ov, hint: written.append((order(ov, hint), hint)) or written[-1][0]
    store.put_many(keys, [k[::-1] for k in keys])
    db.commit({"batch": 0})
    (out, hint), = written
    assert out == sorted(keys) and hint is not None and out is hint[1]   # sorted once, at the read
    assert dict(store.scan()) == {k: k[::-1] for k in keys} and store.count == 300


@pytest.mark.parametrize("case", ["same keys", "an equal list", "changed after the read",
                                  "duplicates read", "other keys"])
def test_a_commit_after_a_multiget_writes_exactly_the_pending_keys(tmp_path, case):
    store, db = _rocks(tmp_path, case.replace(" ", "-"))
    store.recount()                            # the count is kept exact from here on
    rnd = random.Random(7)
    committed = {b"k%04d" % i: b"c%d" % i for i in range(0, 400, 2)}
    store.put_many(list(committed), list(committed.values()))
    db.commit({"batch": 0})
    written = [b"k%04d" % i for i in rnd.sample(range(400), 150)]
    read = {"same keys": written, "an equal list": list(written),
            "changed after the read": written,                     # the caller's list changes
            "duplicates read": written[:100] + written[:50],     # 150 keys, 100 distinct
            "other keys": [b"k%04d" % i for i in rnd.sample(range(400, 800), 150)]}[case]
    olds = store.get_many(read)
    assert olds == [committed.get(k) for k in read]
    if case == "changed after the read":
        written[7] = b"k0999"
    order, reused = store._write_keys, []

    def spy(ov, hint):   # was the read's sorted list written as it is?
        out = order(ov, hint)
        reused.append(hint is not None and out is hint[1])
        assert out == sorted(ov)
        return out
    store._write_keys = spy
    store.put_many(written, [b"n" + k for k in written])
    db.commit({"batch": 1})
    want = dict(committed)
    want.update({k: b"n" + k for k in written})
    assert dict(store.scan()) == want
    assert store.count == len(want)            # the exact count, whichever way it was found
    assert reused == [case in ("same keys", "an equal list")]
