"""The restore fast path gives exactly the slow path's result.

* the columnar decoder (``decode_batch_columns``) against the record-by-record loop and against
  kafka-python's own ``DefaultRecordBatch``, on random batches (null and long keys and values,
  multi-byte varints, headers in runs and mixed, offset gaps, compression, log-append time,
  reads from the middle of a batch);
* the run-based ``StoreReplay`` against the per-record reference model (tests/state/
  replay_reference.py, the replay as it was) on random logs: markers of older / equal / newer
  batches, seals, crashed tails, missing and unparseable batch headers, fake markers, compaction
  gaps, fed in random pieces as tuples, as columns and as encoded bytes;
* a real restore (TaskState over the embedded broker) of two stores with crashed tails, a crash
  between the stores' markers, seals and a cleaned (compacted) log, against the reference replay
  over the same log decoded by the loop.
"""
from __future__ import annotations

import copy
import json
import struct
from contextlib import contextmanager

import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

import statekit.kafka as K
import statekit.wire.columns as wire_columns
from replay_reference import ReferenceReplay
from statekit import broker as broker_mod
from statekit.kafka import Columns, Kafka, decode_batch_columns
from statekit.state import CrashPlan, SimulatedCrash, TaskState
from statekit.state.restore import BATCH_HEADER, MARKER_HEADER, MARKER_KEY, StoreReplay
from statekit.stores import StoreSpec
from statekit.wire.records import decode_rows

try:
    from crc32c import crc32c
except ImportError:  # pragma: no cover
    from kafka.record.util import calc_crc32c as crc32c


@contextmanager
def columnar_min(n: int):
    old = wire_columns.COLUMNAR_MIN
    wire_columns.COLUMNAR_MIN = n
    try:
        yield
    finally:
        wire_columns.COLUMNAR_MIN = old


def build_batch(records, base_offset: int, codec: int = 0, log_append: bool = False) -> bytes:
    """A v2 batch written by kafka-python's builder; ``records`` are (offset, ts, key, value,
    headers) with increasing offsets >= base_offset (gaps allowed, as compaction leaves them)."""
    b = DefaultRecordBatchBuilder(magic=2, compression_type=codec, is_transactional=False,
                                  producer_id=-1, producer_epoch=-1, base_sequence=-1,
                                  batch_size=1 << 30)
    for off, ts, key, value, headers in records:
        b.append(off - base_offset, timestamp=ts, key=key, value=value, headers=list(headers))
    raw = bytearray(b.build())
    struct.pack_into(">q", raw, 0, base_offset)
    if log_append:
        raw[22] |= 0x08
        struct.pack_into(">I", raw, 17, crc32c(bytes(raw[21:])))
    return bytes(raw)


def kafka_python_records(raw: bytes, min_offset: int) -> list:
    batch = DefaultRecordBatch(raw)
    return [(r.offset, r.timestamp, r.key, r.value, tuple(r.headers)) for r in batch
            if r.offset >= min_offset]


# -- the decoder -------------------------------------------------------------------------------

BIG = bytes(range(256)) * 40  # 10,240 bytes: three-byte length varints
blobs = st.one_of(st.none(), st.binary(max_size=90), st.sampled_from([b"", BIG, BIG[:200]]))
header_pool = [(), ((BATCH_HEADER, b"7"),), ((BATCH_HEADER, b"7"),), ((BATCH_HEADER, b"8"),),
               ((BATCH_HEADER, b"12"),),
               ((MARKER_HEADER, b"1"), (BATCH_HEADER, b"7")), (("trace", None),),
               (("k" * 40, b"v" * 300),)]


@st.composite
def batches(draw):
    n = draw(st.integers(1, 160))
    gaps = draw(st.lists(st.integers(1, 3), min_size=n, max_size=n))
    base = draw(st.integers(0, 1 << 40))
    first_ts = draw(st.integers(0, 1 << 41))
    recs = []
    off = base
    run_h = draw(st.sampled_from(header_pool))
    for i in range(n):
        if draw(st.integers(0, 9)) == 0:
            run_h = draw(st.sampled_from(header_pool))
        ts = first_ts + draw(st.sampled_from([0, 0, 1, 200, 1 << 20, 1 << 35]))
        recs.append((off, ts, draw(blobs), draw(blobs), run_h))
        off += gaps[i]
    codec = draw(st.sampled_from([0, 0, 0, 1, 4]))  # none, gzip, zstd
    log_append = draw(st.integers(0, 5)) == 0
    cut = draw(st.integers(0, n))
    return recs, base, codec, log_append, recs[cut][0] if cut < n else off


@settings(max_examples=150, deadline=None)
@given(b=batches())
def test_columnar_decoder_equals_the_loop_and_kafka_python(b):
    recs, base, codec, log_append, min_offset = b
    raw = build_batch(recs, base, codec, log_append)
    want = kafka_python_records(raw, min_offset)
    loop: list = []
    decode_rows(raw, loop, min_offset)
    with columnar_min(0):
        cols = decode_batch_columns(raw, min_offset)
        tuples: list = []
        K.decode_batch(raw, tuples, min_offset)
    assert loop == want
    assert list(cols.tuples()) == want
    assert tuples == want
    # runs cover the records in order, and consecutive runs carry different headers
    assert [r[0] for r in cols.runs] == ([0] + [r[1] for r in cols.runs[:-1]] if want else [])
    assert [r[1] for r in cols.runs[-1:]] == ([len(want)] if want else [])
    assert all(a[2] != b[2] for a, b in zip(cols.runs, cols.runs[1:]))


def test_a_control_batch_decodes_to_nothing():
    raw = bytearray(build_batch([(5, 0, b"k", b"v", ())] * 1, 5))
    raw[22] |= 0x20
    assert decode_batch_columns(bytes(raw)) is None
    out: list = []
    K.decode_batch(bytes(raw), out)
    assert out == []


def test_columns_slice_and_extend_keep_the_runs():
    a = Columns.from_tuples([(0, 0, b"a", b"1", ((BATCH_HEADER, b"1"),)),
                             (1, 0, b"b", b"2", ((BATCH_HEADER, b"1"),)),
                             (2, 0, MARKER_KEY, b"{}", ((MARKER_HEADER, b"1"),))])
    assert a.runs == [(0, 2, ((BATCH_HEADER, b"1"),)), (2, 3, ((MARKER_HEADER, b"1"),))]
    s = a.slice(1, 3)
    assert s.keys == [b"b", MARKER_KEY] and s.runs == [(0, 1, ((BATCH_HEADER, b"1"),)),
                                                       (1, 2, ((MARKER_HEADER, b"1"),))]
    c = Columns.from_tuples([(3, 0, b"c", b"3", ((MARKER_HEADER, b"1"),))])
    s.extend(c)
    assert s.runs[-1] == (1, 3, ((MARKER_HEADER, b"1"),)) and s.offsets == [1, 2, 3]


# -- the replay ----------------------------------------------------------------------------------

KEYS = [b"a", b"b", b"c", MARKER_KEY]


def _marker(m, bad_value=False):
    value = b"not json" if bad_value else json.dumps({"batch": m}).encode()
    return (MARKER_KEY, value, ((MARKER_HEADER, b"1"), (BATCH_HEADER, str(m).encode())))


@st.composite
def changelogs(draw):
    """A log as commits, crashed attempts and seals leave it, plus odd records, minus the
    records compaction removed (offset gaps)."""
    entries = []
    batch = draw(st.integers(-1, 2))
    for _ in range(draw(st.integers(0, 14))):
        kind = draw(st.sampled_from(["commit", "commit", "commit", "crash", "seal", "odd",
                                     "old_marker"]))
        if kind in ("commit", "crash", "seal"):
            b = batch if kind == "seal" else batch + draw(st.integers(1, 2))
            for _ in range(draw(st.integers(0, 5))):
                k = draw(st.sampled_from(KEYS[:3]))
                v = draw(st.one_of(st.none(), st.sampled_from([b"1", b"2", b"3"])))
                entries.append((k, v, ((BATCH_HEADER, str(b).encode()),)))
            if kind != "crash":
                entries.append(_marker(b, draw(st.integers(0, 6)) == 0))
                batch = max(batch, b)
        elif kind == "odd":
            entries.append(draw(st.sampled_from([
                (b"a", b"9", ()),                                         # no batch header
                (b"b", b"9", ((BATCH_HEADER, b"x"),)),                    # unparseable
                (b"c", b"9", (("trace", b"t"), (BATCH_HEADER, b"3"))),    # extra header
                (MARKER_KEY, b"9", ((BATCH_HEADER, b"2"),)),              # a key, not a marker
            ])))
        else:
            entries.append(_marker(draw(st.integers(-1, 6))))
    keep = draw(st.lists(st.booleans(), min_size=len(entries), max_size=len(entries)))
    start = draw(st.integers(0, 1000))
    recs = [(start + i, 1000 + i, *e) for i, e in enumerate(entries)
            if keep[i] or draw(st.integers(0, 2))]
    return start, draw(st.integers(-1, 3)), recs


def _state(rp) -> dict:
    return {"position": rp.position, "safe": rp.safe_offset, "group": rp.group_start,
            "batch": rp.batch, "applied": rp.applied_batch, "held": list(rp.held),
            "pending": [tuple(r[:4]) + (tuple(r[4]),) for r in rp.pending],
            "held_safe": rp.held_safe, "read": rp.records_read, "applied_n": rp.records_applied,
            "superseded": rp.superseded, "markers": rp.markers, "meta": rp.meta()}


def _encoded(piece) -> Columns:
    raw = build_batch(piece, piece[0][0])
    with columnar_min(0):
        return decode_batch_columns(raw)


@settings(max_examples=400, deadline=None)
@given(log=changelogs(), data=st.data())
def test_run_based_replay_equals_the_per_record_reference(log, data):
    start, base_batch, recs = log
    ref = ReferenceReplay("s", start, base_batch)
    fast = StoreReplay("s", start, base_batch)
    i = 0
    while i < len(recs) or i == 0:
        j = data.draw(st.integers(min(i + 1, len(recs)), len(recs)))
        piece = recs[i:j]
        nxt = None
        if data.draw(st.booleans()):
            nxt = (piece[-1][0] + 1 if piece else start) + data.draw(st.integers(0, 2))
        mode = data.draw(st.sampled_from(["tuples", "columns", "bytes"]))
        want = ref.feed(piece, nxt)
        if mode == "tuples":
            got = fast.feed(piece, nxt)
        else:
            cols = _encoded(piece) if mode == "bytes" and piece else Columns.from_tuples(piece)
            got = list(zip(*fast.feed_columns(cols, nxt)))
        assert got == want
        assert _state(fast) == _state(ref)
        i = j
        if not recs:
            break
    # settling: release or drop the held batch, as restoration and standbys do
    r2, f2 = copy.deepcopy(ref), copy.deepcopy(fast)
    assert f2.release_held() == r2.release_held()
    assert _state(f2) == _state(r2)
    assert fast.drop_held() == ref.drop_held()
    assert _state(fast) == _state(ref)
    assert fast.drop_pending() == [r[2] for r in ref.pending]


# -- a real restore --------------------------------------------------------------------------------

STORES = ("counts", "latest")


def _write_history(k, app: str, state_dir: str, cfg: dict) -> None:
    """Commits with tombstones, a crash between the two stores' markers, a crash mid-send (each
    reopen seals), and finally a crashed attempt that nobody reopened after."""
    specs = [StoreSpec(s) for s in STORES]
    counts: dict = {}
    b = 0
    for crash in ("between_stores@6", "mid_send@13", ""):
        t = TaskState(app, 0, specs, state_dir=state_dir, kafka=k, topic_configs=cfg,
                      crash=CrashPlan(crash, mode="raise") if crash else None)
        try:
            b = t.last_batch + 1
            for b in range(b, b + 8):
                for i in range(25):
                    key = f"k{(b * 7 + i * 3) % 60:02d}"
                    counts[key] = counts.get(key, 0) + 1
                    t["counts"].put(key, counts[key])
                    if (b + i) % 4 == 0:
                        t["latest"].delete(key)
                    else:
                        t["latest"].put(key, b)
                t.commit(b)
            t.close()
        except SimulatedCrash:
            t.abandon()
            counts = {}  # the reference is the replay, not this dict
    for s in STORES:
        k.send(f"{app}-{s}-changelog", 0, [(b'"k01"', b"999"), (b'"k02"', None)],
               headers=[(BATCH_HEADER, str(b + 1).encode())])


def _reference_restore(k, app: str) -> tuple[dict, dict, int, dict]:
    """Restore from scratch with the per-record reference replay over the loop-decoded log."""
    replays, items = {}, {}
    with columnar_min(1 << 30):
        for s in STORES:
            topic = f"{app}-{s}-changelog"
            rp = replays[s] = ReferenceReplay(s, k.begin_offsets(topic, [0])[0])
            items[s] = []
            for ch in k.read(topic, 0, None, None, max_bytes=3000):
                items[s] += rp.feed(ch.records, ch.next_offset)
    task_batch = min(rp.batch for rp in replays.values())
    contents, metas, dropped = {}, {}, {}
    for s, rp in replays.items():
        dropped[s] = len(rp.pending)
        rp.pending = []
        if rp.batch <= task_batch:
            items[s] += rp.release_held()
        else:
            dropped[s] += rp.drop_held()
            rp.applied_batch = min(rp.applied_batch, task_batch)
        store: dict = {}
        for key, v in items[s]:
            if v is None:
                store.pop(key, None)
            else:
                store[key] = v
        contents[s], metas[s] = store, rp.meta()
    return contents, metas, task_batch, dropped


@pytest.mark.parametrize("fetch_max_bytes", [2_500, None])
def test_a_real_restore_equals_the_reference_with_gaps_and_crashed_tails(broker, tmp_path,
                                                                         fetch_max_bytes):
    k = Kafka(broker.bootstrap)
    try:
        app = "fp"
        cfg = {"segment.bytes": "3000", "min.cleanable.dirty.ratio": "0.01",
               "delete.retention.ms": "0", "min.compaction.lag.ms": "0"}
        _write_history(k, app, str(tmp_path / "w"), cfg)
        stats = broker_mod.request_clean(broker.dir)
        cleaned = [s for s in stats if s["topic"].startswith(app) and s["records_removed"] > 0]
        assert cleaned, stats  # the log has compaction gaps
        contents, metas, task_batch, dropped = _reference_restore(k, app)
        assert any(dropped.values())  # the crashed tail is there to drop
        with TaskState(app, 0, [StoreSpec(s) for s in STORES], state_dir=str(tmp_path / "r"),
                       kafka=k, fetch_max_bytes=fetch_max_bytes) as t:
            assert t.last_batch == task_batch
            for s in STORES:
                assert dict(t.db.items(s)) == contents[s], s
                m = t.restore_metrics[s]
                assert m.dropped_uncommitted == dropped[s]
            # (the seal after the restore moved the meta offsets; the batch is the reference's)
            meta = t.db.read_meta()
            assert all(meta[f"changelog.{s}"]["batch"] == metas[s]["batch"] for s in STORES)
    finally:
        k.close()
