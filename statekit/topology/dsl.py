"""The DSL: TopologyBuilder, KStream, KGroupedStream, TimeWindowedKStream, KTable.

Each call adds one node to the builder's graph and returns a new handle; nothing runs until an engine
runs the `Plan` that `TopologyBuilder.compile()` returns.

Store names: every stateful step takes `store=` (a name, `kv_store(...)`/`window_store(...)`, or a
`statekit.stores.StoreSpec`). Leave it out and a readable name is made up at compile():
`<source topic>-<operation>` (`words-count`, `clicks-windowed-count`, `users-table`), with `-2`, `-3`
when taken. As in Kafka Streams, a generated name ties your state to the shape of the topology:
name the stores you mean to keep (the changelog topic is `<application>-<store>-changelog`), or use
`TopologyBuilder(require_store_names=True)` to make a missing name a TopologyError.
"""
from __future__ import annotations

import inspect
from typing import Any, Callable, Iterable, Optional

from statekit.errors import TopologyError
from statekit.topology import graph as g
from statekit.topology.graph import Node, StoreDecl, TimeWindows, WindowedSerde, as_decl


class TopologyBuilder:
    """Builds the graph. `compile()` checks it and returns the engine-agnostic `Plan`."""

    def __init__(self, require_store_names: bool = False) -> None:
        self.require_store_names = require_store_names
        self.nodes: list[Node] = []
        self.stores: list[StoreDecl] = []      # in declaration order
        self._sources: dict[str, Node] = {}    # topic -> SOURCE node
        self._counter = 0

    # -- internals -----------------------------------------------------------------------------
    def _add(self, kind: str, parent: Optional[Node], **kw) -> Node:
        name = f"{g.KS_NAMES[kind]}-{self._counter:010d}"
        self._counter += 1
        if parent is not None:
            kw.setdefault("key_serde", parent.key_serde)
            kw.setdefault("value_serde", parent.value_serde)
            kw.setdefault("origin", parent.origin)
        node = Node(name=name, kind=kind, parent=parent, **kw)
        if parent is not None:
            parent.children.append(node)
        self.nodes.append(node)
        return node

    def _declare(self, decl: StoreDecl, owner: Node, hint: str) -> StoreDecl:
        decl.owner = owner.name
        decl.auto_hint = hint
        if decl.name is None and self.require_store_names:
            raise TopologyError(f"{owner.name} ({hint}) is stateful but has no store name: pass "
                                f"store=\"...\" (require_store_names=True)")
        self.stores.append(decl)
        owner.stores.append(decl)   # resolved to names at compile()
        return decl

    def _source(self, topic: str, role: str, key_serde: Any, value_serde: Any) -> Node:
        if not isinstance(topic, str) or not topic:
            raise TopologyError(f"source topic must be a non-empty string, got {topic!r}")
        if topic in self._sources:
            raise TopologyError(f"topic {topic!r} is already a source of this topology; read it once "
                                f"and branch the KStream/KTable you got")
        node = self._add(g.SOURCE, None, key_serde=key_serde, value_serde=value_serde, origin=topic,
                         params={"topic": topic, "role": role})
        self._sources[topic] = node
        return node

    # -- public --------------------------------------------------------------------------------
    def stream(self, topic: str, key_serde: Any = "str", value_serde: Any = "str") -> "KStream":
        return KStream(self, self._source(topic, "stream", key_serde, value_serde))

    def table(self, topic: str, store: Any = None, key_serde: Any = "str",
              value_serde: Any = "str") -> "KTable":
        """A table materialized into a kv store: each record upserts its key (a None value deletes)."""
        src = self._source(topic, "table", key_serde, value_serde)
        node = self._add(g.TABLE_SOURCE, src)
        self._declare(as_decl(store, key_serde=key_serde, value_serde=value_serde), node,
                      f"{topic}-table")
        return KTable(self, node)

    def compile(self):
        from statekit.topology.plan import compile_plan

        return compile_plan(self)

    def describe(self) -> dict:
        return self.compile().describe()


def _same_key(key, value):
    return key


def _check_fn(fn: Any, what: str) -> Callable:
    if not callable(fn):
        raise TopologyError(f"{what} needs a function, got {type(fn).__name__}")
    return fn


class KStream:
    """A record stream. Every method returns a new handle; the stream itself can be branched by
    calling several methods on it."""

    def __init__(self, builder: TopologyBuilder, node: Node) -> None:
        self._b = builder
        self._node = node

    @property
    def node_name(self) -> str:
        return self._node.name

    def _next(self, kind: str, fn: Any = None, **kw) -> "KStream":
        return KStream(self._b, self._b._add(kind, self._node, fn=fn, **kw))

    def _serdes(self, key_serde, value_serde) -> dict:
        kw = {}
        if key_serde is not None:
            kw["key_serde"] = key_serde
        if value_serde is not None:
            kw["value_serde"] = value_serde
        return kw

    def map(self, fn: Callable, key_serde: Any = None, value_serde: Any = None) -> "KStream":
        """fn(key, value) -> (new_key, new_value). Changes the key: a later stateful step shuffles."""
        return self._next(g.MAP, _check_fn(fn, "map"), **self._serdes(key_serde, value_serde))

    def select_key(self, fn: Callable, key_serde: Any = None) -> "KStream":
        """fn(key, value) -> new_key (a map that keeps the value)."""
        _check_fn(fn, "select_key")
        return self._next(g.MAP, lambda k, v, _f=fn: (_f(k, v), v), **self._serdes(key_serde, None))

    def map_values(self, fn: Callable, value_serde: Any = None) -> "KStream":
        """fn(value) -> new_value. Keeps the key (no shuffle needed after it)."""
        return self._next(g.MAP_VALUES, _check_fn(fn, "map_values"), **self._serdes(None, value_serde))

    def filter(self, fn: Callable) -> "KStream":
        """Keeps the records for which fn(key, value) is true."""
        return self._next(g.FILTER, _check_fn(fn, "filter"))

    def filter_not(self, fn: Callable) -> "KStream":
        _check_fn(fn, "filter_not")
        return self._next(g.FILTER, lambda k, v, _f=fn: not _f(k, v))

    def flat_map(self, fn: Callable, key_serde: Any = None, value_serde: Any = None) -> "KStream":
        """fn(key, value) -> iterable of (key, value)."""
        return self._next(g.FLAT_MAP, _check_fn(fn, "flat_map"), **self._serdes(key_serde, value_serde))

    def flat_map_values(self, fn: Callable, value_serde: Any = None) -> "KStream":
        """fn(value) -> iterable of values, each with the record's key."""
        return self._next(g.FLAT_MAP_VALUES, _check_fn(fn, "flat_map_values"),
                          **self._serdes(None, value_serde))

    def peek(self, fn: Callable) -> "KStream":
        """Calls fn(key, value) for its side effect and passes the record on."""
        return self._next(g.PEEK, _check_fn(fn, "peek"))

    def group_by(self, fn: Callable, key_serde: Any = None, value_serde: Any = None) -> "KGroupedStream":
        """Groups by fn(key, value) -> new_key; the aggregation that follows shuffles by it."""
        node = self._b._add(g.KEY_SELECT, self._node, fn=_check_fn(fn, "group_by"),
                            **self._serdes(key_serde, value_serde))
        return KGroupedStream(self._b, node)

    def group_by_key(self, key_serde: Any = None, value_serde: Any = None) -> "KGroupedStream":
        """Groups by the current key. Passing key_serde changes the key's bytes, so it shuffles like
        group_by (the shuffle partitions by the key's bytes)."""
        if key_serde is None:
            return KGroupedStream(self._b, self._node, None, value_serde)
        node = self._b._add(g.KEY_SELECT, self._node, fn=_same_key, key_serde=key_serde,
                            **self._serdes(None, value_serde))
        return KGroupedStream(self._b, node)

    def join(self, table: "KTable", joiner: Callable, how: str = "inner") -> "KStream":
        """Stream-table join: each stream record looks its key up in the table's store (the same task
        holds both: they must be partitioned by the same key bytes, checked at compile()).
        joiner(stream_value, table_value) -> value; how="left" calls it with table_value None when the
        key is missing, "inner" drops the record."""
        if not isinstance(table, KTable):
            raise TopologyError(f"join needs a KTable, got {type(table).__name__} (stream-stream "
                                f"joins are not supported)")
        if how not in ("inner", "left"):
            raise TopologyError(f"join how must be 'inner' or 'left', got {how!r}")
        if table._windowed:
            raise TopologyError("joining a stream with a windowed table is not supported")
        node = self._b._add(g.JOIN, self._node, fn=_check_fn(joiner, "join"), table=table._node,
                            params={"how": how})
        return KStream(self._b, node)

    def left_join(self, table: "KTable", joiner: Callable) -> "KStream":
        return self.join(table, joiner, how="left")

    def process(self, processor: Any, stores: Iterable[Any] = (), key_serde: Any = None,
                value_serde: Any = None) -> "KStream":
        """Processor API. `processor` is a class (or a zero-argument factory) whose instances have
        init(context) and process(key, value) (and optionally close()); one instance per task.
        `stores`: kv_store(...)/window_store(...)/StoreSpec declarations, or names of stores declared
        elsewhere in this topology (a bare new name declares a json/json kv store). The records it
        context.forward()s flow downstream (its output key may differ: a later aggregation would
        need a second shuffle, which is rejected)."""
        if not callable(processor):
            raise TopologyError(f"process needs a processor class or factory, got an instance of "
                                f"{type(processor).__name__}: pass the class itself")
        if not inspect.isclass(processor) and hasattr(processor, "process"):
            raise TopologyError(f"process needs a processor class or factory, got an instance of "
                                f"{type(processor).__name__}: pass the class itself")
        if isinstance(stores, (str, StoreDecl)):
            stores = [stores]
        node = self._b._add(g.PROCESS, self._node, fn=processor,
                            params={"processor": getattr(processor, "__name__", repr(processor))},
                            **self._serdes(key_serde, value_serde))
        for s in stores:
            if isinstance(s, str):
                g.check_name("store", s)
                node.params.setdefault("store_refs", []).append(s)
            else:
                self._b._declare(as_decl(s), node, "process")
        return KStream(self._b, node)

    def to(self, topic: str, key_serde: Any = None, value_serde: Any = None) -> None:
        """Writes the stream to a topic (through the engine's sink)."""
        if not isinstance(topic, str) or not topic:
            raise TopologyError(f"sink topic must be a non-empty string, got {topic!r}")
        self._b._add(g.SINK, self._node, params={"topic": topic},
                     **self._serdes(key_serde, value_serde))


class KGroupedStream:
    """A stream grouped by key, waiting for an aggregation."""

    def __init__(self, builder: TopologyBuilder, node: Node, key_serde: Any = None,
                 value_serde: Any = None) -> None:
        self._b = builder
        self._node = node
        self.key_serde = node.key_serde if key_serde is None else key_serde
        self.value_serde = node.value_serde if value_serde is None else value_serde

    def _agg(self, op: str, fn: Any, store: Any, value_serde: Any, hint: str) -> "KTable":
        node = self._b._add(g.AGGREGATE, self._node, fn=fn, params={"op": op},
                            key_serde=self.key_serde, value_serde=value_serde)
        self._b._declare(as_decl(store, key_serde=self.key_serde, value_serde=value_serde), node, hint)
        return KTable(self._b, node)

    def count(self, store: Any = None) -> "KTable":
        """Count per key (records with a None key or value are skipped, as in Kafka Streams).

        Downstream (to_stream()) sees, with the store's caching on (the default), the latest count
        of each key once per commit (micro-batch), in first-update order; with
        `store=kv_store(name, caching=False)` (or no record cache) every update. The same rule holds
        for reduce/aggregate and the windowed aggregations (see `TaskProcessor`)."""
        return self._agg("count", None, store, "int64", f"{self._node.origin}-count")

    def reduce(self, fn: Callable, store: Any = None, value_serde: Any = None) -> "KTable":
        """fn(aggregate, value) -> aggregate; the first value of a key is its aggregate."""
        return self._agg("reduce", _check_fn(fn, "reduce"), store,
                         self.value_serde if value_serde is None else value_serde,
                         f"{self._node.origin}-reduce")

    def aggregate(self, initializer: Callable, aggregator: Callable, store: Any = None,
                  value_serde: Any = "json") -> "KTable":
        """initializer() -> first aggregate; aggregator(key, value, aggregate) -> new aggregate."""
        _check_fn(initializer, "aggregate initializer")
        _check_fn(aggregator, "aggregate aggregator")
        return self._agg("aggregate", (initializer, aggregator), store, value_serde,
                         f"{self._node.origin}-aggregate")

    def windowed_by(self, windows: TimeWindows, grace_ms: int = 0) -> "TimeWindowedKStream":
        if not isinstance(windows, TimeWindows):
            raise TopologyError("windowed_by needs tumbling(size_ms) or hopping(size_ms, advance_ms)")
        if int(grace_ms) < 0:
            raise TopologyError(f"grace_ms must be >= 0, got {grace_ms}")
        return TimeWindowedKStream(self, windows, int(grace_ms))


class TimeWindowedKStream:
    """A grouped stream cut into time windows (by record timestamp). Results are keyed by
    (key, window_start) and kept in a window store; a record is dropped for a window that closed
    (window end + grace <= the task's stream time, the highest timestamp it has seen)."""

    def __init__(self, grouped: KGroupedStream, windows: TimeWindows, grace_ms: int) -> None:
        self._g = grouped
        self.windows = windows
        self.grace_ms = grace_ms

    def _agg(self, op: str, fn: Any, store: Any, value_serde: Any, hint: str,
             retention_ms: Optional[int]) -> "KTable":
        gs = self._g
        b = gs._b
        if retention_ms is None:
            retention_ms = self.windows.size_ms + self.grace_ms
        if retention_ms < self.windows.size_ms + self.grace_ms:
            raise TopologyError(f"retention_ms {retention_ms} is shorter than window size + grace "
                                f"({self.windows.size_ms + self.grace_ms} ms)")
        node = b._add(g.WINDOW_AGGREGATE, gs._node, fn=fn,
                      params={"op": op, "windows": self.windows, "grace_ms": self.grace_ms},
                      key_serde=WindowedSerde(gs.key_serde), value_serde=value_serde)
        node.params["group_key_serde"] = gs.key_serde
        decl = as_decl(store, kind="window", key_serde=gs.key_serde, value_serde=value_serde)
        if decl.kind != "window":
            raise TopologyError(f"windowed {op} needs a window store, got kind {decl.kind!r}")
        if decl.window_size_ms is None:
            decl.window_size_ms = self.windows.size_ms
        elif decl.window_size_ms != self.windows.size_ms:
            raise TopologyError(f"store {decl.name!r} has window size {decl.window_size_ms} ms but the "
                                f"windows are {self.windows.size_ms} ms")
        if decl.retention_ms is None or store is None or isinstance(store, str):
            decl.retention_ms = int(retention_ms)
        elif decl.retention_ms < self.windows.size_ms + self.grace_ms:
            raise TopologyError(f"store {decl.name!r}: retention_ms {decl.retention_ms} is shorter "
                                f"than window size + grace ({self.windows.size_ms + self.grace_ms} ms)")
        b._declare(decl, node, hint)
        return KTable(b, node, windowed=True)

    def count(self, store: Any = None, retention_ms: Optional[int] = None) -> "KTable":
        return self._agg("count", None, store, "int64", f"{self._g._node.origin}-windowed-count",
                         retention_ms)

    def reduce(self, fn: Callable, store: Any = None, value_serde: Any = None,
               retention_ms: Optional[int] = None) -> "KTable":
        return self._agg("reduce", _check_fn(fn, "reduce"), store,
                         self._g.value_serde if value_serde is None else value_serde,
                         f"{self._g._node.origin}-windowed-reduce", retention_ms)

    def aggregate(self, initializer: Callable, aggregator: Callable, store: Any = None,
                  value_serde: Any = "json", retention_ms: Optional[int] = None) -> "KTable":
        _check_fn(initializer, "aggregate initializer")
        _check_fn(aggregator, "aggregate aggregator")
        return self._agg("aggregate", (initializer, aggregator), store, value_serde,
                         f"{self._g._node.origin}-windowed-aggregate", retention_ms)


class KTable:
    """A changelog stream seen as a table. Materialized tables (a table() source or an aggregation)
    keep their store; filter/map_values here are stateless views (read through on joins)."""

    def __init__(self, builder: TopologyBuilder, node: Node, windowed: bool = False) -> None:
        self._b = builder
        self._node = node
        self._windowed = windowed

    @property
    def node_name(self) -> str:
        return self._node.name

    @property
    def store_name(self) -> Optional[str]:
        """The store holding this table (None until compile() names an auto-named store)."""
        n = self._node
        while n is not None and not n.stores:
            n = n.parent
        if n is None:
            return None
        s = n.stores[0]
        return s if isinstance(s, str) else s.name

    def to_stream(self) -> KStream:
        """The table's updates as a stream of (key, new_value) (None = deleted / filtered out)."""
        return KStream(self._b, self._b._add(g.TO_STREAM, self._node))

    def filter(self, fn: Callable) -> "KTable":
        """A view keeping rows where fn(key, value) is true; an update that fails the predicate is
        forwarded as (key, None), a delete, as Kafka Streams does."""
        return KTable(self._b, self._b._add(g.TABLE_FILTER, self._node, fn=_check_fn(fn, "filter")),
                      self._windowed)

    def map_values(self, fn: Callable, value_serde: Any = None) -> "KTable":
        kw = {} if value_serde is None else {"value_serde": value_serde}
        return KTable(self._b, self._b._add(g.TABLE_MAP_VALUES, self._node,
                                            fn=_check_fn(fn, "map_values"), **kw), self._windowed)
