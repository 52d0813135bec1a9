"""statekit.history over a fake changelog partition: versions, committed flags, value as of."""
from __future__ import annotations

import json

from statekit.history import read_key_history, value_as_of
from statekit.state.restore import BATCH_HEADER, MARKER_HEADER, MARKER_KEY


class FakeChunk:
    def __init__(self, records):
        self.records = records


class FakeKafka:
    def __init__(self, records):
        self.records = records

    def read(self, topic, partition, start=None, end=None):
        yield FakeChunk(self.records[:3])
        yield FakeChunk(self.records[3:])


def rec(off, key, value, batch):
    return (off, 1000 + off, key, None if value is None else json.dumps(value).encode(),
            [(BATCH_HEADER, str(batch).encode())])


def marker(off, batch):
    return (off, 1000 + off, MARKER_KEY, json.dumps({"batch": batch}).encode(),
            [(MARKER_HEADER, b"1"), (BATCH_HEADER, str(batch).encode())])


def test_key_history_versions_and_commits():
    log = [rec(0, b"a", 1, 0), rec(1, b"b", 1, 0), marker(2, 0),
           rec(3, b"a", 2, 1), marker(4, 1),
           rec(5, b"a", None, 2), marker(6, 2),
           rec(7, b"a", 9, 3)]  # after the last marker: a crashed attempt
    pts = read_key_history(FakeKafka(log), "t", 0, b"a", json.loads)
    assert [(p.offset, p.value, p.batch, p.committed) for p in pts] == [
        (0, 1, 0, True), (3, 2, 1, True), (5, None, 2, True), (7, 9, 3, False)]
    assert value_as_of(pts, 0) == 1
    assert value_as_of(pts, 4) == 2
    assert value_as_of(pts, 5) is None  # deleted
    assert value_as_of(pts, 7) is None  # the uncommitted write does not count
    assert value_as_of(pts, 7, committed_only=False) == 9
