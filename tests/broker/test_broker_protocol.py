"""The broker at the protocol level: requests real clients rarely send, errors, framing."""
from __future__ import annotations

import struct
import threading
import time

from kafka.protocol.admin import CreateTopicsRequest, CreateTopicsResponse
from kafka.protocol.consumer import FetchRequest, FetchResponse, ListOffsetsRequest, ListOffsetsResponse
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse, MetadataRequest, MetadataResponse
from kafka.protocol.producer import InitProducerIdRequest, InitProducerIdResponse, ProduceResponse

from _broker_util import Raw, build_batch, decode_records, fetch_request, produce_request

OUT_OF_ORDER_SEQUENCE_NUMBER = 45


def _create(raw, name, partitions=1, configs=None):
    T = CreateTopicsRequest.CreatableTopic
    C = T.CreatableTopicConfig
    resp = raw.call(CreateTopicsRequest(version=7, topics=[T(
        name=name, num_partitions=partitions, replication_factor=1, assignments=[],
        configs=[C(name=k, value=v) for k, v in (configs or {}).items()])], timeout_ms=5000, validate_only=False),
        CreateTopicsResponse)
    assert resp.topics[0].error_code == 0, resp


def _produce(raw, topic, batch, partition=0, acks=-1):
    resp = raw.call(produce_request(topic, partition, batch, acks=acks), ProduceResponse)
    pr = resp.responses[0].partition_responses[0]
    return pr.error_code, pr.base_offset


def _latest(raw, topic, partition=0, ts=-1):
    T = ListOffsetsRequest.ListOffsetsTopic
    resp = raw.call(ListOffsetsRequest(version=7, replica_id=-1, isolation_level=0, topics=[T(
        name=topic, partitions=[T.ListOffsetsPartition(partition_index=partition, current_leader_epoch=-1,
                                                      timestamp=ts)])]), ListOffsetsResponse)
    p = resp.topics[0].partitions[0]
    assert p.error_code == 0
    return p.offset


def test_api_versions_advertises_flexible_versions(shared_broker):
    with Raw(shared_broker.bootstrap) as raw:
        resp = raw.call(ApiVersionsRequest(version=3, client_software_name="t", client_software_version="1"),
                        ApiVersionsResponse)
        assert resp.error_code == 0
        keys = {k.api_key: (k.min_version, k.max_version) for k in resp.api_keys}
        assert keys[0] == (3, 11)   # Produce, flexible from 9
        assert keys[1] == (4, 12)   # Fetch, flexible at 12
        assert keys[3] == (0, 12)   # Metadata
        assert keys[18] == (0, 4)   # ApiVersions


def test_batches_of_many_records_and_list_offsets(shared_broker):
    with Raw(shared_broker.bootstrap) as raw:
        _create(raw, "pr-many")
        total = 0
        for size in (1, 500, 37, 1000):
            err, base = _produce(raw, "pr-many", build_batch([(b"k%d" % i, b"v") for i in range(size)]))
            assert (err, base) == (0, total)
            total += size
            assert _latest(raw, "pr-many") == total
        assert _latest(raw, "pr-many", ts=-2) == 0
        resp = raw.call(fetch_request("pr-many", 0, 520), FetchResponse)
        p = resp.responses[0].partitions[0]
        assert (p.error_code, p.high_watermark, p.log_start_offset) == (0, total, 0)
        recs = decode_records(p.records)
        # whole batches from the one holding offset 520
        assert [o for o, _, _ in recs] == list(range(501, total))


def test_fetch_limits_return_whole_batches(shared_broker):
    with Raw(shared_broker.bootstrap) as raw:
        _create(raw, "pr-limits")
        batches = [build_batch([(b"k", b"x" * 1000)] * 10) for _ in range(5)]
        for b in batches:
            assert _produce(raw, "pr-limits", b)[0] == 0
        size = len(batches[0])
        # a limit smaller than one batch still returns the first whole batch (KIP-74)
        p = raw.call(fetch_request("pr-limits", 0, 0, partition_max_bytes=100), FetchResponse).responses[0].partitions[0]
        assert len(p.records) == size
        p = raw.call(fetch_request("pr-limits", 0, 0, partition_max_bytes=2 * size + 10), FetchResponse).responses[0].partitions[0]
        assert len(p.records) == 2 * size
        assert [o for o, _, _ in decode_records(p.records)] == list(range(20))
        p = raw.call(fetch_request("pr-limits", 0, 50), FetchResponse).responses[0].partitions[0]
        assert (p.error_code, p.records) == (0, b"")
        p = raw.call(fetch_request("pr-limits", 0, 51), FetchResponse).responses[0].partitions[0]
        assert p.error_code == 1  # OFFSET_OUT_OF_RANGE


def test_fetch_waits_for_data_until_max_wait(shared_broker):
    with Raw(shared_broker.bootstrap) as raw, Raw(shared_broker.bootstrap) as other:
        _create(raw, "pr-wait")
        t0 = time.monotonic()
        p = raw.call(fetch_request("pr-wait", 0, 0, max_wait_ms=400), FetchResponse).responses[0].partitions[0]
        waited = time.monotonic() - t0
        assert p.records == b"" and 0.35 <= waited < 3
        timer = threading.Timer(0.3, lambda: _produce(other, "pr-wait", build_batch([(b"a", b"b")])))
        timer.start()
        t0 = time.monotonic()
        p = raw.call(fetch_request("pr-wait", 0, 0, max_wait_ms=10_000), FetchResponse).responses[0].partitions[0]
        waited = time.monotonic() - t0
        timer.join()
        assert decode_records(p.records) == [(0, b"a", b"b")]
        assert 0.25 <= waited < 5  # woken by the append, long before max_wait


def test_idempotent_sequences_dedupe_and_reject_gaps(shared_broker):
    with Raw(shared_broker.bootstrap) as raw:
        _create(raw, "pr-idem")
        r = raw.call(InitProducerIdRequest(version=4, transactional_id=None, transaction_timeout_ms=60000,
                                           producer_id=-1, producer_epoch=-1), InitProducerIdResponse)
        assert r.error_code == 0 and r.producer_id >= 0
        pid, epoch = r.producer_id, r.producer_epoch
        b0 = build_batch([(b"a%d" % i, b"x") for i in range(5)], producer_id=pid, producer_epoch=epoch, base_sequence=0)
        assert _produce(raw, "pr-idem", b0) == (0, 0)
        assert _produce(raw, "pr-idem", b0) == (0, 0)  # a retry: acknowledged with its first offset, not written
        assert _latest(raw, "pr-idem") == 5
        b1 = build_batch([(b"b", b"y")] * 3, producer_id=pid, producer_epoch=epoch, base_sequence=5)
        assert _produce(raw, "pr-idem", b1) == (0, 5)
        gap = build_batch([(b"c", b"z")], producer_id=pid, producer_epoch=epoch, base_sequence=20)
        assert _produce(raw, "pr-idem", gap)[0] == OUT_OF_ORDER_SEQUENCE_NUMBER
        assert _latest(raw, "pr-idem") == 8
        r2 = raw.call(InitProducerIdRequest(version=4, transactional_id=None, transaction_timeout_ms=60000,
                                            producer_id=-1, producer_epoch=-1), InitProducerIdResponse)
        assert r2.producer_id != pid


def test_corrupt_batch_and_unknown_partition_errors(shared_broker):
    with Raw(shared_broker.bootstrap) as raw:
        _create(raw, "pr-bad", partitions=2)
        batch = bytearray(build_batch([(b"k", b"v")]))
        batch[-1] ^= 0xFF  # breaks the CRC
        assert _produce(raw, "pr-bad", bytes(batch))[0] == 2  # CORRUPT_MESSAGE
        assert _produce(raw, "pr-bad", build_batch([(b"k", b"v")]), partition=7)[0] == 3
        assert _produce(raw, "pr-nosuch", build_batch([(b"k", b"v")]))[0] == 3  # not auto-created
        assert _latest(raw, "pr-bad") == 0
        md = raw.call(MetadataRequest(version=12, topics=[MetadataRequest.MetadataRequestTopic(name="pr-nosuch", topic_id=None)],
                                      allow_auto_topic_creation=True, include_topic_authorized_operations=False),
                      MetadataResponse)
        assert md.topics[0].error_code == 3


def test_acks_zero_gets_no_response_and_order_is_kept(shared_broker):
    with Raw(shared_broker.bootstrap) as raw:
        _create(raw, "pr-acks0")
        raw.send(produce_request("pr-acks0", 0, build_batch([(b"a", b"1")]), acks=0))
        assert _produce(raw, "pr-acks0", build_batch([(b"b", b"2")])) == (0, 1)


def test_unsupported_versions_and_apis_are_answered(shared_broker):
    with Raw(shared_broker.bootstrap) as raw:
        # ApiVersions at a version from the future: v0 body with UNSUPPORTED_VERSION and our ranges
        client = b"t"
        body = struct.pack(">hhih", 18, 99, 7, len(client)) + client
        raw.send_bytes(struct.pack(">i", len(body)) + body)
        resp = ApiVersionsResponse[0].decode(raw.recv_frame(), header=True)
        assert resp.header.correlation_id == 7 and resp.error_code == 35
        assert any(k.api_key == 0 for k in resp.api_keys)
        # Fetch v13 names topics by id, which this broker does not do
        corr = raw.send(FetchRequest(version=13, replica_id=-1, max_wait_ms=0, min_bytes=1, max_bytes=1000,
                                     isolation_level=0, session_id=0, session_epoch=-1, topics=[],
                                     forgotten_topics_data=[], rack_id=""))
        resp = FetchResponse[13].decode(raw.recv_frame(), header=True)
        assert resp.header.correlation_id == corr and resp.error_code == 35
        # an API key nobody knows: correlation id and the error code
        body = struct.pack(">hhih", 900, 0, 8, 1) + b"t"
        raw.send_bytes(struct.pack(">i", len(body)) + body)
        assert raw.recv_frame() == struct.pack(">ih", 8, 35)
        # and the connection still works
        assert raw.call(ApiVersionsRequest(version=0), ApiVersionsResponse).error_code == 0


def test_malformed_and_oversized_frames_close_only_that_connection(shared_broker):
    with Raw(shared_broker.bootstrap) as bad:
        body = struct.pack(">hhi", 3, 12, 1) + b"\xff\xff\xff\x01garbage"
        bad.send_bytes(struct.pack(">i", len(body)) + body)
        assert bad.closed_by_peer()
    with Raw(shared_broker.bootstrap) as big:
        big.send_bytes(struct.pack(">i", 200 * 1024 * 1024))
        assert big.closed_by_peer()
    with Raw(shared_broker.bootstrap) as good:
        assert good.call(ApiVersionsRequest(version=3, client_software_name="t", client_software_version="1"),
                         ApiVersionsResponse).error_code == 0


def test_one_produce_request_for_many_partitions(shared_broker):
    from kafka.protocol.producer import ProduceRequest

    with Raw(shared_broker.bootstrap) as raw:
        _create(raw, "pr-multi", partitions=3)
        _create(raw, "pr-multi2", partitions=1)
        TD = ProduceRequest.TopicProduceData
        PD = TD.PartitionProduceData
        req = ProduceRequest(version=9, transactional_id=None, acks=1, timeout_ms=5000, topic_data=[
            TD(name="pr-multi", partition_data=[PD(index=p, records=build_batch([(b"p%d" % p, b"x")] * (p + 1)))
                                                for p in range(3)]),
            TD(name="pr-multi2", partition_data=[PD(index=0, records=build_batch([(b"a", b"b")] * 7)),
                                                 PD(index=1, records=build_batch([(b"a", b"b")]))]),
        ])
        resp = raw.call(req, ProduceResponse)
        got = {(t.name, p.index): (p.error_code, p.base_offset) for t in resp.responses for p in t.partition_responses}
        assert got == {("pr-multi", 0): (0, 0), ("pr-multi", 1): (0, 0), ("pr-multi", 2): (0, 0),
                       ("pr-multi2", 0): (0, 0), ("pr-multi2", 1): (3, -1)}
        assert [_latest(raw, "pr-multi", p) for p in range(3)] == [1, 2, 3]
        assert _latest(raw, "pr-multi2") == 7


def test_fetch_min_bytes_waits_for_enough_data(shared_broker):
    with Raw(shared_broker.bootstrap) as raw:
        _create(raw, "pr-minbytes")
        _produce(raw, "pr-minbytes", build_batch([(b"k", b"v")]))
        t0 = time.monotonic()
        p = raw.call(fetch_request("pr-minbytes", 0, 0, max_wait_ms=500, min_bytes=100_000), FetchResponse).responses[0].partitions[0]
        waited = time.monotonic() - t0
        assert decode_records(p.records) == [(0, b"k", b"v")]
        assert 0.45 <= waited < 3  # not enough bytes: answered at max_wait with what there is
        t0 = time.monotonic()
        p = raw.call(fetch_request("pr-minbytes", 0, 0, max_wait_ms=5000, min_bytes=10), FetchResponse).responses[0].partitions[0]
        assert time.monotonic() - t0 < 1 and p.high_watermark == 1
