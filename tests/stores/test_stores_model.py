"""Random operation sequences against a dict model: every layer combination must read like a plain
dict, `discard()` must return to the last commit, and RocksDB must hold exactly the last commit."""
from __future__ import annotations

from hypothesis import HealthCheck, given, settings, strategies as st

from statekit.stores import RecordingSink, StoreSpec, build_stores

keys = st.sampled_from([b"", b"a", b"a\x00", b"ab", b"b", b"ba", b"c", b"\xff"])
ops = st.lists(st.one_of(
    st.tuples(st.just("put"), keys, st.binary(max_size=3)),
    st.tuples(st.just("delete"), keys),
    st.tuples(st.just("pia"), keys, st.binary(max_size=3)),
    st.tuples(st.just("range"), keys, keys),
    st.tuples(st.just("prefix"), keys),
    st.tuples(st.just("flush")),
    st.tuples(st.just("commit")),
    st.tuples(st.just("discard")),
), max_size=40)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=ops, backend=st.sampled_from(["rocksdb", "memory"]), caching=st.booleans(),
       cache_bytes=st.sampled_from([100, 1 << 20]))
def test_stack_behaves_like_a_dict(tmp_path_factory, ops, backend, caching, cache_bytes):
    task_dir = tmp_path_factory.mktemp("model")
    sink = RecordingSink()
    stores, db = build_stores([StoreSpec("s", key_serde="bytes", value_serde="bytes",
                                         backend=backend, caching=caching)],
                              str(task_dir), sink, cache_bytes=cache_bytes, sync=False)
    s = stores["s"]
    model: dict = {}
    committed: dict = {}
    try:
        for op in ops:
            kind = op[0]
            if kind == "put":
                s.put(op[1], op[2])
                model[op[1]] = op[2]
            elif kind == "delete":
                assert s.delete(op[1]) == model.pop(op[1], None)
            elif kind == "pia":
                assert s.put_if_absent(op[1], op[2]) == model.get(op[1])
                model.setdefault(op[1], op[2])
            elif kind == "range":
                lo, hi = op[1], op[2]
                assert list(s.range(lo, hi)) == sorted((k, v) for k, v in model.items()
                                                       if lo <= k <= hi)
            elif kind == "prefix":
                assert list(s.prefix_scan(op[1])) == sorted(
                    (k, v) for k, v in model.items() if k.startswith(op[1]))
            elif kind == "flush":
                db.flush()
            elif kind == "commit":
                db.flush()
                db.commit({"n": len(model)})
                committed = dict(model)
            elif kind == "discard":
                db.discard()
                model = dict(committed)
            for k in (b"a", b"ab", b"\xff"):
                assert s.get(k) == model.get(k)
        assert list(s.all()) == sorted(model.items())
        if backend == "rocksdb":
            assert dict(db.items("s")) == committed
        # without rollbacks, replaying the changelog rebuilds the state
        if not any(o[0] == "discard" for o in ops):
            db.flush()
            replay: dict = {}
            for _, k, v in sink.records:
                if v is None:
                    replay.pop(k, None)
                else:
                    replay[k] = v
            assert replay == model
    finally:
        db.close()


wops = st.lists(st.one_of(
    st.tuples(st.just("put"), st.sampled_from(["a", "b", "ab"]), st.integers(0, 1000),
              st.integers(-5, 5)),
    st.tuples(st.just("delete"), st.sampled_from(["a", "b", "ab"]), st.integers(0, 1000)),
    st.tuples(st.just("fetch"), st.sampled_from(["a", "b", "ab"]), st.integers(0, 1000),
              st.integers(0, 1000)),
    st.tuples(st.just("flush")),
    st.tuples(st.just("commit")),
    st.tuples(st.just("discard")),
), max_size=40)


@settings(max_examples=60, deadline=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ops=wops, backend=st.sampled_from(["rocksdb", "memory"]), caching=st.booleans(),
       retention=st.sampled_from([None, 50, 300]), segment=st.sampled_from([10, 100]))
def test_window_store_behaves_like_a_model(tmp_path_factory, ops, backend, caching, retention,
                                           segment):
    task_dir = tmp_path_factory.mktemp("wmodel")
    stores, db = build_stores([StoreSpec("w", kind="window", key_serde="str", value_serde="int64",
                                         backend=backend, caching=caching, retention_ms=retention,
                                         segment_ms=segment)],
                              str(task_dir), RecordingSink(), cache_bytes=300, sync=False)
    w = stores["w"]
    model: dict = {}
    stream_time = -1
    committed = ({}, -1)

    def floor():
        return -1 if retention is None or stream_time < 0 else stream_time - retention

    try:
        for op in ops:
            kind = op[0]
            if kind == "put" or kind == "delete":
                _, k, ws = op[:3]
                v = op[3] if kind == "put" else None
                w.put(k, v, ws)
                if ws >= floor():
                    stream_time = max(stream_time, ws)
                    if v is None:
                        model.pop((k, ws), None)
                    else:
                        model[(k, ws)] = v
            elif kind == "fetch":
                _, k, tf, tt = op
                assert list(w.fetch(k, tf, tt)) == sorted(
                    (ws, v) for (kk, ws), v in model.items()
                    if kk == k and tf <= ws <= tt and ws >= floor())
            elif kind == "flush":
                db.flush()
            elif kind == "discard":
                db.discard()
                model, stream_time = dict(committed[0]), committed[1]
            else:
                db.flush()
                db.commit()
                committed = (dict(model), stream_time)
        live = {key: v for key, v in model.items() if key[1] >= floor()}
        assert {(k, ws): v for k, ws, v in w.all()} == live
        db.flush()
        db.commit()
        if backend == "rocksdb":  # reopened: segments and stream time come back from the data
            db.close()
            stores, db = build_stores([w.spec], str(task_dir), RecordingSink(), sync=False)
            assert {(k, ws): v for k, ws, v in stores["w"].all()} == live
    finally:
        db.close()
