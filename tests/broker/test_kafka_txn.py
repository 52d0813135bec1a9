"""statekit.kafka's transactional API (what the runtime uses for exactly-once task commits) and
its read_committed reads, against the embedded broker."""
from __future__ import annotations

import pytest

from statekit.errors import StatekitError
from statekit.kafka import Kafka, ProducerFenced


@pytest.fixture
def k(kafka):
    return kafka   # the shared-broker client of tests/conftest.py, by this module's short name


def _records(k, topic, partition, isolation):
    return [(o, bytes(key), bytes(v)) for ch in k.read(topic, partition, isolation=isolation)
            for o, _, key, v, _ in ch]


def test_commit_and_abort_as_readers_see_them(k):
    k.ensure_topic("kt-a", 2)
    k.ensure_topic("kt-b", 1)
    assert k.supports_transactions()
    txp = k.transactional_producer("app-0_1", timeout_ms=60000)
    pid, epoch = txp.producer_id, txp.epoch
    txp.begin()
    lasts = txp.send_many([("kt-a", 0, [(b"k1", b"v1"), (b"k2", b"v2")]), ("kt-a", 1, []),
                           ("kt-b", 0, [(b"x", b"1", [("h", b"2")])])])
    assert lasts == [1, -1, 0]
    # open: the last stable offsets hold at the transaction's first offsets
    assert k.end_offsets("kt-a", isolation="read_committed") == {0: 0, 1: 0}
    assert k.end_offsets("kt-a") == {0: 2, 1: 0}
    assert k.offsets_many(["kt-a", "kt-b"], 0, isolation="read_committed") == {"kt-a": (0, 0), "kt-b": (0, 0)}
    assert _records(k, "kt-a", 0, "read_committed") == []
    assert _records(k, "kt-a", 0, "read_uncommitted") == [(0, b"k1", b"v1"), (1, b"k2", b"v2")]
    txp.send_many([("kt-a", 0, [(b"k3", b"v3")])])  # a second send in the same transaction
    txp.commit()
    # the commit marker sits at offset 3 of kt-a[0] and 1 of kt-b[0]
    assert k.end_offsets("kt-a", isolation="read_committed") == {0: 4, 1: 0}
    assert k.offsets_many(["kt-a", "kt-b"], 0, isolation="read_committed") == {"kt-a": (0, 4), "kt-b": (0, 2)}
    assert _records(k, "kt-a", 0, "read_committed") == [(0, b"k1", b"v1"), (1, b"k2", b"v2"), (2, b"k3", b"v3")]
    assert [(o, key, v) for ch in k.read("kt-b", 0, isolation="read_committed") for o, _, key, v, h in ch] == \
        [(0, b"x", b"1")]
    txp.begin()
    assert txp.send_many([("kt-a", 0, [(b"k1", b"aborted")])]) == [4]
    txp.abort()
    assert (txp.producer_id, txp.epoch) == (pid, epoch + 1)  # a fresh epoch after an abort
    txp.begin()
    assert txp.send_many([("kt-a", 0, [(b"k9", b"v9")])]) == [6]
    txp.commit()
    assert _records(k, "kt-a", 0, "read_committed") == [
        (0, b"k1", b"v1"), (1, b"k2", b"v2"), (2, b"k3", b"v3"), (6, b"k9", b"v9")]
    assert _records(k, "kt-a", 0, "read_uncommitted") == [
        (0, b"k1", b"v1"), (1, b"k2", b"v2"), (2, b"k3", b"v3"), (4, b"k1", b"aborted"), (6, b"k9", b"v9")]
    chunk = k.fetch("kt-a", 0, 0, isolation="read_committed")
    assert [r[0] for r in chunk] == [0, 1, 2, 6] and chunk.last_stable_offset == 8
    # a commit with nothing sent is local
    txp.begin()
    txp.commit()
    txp.close()


def test_the_producer_of_a_newer_instance_fences_the_older(k):
    k.ensure_topic("kt-f", 1)
    old = k.transactional_producer("app-0_2")
    old.begin()
    old.send_many([("kt-f", 0, [(b"zombie", b"1")])])
    new = Kafka(k.bootstrap).transactional_producer("app-0_2")  # aborts the old one's transaction
    assert new.epoch == old.epoch + 2  # fenced once to abort, once for the new producer
    with pytest.raises(ProducerFenced, match="fenced"):
        old.commit()
    with pytest.raises(ProducerFenced):
        old.begin()  # it stays fenced
    new.begin()
    new.send_many([("kt-f", 0, [(b"new", b"2")])])
    new.commit()
    assert _records(k, "kt-f", 0, "read_committed") == [(2, b"new", b"2")]
    # the zombie writing after the takeover is refused too
    zombie = k.transactional_producer("app-0_3")
    Kafka(k.bootstrap).transactional_producer("app-0_3")
    zombie.begin()
    with pytest.raises(ProducerFenced):
        zombie.send_many([("kt-f", 0, [(b"late", b"3")])])
    assert _records(k, "kt-f", 0, "read_committed") == [(2, b"new", b"2")]


def test_misuse_is_one_clear_error(k):
    k.ensure_topic("kt-m", 1)
    txp = k.transactional_producer("app-0_4")
    with pytest.raises(StatekitError, match="begin"):
        txp.send_many([("kt-m", 0, [(b"a", b"b")])])
    with pytest.raises(StatekitError, match="begin"):
        txp.commit()
    txp.begin()
    with pytest.raises(StatekitError, match="already has an open transaction"):
        txp.begin()
    with pytest.raises(StatekitError, match="does not exist"):
        txp.send_many([("kt-missing", 0, [(b"a", b"b")])])
    txp.send_many([("kt-m", 0, [(b"a", b"b")])])
    txp.close()  # aborts the open transaction
    assert k.end_offsets("kt-m", isolation="read_committed") == k.end_offsets("kt-m") == {0: 2}
    with pytest.raises(StatekitError, match="closed"):
        txp.begin()
    with pytest.raises(StatekitError, match="transaction timeout"):
        k.transactional_producer("app-0_5", timeout_ms=10**9)
    with pytest.raises(StatekitError, match="isolation"):
        k.end_offsets("kt-m", isolation="committed")


def test_without_the_verification_feature_partitions_are_added_before_writing(k):
    """Against a broker that does not verify transactional writes (most Kafka versions), the
    AddPartitionsToTxn answer comes before any batch is sent."""
    k.ensure_topic("kt-v", 2)
    txp = k.transactional_producer("app-0_6")
    conn = txp._coordinator()
    conn.features.discard("statekit.txn.verification")
    sent = []
    orig = conn.send

    def spy(req):
        sent.append(type(req).__name__)
        return orig(req)

    conn.send = spy
    state = _count_flights(conn)
    txp.begin()
    assert txp.send_many([("kt-v", 0, [(b"a", b"1")]), ("kt-v", 1, [(b"b", b"2")])]) == [0, 0]
    txp.commit()
    assert sent == ["AddPartitionsToTxnRequest", "ProduceRequest", "ProduceRequest", "EndTxnRequest"]
    assert state["flights"] == 3  # AddPartitionsToTxn answered first, then the writes, then EndTxn
    assert _records(k, "kt-v", 1, "read_committed") == [(0, b"b", b"2")]


def _count_flights(conn):
    """Round trips: requests sent while none is outstanding start a new one."""
    state = {"outstanding": 0, "flights": 0}
    send, recv = conn.send, conn.recv

    def spy_send(req):
        if state["outstanding"] == 0:
            state["flights"] += 1
        state["outstanding"] += 1
        return send(req)

    def spy_recv(cid):
        out = recv(cid)
        state["outstanding"] -= 1
        return out

    conn.send, conn.recv = spy_send, spy_recv
    return state


def test_a_commit_costs_two_round_trips(k):
    """send_many: AddPartitionsToTxn and every Produce in flight together; commit: one EndTxn."""
    k.ensure_topic("kt-rt", 3)
    txp = k.transactional_producer("app-0_7")
    state = _count_flights(txp._coordinator())
    for _ in range(3):
        txp.begin()
        txp.send_many([("kt-rt", p, [(b"k%d" % i, b"v") for i in range(50)]) for p in range(3)])
        txp.commit()
    assert state["flights"] == 3 * 2
    assert k.end_offsets("kt-rt", isolation="read_committed") == {0: 153, 1: 153, 2: 153}


def test_supports_transactions_false_without_the_apis(k):
    conn = k._any()
    saved = dict(conn.versions)
    try:
        for key in (24, 26):
            conn.versions.pop(key, None)
        assert k.supports_transactions() is False
    finally:
        conn.versions.clear()
        conn.versions.update(saved)
    assert k.supports_transactions() is True
