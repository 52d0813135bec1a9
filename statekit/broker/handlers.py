"""Per-API request handling: kafka.protocol request objects in, response objects out.

Each handler is `async def (broker, request, version) -> response` and answers every topic and
partition it was asked about, with a per-item error code where something is wrong: one bad topic
never fails a whole request.
"""
from __future__ import annotations

import asyncio
import contextvars
import logging
import time
import uuid

from kafka.protocol.admin import (
    AlterConfigsRequest, AlterConfigsResponse,
    CreatePartitionsRequest, CreatePartitionsResponse,
    CreateTopicsRequest, CreateTopicsResponse,
    DeleteRecordsRequest, DeleteRecordsResponse,
    DeleteTopicsRequest, DeleteTopicsResponse,
    DescribeClusterRequest, DescribeClusterResponse,
    DescribeConfigsRequest, DescribeConfigsResponse,
    IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse,
)
from kafka.protocol.consumer import (
    FetchRequest, FetchResponse,
    ListOffsetsRequest, ListOffsetsResponse,
    OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse,
)
from kafka.protocol.metadata import (
    ApiVersionsRequest, ApiVersionsResponse,
    FindCoordinatorRequest, FindCoordinatorResponse,
    MetadataRequest, MetadataResponse,
)
from kafka.protocol.producer import (
    AddOffsetsToTxnRequest, AddOffsetsToTxnResponse,
    AddPartitionsToTxnRequest, AddPartitionsToTxnResponse,
    EndTxnRequest, EndTxnResponse,
    InitProducerIdRequest, InitProducerIdResponse,
    ProduceRequest, ProduceResponse,
    TxnOffsetCommitRequest, TxnOffsetCommitResponse,
)

from . import records as R
from .config import BROKER_CONFIGS, TOPIC_CONFIGS, ConfigError, TopicConfig, validate_topic_configs
from .log import ProduceError
from .topics import PartitionBudgetExceeded, topic_name_problem

log = logging.getLogger("statekit.broker")

#: The connection a request came on (set by the server for each connection's tasks): fetch reads
#: its count of answer bytes waiting to be sent.
CONNECTION: contextvars.ContextVar = contextvars.ContextVar("statekit_broker_connection", default=None)

# Kafka error codes
NONE = 0
OFFSET_OUT_OF_RANGE = 1
CORRUPT_MESSAGE = 2
UNKNOWN_TOPIC_OR_PARTITION = 3
INVALID_FETCH_SIZE = 4
COORDINATOR_NOT_AVAILABLE = 15
INVALID_TOPIC_EXCEPTION = 17
RECORD_LIST_TOO_LARGE = 18
INVALID_REQUIRED_ACKS = 21
UNSUPPORTED_VERSION = 35
TOPIC_ALREADY_EXISTS = 36
INVALID_PARTITIONS = 37
INVALID_REPLICATION_FACTOR = 38
INVALID_REPLICA_ASSIGNMENT = 39
INVALID_CONFIG = 40
INVALID_REQUEST = 42
UNSUPPORTED_FOR_MESSAGE_FORMAT = 43
POLICY_VIOLATION = 44
INVALID_PRODUCER_EPOCH = 47
INVALID_TXN_STATE = 48
INVALID_PRODUCER_ID_MAPPING = 49
OPERATION_NOT_ATTEMPTED = 55
KAFKA_STORAGE_ERROR = 56
SASL_AUTHENTICATION_FAILED = 58
FETCH_SESSION_ID_NOT_FOUND = 70
PRODUCER_FENCED = 90
UNKNOWN_TOPIC_ID = 100

TOPIC_RESOURCE = 2
BROKER_RESOURCE = 4
# DescribeConfigs config sources
SOURCE_TOPIC = 1
SOURCE_STATIC_BROKER = 4
SOURCE_DEFAULT = 5

READ_COMMITTED = 1
TXN_VERIFICATION_FEATURE = "statekit.txn.verification"


def _storage_error(e: OSError) -> str:
    return f"the broker could not write its data directory ({e.strerror or e}); nothing was changed"


def _ms() -> int:
    return int(time.time() * 1000)


# --------------------------------------------------------------------------------------------
# ApiVersions, Metadata, cluster
# --------------------------------------------------------------------------------------------
async def api_versions(broker, req, version):
    return api_versions_response(broker, version)


def api_versions_response(broker, version):
    resp = ApiVersionsResponse(
        version=version, error_code=NONE, throttle_time_ms=0,
        api_keys=[ApiVersionsResponse.ApiVersion(api_key=k, min_version=lo, max_version=hi)
                  for k, (lo, hi) in sorted(broker.supported_versions().items())],
    )
    if version >= 3:
        # statekit's client pipelines AddPartitionsToTxn with its produce requests only where the
        # broker verifies transactional produce requests (clients ignore features they don't know)
        resp.supported_features = [ApiVersionsResponse.SupportedFeatureKey(
            name=TXN_VERIFICATION_FEATURE, min_version=1, max_version=1)]
        resp.finalized_features_epoch = -1
        resp.finalized_features = []
        resp.zk_migration_ready = False
    return resp


def _broker_entry(broker, cls):
    return cls(node_id=broker.node_id, host=broker.advertised_host, port=broker.advertised_port, rack=None)


async def metadata(broker, req, version):
    tm = broker.topics
    if req.topics is None or (version == 0 and not req.topics):
        names = sorted(tm.topics)
    else:
        names = []
        for t in req.topics:
            name = t.name
            if name is None and getattr(t, "topic_id", None):
                top = tm.by_id.get(t.topic_id)
                name = top.name if top else None
            names.append(name)
    auto = broker.auto_create and (version < 4 or req.allow_auto_topic_creation)
    T = MetadataResponse.MetadataResponseTopic
    P = T.MetadataResponsePartition
    topics = []
    for name in names:
        topic = tm.topics.get(name) if name is not None else None
        err = UNKNOWN_TOPIC_OR_PARTITION
        if topic is None and name is not None and auto and topic_name_problem(name) is None:
            topic, err = _auto_create(broker, name)
        if topic is None:
            if name is not None and topic_name_problem(name):
                err = INVALID_TOPIC_EXCEPTION
            topics.append(T(error_code=err, name=name, topic_id=uuid.UUID(int=0), is_internal=False,
                            partitions=[]))
            continue
        topics.append(T(
            error_code=NONE, name=topic.name, topic_id=topic.id, is_internal=False,
            partitions=[P(error_code=NONE, partition_index=p, leader_id=broker.node_id, leader_epoch=0,
                          replica_nodes=[broker.node_id], isr_nodes=[broker.node_id], offline_replicas=[])
                        for p in range(len(topic.partitions))],
        ))
    return MetadataResponse(
        version=version, throttle_time_ms=0,
        brokers=[_broker_entry(broker, MetadataResponse.MetadataResponseBroker)],
        cluster_id=broker.cluster_id, controller_id=broker.node_id, topics=topics, error_code=NONE,
    )


def _auto_create(broker, name):
    """(topic, None) or (None, error code) for auto.create.topics.enable."""
    try:
        return broker.create_topic(name, broker.config.get("num.partitions"), {}), NONE
    except PartitionBudgetExceeded as e:
        log.warning("not auto-creating %s: %s", name, e)
        return None, INVALID_PARTITIONS
    except OSError as e:
        log.error("auto-creating %s failed: %s", name, e)
        return None, KAFKA_STORAGE_ERROR


async def describe_cluster(broker, req, version):
    B = DescribeClusterResponse.DescribeClusterBroker
    return DescribeClusterResponse(
        version=version, throttle_time_ms=0, error_code=NONE, error_message=None, endpoint_type=1,
        cluster_id=broker.cluster_id, controller_id=broker.node_id,
        brokers=[B(broker_id=broker.node_id, host=broker.advertised_host, port=broker.advertised_port, rack=None,
                   is_fenced=False)],
        authorized_operations=None,
    )


async def find_coordinator(broker, req, version):
    """The broker is node 0 and coordinates every group and every transaction (key type 1)."""
    if version >= 4:
        C = FindCoordinatorResponse.Coordinator
        return FindCoordinatorResponse(version=version, throttle_time_ms=0, coordinators=[
            C(key=k, node_id=broker.node_id, host=broker.advertised_host, port=broker.advertised_port,
              error_code=NONE, error_message=None) for k in req.coordinator_keys])
    return FindCoordinatorResponse(version=version, throttle_time_ms=0, error_code=NONE, error_message=None,
                                   node_id=broker.node_id, host=broker.advertised_host, port=broker.advertised_port)


# --------------------------------------------------------------------------------------------
# Topics
# --------------------------------------------------------------------------------------------
def _mk(cls, **kw):
    """Build a nested response struct from the fields it has (they differ between APIs)."""
    fields = cls._struct.fields
    return cls(**{k: v for k, v in kw.items() if k in fields})


def _config_entries(broker, topic_cfg, cls, version, keys=None, include_synonyms=False, doc=False):
    out = []
    for name, d in sorted(TOPIC_CONFIGS.items()):
        if keys is not None and name not in keys:
            continue
        source = topic_cfg.source(name)
        code = {"topic": SOURCE_TOPIC, "broker": SOURCE_STATIC_BROKER}.get(source, SOURCE_DEFAULT)
        e = _mk(cls, name=name, value=topic_cfg.raw(name), read_only=False, config_source=code,
                is_default=source == "default", is_sensitive=False)
        if hasattr(cls, "DescribeConfigsSynonym"):
            e.synonyms = []
            if include_synonyms:
                S = cls.DescribeConfigsSynonym
                if source == "topic":
                    e.synonyms.append(S(name=name, value=topic_cfg.overrides[name], source=SOURCE_TOPIC))
                syn = broker.config.topic_default_synonym(name)
                if syn is not None:
                    e.synonyms.append(S(name=syn[0], value=syn[1], source=SOURCE_STATIC_BROKER))
            e.config_type = 0
            e.documentation = d.doc if doc else None
        out.append(e)
    return out


async def create_topics(broker, req, version):
    """Each topic is created whole or not at all: configs, the partition budget and the catalogue
    write are checked before anything exists (see TopicManager.create)."""
    R_ = CreateTopicsResponse.CreatableTopicResult
    C = R_.CreatableTopicConfigs
    results = []
    seen = set()
    for t in req.topics:
        res = R_(name=t.name, topic_id=uuid.UUID(int=0), error_code=NONE, error_message=None,
                 topic_config_error_code=NONE, num_partitions=-1, replication_factor=-1, configs=[])
        results.append(res)
        problem = topic_name_problem(t.name)
        n = t.num_partitions
        if t.assignments:
            n = len(t.assignments)
        if n == -1:
            n = broker.config.get("num.partitions")
        if problem:
            res.error_code, res.error_message = INVALID_TOPIC_EXCEPTION, problem
        elif t.name in seen:
            res.error_code, res.error_message = INVALID_REQUEST, f"Create topics request from client contains a duplicate topic: {t.name}"
        elif t.name in broker.topics.topics:
            res.error_code, res.error_message = TOPIC_ALREADY_EXISTS, f"Topic '{t.name}' already exists."
        elif n <= 0:
            res.error_code, res.error_message = INVALID_PARTITIONS, "Number of partitions was set to an invalid non-positive value."
        elif t.replication_factor not in (-1, 1):
            res.error_code = INVALID_REPLICATION_FACTOR
            res.error_message = (f"Unable to replicate the partition {t.replication_factor} time(s): The target "
                                 f"replication factor of {t.replication_factor} cannot be reached because only 1 "
                                 f"broker(s) are registered.")
        elif any(list(a.broker_ids) not in ([broker.node_id], []) for a in (t.assignments or [])):
            res.error_code, res.error_message = INVALID_REPLICA_ASSIGNMENT, "the only broker is node 0"
        seen.add(t.name)
        if res.error_code:
            continue
        try:
            configs = validate_topic_configs({c.name: c.value for c in (t.configs or [])})
            if req.validate_only:
                broker.topics.check_room(n)
                cfg = TopicConfig(configs, broker.topics.defaults)
            else:
                topic = broker.create_topic(t.name, n, configs)
                cfg = topic.config
                res.topic_id = topic.id
        except ConfigError as e:
            res.error_code, res.error_message = INVALID_CONFIG, str(e)
            continue
        except PartitionBudgetExceeded as e:
            res.error_code, res.error_message = INVALID_PARTITIONS, str(e)
            continue
        except OSError as e:
            log.error("creating topic %s failed: %s", t.name, e)
            res.error_code, res.error_message = KAFKA_STORAGE_ERROR, _storage_error(e)
            continue
        res.num_partitions, res.replication_factor = n, 1
        res.configs = _config_entries(broker, cfg, C, version)
    return CreateTopicsResponse(version=version, throttle_time_ms=0, topics=results)


async def delete_topics(broker, req, version):
    R_ = DeleteTopicsResponse.DeletableTopicResult
    wanted = []
    if version >= 6:
        for t in req.topics:
            name = t.name
            if name is None and t.topic_id is not None:
                top = broker.topics.by_id.get(t.topic_id)
                name = top.name if top else None
                if name is None:
                    wanted.append((None, t.topic_id))
                    continue
            wanted.append((name, t.topic_id))
    else:
        wanted = [(n, None) for n in req.topic_names]
    results = []
    for name, tid in wanted:
        topic = broker.topics.topics.get(name) if name else None
        if topic is None:
            err = UNKNOWN_TOPIC_ID if name is None else UNKNOWN_TOPIC_OR_PARTITION
            results.append(R_(name=name, topic_id=tid or uuid.UUID(int=0), error_code=err,
                              error_message="This server does not host this topic."))
            continue
        tid = topic.id
        try:
            broker.delete_topic(name)
        except OSError as e:
            log.error("deleting topic %s failed: %s", name, e)
            results.append(R_(name=name, topic_id=tid, error_code=KAFKA_STORAGE_ERROR, error_message=_storage_error(e)))
            continue
        results.append(R_(name=name, topic_id=tid, error_code=NONE, error_message=None))
    return DeleteTopicsResponse(version=version, throttle_time_ms=0, responses=results)


async def create_partitions(broker, req, version):
    R_ = CreatePartitionsResponse.CreatePartitionsTopicResult
    results = []
    for t in req.topics:
        topic = broker.topics.topics.get(t.name)
        if topic is None:
            results.append(R_(name=t.name, error_code=UNKNOWN_TOPIC_OR_PARTITION,
                              error_message="This server does not host this topic-partition."))
            continue
        have = len(topic.partitions)
        if t.count <= have:
            results.append(R_(name=t.name, error_code=INVALID_PARTITIONS,
                              error_message=f"Topic currently has {have} partitions, which is higher than the "
                                            f"requested {t.count}." if t.count < have else
                                            f"Topic already has {have} partitions."))
            continue
        try:
            if req.validate_only:
                broker.topics.check_room(t.count - have)
            else:
                broker.topics.add_partitions(topic, t.count)
                log.info("topic %s now has %d partitions", t.name, t.count)
        except PartitionBudgetExceeded as e:
            results.append(R_(name=t.name, error_code=INVALID_PARTITIONS, error_message=str(e)))
            continue
        except OSError as e:
            log.error("adding partitions to %s failed: %s", t.name, e)
            results.append(R_(name=t.name, error_code=KAFKA_STORAGE_ERROR, error_message=_storage_error(e)))
            continue
        results.append(R_(name=t.name, error_code=NONE, error_message=None))
    return CreatePartitionsResponse(version=version, throttle_time_ms=0, results=results)


async def describe_configs(broker, req, version):
    Res = DescribeConfigsResponse.DescribeConfigsResult
    E = Res.DescribeConfigsResourceResult
    results = []
    for r in req.resources:
        keys = set(r.configuration_keys) if r.configuration_keys is not None else None
        if r.resource_type == TOPIC_RESOURCE:
            topic = broker.topics.topics.get(r.resource_name)
            if topic is None:
                results.append(Res(error_code=UNKNOWN_TOPIC_OR_PARTITION, error_message="unknown topic",
                                   resource_type=r.resource_type, resource_name=r.resource_name, configs=[]))
                continue
            entries = _config_entries(broker, topic.config, E, version, keys, req.include_synonyms,
                                      req.include_documentation)
        elif r.resource_type == BROKER_RESOURCE:
            entries = []
            for name, d in sorted(BROKER_CONFIGS.items()):
                if keys is not None and name not in keys:
                    continue
                overridden = name in broker.config.overrides
                e = E(name=name, value=broker.config.raw(name), read_only=True,
                      config_source=SOURCE_STATIC_BROKER if overridden else SOURCE_DEFAULT,
                      is_default=not overridden, is_sensitive=False, synonyms=[], config_type=0,
                      documentation=d.doc if req.include_documentation else None)
                entries.append(e)
        else:
            results.append(Res(error_code=INVALID_REQUEST, error_message=f"resource type {r.resource_type} is not supported",
                               resource_type=r.resource_type, resource_name=r.resource_name, configs=[]))
            continue
        results.append(Res(error_code=NONE, error_message=None, resource_type=r.resource_type,
                           resource_name=r.resource_name, configs=entries))
    return DescribeConfigsResponse(version=version, throttle_time_ms=0, results=results)


def _alter_topic_configs(broker, topic, changes, validate_only):
    """changes: list of (name, op, value) with op 0 SET, 1 DELETE, 2 APPEND, 3 SUBTRACT."""
    new = dict(topic.config.overrides)
    for name, op, value in changes:
        if name not in TOPIC_CONFIGS:
            raise ConfigError(f"Unknown topic config name: {name}")
        if op == 0:
            new[name] = value
        elif op == 1:
            new.pop(name, None)
        elif op in (2, 3):
            if name != "cleanup.policy":
                raise ConfigError(f"Config value append is not allowed for config key: {name}" if op == 2
                                  else f"Config value subtract is not allowed for config key: {name}")
            cur = set(topic.config.raw(name).split(","))
            vals = {v.strip() for v in (value or "").split(",") if v.strip()}
            cur = cur | vals if op == 2 else cur - vals
            new[name] = ",".join(sorted(cur))
        else:
            raise ConfigError(f"unknown config operation {op}")
    new = validate_topic_configs(new)
    if not validate_only:
        broker.set_topic_configs(topic, new)


async def incremental_alter_configs(broker, req, version):
    Res = IncrementalAlterConfigsResponse.AlterConfigsResourceResponse
    out = []
    for r in req.resources:
        res = Res(error_code=NONE, error_message=None, resource_type=r.resource_type, resource_name=r.resource_name)
        out.append(res)
        if r.resource_type != TOPIC_RESOURCE:
            res.error_code, res.error_message = INVALID_REQUEST, "only topic configs can be altered (broker configs are set at start)"
            continue
        topic = broker.topics.topics.get(r.resource_name)
        if topic is None:
            res.error_code, res.error_message = UNKNOWN_TOPIC_OR_PARTITION, "unknown topic"
            continue
        try:
            _alter_topic_configs(broker, topic, [(c.name, c.config_operation, c.value) for c in r.configs],
                                 req.validate_only)
        except ConfigError as e:
            res.error_code, res.error_message = INVALID_CONFIG, str(e)
        except OSError as e:
            res.error_code, res.error_message = KAFKA_STORAGE_ERROR, _storage_error(e)
    return IncrementalAlterConfigsResponse(version=version, throttle_time_ms=0, responses=out)


async def alter_configs(broker, req, version):
    """The legacy whole-set alter: the given configs replace all overrides."""
    Res = AlterConfigsResponse.AlterConfigsResourceResponse
    out = []
    for r in req.resources:
        res = Res(error_code=NONE, error_message=None, resource_type=r.resource_type, resource_name=r.resource_name)
        out.append(res)
        topic = broker.topics.topics.get(r.resource_name) if r.resource_type == TOPIC_RESOURCE else None
        if r.resource_type != TOPIC_RESOURCE:
            res.error_code, res.error_message = INVALID_REQUEST, "only topic configs can be altered"
            continue
        if topic is None:
            res.error_code, res.error_message = UNKNOWN_TOPIC_OR_PARTITION, "unknown topic"
            continue
        try:
            new = validate_topic_configs({c.name: c.value for c in r.configs})
            if not req.validate_only:
                broker.set_topic_configs(topic, new)
        except ConfigError as e:
            res.error_code, res.error_message = INVALID_CONFIG, str(e)
        except OSError as e:
            res.error_code, res.error_message = KAFKA_STORAGE_ERROR, _storage_error(e)
    return AlterConfigsResponse(version=version, throttle_time_ms=0, responses=out)


# --------------------------------------------------------------------------------------------
# Produce
# --------------------------------------------------------------------------------------------
async def produce(broker, req, version):
    code = INVALID_REQUIRED_ACKS if req.acks not in (-1, 0, 1) else NONE
    T = ProduceResponse.TopicProduceResponse
    P = T.PartitionProduceResponse
    now = _ms()
    out = []
    appended = False
    for td in req.topic_data:
        topic = broker.topics.topics.get(td.name)
        topic_err = NONE
        if topic is None and code == NONE and broker.auto_create and topic_name_problem(td.name) is None:
            topic, topic_err = _auto_create(broker, td.name)
        parts = []
        for pd in td.partition_data:
            pr = P(index=pd.index, error_code=NONE, base_offset=-1, log_append_time_ms=-1, log_start_offset=-1,
                   record_errors=[], error_message=None)
            parts.append(pr)
            if code or topic_err:
                pr.error_code = code or topic_err
                continue
            plog = topic.partitions[pd.index] if topic and 0 <= pd.index < len(topic.partitions) else None
            if plog is None:
                pr.error_code = UNKNOWN_TOPIC_OR_PARTITION
                continue
            data = pd.records
            if not data:
                pr.error_code, pr.error_message = CORRUPT_MESSAGE, "no records"
                continue
            if not isinstance(data, bytearray):
                data = bytearray(data)
            try:
                batches = R.validate_produce(data)
            except R.InvalidBatch as e:
                magic = data[R.MAGIC_OFFSET] if len(data) > R.MAGIC_OFFSET else -1
                pr.error_code = UNSUPPORTED_FOR_MESSAGE_FORMAT if magic in (0, 1) else CORRUPT_MESSAGE
                pr.error_message = str(e)
                continue
            err = _check_transactional(broker, req.transactional_id, batches, td.name, pd.index)
            if err:
                pr.error_code, pr.error_message = err
                continue
            try:
                base, append_time = plog.append(data, batches, now)
            except ProduceError as e:
                pr.error_code, pr.error_message = e.code, str(e) or None
                continue
            except OSError as e:
                log.error("write to %s-%d failed: %s", td.name, pd.index, e)
                pr.error_code, pr.error_message = KAFKA_STORAGE_ERROR, f"KAFKA_STORAGE_ERROR: {e}"
                continue
            appended = True
            pr.base_offset, pr.log_append_time_ms, pr.log_start_offset = base, append_time, plog.log_start_offset
        out.append(T(name=td.name, partition_responses=parts))
    if appended:
        broker.notify_append()
    if req.acks == 0:
        return None
    return ProduceResponse(version=version, responses=out, throttle_time_ms=0)


def _check_transactional(broker, tid, batches, topic, partition):
    """(error code, message) when a transactional batch may not be appended, else None."""
    for _, h in batches:
        if not h.attributes & R.ATTR_TRANSACTIONAL:
            continue
        if h.producer_id < 0:
            return CORRUPT_MESSAGE, "a transactional record batch must carry a producer id"
        if broker.transactions is None:
            return INVALID_TXN_STATE, "this broker keeps no transaction state"
        code = broker.transactions.verify_produce(tid, h.producer_id, h.producer_epoch, topic, partition)
        if code:
            why = {INVALID_PRODUCER_EPOCH: "the producer epoch is not the current one (fenced)",
                   INVALID_PRODUCER_ID_MAPPING: "the producer id is not the transactional id's",
                   INVALID_TXN_STATE: "the partition was not added to an open transaction (AddPartitionsToTxn)"}
            return code, why.get(code)
    return None


# --------------------------------------------------------------------------------------------
# Fetch
# --------------------------------------------------------------------------------------------
async def fetch(broker, req, version):
    deadline = time.monotonic() + max(req.max_wait_ms, 0) / 1000.0
    if version >= 7 and req.session_id != 0:
        return FetchResponse(version=version, throttle_time_ms=0, error_code=FETCH_SESSION_ID_NOT_FOUND,
                             session_id=0, responses=[])
    while True:
        waiter = broker.append_waiter()
        resp, nbytes = _fetch_once(broker, req, version)
        remaining = deadline - time.monotonic()
        if nbytes >= max(req.min_bytes, 1) or remaining <= 0 or broker.stopping or nbytes < 0:
            return resp
        try:
            await asyncio.wait_for(asyncio.shield(waiter), remaining)
        except asyncio.TimeoutError:
            return _fetch_once(broker, req, version)[0]


def _fetch_once(broker, req, version):
    """One pass over the partitions. The response is at most `fetch.max.bytes`, and at most what
    the connection may still buffer (answers not yet sent, see server.Connection) and what all
    connections together may: a client that pipelines fetches without reading their answers gets
    empty ones instead of growing the broker. A read_committed fetch stops at the last stable
    offset and lists the aborted transactions among the batches it returns."""
    T = FetchResponse.FetchableTopicResponse
    P = T.PartitionData
    A = P.AbortedTransaction
    tm = broker.topics
    read_committed = req.isolation_level == READ_COMMITTED
    cap = broker.config.get("fetch.max.bytes")
    left = req.max_bytes if version >= 3 and req.max_bytes > 0 else cap
    left = min(left, cap)
    may_exceed = True  # KIP-74: the first batch goes out even when larger than the limits
    conn = CONNECTION.get()
    if conn is not None:
        room = min(cap - conn.buffered, broker.max_buffered - broker.buffered)
        left = min(left, max(room, 0))
        may_exceed = conn.buffered == 0 and broker.buffered < broker.max_buffered
    total = 0
    errors = False
    out = []
    for ft in req.topics:
        name = ft.topic
        topic = tm.topics.get(name)
        parts = []
        for fp in ft.partitions:
            plog = topic.partitions[fp.partition] if topic and 0 <= fp.partition < len(topic.partitions) else None
            pd = P(partition_index=fp.partition, error_code=NONE, high_watermark=-1, last_stable_offset=-1,
                   log_start_offset=-1, aborted_transactions=[] if read_committed else None,
                   preferred_read_replica=-1, records=b"")
            parts.append(pd)
            if plog is None:
                pd.error_code = UNKNOWN_TOPIC_OR_PARTITION
                errors = True
                continue
            hw = plog.high_watermark
            lso = plog.last_stable_offset
            pd.high_watermark, pd.last_stable_offset = hw, lso
            pd.log_start_offset = plog.log_start_offset
            off = fp.fetch_offset
            if off < plog.log_start_offset or off > hw:
                pd.error_code = OFFSET_OUT_OF_RANGE
                errors = True
                continue
            upper = lso if read_committed else hw
            if off >= upper:
                continue
            limit = min(fp.partition_max_bytes, left)
            data = plog.read(off, limit, min_one=(total == 0 and may_exceed),
                             max_offset=upper if read_committed else None)
            if data:
                pd.records = data
                total += len(data)
                left -= len(data)
                if read_committed and plog.aborted:
                    pd.aborted_transactions = [A(producer_id=pid, first_offset=first)
                                               for pid, first in plog.aborted_between(off, _end_offset(data))]
        out.append(T(topic=name, partitions=parts))
    resp = FetchResponse(version=version, throttle_time_ms=0, error_code=NONE, session_id=0, responses=out)
    # an error answers at once, as Kafka does
    return resp, (-1 if errors else total)


def _end_offset(data: bytes) -> int:
    """The offset after the last whole batch in data."""
    pos, end = 0, -1
    n = len(data)
    while pos + R.HEADER_SIZE <= n:
        h = R.header_at(data, pos)
        end = h.last_offset + 1
        pos += h.size
    return end


# --------------------------------------------------------------------------------------------
# Offsets
# --------------------------------------------------------------------------------------------
async def list_offsets(broker, req, version):
    T = ListOffsetsResponse.ListOffsetsTopicResponse
    P = T.ListOffsetsPartitionResponse
    out = []
    for t in req.topics:
        topic = broker.topics.topics.get(t.name)
        parts = []
        for p in t.partitions:
            pr = P(partition_index=p.partition_index, error_code=NONE, old_style_offsets=[], timestamp=-1,
                   offset=-1, leader_epoch=0)
            parts.append(pr)
            plog = topic.partitions[p.partition_index] if topic and 0 <= p.partition_index < len(topic.partitions) else None
            if plog is None:
                pr.error_code = UNKNOWN_TOPIC_OR_PARTITION
                continue
            ts = p.timestamp
            # read_committed (version 2+) sees the log only up to its last stable offset
            fetchable = plog.last_stable_offset if version >= 2 and req.isolation_level == READ_COMMITTED \
                else plog.high_watermark
            if ts == -1:
                off = fetchable
            elif ts in (-2, -4):
                off = plog.log_start_offset
            elif ts == -3:
                found = plog.max_timestamp_offset()
                off, pr.timestamp = found if found and found[0] < fetchable else (-1, -1)
            elif ts == -5:
                off = -1
            elif ts >= 0:
                found = plog.offset_for_timestamp(ts)
                off, pr.timestamp = found if found and found[0] < fetchable else (-1, -1)
            else:
                pr.error_code = INVALID_REQUEST
                continue
            pr.offset = off
            if version == 0:
                pr.old_style_offsets = [off]
        out.append(T(name=t.name, partitions=parts))
    return ListOffsetsResponse(version=version, throttle_time_ms=0, topics=out)


async def offset_for_leader_epoch(broker, req, version):
    """One leader, epoch 0, forever: every epoch ends at the log end offset."""
    T = OffsetForLeaderEpochResponse.OffsetForLeaderTopicResult
    P = T.EpochEndOffset
    out = []
    for t in req.topics:
        topic = broker.topics.topics.get(t.topic)
        parts = []
        for p in t.partitions:
            plog = topic.partitions[p.partition] if topic and 0 <= p.partition < len(topic.partitions) else None
            if plog is None:
                parts.append(P(error_code=UNKNOWN_TOPIC_OR_PARTITION, partition=p.partition, leader_epoch=-1, end_offset=-1))
            else:
                parts.append(P(error_code=NONE, partition=p.partition, leader_epoch=0, end_offset=plog.log_end_offset))
        out.append(T(topic=t.topic, partitions=parts))
    return OffsetForLeaderEpochResponse(version=version, throttle_time_ms=0, topics=out)


async def delete_records(broker, req, version):
    T = DeleteRecordsResponse.DeleteRecordsTopicResult
    P = T.DeleteRecordsPartitionResult
    out = []
    for t in req.topics:
        topic = broker.topics.topics.get(t.name)
        parts = []
        for p in t.partitions:
            plog = topic.partitions[p.partition_index] if topic and 0 <= p.partition_index < len(topic.partitions) else None
            if plog is None:
                parts.append(P(partition_index=p.partition_index, low_watermark=-1, error_code=UNKNOWN_TOPIC_OR_PARTITION))
                continue
            off = plog.high_watermark if p.offset == -1 else p.offset
            if off < 0 or off > plog.high_watermark:
                parts.append(P(partition_index=p.partition_index, low_watermark=-1, error_code=OFFSET_OUT_OF_RANGE))
                continue
            low = plog.delete_records(off)
            parts.append(P(partition_index=p.partition_index, low_watermark=low, error_code=NONE))
        out.append(T(name=t.name, partitions=parts))
    return DeleteRecordsResponse(version=version, throttle_time_ms=0, topics=out)


# --------------------------------------------------------------------------------------------
# Transactions (statekit.broker.transactions has the rules)
# --------------------------------------------------------------------------------------------
def _fenced(code: int, version: int, first_with_fenced: int) -> int:
    """Requests older than PRODUCER_FENCED get INVALID_PRODUCER_EPOCH, as Kafka answers them."""
    return INVALID_PRODUCER_EPOCH if code == PRODUCER_FENCED and version < first_with_fenced else code


def _txn_call(fn, *args):
    """A coordinator call; a failed write of the transaction log answers
    COORDINATOR_NOT_AVAILABLE (clients retry), as Kafka's coordinator does."""
    try:
        return fn(*args)
    except OSError as e:
        log.error("transaction log write failed: %s", e)
        return COORDINATOR_NOT_AVAILABLE


async def init_producer_id(broker, req, version):
    if req.transactional_id is not None:
        pid, epoch = (req.producer_id, req.producer_epoch) if version >= 3 else (-1, -1)
        result = _txn_call(broker.transactions.init_producer_id, req.transactional_id,
                           req.transaction_timeout_ms, pid, epoch)
        code, pid, epoch = result if isinstance(result, tuple) else (result, -1, -1)
        return InitProducerIdResponse(version=version, throttle_time_ms=0, error_code=_fenced(code, version, 4),
                                      producer_id=pid, producer_epoch=epoch)
    if version >= 3 and req.producer_id >= 0:
        # an idempotent producer asking for a new epoch of its own id (KIP-360)
        pid, epoch = req.producer_id, req.producer_epoch + 1
        if epoch > 32767:
            pid, epoch = broker.next_producer_id(), 0
    else:
        pid, epoch = broker.next_producer_id(), 0
    return InitProducerIdResponse(version=version, throttle_time_ms=0, error_code=NONE,
                                  producer_id=pid, producer_epoch=epoch)


async def add_partitions_to_txn(broker, req, version):
    """Versions 0-3 (one transaction per request, from producers)."""
    TR = AddPartitionsToTxnResponse.AddPartitionsToTxnTopicResult
    PR = TR.AddPartitionsToTxnPartitionResult
    wanted = [(t.name, p) for t in req.v3_and_below_topics for p in t.partitions]
    unknown = {(t, p) for t, p in wanted if broker.topics.get_partition(t, p) is None}
    if unknown:
        # Kafka: the whole request fails; the partitions that exist were not attempted
        codes = {tp: (UNKNOWN_TOPIC_OR_PARTITION if tp in unknown else OPERATION_NOT_ATTEMPTED) for tp in wanted}
    else:
        code = _txn_call(broker.transactions.add_partitions, req.v3_and_below_transactional_id,
                         req.v3_and_below_producer_id, req.v3_and_below_producer_epoch, wanted)
        code = _fenced(code, version, 2)
        codes = {tp: code for tp in wanted}
    results = []
    for t in req.v3_and_below_topics:
        results.append(TR(name=t.name, results_by_partition=[
            PR(partition_index=p, partition_error_code=codes[(t.name, p)]) for p in t.partitions]))
    return AddPartitionsToTxnResponse(version=version, throttle_time_ms=0, error_code=NONE,
                                      results_by_transaction=[], results_by_topic_v3_and_below=results)


async def add_offsets_to_txn(broker, req, version):
    code = _txn_call(broker.transactions.add_offsets, req.transactional_id, req.producer_id,
                     req.producer_epoch, req.group_id)
    return AddOffsetsToTxnResponse(version=version, throttle_time_ms=0, error_code=_fenced(code, version, 2))


async def end_txn(broker, req, version):
    code = _txn_call(broker.transactions.end_txn, req.transactional_id, req.producer_id, req.producer_epoch,
                     bool(req.committed))
    return EndTxnResponse(version=version, throttle_time_ms=0, error_code=_fenced(code, version, 2),
                          producer_id=-1, producer_epoch=-1)


async def txn_offset_commit(broker, req, version):
    """Offsets that become the group's committed offsets when the transaction commits."""
    TT = TxnOffsetCommitResponse.TxnOffsetCommitResponseTopic
    TP = TT.TxnOffsetCommitResponsePartition
    codes: dict = {}
    offsets: dict = {}
    for t in req.topics:
        for p in t.partitions:
            if broker.topics.get_partition(t.name, p.partition_index) is None:
                codes[(t.name, p.partition_index)] = UNKNOWN_TOPIC_OR_PARTITION
            else:
                epoch = p.committed_leader_epoch if version >= 2 else -1
                offsets[(t.name, p.partition_index)] = (p.committed_offset, epoch, p.committed_metadata or "")
    if offsets:
        code = NONE
        if broker.coordinator is None:
            code = COORDINATOR_NOT_AVAILABLE
        elif version >= 3:
            code = broker.coordinator.check_txn_commit(req.group_id, req.generation_id, req.member_id,
                                                       req.group_instance_id)
        if code == NONE:
            code = _txn_call(broker.transactions.txn_offset_commit, req.transactional_id, req.group_id,
                             req.producer_id, req.producer_epoch, offsets)
        codes.update({tp: code for tp in offsets})
    return TxnOffsetCommitResponse(version=version, throttle_time_ms=0, topics=[
        TT(name=t.name, partitions=[TP(partition_index=p.partition_index, error_code=codes[(t.name, p.partition_index)])
                                    for p in t.partitions]) for t in req.topics])


# --------------------------------------------------------------------------------------------
# The table: api key -> (request class, response class, min version, max version, handler)
# Versions are the ones this broker really implements; e.g. Fetch and Produce stop before 13,
# where requests name topics by id only.
# --------------------------------------------------------------------------------------------
API_TABLE = {
    0: (ProduceRequest, ProduceResponse, 3, 11, produce),
    1: (FetchRequest, FetchResponse, 4, 12, fetch),
    2: (ListOffsetsRequest, ListOffsetsResponse, 1, 8, list_offsets),
    3: (MetadataRequest, MetadataResponse, 0, 12, metadata),
    10: (FindCoordinatorRequest, FindCoordinatorResponse, 0, 4, find_coordinator),
    18: (ApiVersionsRequest, ApiVersionsResponse, 0, 4, api_versions),
    19: (CreateTopicsRequest, CreateTopicsResponse, 2, 7, create_topics),
    20: (DeleteTopicsRequest, DeleteTopicsResponse, 1, 6, delete_topics),
    21: (DeleteRecordsRequest, DeleteRecordsResponse, 0, 2, delete_records),
    22: (InitProducerIdRequest, InitProducerIdResponse, 0, 4, init_producer_id),
    23: (OffsetForLeaderEpochRequest, OffsetForLeaderEpochResponse, 2, 4, offset_for_leader_epoch),
    # transactions, up to the versions before KIP-890's transaction version 2
    24: (AddPartitionsToTxnRequest, AddPartitionsToTxnResponse, 0, 3, add_partitions_to_txn),
    25: (AddOffsetsToTxnRequest, AddOffsetsToTxnResponse, 0, 3, add_offsets_to_txn),
    26: (EndTxnRequest, EndTxnResponse, 0, 3, end_txn),
    28: (TxnOffsetCommitRequest, TxnOffsetCommitResponse, 0, 3, txn_offset_commit),
    32: (DescribeConfigsRequest, DescribeConfigsResponse, 1, 4, describe_configs),
    33: (AlterConfigsRequest, AlterConfigsResponse, 0, 2, alter_configs),
    37: (CreatePartitionsRequest, CreatePartitionsResponse, 0, 3, create_partitions),
    44: (IncrementalAlterConfigsRequest, IncrementalAlterConfigsResponse, 0, 1, incremental_alter_configs),
    60: (DescribeClusterRequest, DescribeClusterResponse, 0, 1, describe_cluster),
}

# The consumer-group APIs, answered by statekit.broker.groups.GroupCoordinator
GROUP_API_KEYS = (8, 9, 11, 12, 13, 14, 15, 16, 42, 47)
# versions advertised for them when the coordinator does not declare its own
GROUP_DEFAULT_VERSIONS = {8: (2, 8), 9: (1, 7), 11: (0, 7), 12: (0, 4), 13: (0, 4), 14: (0, 5),
                          15: (0, 5), 16: (0, 4)}
