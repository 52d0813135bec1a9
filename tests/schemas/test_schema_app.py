"""An App reading an Avro topic through the embedded Schema Registry, with real instance processes
(which find the registry themselves): counts and last records across a disk-loss crash and a
restore from scratch, exact; the store holding the records' own wire bytes and its changelog the
same bytes; a key's history and queries decoded; two schema versions in one topic; and a record
that is not in the wire format failing the app in one line that names where it is."""
from __future__ import annotations

import collections
import json
import os
import sys

import pytest

import statekit
import statekit.serdes
from statekit import datagen
from statekit.errors import ProcessorError
from statekit.runtime.lifecycle import AppState
from statekit.schemas.serdes import forget_registries

sys.path.insert(0, os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "runtime"))
from harness import unique  # noqa: E402

from waiting import wait_until  # noqa: E402


@pytest.fixture(scope="module")
def embedded_registry():
    """The embedded registry in STATEKIT_HOME's broker directory, where every process of the test
    (instances included) finds it, as after `%statekit up`."""
    from statekit import registry

    forget_registries()
    os.environ.pop("STATEKIT_SCHEMA_REGISTRY_URL", None)
    handle = registry.start(port=0)
    try:
        yield handle
    finally:
        handle.stop()
        forget_registries()


def source_records(kafka, topic):
    """{partition: [(key bytes, value bytes)]} as the topic holds them."""
    out = {}
    for p, end in kafka.end_offsets(topic).items():
        out[p] = [(r[2], r[3]) for ch in kafka.read(topic, p, 0, end) for r in ch.records]
    return out


def changelog_sizes(kafka, topic):
    """Records per changelog partition (offsets minus the transactions' control markers)."""
    b, e = kafka.begin_offsets(topic), kafka.end_offsets(topic)
    return {p: kafka.count_records(topic, p, b[p], e[p]) for p in e}


def changelog_values(kafka, topic):
    """{key bytes: last value bytes} of the data records of a changelog (markers left out)."""
    last = {}
    for p, end in kafka.end_offsets(topic).items():
        for ch in kafka.read(topic, p, 0, end, isolation="read_committed"):
            for _off, _ts, k, v, headers in ch.records:
                if not any(h == "statekit.marker" for h, _ in headers or ()):
                    last[k] = v
    return last


def click_v2():
    from statekit.generator_schemas import avro_schema

    s = avro_schema("clicks")
    return dict(s, fields=s["fields"] + [{"name": "country", "type": "string", "default": "unknown"}])


def test_app_counts_an_avro_topic_across_a_crash_and_restores_it_exactly(
        shared_broker, kafka, tmp_path, embedded_registry):
    topic = unique("clicks")
    datagen.produce_fast(topic, "clicks", 5, 1_000, shared_broker.bootstrap, keys=12, partitions=2,
                         value_format="avro")
    app = statekit.App(unique("app"), bootstrap=shared_broker.bootstrap,
                       state_dir=str(tmp_path / "st"), engine="local", partitions=2, instances=1)
    clicks = app.stream(topic, value_serde="avro")
    clicks.group_by_key().count(store="counts")
    clicks.group_by_key().reduce(lambda previous, click: click, store="last")
    try:
        app.start(max_records_per_trigger=300)             # several commits per task
        assert app.process_all_available()
        sizes = {s: changelog_sizes(kafka, app.changelog_topic(s)) for s in ("counts", "last")}
        rec = app.crash("disk-loss", instance=0)
        assert rec["status"] == "applied"
        wait_until(lambda: app.state == AppState.ERROR, 30, "the app in ERROR")
        # more clicks while the app is down, of half the users, with a second version of the schema
        extra = [datagen.Record(c.key, {**c.value, "country": "PT"}, 0)
                 for c in datagen.generate("clicks", seed=9, limit=300, keys=12) if c.key < "u0006"]
        datagen.produce(topic, extra, shared_broker.bootstrap,
                        value_serde=statekit.serdes.avro(schema=click_v2()))
        app.restart()
        assert app.process_all_available()
        # each store of each task, its whole changelog (the restores' events arrive through the
        # events topic, a moment after the tasks said they are open)
        summary, = wait_until(lambda: (lambda s: (s,) if len(s) >= 4 else None)(app.restore_summary()),
                              30, "the four restores' events")
        assert sorted(zip(summary.task, summary.store)) == [
            ("0_0", "counts"), ("0_0", "last"), ("0_1", "counts"), ("0_1", "last")]
        for row in summary.itertuples():
            assert row.source == "scratch" and row.records == sizes[row.store][int(row.task[-1])], row

        every = [r.value for r in datagen.generate("clicks", seed=5, limit=1_000, keys=12)]
        every += [r.value for r in extra]
        counts = app.query_all("counts")
        assert dict(zip(counts.key, counts.value)) == dict(collections.Counter(c["user"] for c in every))
        last = app.query_all("last")
        want_last = {}
        for c in every:       # one user's clicks are one partition's, in this order
            want_last[c["user"]] = c
        assert dict(zip(last.key, last.value)) == want_last
        registry = statekit.serdes.registry_client()
        ids = {v.schema_id for v in last.value}
        assert ids == {registry.get_latest_version(f"{topic}-value").schema_id,
                       registry.get_version(f"{topic}-value", 1).schema_id}
        assert app.query("last", "u0003") == want_last["u0003"]

        # the store's bytes are the records' own: its changelog holds each key's last source value
        src_last = {}
        for recs in source_records(kafka, topic).values():
            for k, v in recs:
                src_last[k] = v
        logged = changelog_values(kafka, app.changelog_topic("last"))
        assert logged == src_last
        assert all(v[:1] == b"\x00" for v in logged.values())

        from statekit.history import key_history

        points = key_history(app, "last", "u0003")
        assert points and points[-1].value == want_last["u0003"]
    finally:
        app.stop()


def test_a_record_without_the_magic_byte_fails_the_app_in_one_line(
        shared_broker, kafka, tmp_path, embedded_registry):
    topic = unique("mixed")
    kafka.ensure_topic(topic, 1)
    good = statekit.serdes.avro(schema=click_v2()).bind(topic).to_bytes(
        {**next(datagen.generate("clicks", seed=1, limit=1)).value, "country": "AO"})
    kafka.send(topic, 0, [(b"u1", good), (b"u2", json.dumps({"user": "u2"}).encode())])
    app = statekit.App(unique("app"), bootstrap=shared_broker.bootstrap,
                       state_dir=str(tmp_path / "st"), engine="local", partitions=1, instances=1)
    app.stream(topic, value_serde="avro").group_by_key().reduce(lambda a, v: v, store="last")
    try:
        app.start()
        with pytest.raises(ProcessorError) as err:
            app.process_all_available(timeout=60)
        assert app.state == AppState.ERROR and str(app.error) == str(err.value)
        msg = str(err.value)
        assert "\n" not in msg, msg
        assert (f"cannot decode a record of {topic} partition 0 offset 1 with serdes str/avro: "
                f"the avro serde reads the Confluent wire format, and these bytes begin with 0x7b "
                f"('{{'), not the magic byte 0: it looks like plain JSON (serde 'json')") in msg, msg
    finally:
        app.stop()
