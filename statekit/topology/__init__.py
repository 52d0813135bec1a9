"""statekit.topology — the DSL and the processor API as a plain graph (no Spark, no I/O).

    from statekit.topology import TopologyBuilder, tumbling

    b = TopologyBuilder()
    words = b.stream("lines").flat_map_values(str.split)
    words.group_by(lambda k, w: w).count(store="word-counts").to_stream().to("counts", value_serde="int64")
    plan = b.compile()        # a Plan: picklable, engine-agnostic (see plan.py and ARCHITECTURE.md)

Public API: TopologyBuilder, KStream, KGroupedStream, TimeWindowedKStream, KTable, tumbling, hopping,
TimeWindows, Processor, ProcessorContext, kv_store, window_store, store_spec, StoreDecl, Plan,
TaskProcessor, SourceSpec, SinkSpec, RouteSpec, WindowedSerde.

Semantics worth knowing:
* Aggregations forward (key, new_value) for every update (the KTable's changelog stream). Kafka
  Streams' record cache would forward only on flush/commit; statekit's cache still absorbs repeated
  writes before the changelog, but downstream steps see every update.
* Records with a None key (or None value) are skipped by aggregations, table materialization and
  joins, as in Kafka Streams (counted in TaskProcessor.skipped_null).
* Windowed aggregations use record timestamps, epoch-aligned windows [start, start + size), and the
  task's stream time (highest timestamp seen, persisted with the task's state): a record is dropped
  for a window whose end + grace <= stream time. Results are keyed (key, window_start).
* One shuffle per topology (source -> stateless -> [shuffle] -> stateful -> sinks); a topology that
  changes the key after its first stateful step and then needs keyed state again is rejected.
"""
from statekit.topology.dsl import KGroupedStream, KStream, KTable, TimeWindowedKStream, TopologyBuilder
from statekit.topology.graph import (StoreDecl, TimeWindows, WindowedSerde, hopping, kv_store, store_spec,
                                     tumbling, window_store)
from statekit.topology.plan import Plan, RouteSpec, SinkSpec, SourceSpec, TaskProcessor
from statekit.topology.processor import Processor, ProcessorContext

__all__ = [
    "KGroupedStream", "KStream", "KTable", "Plan", "Processor", "ProcessorContext", "RouteSpec",
    "SinkSpec", "SourceSpec", "StoreDecl", "TaskProcessor", "TimeWindowedKStream", "TimeWindows",
    "TopologyBuilder", "WindowedSerde", "hopping", "kv_store", "store_spec", "tumbling", "window_store",
]
