"""Version negotiation as real clients do it, against a tiny fake broker socket: ApiVersions v3 first;
a broker that does not know v3 answers UNSUPPORTED_VERSION in v0 framing (as Kafka does), and the
client asks v0 on a new connection; every request then uses the highest version both
sides have, and an API the broker does not offer is refused before anything is sent."""
from __future__ import annotations

import socket
import struct
import threading

import pytest
from kafka.protocol.admin import CreateTopicsRequest, DescribeConfigsRequest
from kafka.protocol.consumer import FetchRequest, ListOffsetsRequest
from kafka.protocol.metadata import MetadataRequest

from statekit.errors import StatekitError
from statekit.kafka import UnsupportedApi
from statekit.kafka.connection import Connection
from statekit.kafka.versions import SPOKEN, api_name

# an old broker: what it offers (api key -> (min, max)); ApiVersions only v0-2, no CreateTopics
OFFERED = {0: (0, 7), 1: (0, 10), 2: (0, 5), 3: (0, 9), 18: (0, 2)}


def _v0_answer(correlation: int, error: int, table: dict) -> bytes:
    """ApiVersions' answer in v0 framing: error code, then [api key, min, max]."""
    body = struct.pack(">ih", correlation, error) + struct.pack(">i", len(table))
    body += b"".join(struct.pack(">hhh", k, lo, hi) for k, (lo, hi) in sorted(table.items()))
    return struct.pack(">i", len(body)) + body


class FakeBroker:
    """Answers ApiVersions as a broker that knows v0-2 only: to a higher version UNSUPPORTED_VERSION
    (35) with its ApiVersions range in v0 framing (``hang_up``: closes the connection instead), to
    v0-2 its table; records every request header it read, per connection."""

    def __init__(self, hang_up: bool = False, garbage: bool = False):
        self.hang_up = hang_up
        self.garbage = garbage
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(8)
        self.addr = self.sock.getsockname()
        self.requests: list = []  # (connection number, api key, version)
        self.connections = 0
        self._stop = False
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self):
        while not self._stop:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            threading.Thread(target=self._conn, args=(c, self.connections), daemon=True).start()

    @staticmethod
    def _read(c, n):
        buf = b""
        while len(buf) < n:
            got = c.recv(n - len(buf))
            if not got:
                raise EOFError
            buf += got
        return buf

    def _conn(self, c, number):
        try:
            while True:
                size, = struct.unpack(">i", self._read(c, 4))
                frame = self._read(c, size)
                key, version, correlation = struct.unpack_from(">hhi", frame, 0)
                self.requests.append((number, key, version))
                if key != 18:
                    c.close()  # what a broker does with a request it cannot parse
                    return
                if self.garbage:
                    c.sendall(struct.pack(">i", 3) + b"\x00\x01\x02")
                elif version > OFFERED[18][1]:
                    if self.hang_up:
                        c.close()
                        return
                    c.sendall(_v0_answer(correlation, 35, {18: OFFERED[18]}))
                else:
                    c.sendall(_v0_answer(correlation, 0, OFFERED))
        except (EOFError, OSError):
            pass
        finally:
            c.close()

    def close(self):
        self._stop = True
        self.sock.close()


@pytest.fixture
def old_broker():
    b = FakeBroker()
    try:
        yield b
    finally:
        b.close()


def test_a_broker_that_does_not_know_v3_is_asked_v0_on_a_new_connection(old_broker):
    conn = Connection(*old_broker.addr, timeout=10, client_id="t")
    try:
        assert old_broker.requests == [(1, 18, 3), (2, 18, 0)]
        assert old_broker.connections == 2
        assert conn.versions == OFFERED
        # the highest version both sides have: statekit's top where the broker goes further,
        # the broker's where it stops short
        assert conn.version(MetadataRequest) == min(SPOKEN[3].hi, 9) == 9
        assert conn.version(FetchRequest) == min(SPOKEN[1].hi, 10) == 10
        assert conn.version(ListOffsetsRequest) == 5
        assert conn.version(ListOffsetsRequest, 2) == 5  # read_committed needs v2+
    finally:
        conn.close()


@pytest.mark.parametrize("cls", [CreateTopicsRequest, DescribeConfigsRequest])
def test_an_api_the_broker_lacks_is_refused_before_sending_in_one_line(old_broker, cls):
    conn = Connection(*old_broker.addr, timeout=10, client_id="t")
    try:
        sent = list(old_broker.requests)
        with pytest.raises(UnsupportedApi) as e:
            conn.version(cls)
        msg = str(e.value)
        assert "\n" not in msg
        host, port = old_broker.addr
        assert msg.startswith(f"the broker at {host}:{port} does not offer {api_name(cls)}: ")
        assert SPOKEN[cls.API_KEY].without in msg  # what to do
        assert "statekit broker start" not in msg  # the wrong way
        assert (e.value.api, e.value.broker) == (api_name(cls), f"{host}:{port}")
        assert old_broker.requests == sent  # nothing went out
        assert conn.sock.fileno() >= 0  # and the connection is still there
    finally:
        conn.close()


def test_a_version_range_that_does_not_meet_statekits_is_refused():
    b = FakeBroker()
    try:
        conn = Connection(*b.addr, timeout=10, client_id="t")
        conn.versions[1] = (0, 3)  # a broker with Fetch v0-3 only
        with pytest.raises(UnsupportedApi, match=r"offers Fetch v0-3, statekit speaks v4-\d+: "):
            conn.version(FetchRequest)
        conn.close()
    finally:
        b.close()


def test_a_broker_that_hangs_up_on_v3_is_not_asked_again():
    """What hangs up on ApiVersions is not a broker that merely lacks v3 (Kafka answers that in v0
    framing): a TLS listener, or a broker without ApiVersions. One connection, one line."""
    b = FakeBroker(hang_up=True)
    try:
        with pytest.raises(StatekitError) as e:
            Connection(*b.addr, timeout=10, client_id="t")
        assert "\n" not in str(e.value)
        assert b.requests == [(1, 18, 3)] and b.connections == 1
    finally:
        b.close()


def test_a_broker_that_answers_v0_with_garbage_is_one_line():
    b = FakeBroker(garbage=True)
    try:
        with pytest.raises(StatekitError) as e:
            Connection(*b.addr, timeout=10, client_id="t")
        assert "\n" not in str(e.value) and "ApiVersions v0" in str(e.value)
        assert [r[2] for r in b.requests] == [3, 0]
    finally:
        b.close()


def test_the_architecture_table_lists_what_the_client_speaks():
    """docs/ARCHITECTURE.md, "What statekit needs from a Kafka cluster": one row per API the client
    sends, with the versions of statekit.kafka.versions.SPOKEN."""
    import os
    import re

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    with open(os.path.join(root, "docs", "ARCHITECTURE.md")) as f:
        doc = f.read()
    section = doc.split("#### What statekit needs from a Kafka cluster", 1)[1].split("\n#", 1)[0]
    rows = dict(re.findall(r"^\| (\w+) \| ([\d-]+) \|", section, re.M))
    want = {api_name(a.request): str(a.lo) if a.lo == a.hi else f"{a.lo}-{a.hi}" for a in SPOKEN.values()}
    assert rows == want


def test_the_versioned_class_that_loses_kafka_pythons_race_does_not_break_decoding(old_broker):
    """kafka-python 3.0 makes ``ApiVersionsResponse[3]`` on first use, and the new class registers
    itself, by weak proxy, as the decoder of every ApiVersions answer. Two threads doing so at once
    each make one; the one the registry kept could be collected, and every answer to that API then
    raised ReferenceError (seen once in CI, in notebook 10). Here the losing class is made as
    kafka-python makes it, and dropped."""
    import gc

    from kafka.protocol.api_header import ResponseClassRegistry
    from kafka.protocol.metadata import ApiVersionsResponse

    registry = ResponseClassRegistry._response_class_registry
    loser = type("ApiVersionsResponse_v3", tuple(ApiVersionsResponse.mro()), {"_class_version": 3},
                 init=False)
    assert loser[None] is ApiVersionsResponse
    del loser
    gc.collect()
    assert registry[18] is ApiVersionsResponse
    conn = Connection(*old_broker.addr, timeout=10, client_id="t")
    assert conn.versions == OFFERED
    conn.close()


def test_a_dead_registry_entry_loses_one_connection_and_is_put_back(old_broker):
    """An entry that died anyway (made before statekit was imported): the answer read with it loses
    its connection, as a retriable outage, and the entry is put back for the next one."""
    import gc
    import weakref

    from kafka.protocol.api_header import ResponseClassRegistry
    from kafka.protocol.metadata import ApiVersionsResponse

    from statekit.errors import KafkaUnavailable

    class Collected:
        pass

    dead = weakref.proxy(Collected)
    del Collected
    gc.collect()
    registry = ResponseClassRegistry._response_class_registry
    registry[18] = dead
    try:
        with pytest.raises(KafkaUnavailable, match=r"\(ReferenceError: "):
            Connection(*old_broker.addr, timeout=10, client_id="t")
        assert registry[18] is ApiVersionsResponse
        conn = Connection(*old_broker.addr, timeout=10, client_id="t")
        assert conn.versions == OFFERED
        conn.close()
    finally:
        registry[18] = ApiVersionsResponse


def test_an_error_that_is_not_about_the_bytes_is_a_lost_connection_worth_retrying(old_broker, monkeypatch):
    """Only what kafka-python cannot decode is "bytes statekit cannot read" (not retried); anything
    else raised while an answer is read loses this connection, and a new one is tried."""
    from kafka.protocol.parser import KafkaProtocol

    from statekit.errors import KafkaUnavailable

    def broken(self, data):
        raise ReferenceError("weakly-referenced object no longer exists")

    monkeypatch.setattr(KafkaProtocol, "receive_bytes", broken)
    with pytest.raises(KafkaUnavailable) as e:
        Connection(*old_broker.addr, timeout=10, client_id="t")
    msg = str(e.value)
    assert "\n" not in msg and "cannot read" not in msg
    host, port = old_broker.addr
    assert msg.startswith(f"lost the connection to Kafka at {host}:{port} while reading its answer (ReferenceError")
    assert old_broker.requests == [(1, 18, 3)]  # nothing asked again on this connection
