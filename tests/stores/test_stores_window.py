"""Window stores: composite keys, fetch order, retention dropping whole segments, restore."""
from __future__ import annotations

import struct

import pytest

from statekit.stores import MemoryStore, SegmentedStore, StoreSpec
from statekit.stores.window import split_window_key, window_key


def wspec(name="w", **kw):
    kw.setdefault("key_serde", "str")
    kw.setdefault("value_serde", "int64")
    return StoreSpec(name, kind="window", **kw)


def test_window_key_layout():
    assert window_key(b"k", 5) == b"k" + b"\x00" * 7 + b"\x05"
    assert split_window_key(b"ab" + struct.pack(">Q", 1234)) == (b"ab", 1234)


def test_fetch_returns_windows_in_time_order(make_task, backend):
    stores, db, sink = make_task(wspec(backend=backend, segment_ms=100))
    w = stores["w"]
    for ts in [250, 0, 120, 99, 100]:
        w.put("k", ts, ts)
    w.put("k2", 7, 120)
    w.put("k\x00", 8, 120)  # a key that extends "k" sorts inside k's byte range: filtered out
    assert list(w.fetch("k", 0, 1000)) == [(0, 0), (99, 99), (100, 100), (120, 120), (250, 250)]
    assert list(w.fetch("k", 99, 120)) == [(99, 99), (100, 100), (120, 120)]
    assert list(w.fetch("k", 121, 249)) == []
    assert list(w.fetch("k", 10, 5)) == []
    assert w.get("k", 120) == 120 and w.get("k", 121) is None
    # composite byte order: "k\x00"+120 sorts before "k"+100 (its 9th byte is 0x00 < 0x64)
    assert list(w.fetch_all(100, 120)) == [("k\x00", 120, 8), ("k", 100, 100), ("k", 120, 120),
                                           ("k2", 120, 7)]
    db.flush()
    db.commit({"batch": 1})
    assert list(w.fetch("k", 0, 1000)) == [(0, 0), (99, 99), (100, 100), (120, 120), (250, 250)]
    assert w.segmented.segments() == [0, 1, 2]
    assert ("w", b"k" + struct.pack(">Q", 250), struct.pack(">q", 250)) in sink.records


def test_window_delete_is_a_tombstone(make_task, backend):
    stores, db, sink = make_task(wspec(backend=backend, segment_ms=100))
    w = stores["w"]
    w.put("k", 1, 10)
    db.flush()
    db.commit()
    w.delete("k", 10)
    assert w.get("k", 10) is None
    db.flush()
    assert sink.records[-1] == ("w", b"k" + struct.pack(">Q", 10), None)
    db.commit()
    assert list(w.all()) == []


def test_retention_drops_whole_segments(make_task, backend):
    stores, db, sink = make_task(wspec(backend=backend, retention_ms=250, segment_ms=100))
    w = stores["w"]
    for ts in [0, 50, 150]:
        w.put("k", ts, ts)
    db.flush()
    db.commit()
    assert w.segmented.segments() == [0, 1]
    for ts in [250, 350]:
        w.put("k", ts, ts)
    # stream time 350, floor 100: windows < 100 expired; segment 0 ([0,100)) dropped as a whole
    assert w.segmented.segments() == [1]
    if backend == "rocksdb":  # (pending: RocksDB still has the last commit)
        assert len(list(db.items("w"))) == 3
    db.flush()
    assert w.segmented.segments() == [1, 2, 3]
    assert w.segmented.segments_dropped == 1
    assert list(w.fetch("k", 0, 1000)) == [(150, 150), (250, 250), (350, 350)]
    w.put("k", 1, 60)  # expired on arrival: dropped
    assert w.expired_puts == 1 and w.get("k", 60) is None
    w.put("k", 999, 400)  # floor 150: segment 1 still holds live window 150, it stays
    db.flush()  # segments are what the inner store holds: the cache must reach it first
    assert w.segmented.segments() == [1, 2, 3, 4]
    assert list(w.fetch("k", 0, 1000)) == [(150, 150), (250, 250), (350, 350), (400, 999)]
    w.put("k", 5, 420)  # floor 170: window 150 is expired (hidden) though its segment remains
    assert list(w.fetch("k", 0, 1000)) == [(250, 250), (350, 350), (400, 999), (420, 5)]
    db.flush()
    db.commit()
    if backend == "rocksdb":
        segs = sorted({struct.unpack(">Q", k[:8])[0] for k, _ in db.items("w")})
        assert segs == [1, 2, 3, 4]
    w.put("k", 6, 600)  # floor 350: segments 1 and 2 ([100,300)) go with one range delete,
    db.flush()          # segment 3 keeps its live window 350
    assert w.segmented.segments() == [3, 4, 6]
    assert w.segmented.segments_dropped == 3
    db.commit()
    assert list(w.fetch("k", 0, 1000)) == [(350, 350), (400, 999), (420, 5), (600, 6)]
    if backend == "rocksdb":
        assert sorted({struct.unpack(">Q", k[:8])[0] for k, _ in db.items("w")}) == [3, 4, 6]


def test_retention_survives_reopen(make_task, tmp_path):
    spec = wspec(retention_ms=250, segment_ms=100)
    stores, db, _ = make_task(spec, task_dir=tmp_path / "t")
    w = stores["w"]
    for ts in [150, 250, 350]:
        w.put("k", ts, ts)
    db.flush()
    db.commit()
    db.close()
    stores, db, _ = make_task(spec, task_dir=tmp_path / "t")
    w = stores["w"]
    assert w.segmented.stream_time == 350
    assert list(w.fetch("k", 0, 1000)) == [(150, 150), (250, 250), (350, 350)]
    w.put("k", 1, 90)
    assert w.expired_puts == 1


def test_discard_restores_segments_and_stream_time(make_task):
    stores, db, _ = make_task(wspec(retention_ms=250, segment_ms=100))
    w = stores["w"]
    w.put("k", 1, 150)
    db.flush()
    db.commit()
    w.put("k", 2, 900)  # would expire segment 1
    db.flush()
    assert w.segmented.segments() == [9]
    db.discard()
    assert w.segmented.stream_time == 150 and w.segmented.segments() == [1]
    assert list(w.fetch("k", 0, 1000)) == [(150, 1)]


def test_window_restore_translates_keys_and_applies_retention(make_task, backend):
    stores, db, sink = make_task(wspec(backend=backend, retention_ms=250, segment_ms=100))
    log = [(window_key(b"k", ts), struct.pack(">q", ts)) for ts in [0, 120, 250, 390]]
    log.append((window_key(b"k", 250), None))
    n = db.write_batch_raw("w", log, meta={"restored": 5})
    assert n == 5  # all applied (window 0 was live when it arrived), then segment 0 dropped
    w = stores["w"]
    # stream time 390, floor 140: segment 0 dropped in the same batch; 120 hidden; 250 deleted
    assert list(w.fetch("k", 0, 1000)) == [(390, 390)]
    assert w.segmented.segments() == [1, 2, 3]
    assert db.read_meta() == {"restored": 5}
    assert sink.records == []  # restoring does not write the changelog



def test_a_restored_tombstone_does_not_move_stream_time(make_task, backend):
    # a seal's tombstone for a window only a crashed attempt wrote, far ahead: restoring it must
    # not expire the committed windows (stream time stays where the values put it)
    stores, db, sink = make_task(wspec(backend=backend, retention_ms=250, segment_ms=100))
    log = [(window_key(b"k", ts), struct.pack(">q", ts)) for ts in [0, 120, 200]]
    log.append((window_key(b"k", 100_000), None))
    assert db.write_batch_raw("w", log) == 4
    w = stores["w"]
    assert w.segmented.stream_time == 200
    assert list(w.fetch("k", 0, 10**6)) == [(0, 0), (120, 120), (200, 200)]
    assert w.segmented.segments() == [0, 1, 2, 1000]

def test_segmented_store_on_memory_directly():
    inner = MemoryStore("m")
    seg = SegmentedStore(inner, segment_ms=10, retention_ms=None)
    seg.put(window_key(b"a", 25), b"x")
    seg.put(window_key(b"a", 5), b"y")
    seg.put(window_key(b"b", 15), b"z")
    assert list(seg.all()) == [(window_key(b"a", 5), b"y"), (window_key(b"a", 25), b"x"),
                               (window_key(b"b", 15), b"z")]
    assert [k[:8] for k, _ in inner.all()] == [struct.pack(">Q", s) for s in (0, 1, 2)]
    assert seg.stats()["segments"] == 3


def test_window_spec_validation():
    with pytest.raises(ValueError, match="window and session stores"):
        StoreSpec("x", retention_ms=10)
    with pytest.raises(ValueError, match="kind"):
        StoreSpec("x", kind="sessions")
    assert StoreSpec("w", kind="window", retention_ms=3_600_000).effective_segment_ms() == 1_800_000
    assert StoreSpec("w", kind="window").changelog_cleanup_policy == "compact,delete"
    assert StoreSpec("k").changelog_cleanup_policy == "compact"


def test_negative_window_start_rejected(make_task):
    stores, _, _ = make_task(wspec())
    with pytest.raises(ValueError, match="window_start"):
        stores["w"].put("k", 1, -1)


def test_window_metrics_and_pandas(make_task):
    stores, db, _ = make_task(wspec(retention_ms=1000, segment_ms=100))
    w = stores["w"]
    w.put("a", 1, 10)
    list(w.fetch("a", 0, 10))
    m = w.metrics()
    assert m["put"]["count"] == 1 and m["fetch"]["count"] == 1
    assert m["window"]["stream_time"] == 10
    df = w.to_pandas()
    assert df.to_dict("records") == [{"key": "a", "window_start": 10, "value": 1}]


def test_changelog_items_round_trip_through_restore(make_task, tmp_path):
    spec = wspec(segment_ms=100)
    stores, db, sink = make_task(spec, task_dir=tmp_path / "one")
    w = stores["w"]
    for ts in [5, 150, 270]:
        w.put("k", ts, ts)
    db.flush()
    db.commit()
    items = list(db.changelog_items("w"))
    assert items == [(k, v) for _, k, v in sink.records]
    stores2, db2, _ = make_task(spec, task_dir=tmp_path / "two")
    db2.write_batch_raw("w", items)
    assert list(stores2["w"].fetch("k", 0, 1000)) == [(5, 5), (150, 150), (270, 270)]
    assert db2.logged_stores() == ["w"]
