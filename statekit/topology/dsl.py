"""The DSL: TopologyBuilder, KStream, KGroupedStream, TimeWindowedKStream, SessionWindowedKStream,
SlidingWindowedKStream, KTable, KGroupedTable.

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
from statekit.stores.serdes import ListSerde, TimestampedSerde
from statekit.topology import graph as g
from statekit.topology.graph import (JoinWindows, Node, SessionWindows, SlidingWindows, StoreDecl,
                                     Suppressed, TimeWindows, as_decl)
from statekit.topology.serdes import (CombinedKeySerde, JoinSideKeySerde, ResponseSerde,
                                      SessionWindowedSerde, SideListSerde, SubscriptionSerde,
                                      WindowedSerde)


class TopologyBuilder:
    """Builds the graph. `compile()` checks it and returns the engine-agnostic `Plan`."""

    def __init__(self, require_store_names: bool = False) -> None:
        self.require_store_names = require_store_names
        self.nodes: list[Node] = []
        self.stores: list[StoreDecl] = []      # in declaration order
        self._sources: dict[str, Node] = {}    # topic -> SOURCE node
        self._counter = 0

    # -- internals -----------------------------------------------------------------------------
    def _add(self, kind: str, parent: Optional[Node], label: Optional[str] = None, **kw) -> Node:
        name = f"{label or g.KS_NAMES[kind]}-{self._counter:010d}"
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

    def compile(self, application: Optional[str] = None, *, engine_shuffle: bool = False):
        """Check the graph and return its `Plan`. `application` names the internal topics
        (`<application>-<name>-repartition`): a topology that needs one (a key change before a
        stateful step) cannot compile without it. `engine_shuffle`: for an engine that partitions
        records by key itself (see `statekit.topology.compile`)."""
        from statekit.topology.compile import compile_plan

        return compile_plan(self, application, engine_shuffle=engine_shuffle)

    def describe(self, application: Optional[str] = None) -> dict:
        """describe() of the plan; without an application, internal topics show `<application>`."""
        return self.compile(application or PLACEHOLDER_APP).describe(application or PLACEHOLDER_APP)


PLACEHOLDER_APP = "<application>"


def _same_key(key, value):
    return key


def _value_serde(kw_serde, default):
    return default if kw_serde is None else kw_serde


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

    def join(self, other: Any, joiner: Callable, windows: Optional[JoinWindows] = None,
             how: str = "inner", store: Any = None, value_serde: Any = None) -> "KStream":
        """Join with a KTable (stream-table: each record looks its key up in the table's store) or,
        with `windows=JoinWindows(before_ms, after_ms, grace_ms)`, with another KStream
        (stream-stream: records of both sides with the same key and timestamps within the window
        meet; each side waits in a window store with a changelog). joiner(left_value, right_value)
        -> value. how: "inner", "left" (a left record without a match gives joiner(v, None); for
        a stream-stream join once its window has closed), "outer" (stream-stream only: unmatched
        records of both sides). Both inputs must be keyed by the same key serde; a key changed
        inside a task is repartitioned first. `store`: the base name of the join's stores
        (`<store>-left`, `<store>-right`, `<store>-outer`). Null keys and values follow Kafka
        Streams: skipped, except that a left/outer stream-stream join emits a null-key record at
        once as unmatched."""
        if how not in ("inner", "left", "outer"):
            raise TopologyError(f"join how must be 'inner', 'left' or 'outer', got {how!r}")
        _check_fn(joiner, "join")
        if isinstance(other, KStream):
            if windows is None:
                raise TopologyError("a stream-stream join needs windows=JoinWindows(before_ms, "
                                    "after_ms, grace_ms): how far apart two records may be to meet")
            if not isinstance(windows, JoinWindows):
                raise TopologyError(f"windows must be JoinWindows(before_ms, after_ms, grace_ms), "
                                    f"got {type(windows).__name__}")
            return self._stream_join(other, joiner, windows, how, store, value_serde)
        if not isinstance(other, KTable):
            raise TopologyError(f"join needs a KTable or a KStream, got {type(other).__name__}")
        if windows is not None:
            raise TopologyError("a stream-table join has no windows (the table's current value is "
                                "used): leave windows out")
        if how == "outer":
            raise TopologyError("a stream-table join is 'inner' or 'left' (an outer join needs two "
                                "streams or two tables)")
        if other._windowed:
            raise TopologyError("joining a stream with a windowed table is not supported: its keys "
                                "are (key, window); to_stream() it and join it as a stream")
        kw = {} if value_serde is None else {"value_serde": value_serde}
        node = self._b._add(g.JOIN, self._node, fn=joiner, table=other._node,
                            params={"how": how}, **kw)
        return KStream(self._b, node)

    def left_join(self, other: Any, joiner: Callable, windows: Optional[JoinWindows] = None,
                  store: Any = None, value_serde: Any = None) -> "KStream":
        return self.join(other, joiner, windows, "left", store, value_serde)

    def outer_join(self, other: "KStream", joiner: Callable, windows: JoinWindows,
                   store: Any = None, value_serde: Any = None) -> "KStream":
        if not isinstance(other, KStream):
            raise TopologyError(f"outer_join needs a KStream, got {type(other).__name__}")
        return self.join(other, joiner, windows, "outer", store, value_serde)

    def _stream_join(self, other: "KStream", joiner, windows: JoinWindows, how: str, store,
                     value_serde) -> "KStream":
        b = self._b
        left, right = self._node, other._node
        base = None
        if store is not None:
            if not isinstance(store, str):
                raise TopologyError("a stream-stream join's store= is the base name of its stores "
                                    "(a string): they become <store>-left, -right and -outer")
            base = g.check_name("store", store)
        hint = f"{left.origin}-{right.origin}-join"
        retention = max(windows.size_ms + windows.grace_ms, 1)
        size = windows.size_ms if windows.size_ms > 0 else None
        outer = how in ("left", "outer")
        params = {"how": how, "windows": windows}
        this = b._add(g.STREAM_JOIN, left, fn=joiner, label="KSTREAM-OUTERTHIS" if how == "outer"
                      else "KSTREAM-JOINTHIS", params=dict(params, side="left"))
        that = b._add(g.STREAM_JOIN, right, fn=joiner, label="KSTREAM-OUTEROTHER" if outer
                      else "KSTREAM-JOINOTHER", params=dict(params, side="right"),
                      key_serde=left.key_serde)
        this.params["join"] = that.params["join"] = this.name
        decls = []
        for side, node in (("left", left), ("right", right)):
            d = StoreDecl(None if base is None else f"{base}-{side}", "window", left.key_serde,
                          ListSerde(node.value_serde), caching=False, retention_ms=retention,
                          window_size_ms=size)
            decls.append(b._declare(d, this if side == "left" else that, f"{hint}-{side}"))
        this.stores.append(decls[1])   # each side reads the other side's buffer too
        that.stores.append(decls[0])
        if outer:
            d = StoreDecl(None if base is None else f"{base}-outer", "kv",
                          JoinSideKeySerde(left.key_serde),
                          SideListSerde(left.value_serde, right.value_serde), caching=False)
            b._declare(d, this, f"{hint}-outer")
            that.stores.append(d)
        merged = b._add(g.MERGE, this, label="KSTREAM-MERGE",
                        value_serde=left.value_serde if value_serde is None else value_serde)
        merged.extra_parents.append(that)
        that.children.append(merged)
        return KStream(b, merged)

    def merge(self, other: "KStream") -> "KStream":
        """The records of both streams, as one stream (keys and values as they are)."""
        if not isinstance(other, KStream):
            raise TopologyError(f"merge needs a KStream, got {type(other).__name__}")
        node = self._b._add(g.MERGE, self._node)
        node.extra_parents.append(other._node)
        other._node.children.append(node)
        return KStream(self._b, node)

    def process(self, processor: Any, stores: Iterable[Any] = (), key_serde: Any = None,
                value_serde: Any = None) -> "KStream":
        """Processor API. `processor` is a class (or a zero-argument factory) whose instances have
        init(context) and process(key, value) (and optionally close()); one instance per task.
        `stores`: kv_store(...)/window_store(...)/StoreSpec declarations, or names of stores declared
        elsewhere in this topology (a bare new name declares a json/json kv store). The records it
        context.forward()s flow downstream (its output key may differ: a later stateful step then
        reads them through a repartition topic). `context.schedule(interval_ms, PunctuationType.
        STREAM_TIME | WALL_CLOCK_TIME, callback)` in init() registers a punctuator (see
        statekit.topology.processor)."""
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

    def windowed_by(self, windows: Any, grace_ms: Optional[int] = None):
        """Cut the groups into windows: tumbling(...)/hopping(...) (TimeWindowedKStream),
        SessionWindows(gap_ms, grace_ms) (SessionWindowedKStream) or SlidingWindows(difference_ms,
        grace_ms) (SlidingWindowedKStream). `grace_ms` here overrides the windows' own grace."""
        if grace_ms is not None and int(grace_ms) < 0:
            raise TopologyError(f"grace_ms must be >= 0, got {grace_ms}: how long a window accepts "
                                f"late records after it ends; pass 0 or more")
        if isinstance(windows, TimeWindows):
            return TimeWindowedKStream(self, windows, int(grace_ms or 0))
        if isinstance(windows, SessionWindows):
            if grace_ms is not None:
                windows = SessionWindows(windows.gap_ms, int(grace_ms))
            return SessionWindowedKStream(self, windows)
        if isinstance(windows, SlidingWindows):
            if grace_ms is not None:
                windows = SlidingWindows(windows.difference_ms, int(grace_ms))
            return SlidingWindowedKStream(self, windows)
        raise TopologyError("windowed_by needs tumbling(size_ms), hopping(size_ms, advance_ms), "
                            "SessionWindows(gap_ms, grace_ms) or SlidingWindows(difference_ms, "
                            "grace_ms)")


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


class SessionWindowedKStream:
    """A grouped stream cut into sessions (see SessionWindows). Results are keyed by
    (key, start, end) and kept in a session store; when a record bridges two sessions they merge
    (the merged ones are deleted: their keys get a None update downstream). A record is dropped
    when its (merged) session ends before stream time - gap - grace. As in Kafka Streams, only a
    None key skips a record: a None value reaches the aggregator (count counts it)."""

    def __init__(self, grouped: KGroupedStream, windows: SessionWindows) -> None:
        self._g = grouped
        self.windows = windows

    def _agg(self, op: str, fn: Any, store: Any, value_serde: Any, hint: str,
             retention_ms: Optional[int]) -> "KTable":
        gs = self._g
        b = gs._b
        w = self.windows
        least = w.gap_ms + w.grace_ms
        decl = as_decl(store, kind="session", key_serde=gs.key_serde, value_serde=value_serde)
        if decl.kind != "session":
            raise TopologyError(f"a session-windowed {op} needs a session store "
                                f"(session_store(...) or a name), got kind {decl.kind!r}")
        if retention_ms is not None:
            decl.retention_ms = int(retention_ms)
        if decl.retention_ms is None:
            decl.retention_ms = least
        if decl.retention_ms < least:
            raise TopologyError(f"session store {decl.name or hint!r}: retention_ms "
                                f"{decl.retention_ms} is shorter than gap + grace ({least} ms)")
        node = b._add(g.SESSION_AGGREGATE, gs._node, fn=fn,
                      params={"op": op, "windows": w, "grace_ms": w.grace_ms,
                              "retention_ms": decl.retention_ms},
                      key_serde=SessionWindowedSerde(gs.key_serde), value_serde=value_serde)
        node.params["group_key_serde"] = gs.key_serde
        b._declare(decl, node, hint)
        return KTable(b, node, windowed=True)

    def count(self, store: Any = None, retention_ms: Optional[int] = None) -> "KTable":
        return self._agg("count", None, store, "int64", f"{self._g._node.origin}-session-count",
                         retention_ms)

    def reduce(self, fn: Callable, store: Any = None, value_serde: Any = None,
               retention_ms: Optional[int] = None) -> "KTable":
        return self._agg("reduce", _check_fn(fn, "reduce"), store,
                         _value_serde(value_serde, self._g.value_serde),
                         f"{self._g._node.origin}-session-reduce", retention_ms)

    def aggregate(self, initializer: Callable, aggregator: Callable, merger: Callable,
                  store: Any = None, value_serde: Any = "json",
                  retention_ms: Optional[int] = None) -> "KTable":
        """initializer() -> aggregate; aggregator(key, value, aggregate) -> aggregate;
        merger(key, aggregate1, aggregate2) -> the aggregate of two sessions that merge."""
        _check_fn(initializer, "aggregate initializer")
        _check_fn(aggregator, "aggregate aggregator")
        _check_fn(merger, "session aggregate merger")
        return self._agg("aggregate", (initializer, aggregator, merger), store, value_serde,
                         f"{self._g._node.origin}-session-aggregate", retention_ms)


class SlidingWindowedKStream:
    """A grouped stream cut into sliding windows (see SlidingWindows): Kafka Streams' algorithm,
    each record updating the windows it falls in and creating its own left window [t - d, t] and,
    when later records need it, its right window [t + 1, t + 1 + d]. Results are keyed by
    (key, window_start) (the window is [start, start + d], both ends included) and kept in a window
    store as (max record timestamp, aggregate). Records with a None key or value are skipped;
    records whose window [t, t + d] ends before stream time - grace are dropped."""

    def __init__(self, grouped: KGroupedStream, windows: SlidingWindows) -> None:
        self._g = grouped
        self.windows = windows

    def _agg(self, op: str, fn: Any, store: Any, value_serde: Any, hint: str,
             retention_ms: Optional[int]) -> "KTable":
        gs = self._g
        b = gs._b
        w = self.windows
        least = max(2 * w.difference_ms + w.grace_ms, 1)
        decl = as_decl(store, kind="window", key_serde=gs.key_serde,
                       value_serde=TimestampedSerde(value_serde))
        if decl.kind != "window":
            raise TopologyError(f"a sliding-windowed {op} needs a window store, got kind "
                                f"{decl.kind!r}")
        if not isinstance(decl.value_serde, TimestampedSerde):
            decl.value_serde = TimestampedSerde(decl.value_serde)
        if retention_ms is not None:
            decl.retention_ms = int(retention_ms)
        elif decl.retention_ms is None or store is None or isinstance(store, str):
            decl.retention_ms = least
        if decl.retention_ms < least:
            raise TopologyError(f"store {decl.name or hint!r}: retention_ms {decl.retention_ms} is "
                                f"shorter than 2 * difference + grace ({least} ms)")
        decl.window_size_ms = max(w.difference_ms, 1)
        node = b._add(g.SLIDING_AGGREGATE, gs._node, fn=fn,
                      params={"op": op, "windows": w, "grace_ms": w.grace_ms,
                              "retention_ms": decl.retention_ms},
                      key_serde=WindowedSerde(gs.key_serde), value_serde=value_serde)
        node.params["group_key_serde"] = gs.key_serde
        b._declare(decl, node, hint)
        return KTable(b, node, windowed=True)

    def count(self, store: Any = None, retention_ms: Optional[int] = None) -> "KTable":
        return self._agg("count", None, store, "int64", f"{self._g._node.origin}-sliding-count",
                         retention_ms)

    def reduce(self, fn: Callable, store: Any = None, value_serde: Any = None,
               retention_ms: Optional[int] = None) -> "KTable":
        return self._agg("reduce", _check_fn(fn, "reduce"), store,
                         _value_serde(value_serde, self._g.value_serde),
                         f"{self._g._node.origin}-sliding-reduce", retention_ms)

    def aggregate(self, initializer: Callable, aggregator: Callable, store: Any = None,
                  value_serde: Any = "json", retention_ms: Optional[int] = None) -> "KTable":
        _check_fn(initializer, "aggregate initializer")
        _check_fn(aggregator, "aggregate aggregator")
        return self._agg("aggregate", (initializer, aggregator), store, value_serde,
                         f"{self._g._node.origin}-sliding-aggregate", retention_ms)


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

    # -- table-table joins ---------------------------------------------------------------------------
    def join(self, other: "KTable", joiner_or_fk: Callable, joiner: Optional[Callable] = None,
             how: str = "inner", store: Any = None, value_serde: Any = None) -> "KTable":
        """Join two tables. `join(other, joiner)`: on the key (both tables keyed by the same key
        serde, in the same task); the result is a table whose row for a key is joiner(left, right)
        (how="left": also rows with no right value, joiner(left, None); "outer": rows of either).
        `join(other, foreign_key_extractor, joiner)`: a foreign-key join (Kafka Streams KIP-213):
        each left row joins the `other` row whose key is foreign_key_extractor(left_value);
        subscriptions travel to the foreign key's task through a repartition topic and wait in a
        subscription store, answers come back through another; the result is kept in a kv store
        (`store` names it, and the subscription store `<store>-subscription`); how "inner" or
        "left"."""
        if not isinstance(other, KTable):
            raise TopologyError(f"a table join needs a KTable, got {type(other).__name__} (join a "
                                f"stream with stream.join(table, ...))")
        if how not in ("inner", "left", "outer"):
            raise TopologyError(f"join how must be 'inner', 'left' or 'outer', got {how!r}")
        if self._windowed or other._windowed:
            raise TopologyError("joining windowed tables is not supported: to_stream() them and "
                                "join the streams with JoinWindows")
        if joiner is not None:
            if how == "outer":
                raise TopologyError("a foreign-key join is 'inner' or 'left'")
            return self._fk_join(other, _check_fn(joiner_or_fk, "foreign_key_extractor"),
                                 _check_fn(joiner, "join"), how, store, value_serde)
        joiner = _check_fn(joiner_or_fk, "join")
        if store is not None:
            raise TopologyError("a table-table join on the key keeps no store of its own (its rows "
                                "are computed from both tables' stores): leave store= out")
        b = self._b
        left, right = self._node, other._node
        kw = {} if value_serde is None else {"value_serde": value_serde}
        this = b._add(g.TABLE_JOIN, left, fn=joiner, table=right, label="KTABLE-JOINTHIS",
                      params={"how": how, "side": "left"}, **kw)
        that = b._add(g.TABLE_JOIN, right, fn=joiner, table=left, label="KTABLE-JOINOTHER",
                      params={"how": how, "side": "right"}, key_serde=left.key_serde,
                      value_serde=this.value_serde)
        merged = b._add(g.TABLE_MERGE, this, params={"how": how})
        merged.extra_parents.append(that)
        that.children.append(merged)
        return KTable(b, merged)

    def left_join(self, other: "KTable", joiner_or_fk: Callable, joiner: Optional[Callable] = None,
                  store: Any = None, value_serde: Any = None) -> "KTable":
        return self.join(other, joiner_or_fk, joiner, "left", store, value_serde)

    def outer_join(self, other: "KTable", joiner: Callable, value_serde: Any = None) -> "KTable":
        return self.join(other, joiner, None, "outer", None, value_serde)

    def _fk_join(self, other: "KTable", extractor, joiner, how, store, value_serde) -> "KTable":
        b = self._b
        left, foreign = self._node, other._node
        base = None
        if store is not None:
            if not isinstance(store, str):
                raise TopologyError("a foreign-key join's store= is a base name (a string): its "
                                    "stores become <store>-subscription and <store>")
            base = g.check_name("store", store)
        params = {"how": how}
        send = b._add(g.FK_SEND, left, fn=extractor, params=params,
                      key_serde=foreign.key_serde, value_serde=SubscriptionSerde(left.key_serde))
        recv = b._add(g.FK_RECEIVE, send, table=foreign, params=params,
                      key_serde=left.key_serde, value_serde=ResponseSerde(foreign.value_serde))
        sub = StoreDecl(None if base is None else f"{base}-subscription", "kv",
                        CombinedKeySerde(foreign.key_serde, left.key_serde),
                        SubscriptionSerde(left.key_serde), caching=False)
        b._declare(sub, recv, f"{left.origin}-{foreign.origin}-fk-subscription")
        fore = b._add(g.FK_FOREIGN, foreign, params=params, key_serde=left.key_serde,
                      value_serde=ResponseSerde(foreign.value_serde))
        fore.stores.append(sub)
        merged = b._add(g.MERGE, recv, label="KTABLE-FK-JOIN-RESPONSES")
        merged.extra_parents.append(fore)
        fore.children.append(merged)
        resp = b._add(g.FK_RESPONSE, merged, fn=joiner, table=left, params=params,
                      key_serde=left.key_serde,
                      value_serde=left.value_serde if value_serde is None else value_serde)
        b._declare(StoreDecl(base, "kv", left.key_serde, resp.value_serde), resp,
                   f"{left.origin}-{foreign.origin}-fk-join")
        return KTable(b, resp)

    # -- re-aggregation --------------------------------------------------------------------------------
    def group_by(self, fn: Callable, key_serde: Any = None, value_serde: Any = None) -> "KGroupedTable":
        """Group the table's rows by fn(key, value) -> group key, for count/aggregate/reduce with
        an adder *and a subtractor*: when a row changes (or moves to another group) its old value
        is subtracted from its old group and its new value added to its new group. The groups are
        repartitioned by their key."""
        if self._windowed:
            raise TopologyError("group_by on a windowed table is not supported: to_stream() it "
                                "and group the stream")
        kw = {}
        if key_serde is not None:
            kw["key_serde"] = key_serde
        if value_serde is not None:
            kw["value_serde"] = value_serde
        node = self._b._add(g.TABLE_GROUP_BY, self._node, fn=_check_fn(fn, "group_by"), **kw)
        return KGroupedTable(self._b, node)

    # -- suppression -----------------------------------------------------------------------------------
    def suppress(self, until: Suppressed, store: Any = None) -> "KTable":
        """Hold updates back in a buffer store (with a changelog, so a crash neither loses nor
        repeats a final result): until_window_closes() emits each window's final value once,
        when stream time passes the window's end + grace (windowed tables only); until_time_limit(ms)
        the latest value of a key, ms of stream time after its first held update."""
        if not isinstance(until, Suppressed):
            raise TopologyError("suppress needs until_window_closes() or until_time_limit(ms)")
        if until.kind == "window_close" and not self._windowed:
            raise TopologyError("suppress(until_window_closes()) needs a windowed table (a "
                                "windowed count/reduce/aggregate): a plain table's rows never "
                                "close; use until_time_limit(ms) instead")
        b = self._b
        n = self._node
        node = b._add(g.SUPPRESS, n, params={"until": until})
        decl = as_decl(store, kind="buffer", key_serde=n.key_serde, value_serde=n.value_serde)
        if decl.kind not in ("buffer", "kv"):
            raise TopologyError(f"suppress keeps its buffer in a buffer store; pass a name, got a "
                                f"{decl.kind} store")
        decl.kind = "buffer"
        b._declare(decl, node, f"{n.origin}-suppress")
        return KTable(b, node, self._windowed)


class KGroupedTable:
    """A table grouped by a new key (KTable.group_by), waiting for an aggregation with a subtractor."""

    def __init__(self, builder: TopologyBuilder, node: Node) -> None:
        self._b = builder
        self._node = node

    def _agg(self, op: str, fn: Any, store: Any, value_serde: Any, hint: str) -> KTable:
        n = self._node
        node = self._b._add(g.TABLE_AGGREGATE, n, fn=fn, params={"op": op},
                            key_serde=n.key_serde, value_serde=value_serde)
        self._b._declare(as_decl(store, key_serde=n.key_serde, value_serde=value_serde), node, hint)
        return KTable(self._b, node)

    def count(self, store: Any = None) -> KTable:
        """Rows per group (a group whose rows all left keeps the count 0, as in Kafka Streams)."""
        return self._agg("count", None, store, "int64", f"{self._node.origin}-table-count")

    def reduce(self, adder: Callable, subtractor: Callable, store: Any = None,
               value_serde: Any = None) -> KTable:
        """adder(aggregate, value), subtractor(aggregate, value) -> aggregate."""
        _check_fn(adder, "reduce adder")
        _check_fn(subtractor, "reduce subtractor")
        return self._agg("reduce", (adder, subtractor), store,
                         _value_serde(value_serde, self._node.value_serde),
                         f"{self._node.origin}-table-reduce")

    def aggregate(self, initializer: Callable, adder: Callable, subtractor: Callable,
                  store: Any = None, value_serde: Any = "json") -> KTable:
        """initializer() -> aggregate; adder(key, value, aggregate) and subtractor(key, value,
        aggregate) -> aggregate."""
        _check_fn(initializer, "aggregate initializer")
        _check_fn(adder, "aggregate adder")
        _check_fn(subtractor, "aggregate subtractor")
        return self._agg("aggregate", (initializer, adder, subtractor), store, value_serde,
                         f"{self._node.origin}-table-aggregate")
