"""An App with exactly-once output against a broker that requires SASL over TLS (SASL_SSL, as a
managed Kafka does): the App, its instance processes, their transactional producers and the sink
find the broker's CA and credentials by themselves; a crash between a batch's writes and its
commit leaves nothing twice in the committed output, and the counts are exact."""
from __future__ import annotations

import struct

import pytest

import statekit
from harness import unique
from statekit.runtime.lifecycle import AppState
from test_app import LINES, reference, send_lines


@pytest.fixture
def sasl_ssl_broker(tmp_path):
    from statekit import broker as broker_mod

    h = broker_mod.start(dir=str(tmp_path / "broker"), port=0, auth=True, tls=True)
    try:
        yield h
    finally:
        h.stop()


def _outputs(kafka, topic, isolation):
    """{word: [counts in the order written]}."""
    out: dict = {}
    for p, end in sorted(kafka.end_offsets(topic, None, isolation).items()):
        for chunk in kafka.read(topic, p, None, end, isolation=isolation):
            for _off, _ts, k, v, _h in chunk.records:
                out.setdefault(k.decode(), []).append(struct.unpack(">q", v)[0])
    return out


def test_exactly_once_output_over_sasl_ssl(sasl_ssl_broker, tmp_path):
    from statekit.kafka import Kafka

    assert sasl_ssl_broker.credentials["security.protocol"] == "SASL_SSL"
    kafka = Kafka(sasl_ssl_broker.bootstrap)
    topic, out = unique("lines"), unique("counts")
    kafka.ensure_topic(topic, 1)
    kafka.ensure_topic(out, 1)
    app = statekit.App(unique("tls"), bootstrap=sasl_ssl_broker.bootstrap, partitions=1,
                       state_dir=str(tmp_path / "st"), engine="local", processing_guarantee="exactly_once")
    (app.stream(topic).flat_map_values(str.split).group_by(lambda k, w: w).count(store="counts")
     .to_stream().to(out, value_serde="int64"))
    try:
        send_lines(kafka, topic, LINES[:4])
        app.start(sink="kafka", max_records_per_trigger=4)
        assert app.process_all_available()
        # the next batch with records: its records and outputs are written, its transaction is not committed
        app.crash("process", point="before_commit", after_records=1, subtopology=app.store_subtopology("counts"))
        send_lines(kafka, topic, LINES[4:])
        assert app.process_all_available(timeout=60) is False and app.state == AppState.ERROR
        assert app.crashes[0]["applied"]
        app.restart()
        assert app.process_all_available(timeout=60)
        want = reference(LINES)
        assert app.query_all("counts").set_index("key")["value"].to_dict() == want
        committed = _outputs(kafka, out, "read_committed")
        assert {w: counts[-1] for w, counts in committed.items()} == want
        assert all(a < b for counts in committed.values() for a, b in zip(counts, counts[1:])), committed
        uncommitted = _outputs(kafka, out, "read_uncommitted")
        assert sum(map(len, uncommitted.values())) > sum(map(len, committed.values()))  # the aborted outputs
    finally:
        app.stop()
        kafka.close()
