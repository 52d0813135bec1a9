"""A topology `Plan` on Spark's own state store: stage 1 (mapInPandas) + transformWithStateInPandas.

    source     statekit-kafka (every topic of plan.sources)
    stage 1    mapInPandas: decode with the source serdes, plan.pre_shuffle_routed per record ->
               (gkey, route, source_index, src_partition, offset, timestamp, seq, key, value);
               gkey = the route's key-serde bytes (what picks a Kafka Streams task), key/value
               pickled for the trip through the shuffle
    stateful   groupBy("gkey").transformWithStateInPandas(NativeProcessor): Spark hashes gkey into
               spark.sql.shuffle.partitions (= partitions) state partitions. Per grouping key, every
               KV store of the plan is a ValueState (`v binary`: the store's value-serde bytes, the
               same bytes the changelog engine writes), every window store a MapState
               (window_start long -> v binary), i.e. RocksDB rows keyed by (key, window_start);
               windowed plans also keep a ValueState `_stream_time` per key.
    output     (topic, key, value) rows encoded with the sink serdes, outputMode Update

The plan's own `TaskProcessor` runs inside the StatefulProcessor (one per Spark task = state partition
and micro-batch, like a Kafka Streams task per batch), with store objects that read and write the
current grouping key's state variables. So count / reduce / aggregate (windowed or not) and the
processor API run the same code as on the changelog engine. The differences, by construction of
Spark's model: state is scoped to the grouping key (a processor may only read/write the key it is
processing: anything else raises a one-line ProcessorError), and the stream time that closes windows
is per key, not per task.
"""
from __future__ import annotations

import pickle
from typing import Any

from statekit.errors import ProcessorError, StatekitError

STAGE1_SCHEMA = ("gkey binary, route int, source_index int, src_partition int, offset long, "
                 "timestamp long, seq int, key binary, value binary")
OUTPUT_SCHEMA = "topic string, key binary, value binary"
SORT_COLS = ["timestamp", "source_index", "src_partition", "offset", "seq"]
STREAM_TIME_VAR = "_stream_time"

_DUMPS = pickle.dumps
_LOADS = pickle.loads
_PROTO = pickle.HIGHEST_PROTOCOL


def state_var(store: str) -> str:
    """The TWS state variable holding a store (Spark: a column family of the state store)."""
    return store


def store_layout(plan) -> list:
    """[(store name, kind "kv"|"window", key_serde, value_serde)] of the plan's stores."""
    return [(s.name, s.kind, s.key_serde, s.value_serde) for s in plan.stores]


def gkey_serde(plan, store: str):
    """The serde of the grouping-key bytes under which `store` lives: the key serde of the route
    that reaches the node using the store (the store's own key serde for aggregations)."""
    targets = {r.target: r for r in plan.routes}
    for n in plan.nodes:
        if any(s.name == store for s in n.stores):
            m = n
            while m is not None and m.name not in targets:
                m = m.parent
            if m is not None:
                return targets[m.name].key_serde
    return plan.store(store).key_serde


# --- what this engine runs -----------------------------------------------------------------------------

def _native_kinds() -> set:
    from statekit.topology import graph as g

    return {g.SOURCE, g.TABLE_SOURCE, g.MAP, g.MAP_VALUES, g.FILTER, g.FLAT_MAP, g.FLAT_MAP_VALUES,
            g.PEEK, g.MERGE, g.KEY_SELECT, g.AGGREGATE, g.WINDOW_AGGREGATE, g.JOIN, g.PROCESS,
            g.TABLE_FILTER, g.TABLE_MAP_VALUES, g.TO_STREAM, g.SINK}


def check_supported(plan) -> None:
    """Refuse, in one line, a topology this engine cannot run: Spark's state is scoped to one
    grouping key per query, so issue 12's operators — stream-stream and table-table joins,
    foreign-key joins, session and sliding windows, suppress, table re-aggregation, repartition
    topics (sub-topologies), punctuators — stay with statekit's changelog engine."""
    from statekit.errors import TopologyError
    from statekit.topology.steps import describe_step

    fix = "run it with statekit.App(...) (the changelog engine)"
    if getattr(plan, "is_composite", False) or getattr(plan, "repartition_topics", None):
        topics = ", ".join(plan.repartition_topics)
        raise TopologyError(f"the spark engine runs one query without repartition topics; this "
                            f"topology needs {topics}: {fix}")
    kinds = _native_kinds()
    for n in plan.nodes:
        if n.kind not in kinds:
            raise TopologyError(f"the spark engine does not run {describe_step(n)} ({n.name}): "
                                f"{fix}, or leave the step out")
        if n.kind == "process" and n.params.get("schedules"):
            raise TopologyError(f"the spark engine does not run punctuators ({describe_step(n)} "
                                f"calls context.schedule()): {fix}")
    for s in plan.stores:
        if s.kind not in ("kv", "window"):
            raise TopologyError(f"the spark engine keeps kv and window stores only; store "
                                f"{s.name!r} is a {s.kind} store: {fix}")


# --- stage 1 -----------------------------------------------------------------------------------------

def make_stage1(plan):
    """mapInPandas function: the pre-shuffle steps and the grouping key of every record."""
    topics = [s.topic for s in plan.sources]
    by_topic: dict = {}
    for i, t in enumerate(topics):
        by_topic.setdefault(t, []).append(i)

    def stage1(frames):
        import pandas as pd

        from statekit.topology.graph import resolve_serde

        rserdes = [resolve_serde(r.key_serde) for r in plan.routes]
        keyed = [r.keyed for r in plan.routes]
        for pdf in frames:
            if len(pdf) == 0:
                continue
            cols: dict = {c: [] for c in ("gkey", "route", "source_index", "src_partition", "offset",
                                          "timestamp", "seq", "key", "value")}
            for kb, vb, topic, part, off, ts in zip(
                    pdf["key"].tolist(), pdf["value"].tolist(), pdf["topic"].tolist(),
                    pdf["partition"].tolist(), pdf["offset"].tolist(), pdf["ts"].tolist()):
                for si in by_topic.get(topic, ()):
                    ks, vs = plan.source_serdes(si)
                    try:
                        key = None if kb is None else ks.from_bytes(kb)
                        value = None if vb is None else vs.from_bytes(vb)
                    except Exception as e:
                        raise ProcessorError(f"cannot decode a record of {topic} partition {part} "
                                             f"offset {off}: {type(e).__name__}: {e}") from e
                    for seq, (r, k, v) in enumerate(plan.pre_shuffle_routed(si, key, value, ts, part, off)):
                        if k is None:
                            if keyed[r]:
                                continue  # Kafka Streams skips null keys before keyed steps
                            g = b""
                        else:
                            try:
                                g = rserdes[r].to_bytes(k)
                            except Exception as e:
                                raise ProcessorError(
                                    f"key {k!r} from {topic} partition {part} offset {off} cannot be "
                                    f"serialized with its route's key serde: {type(e).__name__}: {e}") from e
                        cols["gkey"].append(g)
                        cols["route"].append(r)
                        cols["source_index"].append(si)
                        cols["src_partition"].append(part)
                        cols["offset"].append(off)
                        cols["timestamp"].append(ts)
                        cols["seq"].append(seq)
                        cols["key"].append(_DUMPS(k, _PROTO))
                        cols["value"].append(_DUMPS(v, _PROTO))
            if not cols["gkey"]:
                continue
            yield pd.DataFrame({
                "gkey": cols["gkey"],
                "route": pd.array(cols["route"], dtype="int32"),
                "source_index": pd.array(cols["source_index"], dtype="int32"),
                "src_partition": pd.array(cols["src_partition"], dtype="int32"),
                "offset": pd.array(cols["offset"], dtype="int64"),
                "timestamp": pd.array(cols["timestamp"], dtype="int64"),
                "seq": pd.array(cols["seq"], dtype="int32"),
                "key": cols["key"], "value": cols["value"],
            })

    return stage1


# --- the stores as TWS state variables ---------------------------------------------------------------

class _Scope:
    """What the store proxies need: the key being processed (state is scoped to it)."""

    __slots__ = ("key",)

    def __init__(self) -> None:
        self.key = None


def _other_key(store: str, k: Any, cur: Any) -> ProcessorError:
    return ProcessorError(f"store {store!r}: the spark engine keeps state per grouping key, and key "
                          f"{k!r} is not the key being processed ({cur!r}); use engine='changelog' "
                          f"for processors that touch other keys")


class _KeyScopedStore:
    """A store over Spark state that exists per grouping key: only that key may be touched."""

    def __init__(self, name: str, state, value_serde, scope: _Scope) -> None:
        self.name = name
        self.state = state
        self.serde = value_serde
        self.scope = scope

    def _check(self, k):
        if k != self.scope.key:
            raise _other_key(self.name, k, self.scope.key)


class ValueStateStore(_KeyScopedStore):
    """A KV store seen through one ValueState per grouping key."""

    def get(self, k):
        self._check(k)
        t = self.state.get()
        if t is None or t[0] is None:
            return None
        return self.serde.from_bytes(bytes(t[0]))

    def put(self, k, v) -> None:
        self._check(k)
        if v is None:
            self.state.clear()
        else:
            self.state.update((self.serde.to_bytes(v),))

    def delete(self, k) -> None:
        self.put(k, None)

    def put_if_absent(self, k, v):
        old = self.get(k)
        if old is None:
            self.put(k, v)
        return old

    def _unsupported(self, *a, **kw):
        raise ProcessorError(f"store {self.name!r}: range scans are not available on the spark engine "
                             f"(state is scoped to the grouping key)")

    all = range = prefix_scan = approximate_num_entries = _unsupported


class MapStateWindowStore(_KeyScopedStore):
    """A window store seen through one MapState (window_start -> value) per grouping key."""

    def get(self, k, window_start):
        self._check(k)
        t = self.state.getValue((int(window_start),))
        if t is None or t[0] is None:
            return None
        return self.serde.from_bytes(bytes(t[0]))

    fetch = get

    def put(self, k, v, window_start) -> None:
        self._check(k)
        if v is None:
            self.state.removeKey((int(window_start),))
        else:
            self.state.updateValue((int(window_start),), (self.serde.to_bytes(v),))

    def fetch_range(self, k, t_from, t_to):
        self._check(k)
        out = []
        for (ws,), (vb,) in self.state.iterator():
            if t_from <= ws <= t_to and vb is not None:
                out.append((int(ws), self.serde.from_bytes(bytes(vb))))
        return sorted(out)

    def _unsupported(self, *a, **kw):
        raise ProcessorError(f"store {self.name!r}: scans over keys are not available on the spark "
                             f"engine (state is scoped to the grouping key)")

    all = range = _unsupported


class _Context:
    """The TaskProcessor's context (task_id, batch_id, get_store, forward, stream_time)."""

    def __init__(self, task_id, batch_id, stores: dict, out: list, sink_serdes: dict) -> None:
        self.task_id = task_id
        self.batch_id = batch_id
        self.stream_time = -1
        self._stores = stores
        self._out = out
        self._sink = sink_serdes

    def get_store(self, name: str):
        return self._stores[name]

    def forward(self, topic: str, key, value, timestamp=None) -> None:
        ks, vs = self._sink[topic]
        self._out.append((topic, None if key is None else ks.to_bytes(key),
                          None if value is None else vs.to_bytes(value)))


def make_processor_class():
    """The StatefulProcessor class (built lazily: importing this module must not import pyspark)."""
    from pyspark.sql.streaming import StatefulProcessor

    class NativeProcessor(StatefulProcessor):
        """Runs the plan's TaskProcessor over the state variables of the current grouping key."""

        def __init__(self, plan) -> None:
            self.plan = plan

        def init(self, handle) -> None:
            from pyspark import TaskContext

            from statekit.topology.graph import resolve_serde

            plan = self.plan
            self.scope = _Scope()
            stores = {}
            for name, kind, _ks, vs in store_layout(plan):
                serde = resolve_serde(vs)
                if kind == "window":
                    st = handle.getMapState(state_var(name), "window_start long", "v binary")
                    stores[name] = MapStateWindowStore(name, st, serde, self.scope)
                else:
                    st = handle.getValueState(state_var(name), "v binary")
                    stores[name] = ValueStateStore(name, st, serde, self.scope)
            self.windows = plan.has_windows
            self.stream_time = (handle.getValueState(STREAM_TIME_VAR, "t long")
                                if self.windows else None)
            ctx = TaskContext.get()
            task = ctx.partitionId() if ctx is not None else None
            try:
                batch = int(ctx.getLocalProperty("streaming.sql.batchId")) if ctx is not None else -1
            except (TypeError, ValueError):
                batch = -1
            self.out: list = []
            sink = {s.topic: plan.sink_serdes(s.topic) for s in plan.sinks}
            self.ctx = _Context(task, batch, stores, self.out, sink)
            self.tp = plan.new_processor(self.ctx)

        def handleInputRows(self, key, rows, timerValues):
            import pandas as pd

            parts = [f for f in rows if len(f)]
            if not parts:
                return
            pdf = parts[0] if len(parts) == 1 else pd.concat(parts, ignore_index=True)
            if len(pdf) > 1:
                pdf = pdf.sort_values(SORT_COLS, kind="stable")
            tp = self.tp
            scope = self.scope
            if self.windows:
                t = self.stream_time.get()
                tp.stream_time = -1 if t is None else int(t[0])
            out = self.out
            out.clear()
            loads = _LOADS
            try:
                for r, p, o, ts, kp, vp in zip(pdf["route"].tolist(), pdf["src_partition"].tolist(),
                                               pdf["offset"].tolist(), pdf["timestamp"].tolist(),
                                               pdf["key"].tolist(), pdf["value"].tolist()):
                    k = loads(kp)
                    scope.key = k
                    tp.process(r, k, loads(vp), ts, o, p)
            except StatekitError:
                raise
            if self.windows:
                self.stream_time.update((int(tp.stream_time),))
            if out:
                topics, keys, values = zip(*out)
                out.clear()
                yield pd.DataFrame({"topic": list(topics), "key": list(keys), "value": list(values)})

        def close(self) -> None:
            tp = getattr(self, "tp", None)
            if tp is not None:
                tp.close()

    return NativeProcessor


def build_native(src, plan):
    """The streaming DataFrame (topic, key, value) of a plan on Spark's state store, from the
    statekit-kafka source frame `src` (columns key, value, topic, partition, offset, ts)."""
    check_supported(plan)
    staged = src.mapInPandas(make_stage1(plan), STAGE1_SCHEMA)
    proc = make_processor_class()(plan)
    return staged.groupBy("gkey").transformWithStateInPandas(
        statefulProcessor=proc, outputStructType=OUTPUT_SCHEMA, outputMode="Update", timeMode="None")


# --- the plain count, as Spark's own aggregation ---------------------------------------------------

def simple_count(plan):
    """(route, store) when the plan is one un-windowed count with no sinks after it (then
    `groupBy(gkey).count()` is an equivalent Spark aggregation), else None."""
    from statekit.topology import graph as g

    aggs = [n for n in plan.nodes if plan.post[n.name] and n.kind not in (g.TABLE_FILTER,)]
    if len(plan.routes) != 1 or len(aggs) != 1:
        return None
    n = aggs[0]
    if n.kind != g.AGGREGATE or n.params.get("op") != "count" or n.children:
        return None
    return plan.routes[0].index, n.stores[0].name


def build_groupby_count(src, plan):
    """groupBy(gkey).count(): Spark's own streaming aggregation (StateStoreSaveExec on the RocksDB
    provider; state = (gkey) -> count). Output rows (topic = the store name, key = gkey, value =
    int64 big-endian bytes, like the int64 serde) in outputMode "update"."""
    from pyspark.sql import functions as F

    route, store = simple_count(plan)
    staged = src.mapInPandas(make_stage1(plan), STAGE1_SCHEMA).where(F.col("route") == route)
    counts = staged.groupBy("gkey").count()
    return counts.select(F.lit(store).alias("topic"), F.col("gkey").alias("key"),
                         F.unhex(F.lpad(F.hex(F.col("count")), 16, "0")).alias("value"))
