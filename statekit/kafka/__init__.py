"""statekit's Kafka client: the only statekit package that imports ``kafka`` (kafka-python's
protocol schemas; the broker aside).

* :mod:`.config` - client settings, the bootstrap address, SASL / TLS;
* :mod:`.connection` - one broker connection (framing, versions, authentication);
* :mod:`.client` - :class:`Kafka`: metadata, admin, offsets, produce, fetch;
* :mod:`.transactions` - :class:`TransactionalProducer`;
* :mod:`.versions` - the APIs and versions it speaks, and what a broker without one costs;
* :mod:`.errors` - what the client raises;
* :mod:`.log_figures` - the records a partition holds, from the embedded broker (for forecasts).

Record batches are read and written by :mod:`statekit.wire`; its batch-level names are
re-exported here, as the client's own vocabulary.
"""
from __future__ import annotations

from statekit.errors import BrokerUnreachable, UnknownTopic
from statekit.wire import (Columns, decode_batch, decode_batch_columns, encode_batches,
                           encode_batches_flat)

from .client import READ_COMMITTED, READ_UNCOMMITTED, Chunk, ColumnChunk, Kafka, PendingSend
from .config import load_kafka_config
from .errors import KafkaError, ProducerFenced, UnsupportedApi
from .transactions import TransactionalProducer

__all__ = [
    "load_kafka_config", "Kafka", "TransactionalProducer", "Chunk", "ColumnChunk", "Columns",
    "PendingSend", "KafkaError", "ProducerFenced", "UnsupportedApi", "BrokerUnreachable", "UnknownTopic",
    "READ_COMMITTED", "READ_UNCOMMITTED", "decode_batch", "decode_batch_columns", "encode_batches",
    "encode_batches_flat",
]

