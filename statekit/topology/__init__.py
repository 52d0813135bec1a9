"""statekit.topology — the DSL and the processor API as a plain graph (no Spark, no I/O).

    from statekit.topology import TopologyBuilder, tumbling

    b = TopologyBuilder()
    words = b.stream("lines").flat_map_values(str.split)
    words.group_by(lambda k, w: w).count(store="word-counts").to_stream().to("counts", value_serde="int64")
    plan = b.compile("wordcount")   # a Plan: picklable, engine-agnostic (see plan.py, ARCHITECTURE.md)

Public API: TopologyBuilder, KStream, KGroupedStream, TimeWindowedKStream, SessionWindowedKStream,
SlidingWindowedKStream, KTable, KGroupedTable; windows tumbling, hopping, TimeWindows, JoinWindows,
SessionWindows, SlidingWindows; suppression until_window_closes, until_time_limit; stores kv_store,
window_store, session_store, store_spec, StoreDecl; Processor, ProcessorContext, PunctuationType,
Cancellable; Plan, TaskProcessor, SourceSpec, SinkSpec, RouteSpec; serdes WindowedSerde,
SessionWindowedSerde. `statekit.testing.TopologyTestDriver` runs a topology in-process.

Semantics worth knowing:
* Aggregations forward, with the store's record cache on (the default), the latest value of each
  key once per commit (micro-batch), in first-update order; without it every update (TaskProcessor).
* Records with a None key (or None value) are skipped by aggregations, table materialization and
  joins, as in Kafka Streams (counted in TaskProcessor.skipped_null); Kafka's exceptions hold: a
  left/outer stream-stream join emits a None-key record as unmatched, a session aggregation passes
  None values to its aggregator.
* Windowed aggregations use record timestamps and stream time (the highest timestamp seen): a record
  is dropped for a window whose end + grace <= stream time (sessions: end + gap + grace). Time
  windows are epoch-aligned [start, start + size) and keyed (key, window_start); session results are
  keyed (key, start, end), sliding ones (key, start) for the window [start, start + difference].
* A key changed inside a task before another stateful step goes through a repartition topic
  `<application>-<name>-repartition`: the plan then has several sub-topologies
  (`plan.subtopologies`), and compile() needs the application name.
"""
from statekit.topology.dsl import (KGroupedStream, KGroupedTable, KStream, KTable,
                                   SessionWindowedKStream, SlidingWindowedKStream,
                                   TimeWindowedKStream, TopologyBuilder)
from statekit.topology.graph import (JoinWindows, SessionWindows, SlidingWindows, StoreDecl,
                                     Suppressed, TimeWindows, hopping, kv_store, session_store,
                                     session_windows, sliding_windows, store_spec, tumbling,
                                     until_time_limit, until_window_closes, window_store)
from statekit.topology.plan import Plan, RouteSpec, SinkSpec, SourceSpec
from statekit.topology.processor import Cancellable, Processor, ProcessorContext, PunctuationType
from statekit.topology.serdes import SessionWindowedSerde, WindowedSerde
from statekit.topology.task import TaskProcessor

__all__ = [
    "Cancellable", "JoinWindows", "KGroupedStream", "KGroupedTable", "KStream", "KTable", "Plan",
    "Processor", "ProcessorContext", "PunctuationType", "RouteSpec", "SessionWindowedKStream",
    "SessionWindowedSerde", "SessionWindows", "SinkSpec", "SlidingWindowedKStream",
    "SlidingWindows", "SourceSpec", "StoreDecl", "Suppressed", "TaskProcessor",
    "TimeWindowedKStream", "TimeWindows", "TopologyBuilder", "WindowedSerde", "hopping",
    "kv_store", "session_store", "session_windows", "sliding_windows", "store_spec", "tumbling",
    "until_time_limit", "until_window_closes", "window_store",
]
