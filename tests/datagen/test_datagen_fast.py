"""The accounts generator, its reference helper, and the fast produce path: exactly the records the
seeded generators define, in the partitions and the order the record-at-a-time path gives."""
from __future__ import annotations

import itertools
import json
import random
import uuid

import numpy as np
import pytest

from statekit import datagen
from statekit.errors import StatekitError
from statekit.kafka import Kafka
from statekit.wire import decode_batch, encode_batches, encode_batches_flat
from statekit.partition import partition_for, partitions_for, partitions_of_rows


def test_accounts_visit_every_account_once_first_and_are_seeded():
    recs = list(datagen.generate("accounts", seed=5, limit=3_000, keys=1_000))
    first = [r.key for r in recs[:1_000]]
    assert sorted(first) == [datagen.account_key(i, 1_000) for i in range(1_000)]
    assert first != sorted(first)                        # a seeded order, not 0, 1, 2 ...
    assert {r.key for r in recs[1_000:]} <= set(first)
    assert all(r.value == {"account": r.key, "amount": r.value["amount"]} for r in recs)
    amounts = [r.value["amount"] for r in recs]
    assert min(amounts) >= datagen.AMOUNT_MIN and max(amounts) <= datagen.AMOUNT_MAX
    assert min(amounts) < 0 < max(amounts)
    again = list(datagen.generate("accounts", seed=5, limit=3_000, keys=1_000))
    other = list(datagen.generate("accounts", seed=6, limit=3_000, keys=1_000))
    assert again == recs and other != recs
    assert datagen.account_key(42, 10**8) == "acct-00000042"  # wider ids get more digits


def test_accounts_reference_equals_a_plain_loop_over_the_records():
    limit, keys = 140_000, 9_000  # crosses generator blocks (65,536 records each)
    counts, sums = {}, {}
    for r in datagen.generate("accounts", seed=11, limit=limit, keys=keys):
        counts[r.key] = counts.get(r.key, 0) + 1
        sums[r.key] = sums.get(r.key, 0) + r.value["amount"]
    assert datagen.accounts_reference(11, limit, keys) == (counts, sums)
    c, s = datagen.accounts_reference(11, 500, keys)     # fewer records than accounts
    assert len(c) == 500 and sum(c.values()) == 500


def test_keys_sets_how_many_distinct_keys_every_generator_draws_from():
    for name in ("words", "clicks", "sensors", "accounts"):
        got = {r.key for r in datagen.generate(name, seed=1, limit=4_000, keys=7)}
        assert len(got) == 7, name
    with pytest.raises(StatekitError, match="keys must be"):
        datagen.generate("words", keys=0)


def test_vectorized_partitioner_is_kafkas_murmur2():
    r = random.Random(3)
    mixed = []
    for length in range(1, 21):
        keys = [bytes(r.randrange(256) for _ in range(length)) for _ in range(300)]
        mixed += keys[:20] + [None]
        mat = np.frombuffer(b"".join(keys), np.uint8).reshape(len(keys), length)
        for n in (1, 4, 7):
            assert partitions_of_rows(mat, n).tolist() == [partition_for(k, n) for k in keys]
    r.shuffle(mixed)
    for n in (1, 4, 7):
        assert partitions_for(mixed, n).tolist() == [-1 if k is None else partition_for(k, n)
                                                     for k in mixed]


def _decoded(batches) -> list:
    out: list = []
    for raw, _n in batches:
        decode_batch(raw, out)
    return [(r[1], r[2], r[3], r[4]) for r in out]


def test_column_encoder_writes_the_records_encode_batches_writes():
    r = random.Random(9)
    recs = []
    for _ in range(20_000):
        k = None if r.random() < 0.05 else r.randbytes(r.choice([0, 5, 70, 300]))
        v = None if r.random() < 0.05 else r.randbytes(r.choice([0, 1, 60, 9_000]))
        recs.append((k, v))

    def flat(xs):
        return (np.frombuffer(b"".join(x or b"" for x in xs), np.uint8),
                np.array([-1 if x is None else len(x) for x in xs], np.int64))

    kb, kl = flat([k for k, _ in recs])
    vb, vl = flat([v for _, v in recs])
    got = encode_batches_flat(kb, kl, vb, vl, 777, 200_000)
    assert _decoded(got) == _decoded(encode_batches(recs, None, 200_000, 777))
    assert _decoded(got) == [(777, k, v, ()) for k, v in recs]
    assert sum(n for _b, n in got) == len(recs) and len(got) > 10
    assert all(len(b) <= 200_000 for b, n in got if n > 1)


def _expected(name: str, seed: int, limit: int, partitions: int, **kw) -> dict:
    want: dict = {}
    for rec in datagen.generate(name, seed=seed, limit=limit, **kw):
        k, v = datagen.encode(rec)
        want.setdefault(partition_for(k, partitions), []).append((k, v))
    return want


def _read_all(k: Kafka, topic: str) -> dict:
    got: dict = {}
    for p, end in k.end_offsets(topic).items():
        got[p] = [(r[2], r[3]) for ch in k.read(topic, p, 0, end) for r in ch.records]
    return {p: v for p, v in got.items() if v}


@pytest.mark.parametrize("name,limit,kw", [("accounts", 150_001, {"keys": 60_000}),
                                           ("words", 3_001, {"keys": 40})])
def test_produce_fast_writes_exactly_the_generators_records(broker, name, limit, kw):
    k = Kafka(broker.bootstrap)
    try:
        seen = []
        prog = datagen.produce_fast("t", name, 7, limit, kafka=k, partitions=3, chunk=40_000,
                                    progress=lambda p: seen.append(p.sent), **kw)
        assert prog.sent == limit and prog.done and prog.error is None
        assert seen[-1] == limit and seen == sorted(seen)
        assert len(seen) == -(-limit // 40_000)  # once per round (its acks in), the last at the end
        assert _read_all(k, "t") == _expected(name, 7, limit, 3, **kw)
    finally:
        k.close()


def test_produce_fast_appends_to_an_existing_topic_with_its_partition_count(broker):
    k = Kafka(broker.bootstrap)
    try:
        k.ensure_topic("acc", 2)
        datagen.produce_fast("acc", "accounts", 1, 5_000, kafka=k, partitions=8, keys=3_000)
        assert _read_all(k, "acc") == _expected("accounts", 1, 5_000, 2, keys=3_000)
    finally:
        k.close()


@pytest.mark.parametrize("kw,msg", [({"limit": 0}, "limit must be"),
                                    ({"generator": "nope"}, "unknown generator"),
                                    ({"keys": -3}, "keys must be")])
def test_produce_fast_bad_input_is_one_line_and_writes_nothing(broker, kw, msg):
    k = Kafka(broker.bootstrap)
    try:
        args = {"generator": "accounts", "limit": 10, **kw}
        with pytest.raises(StatekitError, match=msg) as e:
            datagen.produce_fast("bad", seed=1, kafka=k, **args)
        assert "\n" not in str(e.value)
        assert "bad" not in k.topics()
    finally:
        k.close()


def test_the_accounts_iterator_and_the_block_definition_agree_across_blocks():
    it = itertools.islice(datagen.accounts(seed=3, keys=100), 70_000, 70_010)
    ids, amounts = datagen._accounts_range(3, 100, 70_000, 70_010)
    assert [(r.key, r.value["amount"]) for r in it] == [
        (datagen.account_key(i, 100), a) for i, a in zip(ids.tolist(), amounts.tolist())]


def test_statekit_produce_command(broker, capsys):
    from statekit.cli import main

    assert main(["produce", "cli", "--generator", "accounts", "--limit", "5000", "--keys", "300",
                 "--seed", "4", "--partitions", "2", "--bootstrap", broker.bootstrap]) == 0
    out = capsys.readouterr().out
    assert out.startswith("wrote 5,000 accounts records (seed 4) to cli in ")
    with Kafka(broker.bootstrap) as k:
        assert _read_all(k, "cli") == _expected("accounts", 4, 5_000, 2, keys=300)
    assert main(["produce", "cli", "--generator", "words", "--limit", "0",
                 "--bootstrap", broker.bootstrap]) == 1
    err = capsys.readouterr().err
    assert err.strip() == "statekit: --limit must be >= 1 (got 0)"


def test_produce_timed_writes_each_records_time_in_order(kafka):
    """Event times (out of order, one batch per partition) come back exactly as given."""
    import json

    recs = list(datagen.shop_events(seed=3, orders=40))
    assert len({r.timestamp for r in recs}) > 10
    n = datagen.produce_timed("timed-shop", recs, kafka=kafka, partitions=3)
    assert n == len(recs)
    want: dict = {p: [] for p in range(3)}
    rr = itertools.count()
    for r in recs:
        key = None if r.key is None else r.key.encode()
        value = None if r.value is None else json.dumps(r.value, separators=(",", ":"),
                                                          sort_keys=True).encode()
        p = partition_for(key, 3) if key is not None else next(rr) % 3
        want[p].append((int(r.timestamp), key, value))
    got = {p: [(t, k, v) for c in kafka.read("timed-shop", p) for _o, t, k, v, _h in c] for p in range(3)}
    assert got == want


# -- --format avro / protobuf / json_schema: the generators' values with their schemas ----------

@pytest.fixture
def mock_registry(monkeypatch):
    """confluent-kafka's in-memory registry (this process: produce runs here)."""
    from statekit.schemas.serdes import forget_registries

    monkeypatch.setenv("STATEKIT_SCHEMA_REGISTRY_URL", f"mock://{uuid.uuid4().hex}")
    forget_registries()
    yield
    forget_registries()


@pytest.mark.parametrize("fmt", ["avro", "protobuf", "json_schema"])
@pytest.mark.parametrize("name,limit,kw", [("accounts", 20_001, {"keys": 5_000}),
                                           ("clicks", 1_500, {"keys": 30})])
def test_produce_fast_in_a_registry_format_writes_the_generators_records(kafka, mock_registry,
                                                                          fmt, name, limit, kw):
    """Keys as the JSON path writes them, in the same partitions and order; every value decodes
    (with the schema the registry holds under <topic>-value) to the generator's value."""
    from statekit.schemas.client import client_for, settings_for
    from statekit.stores.serdes import get_serde

    t = f"{name}-{fmt}-{uuid.uuid4().hex[:8]}"
    prog = datagen.produce_fast(t, name, 3, limit, kafka=kafka, partitions=3, chunk=8_000,
                                value_format=fmt, **kw)   # later rounds reuse the first's header
    assert prog.sent == limit
    got = _read_all(kafka, t)
    want = _expected(name, 3, limit, 3, **kw)
    assert {p: [kb for kb, _ in v] for p, v in got.items()} == \
        {p: [kb for kb, _ in v] for p, v in want.items()}
    serde = get_serde(fmt)
    assert {p: [serde.from_bytes(vb) for _, vb in v] for p, v in got.items()} == \
        {p: [json.loads(vb) for _, vb in v] for p, v in want.items()}
    ids = {vb[1:5] for v in got.values() for _, vb in v}
    latest = client_for(settings_for()).get_latest_version(f"{t}-value")
    assert ids == {latest.schema_id.to_bytes(4, "big")} and latest.schema.schema_type == \
        {"avro": "AVRO", "protobuf": "PROTOBUF", "json_schema": "JSON"}[fmt]


def test_avro_accounts_columns_are_the_serializers_bytes(mock_registry):
    """The column-wise Avro path writes, value for value, what confluent-kafka's AvroSerializer
    writes for the same record."""
    from confluent_kafka.schema_registry.avro import AvroSerializer
    from confluent_kafka.serialization import MessageField, SerializationContext

    from statekit.generator_schemas import ValueEncoder, avro_schema

    enc = ValueEncoder("avro", "accounts", "acc")
    ids, amounts = datagen._accounts_range(9, 2_000, 0, 4_000)
    amounts[:3] = [-500, 1000, 63]             # the varint widths' edges: 1 and 2 bytes
    amounts[3:6] = [-64, 64, 0]
    kmat = datagen._account_keys(ids, 2_000)
    flat, lens = enc.accounts_columns({"account": kmat[0].tobytes().decode(), "amount": 1},
                                      kmat, amounts)
    ser = AvroSerializer(enc.serde.client(), json.dumps(avro_schema("accounts")))
    ctx = SerializationContext("acc", MessageField.VALUE)
    starts = np.concatenate(([0], np.cumsum(lens)))
    for i in range(len(ids)):
        want = ser({"account": kmat[i].tobytes().decode(), "amount": int(amounts[i])}, ctx)
        assert flat[starts[i]:starts[i + 1]].tobytes() == want


def test_produce_in_a_registry_format_refuses_a_file_and_an_unknown_format(kafka, mock_registry):
    with pytest.raises(StatekitError, match="needs --generator"):
        datagen.produce("f-nothing", iter([]), kafka=kafka, value_format="avro")
    with pytest.raises(StatekitError, match="unknown format 'xml'"):
        datagen.produce_fast("f-nothing", "words", 1, 10, kafka=kafka, value_format="xml")
    assert "f-nothing" not in kafka.topics()


def test_produce_with_a_schema_serde_writes_its_values(kafka, mock_registry):
    import statekit.serdes

    schema = {"type": "record", "name": "Move", "fields": [{"name": "account", "type": "string"},
                                                           {"name": "amount", "type": "long"}]}
    recs = [datagen.Record(f"a{i}", {"account": f"a{i}", "amount": i - 5}, 0) for i in range(40)]
    t = f"moves-{uuid.uuid4().hex[:8]}"
    datagen.produce(t, recs, kafka=kafka, partitions=2, value_serde=statekit.serdes.avro(schema=schema))
    got = {(kb.decode(), json.dumps(statekit.serdes.avro().from_bytes(vb), sort_keys=True))
           for v in _read_all(kafka, t).values() for kb, vb in v}
    assert got == {(r.key, json.dumps(r.value, sort_keys=True)) for r in recs}
    assert statekit.serdes.registry_client().get_versions(f"{t}-value") == [1]
    with pytest.raises(StatekitError, match="value_serde= takes statekit.serdes.avro"):
        datagen.produce(t, recs, kafka=kafka, value_serde="json")


def test_statekit_produce_command_in_avro(kafka, shared_broker, mock_registry, capsys):
    from statekit.cli import main
    from statekit.stores.serdes import get_serde

    t = f"cli-avro-{uuid.uuid4().hex[:8]}"
    assert main(["produce", t, "--generator", "sensors", "--limit", "300", "--format", "avro",
                 "--partitions", "2", "--bootstrap", shared_broker.bootstrap]) == 0
    assert capsys.readouterr().out.startswith(f"wrote 300 sensors records in avro (seed 42) to {t} ")
    got = [get_serde("avro").from_bytes(vb) for v in _read_all(kafka, t).values() for _, vb in v]
    want = [r.value for r in datagen.generate("sensors", seed=42, limit=300)]
    assert sorted(json.dumps(v, sort_keys=True) for v in got) == \
        sorted(json.dumps(v, sort_keys=True) for v in want)
