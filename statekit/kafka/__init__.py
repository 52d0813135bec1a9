"""statekit's Kafka client: the only statekit package that imports ``kafka`` (kafka-python's
protocol schemas; the broker aside).

* :mod:`.config` - client settings, the bootstrap address, SASL / TLS;
* :mod:`.connection` - one broker connection (framing, versions, authentication);
* :mod:`.client` - :class:`Kafka`: metadata, admin, offsets, produce, fetch;
* :mod:`.transactions` - :class:`TransactionalProducer`;
* :mod:`.errors` - what the client raises.

Record batches are read and written by :mod:`statekit.wire`; its record-level names are
re-exported here for the modules and tests that import them from the client.
"""
from __future__ import annotations

import sys
import types

from statekit.errors import BrokerUnreachable, UnknownTopic
from statekit.wire import (Columns, decode_batch, decode_batch_columns, encode_batches,
                           encode_batches_flat)
from statekit.wire.columns import decode_columns as _decode_columns  # noqa: F401 - state/forecast.py
from statekit.wire.records import decode_rows as _decode_loop  # noqa: F401 - tests/state

from .client import READ_COMMITTED, READ_UNCOMMITTED, Chunk, ColumnChunk, Kafka, PendingSend
from .config import load_kafka_config
from .config import security_of as _security  # noqa: F401 - tests/broker/test_kafka_config.py
from .errors import KafkaError, ProducerFenced
from .transactions import TransactionalProducer

__all__ = [
    "resolve_bootstrap", "load_kafka_config", "Kafka", "TransactionalProducer", "Chunk",
    "ColumnChunk", "Columns", "PendingSend", "KafkaError", "ProducerFenced", "BrokerUnreachable",
    "UnknownTopic", "READ_COMMITTED", "READ_UNCOMMITTED", "decode_batch", "decode_batch_columns",
    "encode_batches", "encode_batches_flat",
]


class _Module(types.ModuleType):
    """``statekit.kafka._COLUMNAR_MIN`` reads and sets the columnar decoder's threshold, which
    lives in :mod:`statekit.wire.columns` (tests/state/test_state_fastpath.py sets it here)."""

    @property
    def _COLUMNAR_MIN(self):
        from statekit.wire import columns

        return columns.COLUMNAR_MIN

    @_COLUMNAR_MIN.setter
    def _COLUMNAR_MIN(self, n):
        from statekit.wire import columns

        columns.COLUMNAR_MIN = n


def __getattr__(name):
    # re-export, lazy (statekit.bootstrap imports this package): statekit/app.py, state/standby.py,
    # engine/spark/source.py, engine/spark_native/app.py and tests/state/test_state_kafka.py should
    # import resolve_bootstrap from statekit.bootstrap
    if name == "resolve_bootstrap":
        from statekit.bootstrap import resolve_bootstrap

        return resolve_bootstrap
    raise AttributeError(f"module 'statekit.kafka' has no attribute {name!r}")


sys.modules[__name__].__class__ = _Module
