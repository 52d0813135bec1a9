"""Session stores (window layout keyed by session end) and suppression buffers (time-ordered kv),
checked against plain-Python models over random operations, through commit, discard, changelog and
restore; and the composite serdes they use."""
from __future__ import annotations

import random
import struct

import pytest

from statekit.stores import ListSerde, StoreSpec, TimestampedSerde, get_serde
from statekit.stores.inspect import frame
from statekit.stores.serdes import serde_name


# -- composite serdes ------------------------------------------------------------------------------

def test_list_and_timestamped_serdes_round_trip_and_parse():
    ls = ListSerde("json")
    for items in ([], [1, "a", None, {"x": [1]}], ["é" * 3]):
        assert ls.from_bytes(ls.to_bytes(items)) == items
    assert ls.to_bytes(["a"]) == b"\x00\x00\x00\x01\x00\x00\x00\x03\"a\""
    ts = TimestampedSerde("int64")
    assert ts.from_bytes(ts.to_bytes((7, -3))) == (7, -3)
    assert ts.from_bytes(ts.to_bytes((-5, None))) == (-5, None)
    nested = get_serde("list(timestamped(str))")
    assert nested == ListSerde("timestamped(str)")
    assert nested.from_bytes(nested.to_bytes([(1, "a"), (2, None)])) == [(1, "a"), (2, None)]
    assert serde_name(ListSerde("int64")) == "list(int64)"
    assert serde_name(ListSerde(object.__new__(type("Odd", (), {"to_bytes": 1, "from_bytes": 1})))) is None
    with pytest.raises(ValueError, match="unknown serde"):
        get_serde("list(nope)")
    import pickle
    assert pickle.loads(pickle.dumps(nested)) == nested


# -- session store ---------------------------------------------------------------------------------

def sspec(name="s", **kw):
    kw.setdefault("key_serde", "str")
    kw.setdefault("value_serde", "json")
    return StoreSpec(name, kind="session", **kw)


def test_session_spec_is_segmented():
    s = sspec(retention_ms=1000)
    assert s.segmented and s.changelog_cleanup_policy == "compact,delete"
    assert s.describe()["segment_ms"] == 60_000
    assert not StoreSpec("b", kind="buffer").segmented


def test_find_sessions_and_layout(make_task, backend):
    stores, db, sink = make_task(sspec(backend=backend, segment_ms=100))
    s = stores["s"]
    s.put("k", 0, 10, "a")
    s.put("k", 20, 35, "b")
    s.put("k", 200, 200, "c")
    s.put("k\x00", 21, 30, "other key")      # extends "k": never returned for "k"
    s.put("j", 5, 25, "j")
    assert s.find_sessions("k", 10, 20) == [(0, 10, "a"), (20, 35, "b")]
    assert s.find_sessions("k", 11, 19) == []                  # [0,10] ends too early, [20,35] starts too late
    assert s.find_sessions("k", 36, 10**9) == [(200, 200, "c")]
    assert s.fetch("k") == [(0, 10, "a"), (20, 35, "b"), (200, 200, "c")]
    assert s.fetch_session("k", 20, 35) == "b" and s.fetch_session("k", 21, 35) is None
    s.remove("k", 20, 35)
    assert s.fetch("k") == [(0, 10, "a"), (200, 200, "c")]
    db.flush()
    db.commit()
    recs = sink.for_store("s")
    assert (b"k" + struct.pack(">Q", 10), struct.pack(">q", 0) + b'"a"') in recs
    assert (b"k" + struct.pack(">Q", 35), None) in recs        # the removal: a tombstone
    assert sorted(s.all()) == sorted([("j", 5, 25, "j"), ("k", 0, 10, "a"), ("k", 200, 200, "c"),
                                      ("k\x00", 21, 30, "other key")])
    df = frame(db.items("s"), s.spec.describe())
    assert sorted(map(tuple, df.values.tolist())) == sorted(map(tuple, s.to_pandas().values.tolist()))
    with pytest.raises(ValueError, match="start <= end"):
        s.put("k", 5, 4, "x")


def test_session_retention_by_end(make_task):
    stores, db, _ = make_task(sspec(retention_ms=100, segment_ms=50))
    s = stores["s"]
    s.put("k", 0, 40, 1)
    s.put("k", 100, 130, 2)      # stream time 130, floor 30: [0,40] still live (end 40 >= 30)
    assert s.fetch("k") == [(0, 40, 1), (100, 130, 2)]
    s.put("k", 145, 145, 3)      # floor 45: [0,40] expired
    assert s.fetch("k") == [(100, 130, 2), (145, 145, 3)]
    s.put("k", 1, 20, 9)         # expired on arrival
    assert s.expired_puts == 1 and s.find_sessions("k", 0, 10**9)[0][0] == 100


def test_session_store_random_against_model_with_restore(make_task, tmp_path, backend):
    """Random puts/removes over committed batches (some discarded) vs a dict model; then the
    changelog replayed into a fresh store gives the same sessions."""
    rng = random.Random(11)
    spec = sspec(backend=backend, segment_ms=64)
    stores, db, sink = make_task(spec, task_dir=tmp_path / "a")
    s = stores["s"]
    committed: dict = {}
    model: dict = {}
    for batch in range(30):
        for _ in range(rng.randint(1, 8)):
            k = rng.choice("abc")
            end = rng.randint(0, 500)
            start = rng.randint(max(0, end - 30), end)
            if rng.random() < 0.3 and [e for (kk, e) in model if kk == k]:
                e = rng.choice([e for (kk, e) in model if kk == k])
                st, _v = model.pop((k, e))
                s.remove(k, st, e)
            else:
                v = rng.randint(0, 99)
                s.put(k, start, end, v)
                model[(k, end)] = (start, v)
        if rng.random() < 0.2:
            db.discard()
            sink.clear()
            model = dict(committed)
        else:
            db.flush()
            db.commit({"batch": batch})
            committed = dict(model)
        for k in "abc":
            want = sorted(((st, e, v) for (kk, e), (st, v) in model.items() if kk == k),
                          key=lambda w: w[1])     # end order (ends of one key are unique)
            assert s.fetch(k) == want
            lo, hi = rng.randint(0, 500), rng.randint(0, 500)
            assert s.find_sessions(k, lo, hi) == [w for w in want if w[1] >= lo and w[0] <= hi]
    log = list(db.changelog_items("s"))
    stores2, db2, _ = make_task(spec, task_dir=tmp_path / "b")
    db2.write_batch_raw("s", log)
    assert sorted(stores2["s"].all()) == sorted(s.all()) == sorted(
        (k, st, e, v) for (k, e), (st, v) in committed.items())


# -- suppression buffer ----------------------------------------------------------------------------

def bspec(name="b", **kw):
    kw.setdefault("key_serde", "str")
    kw.setdefault("value_serde", "json")
    return StoreSpec(name, kind="buffer", **kw)


def test_buffer_orders_by_time_then_key_and_keeps_metadata(make_task, backend):
    stores, db, sink = make_task(bspec(backend=backend))
    b = stores["b"]
    b.put("z", 10, {"n": 1}, 0, None, 7, offset=3, partition=1, topic="t")
    b.put("a", 10, 2, None, 1, 8)
    b.put("m", -5, None, 3, 4, 9)
    assert b.count() == 3 and b.min_time() == -5
    assert [(r.time, r.key) for r in b.all()] == [(-5, "m"), (10, "a"), (10, "z")]
    z = b.get("z")
    assert (z.value, z.old, z.prior, z.timestamp, z.offset, z.partition, z.topic) == (
        {"n": 1}, 0, None, 7, 3, 1, "t")
    b.put("z", 3, {"n": 2}, {"n": 1}, None, 11)            # re-put at another time moves the entry
    assert [(r.time, r.key) for r in b.all()] == [(-5, "m"), (3, "z"), (10, "a")]
    assert b.count() == 3
    out = b.evict_until(3)
    assert [(r.key, r.value, r.old, r.prior) for r in out] == [("m", None, 3, 4),
                                                                 ("z", {"n": 2}, {"n": 1}, None)]
    assert b.count() == 1 and b.get("m") is None
    db.flush()
    db.commit()
    assert b.pop_oldest().key == "a" and b.count() == 0 and b.pop_oldest() is None
    assert b.min_time() is None
    db.flush()
    db.commit()
    assert list(db.items("b")) == []          # index, entries and count all deleted


def test_buffer_random_against_model_with_restore(make_task, tmp_path, backend):
    rng = random.Random(5)
    spec = bspec(backend=backend)
    stores, db, sink = make_task(spec, task_dir=tmp_path / "a")
    b = stores["b"]
    model: dict = {}
    committed: dict = {}
    for step in range(400):
        op = rng.random()
        k = rng.choice(["k%d" % i for i in range(12)])
        if step % 53 == 52:       # a failed batch: its writes (evictions too) roll back
            db.discard()
            model = dict(committed)
        elif op < 0.55:
            t = rng.randint(-50, 200)
            v = rng.randint(0, 9)
            b.put(k, t, v, None, None, step)
            model[k] = (t, v)
        elif op < 0.7:
            r = b.delete(k)
            assert (r is None) == (k not in model)
            model.pop(k, None)
        elif op < 0.85:
            t = rng.randint(-50, 200)
            out = b.evict_until(t)
            want = sorted((tt, kk) for kk, (tt, _v) in model.items() if tt <= t)
            assert [(r.time, r.key) for r in out] == want
            for _t, kk in want:
                del model[kk]
        else:
            r = b.pop_oldest()
            if model:
                want = min((tt, kk) for kk, (tt, _v) in model.items())
                assert (r.time, r.key) == want
                del model[r.key]
            else:
                assert r is None
        if step % 37 == 0:
            db.flush()
            db.commit()
            committed = dict(model)
        assert b.count() == len(model)
    db.flush()
    db.commit()
    assert [(r.key, r.time, r.value) for r in b.all()] == sorted(
        ((k, t, v) for k, (t, v) in model.items()), key=lambda x: (x[1], x[0].encode()))
    stores2, db2, _ = make_task(spec, task_dir=tmp_path / "b")
    db2.write_batch_raw("b", [(k, v) for _s, k, v in sink.records])
    b2 = stores2["b"]
    assert list(b2.all()) == list(b.all()) and b2.count() == len(model)
    df = frame(db.items("b"), b.spec.describe())
    assert df["key"].tolist() == [r.key for r in b.all()]


def test_buffer_evictions_rolled_back_are_evicted_again(make_task, backend):
    # evictions walk only what is newer than the last eviction (a long batch would otherwise walk
    # its own evicted entries again at every record); a rollback must bring the old ones back
    stores, db, _ = make_task(bspec(backend=backend))
    b = stores["b"]
    for i, k in enumerate("abcdef"):
        b.put(k, i * 10, i, None, None, i)
    db.flush()
    db.commit()
    assert [r.key for r in b.evict_until(25)] == ["a", "b", "c"]
    assert [r.key for r in b.evict_until(25)] == []
    b.put("g", 5, 7, None, None, 9)          # older than the last eviction: found all the same
    assert b.min_time() == 5
    assert [r.key for r in b.evict_until(35)] == ["g", "d"]
    db.discard()                             # the batch failed: a, b, c and d are back, g is gone
    assert b.min_time() == 0 and b.count() == 6
    assert [r.key for r in b.evict_until(15)] == ["a", "b"]
    assert b.pop_oldest().key == "c"
    db.discard()
    assert [r.key for r in b.all()] == list("abcdef")
