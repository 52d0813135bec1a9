"""statekit.wire: the one record-batch codec. The broker, its cleaner, the client and the sink use
the same functions; varlong deltas over their full range; column encoding equals the tuple path;
the column-wise produce validation agrees with the record walk on valid and damaged batches."""
from __future__ import annotations

import os
import random
import re
import struct
import subprocess

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings, strategies as st
from kafka.record.default_records import DefaultRecordBatch, DefaultRecordBatchBuilder

import statekit.wire as W
from statekit.wire import Columns, InvalidBatch
from statekit.wire.validate import records_valid, walk_records

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
NOW = 1_760_000_000_000


def test_one_codec_the_broker_client_and_cleaner_share():
    import statekit.broker.cleaner as cleaner
    import statekit.broker.log as log
    import statekit.broker.records as broker_records
    import statekit.kafka as client
    import statekit.kafka.client as client_mod

    assert broker_records.validate_produce is W.validate_produce
    assert broker_records.decompress is W.decompress
    assert broker_records.scan is W.scan
    assert broker_records.InvalidBatch is W.InvalidBatch
    assert client.decode_batch_columns is W.decode_batch_columns
    assert client.decode_batch is W.decode_batch
    assert client.encode_batches is W.encode_batches
    assert client.encode_batches_flat is W.encode_batches_flat
    assert client.Columns is W.Columns
    assert client_mod.decode_columns is W.decode_columns
    assert cleaner.decode_rows is W.decode_rows and log.decode_rows is W.decode_rows


def test_no_other_varint_or_decompress_in_the_tree():
    """Every zigzag varint and decompress routine lives in statekit/wire."""
    out = subprocess.run(["grep", "-rnE", r"def _?(varint|zz|zz_varint|varint_slow|decompress|varints)\b",
                          "statekit", "kernel_ext"], cwd=ROOT, capture_output=True, text=True).stdout
    where = sorted({line.split(":", 1)[0] for line in out.splitlines()})
    assert where == ["statekit/wire/compression.py"], out
    out = subprocess.run(["grep", "-rlE", r"kafka\.record|kafka import codec|kafka\.codec",
                          "statekit"], cwd=ROOT, capture_output=True, text=True).stdout
    assert out == ""


@pytest.mark.parametrize("n", [0, 1, -1, 63, 64, -65, 8191, 8192, 1 << 31, -(1 << 31), NOW, -NOW,
                               (1 << 63) - 1, -(1 << 63)])
def test_varints_round_trip_over_the_varlong_range(n):
    b = W.write_varint(n)
    assert W.read_varint(b + b"\xff", 0) == (n, len(b))
    assert len(b) <= 10
    a = np.frombuffer(b * 3, np.uint8)
    v, w = W.varint.read_varints(a, np.array([0, len(b), 2 * len(b)], np.int64))
    assert v.tolist() == [n] * 3
    z = W.varint.zigzag_array(np.array([n], np.int64))
    assert W.varint.varint_sizes(z).tolist() == [len(b)]
    out = np.zeros(len(b), np.uint8)
    W.varint.put_varints(out, np.array([0]), z, np.array([len(b)]))
    assert out.tobytes() == b


def kp_records(raw):
    return [(r.offset, r.timestamp, r.key, r.value, tuple(r.headers)) for r in DefaultRecordBatch(raw)]


def test_a_batch_spanning_1970_to_now_decodes_and_validates():
    """Timestamp deltas of 6 bytes (the bug: the broker read at most 5)."""
    b = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 20)
    stamps = [0] + [NOW - 40 + i for i in range(40)] + [NOW]
    for i, ts in enumerate(stamps):
        b.append(i, timestamp=ts, key=b"k%d" % i, value=b"v" * i, headers=[])
    raw = bytes(b.build())
    want = kp_records(raw)
    assert [r[1] for r in want] == stamps
    rows: list = []
    W.decode_rows(raw, rows)
    assert rows == want
    assert list(W.decode_batch_columns(raw).tuples()) == want
    assert W.validate_produce(raw) == [(0, W.header_at(raw))]
    h = W.header_at(raw)
    walk_records(raw, W.batch.HEADER_SIZE, h.size, h.count)
    assert records_valid(raw, W.batch.HEADER_SIZE, h.size, h.count)


blob = st.one_of(st.none(), st.binary(max_size=40), st.sampled_from([b"", b"x" * 300, b"y" * 20_000]))
header_sets = st.sampled_from([(), (("h", b"1"),), (("h", b"2"), ("z", None)), (("k" * 30, b"v" * 200),)])


@st.composite
def column_items(draw):
    n = draw(st.integers(1, 120))
    keys = [draw(blob) for _ in range(n)]
    values = [draw(blob) for _ in range(n)]
    cuts = sorted(set(draw(st.lists(st.integers(1, n - 1), max_size=4)))) if n > 1 else []
    bounds = [0] + cuts + [n]
    runs = [(s, e, draw(header_sets)) for s, e in zip(bounds, bounds[1:])]
    kind = draw(st.sampled_from(["one", "each"]))
    if kind == "one":
        ts = draw(st.integers(0, NOW))
    else:
        ts = [draw(st.sampled_from([0, 1, NOW, NOW - 5, NOW + 1 << 20])) for _ in range(n)]
    return keys, values, runs, ts, draw(st.sampled_from([200, 5_000, 900_000]))


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(item=column_items())
def test_columns_encode_to_the_records_of_the_tuple_path(item):
    keys, values, runs, ts, batch_bytes = item
    cols = Columns.of(keys, values, runs=runs, **({"timestamp": ts} if isinstance(ts, int) else
                                                   {"timestamps": ts}))
    hdrs = cols.headers()
    stamps = [ts] * len(keys) if isinstance(ts, int) else ts
    prod = [7, 3, 100]
    batches = W.encode_columns(cols, batch_bytes=batch_bytes, producer=prod)
    got, base = [], 0
    for raw, count in batches:
        assert W.validate_produce(raw)
        h = W.header_at(raw)
        assert (h.count, h.producer_id, h.producer_epoch, h.base_sequence) == (count, 7, 3, 100 + base)
        assert h.attributes & W.batch.ATTR_TRANSACTIONAL
        assert len(raw) <= max(batch_bytes, 61 + 25 + 2 * 20_000 + 400) or count == 1
        recs = kp_records(raw)
        got += [(base + o, t, k, v, tuple(hh)) for o, t, k, v, hh in recs]
        base += count
    assert prod[2] == 100 + len(keys)
    want = [(i, stamps[i], keys[i], values[i], tuple(hdrs[i])) for i in range(len(keys))]
    assert got == want
    # the tuple path: same records (one timestamp only)
    if isinstance(ts, int):
        tup = W.encode_batches([(k, v, list(h)) for k, v, h in zip(keys, values, hdrs)], None,
                               batch_bytes, ts)
        rows, base = [], 0
        for raw, count in tup:
            rows += [(base + o, t, k, v, hh) for o, t, k, v, hh in kp_records(raw)]
            base += count
        assert rows == want


def test_encode_batches_flat_is_the_column_encoder_without_headers():
    rng = random.Random(3)
    keys = [None if rng.random() < 0.1 else bytes(rng.randrange(256) for _ in range(rng.randrange(9)))
            for _ in range(500)]
    values = [None if rng.random() < 0.1 else b"v" * rng.randrange(400) for _ in range(500)]
    kbuf, klen = W.columns.flat(keys)
    vbuf, vlen = W.columns.flat(values)
    a = W.encode_batches_flat(kbuf, klen, vbuf, vlen, NOW, 20_000)
    b = W.encode_columns(Columns.of(keys, values, timestamp=NOW), batch_bytes=20_000)
    assert a == b and len(a) > 1
    ref = W.encode_batches(list(zip(keys, values)), None, 20_000, NOW)
    decoded = [r for raw, _ in a for r in kp_records(raw)]
    assert [r[1:] for r in decoded] == [r[1:] for raw, _ in ref for r in kp_records(raw)]


@pytest.mark.parametrize("kept", [b" \t\n\rn", b"", b"{"])
def test_values_kept_cuts_out_only_the_values_that_begin_so(kept):
    """A count reads a batch with ``values_kept`` (first bytes): a null value is None, a value
    that begins with one of them is its bytes, every other is NOT_READ; keys, offsets,
    timestamps and headers are the full decode's."""
    rng = random.Random(len(kept))
    pool = [None, b"null", b" null", b"null\n", b"nul", b"NULL", b"", b'{"a": 1}', b"1", b"n" * 300]
    n = 400
    values = [rng.choice(pool) for _ in range(n)]
    keys = [b"k%d" % rng.randrange(50) for _ in range(n)]
    stamps = [NOW + rng.randrange(-5000, 5000) for _ in range(n)]
    (raw, _c), = W.encode_columns(Columns.of(keys, values, [("h", b"1")], timestamps=stamps))
    full = W.decode_batch_columns(raw)
    got = W.decode_batch_columns(raw, 0, kept)
    assert full.values == values
    assert (got.keys, got.offsets, got.timestamps, got.runs) == \
        (full.keys, full.offsets, full.timestamps, full.runs)
    want = [None if v is None else v if v[:1] and v[0] in kept else W.NOT_READ for v in values]
    assert got.values == want
    assert W.NOT_READ in got.values and not isinstance(W.NOT_READ, bytes)


@pytest.mark.parametrize("width", [1, 8, 13, 64, 65])
def test_items_of_one_length_decode_as_written_trailing_zero_bytes_too(width):
    """Keys and values of one length are gathered as fixed-width strings (numpy drops their
    trailing zero bytes): every item must come back as it was written."""
    rng = random.Random(width)
    n = 700
    keys = [bytes(rng.choice([0, 0, 1, 97, 255]) for _ in range(width)) for _ in range(n)]
    values = [struct.pack(">q", rng.choice([0, 1, 256, 65536, rng.randrange(1 << 62)]))
              for _ in range(n)]
    keys[5] = b"\0" * width
    got = Columns()
    for raw, _count in W.encode_columns(Columns.of(keys, values, timestamp=NOW)):
        got.extend(W.decode_batch_columns(raw))
    assert got.keys == keys and got.values == values
    assert all(type(k) is bytes for k in got.keys + got.values)


def test_compressed_batches_decode_and_validate():
    cols = Columns.of([b"a", None, b"c" * 100] * 30, [b"1", b"2", None] * 30, headers=[("h", b"x")],
                      timestamps=[0, NOW, NOW - 1] * 30)
    for codec in (1, 4):
        (raw, n), = W.encode_columns(cols, codec=codec)
        assert raw[22] & 7 == codec and n == 90
        assert W.validate_produce(raw)
        assert [r[1:] for r in kp_records(raw)] == [(t, k, v, (("h", b"x"),)) for t, k, v in
                                                    zip(cols.timestamps, cols.keys, cols.values)]
        assert list(W.decode_batch_columns(raw).tuples()) == kp_records(raw)
    with pytest.raises(InvalidBatch, match="inflate past"):
        W.decompress(1, W.compress(1, b"\0" * (2 << 20)), limit=1 << 20)


def _valid_batch(rng, n):
    hs = [(), (("b", b"7"),), (("m", b"1"), ("b", b"7"))]
    recs = [(rng.choice([None, b"k%d" % i]), rng.choice([None, b"", b"v" * rng.randrange(300)]),
             hs[0 if i % 17 else (1 if i % 2 else 2)]) for i in range(n)]
    recs[0] = (recs[0][0], recs[0][1], hs[1])
    ts = [rng.choice([0, NOW, NOW + 5]) for _ in range(n)]
    cols = Columns.of([r[0] for r in recs], [r[1] for r in recs], timestamps=ts,
                      runs=Columns.from_tuples([(i, 0, None, None, r[2]) for i, r in enumerate(recs)]).runs)
    (raw, _), = W.encode_columns(cols)
    return bytearray(raw)


def test_column_validation_agrees_with_the_record_walk_on_damaged_batches():
    """records_valid says True only for bytes walk_records accepts; flipped bytes, cut records and
    changed lengths are refused by both (the walk says why)."""
    rng = random.Random(11)
    seen_bad = accepted = 0
    for trial in range(400):
        raw = _valid_batch(rng, rng.randrange(32, 120))
        h = W.header_at(raw)
        end = h.size
        assert records_valid(bytes(raw), 61, end, h.count)
        for _ in range(rng.randrange(1, 4)):
            raw[rng.randrange(61, end)] = rng.randrange(256)
        data = bytes(raw)
        try:
            walk_records(data, 61, end, h.count)
            ok = True
        except InvalidBatch:
            ok = False
            seen_bad += 1
        if records_valid(data, 61, end, h.count):
            assert ok, f"trial {trial}: the column check accepted what the walk refuses"
            accepted += 1
    assert seen_bad > 50 and accepted > 50  # both verdicts were exercised


def test_offset_deltas_must_count_from_zero_in_the_column_check_too():
    raw = _valid_batch(random.Random(1), 64)
    h = W.header_at(raw)
    recs: list = []
    W.decode_rows(bytes(raw), recs)
    # rebuild record 5 with offset delta 6
    body = b"".join(W.encode_record(6 if i == 5 else i, k, v, W.encode_headers(list(hh)), t - h.first_timestamp)
                    for i, (o, t, k, v, hh) in enumerate(recs))
    bad = W.build_batch(body, 64, first_timestamp=h.first_timestamp, max_timestamp=h.max_timestamp)
    assert not records_valid(bad, 61, len(bad), 64)
    with pytest.raises(InvalidBatch, match="record 5 has offset delta 6"):
        W.validate_produce(bad)


def test_cleaner_rebuilds_a_compressed_batch_with_the_codec():
    from statekit.broker.cleaner import _parse, _rebuild

    cols = Columns.of([b"a", b"b", b"a", b"c"] * 20, [b"%d" % i for i in range(80)],
                      headers=[("h", b"1")], timestamps=[0] + [NOW] * 79)
    (raw, _), = W.encode_columns(cols, codec=1)
    raw = bytearray(raw)
    struct.pack_into(">q", raw, 0, 1000)
    h = W.header_at(raw)
    parsed = _parse(h, bytes(raw))
    keep = [0, 5, 79]
    out = _rebuild(h, bytes(raw), parsed, keep)
    hh = W.header_at(out)
    assert (hh.base_offset, hh.last_offset_delta, hh.count, hh.attributes & 7) == (1000, 79, 3, 1)
    assert W.batch.crc32c(memoryview(out)[21:]) == hh.crc
    rows: list = []
    W.decode_rows(out, rows)
    assert rows == [(1000 + i, cols.timestamps[i], cols.keys[i], cols.values[i], (("h", b"1"),))
                    for i in keep]


def test_kafka_client_modules_stay_small_and_say_why():
    for d in ("statekit/kafka", "statekit/wire"):
        for name in os.listdir(os.path.join(ROOT, d)):
            if name.endswith(".py"):
                text = open(os.path.join(ROOT, d, name)).read()
                assert text.count("\n") < 900, name
                assert re.match(r'"""', text), f"{d}/{name} has no docstring"
