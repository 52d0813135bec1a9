"""Every KeyValueStore operation, on both backends, at every depth of the stack, before and after
a commit (so reads go through cache, overlay and committed data)."""
from __future__ import annotations

import pytest

from statekit.stores import KeyValueStore, StoreSpec
from statekit.stores.api import prefix_end

STACKS = {
    "inner": dict(caching=False, logging=False),
    "logging": dict(caching=False, logging=True),
    "caching": dict(caching=True, logging=False),
    "full": dict(caching=True, logging=True),
}


@pytest.fixture(params=list(STACKS))
def stack(request):
    return request.param


@pytest.fixture(params=[False, True], ids=["pending", "committed"])
def committed(request):
    return request.param


@pytest.fixture
def kv(make_task, backend, stack, committed):
    """(bytes-level store, settle) where settle() commits when the test runs 'committed'."""
    stores, db, sink = make_task(StoreSpec("s", key_serde="bytes", value_serde="bytes",
                                           backend=backend, **STACKS[stack]))
    top = stores["s"]

    def settle():
        if committed:
            db.flush()
            db.commit({"n": 1})

    return top.inner, settle


def test_layers_implement_the_protocol(kv):
    store, _ = kv
    assert isinstance(store, KeyValueStore)
    assert store.name == "s"


def test_get_put_overwrite_delete(kv):
    s, settle = kv
    assert s.get(b"a") is None
    s.put(b"a", b"1")
    s.put(b"b", b"2")
    s.put(b"b", b"22")
    s.put(b"e", b"")
    settle()
    assert s.get(b"a") == b"1"
    assert s.get(b"b") == b"22"
    assert s.get(b"e") == b""  # empty value is a value, not a deletion
    assert s.delete(b"a") == b"1"
    assert s.delete(b"zz") is None
    s.put(b"b", None)  # put None deletes
    settle()
    assert s.get(b"a") is None
    assert s.get(b"b") is None
    assert list(s.all()) == [(b"e", b"")]


def test_put_if_absent(kv):
    s, settle = kv
    assert s.put_if_absent(b"k", b"first") is None
    assert s.put_if_absent(b"k", b"second") == b"first"
    settle()
    assert s.get(b"k") == b"first"
    assert s.put_if_absent(b"k", b"third") == b"first"
    s.delete(b"k")
    assert s.put_if_absent(b"k", b"fourth") is None
    settle()
    assert s.get(b"k") == b"fourth"


def test_range_is_inclusive_at_both_ends(kv):
    s, settle = kv
    for k in [b"a", b"b", b"ba", b"c", b"d"]:
        s.put(k, k.upper())
    settle()
    assert list(s.range(b"b", b"c")) == [(b"b", b"B"), (b"ba", b"BA"), (b"c", b"C")]
    assert list(s.range(None, b"b")) == [(b"a", b"A"), (b"b", b"B")]
    assert list(s.range(b"c", None)) == [(b"c", b"C"), (b"d", b"D")]
    assert list(s.range(b"bb", b"bz")) == []
    assert list(s.range(b"d", b"a")) == []
    assert list(s.scan(b"b", b"c")) == [(b"b", b"B"), (b"ba", b"BA")]  # scan: half-open


def test_prefix_scan_and_all(kv):
    s, settle = kv
    keys = [b"a", b"ab", b"ab\x00", b"abc", b"ab\xff", b"ab\xff\xff", b"ac", b"\xff", b"\xff\x01"]
    for k in keys:
        s.put(k, b"v" + k)
    settle()
    assert [k for k, _ in s.prefix_scan(b"ab")] == [b"ab", b"ab\x00", b"abc", b"ab\xff",
                                                   b"ab\xff\xff"]
    assert [k for k, _ in s.prefix_scan(b"\xff")] == [b"\xff", b"\xff\x01"]
    assert list(s.prefix_scan(b"zz")) == []
    assert list(s.all()) == [(k, b"v" + k) for k in sorted(keys)]


def test_approximate_count(kv):
    s, settle = kv
    for i in range(10):
        s.put(b"k%d" % i, b"v")
    settle()
    assert s.approximate_count() == 10


def test_prefix_end():
    assert prefix_end(b"ab") == b"ac"
    assert prefix_end(b"a\xff") == b"b"
    assert prefix_end(b"\xff\xff") is None
    assert prefix_end(b"") is None


def test_typed_store_round_trip(make_task, backend):
    stores, db, _ = make_task(StoreSpec("t", backend=backend))
    t = stores["t"]
    assert isinstance(t, KeyValueStore)  # the typed face has the same method names
    t.put({"user": 1}, {"n": [1, 2]})
    t.put("x", 3)
    assert t.get({"user": 1}) == {"n": [1, 2]}
    assert t.put_if_absent("x", 4) == 3
    assert t.delete("x") == 3
    assert t.get("x") is None
    db.flush()
    db.commit()
    assert list(t.all()) == [({"user": 1}, {"n": [1, 2]})]
    assert t.approximate_count() == 1
    df = t.to_pandas()
    assert list(df.columns) == ["key", "value"] and df.iloc[0]["value"] == {"n": [1, 2]}


def test_typed_ranges_use_byte_order(make_task):
    stores, db, _ = make_task(StoreSpec("t", key_serde="int64", value_serde="str"))
    t = stores["t"]
    for i in [5, 1, 300, 20]:
        t.put(i, str(i))
    assert list(t.range(2, 300)) == [(5, "5"), (20, "20"), (300, "300")]
    assert list(t.scan(2, 300)) == [(5, "5"), (20, "20")]
    stores2, _, _ = make_task(StoreSpec("p", key_serde="str"), task_dir=db.path + "-2")
    p = stores2["p"]
    for k in ["user:1", "user:2", "usr", "user"]:
        p.put(k, 1)
    assert [k for k, _ in p.prefix_scan("user:")] == ["user:1", "user:2"]


def test_approximate_count_with_dirty_and_pending_writes(make_task):
    """Exact on the memory backend (its committed count is exact) whatever the cache and the
    overlay hold: overwrites, deletes of committed keys, deletes of keys never written."""
    from statekit.stores import StoreSpec

    stores, db, _ = make_task(StoreSpec("c", backend="memory", key_serde="bytes",
                                        value_serde="bytes"),
                              StoreSpec("n", backend="memory", key_serde="bytes",
                                        value_serde="bytes", caching=False))
    for name in ("c", "n"):
        s = stores[name]
        for i in range(10):
            s.put(b"k%d" % i, b"v")
    db.flush()
    db.commit()
    for name in ("c", "n"):
        s = stores[name]
        assert s.approximate_count() == 10
        s.put(b"k1", b"w")          # overwrite of a committed key
        s.delete(b"k2")             # delete of a committed key
        s.delete(b"nope")           # delete of a key never written
        s.put(b"new", b"x")         # a new key
        s.put(b"new2", b"x")
        s.delete(b"new2")           # new, then deleted again
        assert s.approximate_count() == len(list(s.all())) == 10, name
    db.flush()                      # cache entries -> overlay (pending, not committed)
    for name in ("c", "n"):
        assert stores[name].approximate_count() == len(list(stores[name].all())) == 10
        stores[name].delete(b"k3")
        assert stores[name].approximate_count() == 9
    db.flush()
    db.commit()
    for name in ("c", "n"):
        assert stores[name].approximate_count() == len(list(stores[name].all())) == 9


def test_approximate_count_with_a_pending_segment_drop(make_task):
    from statekit.stores import StoreSpec

    stores, db, _ = make_task(StoreSpec("w", kind="window", backend="memory", retention_ms=10_000,
                                        segment_ms=5_000))
    w = stores["w"]
    for ws in range(0, 10_000, 1000):
        w.put("a", ws, ws)
        w.put("b", ws, ws)
    db.flush()
    db.commit()
    assert w.approximate_count() == 20
    w.put("a", 1, 30_000)   # stream time 30 s: segments 0 and 1 are dropped (pending)
    assert w.approximate_count() == len(list(w.all())) == 1
    db.flush()
    assert w.approximate_count() == 1
    db.commit()
    assert w.approximate_count() == 1


def test_a_store_frame_decodes_whole_columns_as_one_item_at_a_time_would():
    """The kv frame decodes a column at once (int64 as one view, JSON as one array parse) and
    falls back to one item at a time when an item does not decode so: the same frame."""
    from statekit.stores.inspect import frame
    from statekit.stores.serdes import get_serde

    js, i64 = get_serde("json"), get_serde("int64")
    keys = [js.to_bytes(k) for k in ["a", "b\u00e9", 7, "q\"x"]]
    rows = list(zip(keys, [i64.to_bytes(v) for v in [1, -2, 3, 2 ** 40]]))
    df = frame(iter(rows), {"key_serde": "json", "value_serde": "int64"})
    assert df["key"].tolist() == ["a", "b\u00e9", 7, "q\"x"]
    assert df["value"].tolist() == [1, -2, 3, 2 ** 40]
    vals = [js.to_bytes(v) for v in [{"n": 1}, [1, 2], None, 2.5]]
    df = frame(iter(zip(keys, vals)), {"key_serde": "json", "value_serde": "json"}, limit=3)
    assert df["value"].tolist() == [{"n": 1}, [1, 2], None]
    # an item that is not one JSON document is shown as its bytes, the others decoded
    odd = [b"1,2", b"[3", b"4]"]
    df = frame(iter(zip(keys, odd)), {"key_serde": "json", "value_serde": "json"})
    assert df["value"].tolist() == [b"1,2", b"[3", b"4]"]
    # an int64 column with a short item: that item as bytes
    df = frame(iter(zip(keys[:2], [i64.to_bytes(5), b"\x01"])),
               {"key_serde": "json", "value_serde": "int64"})
    assert df["value"].tolist() == [5, b"\x01"]
