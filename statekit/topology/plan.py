"""compile(): checks a topology graph and turns it into the engine-agnostic `Plan`.

A plan has two halves around exactly one shuffle (one Kafka Streams sub-topology with a repartition):

* pre-shuffle — the stateless steps from each source up to the first step that needs its records
  partitioned by key (an aggregation, a table's materialization, a join) or that runs in a task
  (process, sinks). Engines run it where the records are read (Spark stage 1).
* the task — everything after: stores, joins, processors and sinks, one `TaskProcessor` per task.

Each edge that crosses the shuffle is a *route* (usually one per source; more when a source branches
before the shuffle). A route knows the key serde whose bytes pick the task
(`statekit.partition.partition_for(key_bytes, partitions)`, the same function interactive queries use
with the store's key serde).

Engines use the bytes-level pair:

    for task, record in plan.shuffle(source_index, key_bytes, value_bytes, timestamp, partition,
                                     offset, partitions):
        ...  # ship `record` (a tuple of ints and bytes) to task `task`
    # in the task: statekit.worker.task.StreamTask.process(batch_id, records)

`record` = (route, source_partition, offset, timestamp, key_pickle, value_pickle): the Python key and
value pickled for the trip through the shuffle only (never stored: stores use their serdes).

Forwarding rule (see `TaskProcessor`): an aggregation whose store has caching on (the default) in a
task with a record cache (`context.cache_bytes > 0`) forwards, at `TaskProcessor.flush()` (once per
commit, i.e. per micro-batch), the latest value of each key it updated, in first-update order; with
caching off it forwards every update as it happens — Kafka Streams' KTable cache behaviour.
"""
from __future__ import annotations

import pickle
from dataclasses import dataclass
from typing import Any, Iterator, Optional

from statekit.errors import ProcessorError, StatekitError, TopologyError
from statekit.partition import partition_for
from statekit.topology import graph as g
from statekit.topology.graph import Node, StoreDecl, resolve_serde, serde_label
from statekit.topology.processor import ProcessorContext

_DUMPS = pickle.dumps
_LOADS = pickle.loads
_PROTO = pickle.HIGHEST_PROTOCOL

_NONE_PICKLE = _DUMPS(None, _PROTO)
_MEMO_MAX = 1 << 16          # entries per shuffle memo (key bytes -> task, str -> pickle)
_PICKLE_MEMO_LEN = 64        # only str keys/values this short have their pickle memoized
_LOADS_MEMO_BYTES = 80       # only pickles this short are memoized (to a str) in a task's batch

# Names reserved for stores statekit adds to a task (`_task`: the outbox and stream time).
RESERVED_PREFIX = "_"


@dataclass(frozen=True)
class SourceSpec:
    index: int
    topic: str
    role: str            # "stream" | "table"
    key_serde: Any
    value_serde: Any
    node: str


@dataclass(frozen=True)
class SinkSpec:
    topic: str
    key_serde: Any
    value_serde: Any


@dataclass(frozen=True)
class RouteSpec:
    """One edge across the shuffle: records of `source_index` that reach `target` (a task node)."""

    index: int
    source_index: int
    target: str
    key_serde: Any       # its bytes pick the task
    keyed: bool          # the target needs a key: records with a None key are dropped (as Kafka
                         # Streams skips them); otherwise a None key goes to task partition % N


# -- compile -------------------------------------------------------------------------------------

def _describe_step(n: Node) -> str:
    if n.kind in (g.AGGREGATE, g.WINDOW_AGGREGATE):
        return ("windowed " if n.kind == g.WINDOW_AGGREGATE else "") + n.params.get("op", "aggregate")
    if n.kind == g.PROCESS:
        return f"process({n.params.get('processor')})"
    if n.kind == g.JOIN:
        return f"{n.params.get('how')} join"
    return n.kind.replace("_", " ")


def _resolve_stores(builder) -> list:
    decls: list[StoreDecl] = builder.stores
    taken: dict[str, StoreDecl] = {}
    for d in decls:
        if d.name is None:
            continue
        if d.name.startswith(RESERVED_PREFIX):
            raise TopologyError(f"store name {d.name!r} is reserved (names starting with "
                                f"{RESERVED_PREFIX!r} belong to statekit); pick another")
        if d.name in taken and taken[d.name] is not d:
            raise TopologyError(f"store name {d.name!r} is used twice (by {taken[d.name].owner} and "
                                f"{d.owner}); give each store its own name, or pass the name as a "
                                f"string to process(stores=[...]) to share one")
        taken[d.name] = d
    for d in decls:
        if d.name is None:
            base = g.check_name("store", d.auto_hint or "store")
            name, i = base, 2
            while name in taken:
                name, i = f"{base}-{i}", i + 1
            d.name = name
            taken[name] = d
    # process(stores=["name"]): a reference to a store declared elsewhere, or a new json kv store
    for n in builder.nodes:
        for ref in n.params.get("store_refs", ()):
            if ref.startswith(RESERVED_PREFIX):
                raise TopologyError(f"store name {ref!r} is reserved; pick another")
            if ref not in taken:
                d = StoreDecl(ref, owner=n.name)
                builder.stores.append(d)
                taken[ref] = d
            if ref not in [s.name for s in n.stores]:
                n.stores.append(taken[ref])
    return [taken[d.name] for d in builder.stores if taken.get(d.name) is d]


def compile_plan(builder) -> "Plan":
    nodes: list[Node] = list(builder.nodes)
    if not nodes:
        raise TopologyError("the topology is empty: read a topic with builder.stream(...) or "
                            "builder.table(...)")
    decls = _resolve_stores(builder)

    # phases: a node runs in the task when it needs keyed input, runs user processors or writes a
    # sink, or follows a node that runs in the task.
    post: dict[str, bool] = {}
    for n in nodes:  # nodes are in creation order: parents first
        post[n.name] = (n.kind in g.KEY_DEPENDENT or n.kind in (g.PROCESS, g.SINK)
                        or (n.parent is not None and post[n.parent.name]))

    # inside the task: has the key changed since the shuffle, and by which step?
    rekeyed: dict[str, Optional[Node]] = {}
    part_serde: dict[str, Any] = {}   # the key serde that partitioned a task node's records
    for n in nodes:
        if not post[n.name]:
            continue
        p = n.parent
        if p is not None and not post[p.name]:
            rekey_in, pserde = None, p.key_serde
        else:
            rekey_in, pserde = rekeyed[p.name], part_serde[p.name]
        part_serde[n.name] = pserde
        if n.kind in g.KEY_DEPENDENT and rekey_in is not None and n.kind != g.TABLE_SOURCE:
            raise TopologyError(
                f"{n.name} ({_describe_step(n)}) needs its records partitioned by key, but "
                f"{rekey_in.name} ({_describe_step(rekey_in)}) changed the key after the shuffle: "
                f"statekit runs one repartition per topology (Kafka Streams would start a second "
                f"sub-topology here); change the key before the first stateful step, or write to a "
                f"topic with .to() and read it back in a second application")
        rekeyed[n.name] = n if n.kind in g.KEY_CHANGING else rekey_in
        if n.kind in (g.AGGREGATE, g.WINDOW_AGGREGATE, g.TABLE_SOURCE):
            d = n.stores[0]
            sk = "json" if d.key_serde is None else d.key_serde
            if serde_label(sk) != serde_label(pserde):
                raise TopologyError(
                    f"store {d.name!r} has key serde {serde_label(sk)!r} but {n.name} "
                    f"({_describe_step(n)}) receives keys partitioned by their "
                    f"{serde_label(pserde)!r} bytes: interactive queries would look for a key in the "
                    f"wrong task; leave the store's key_serde out or make them equal")

    # joins: both sides in the same task, partitioned by the same key bytes
    for n in nodes:
        if n.kind != g.JOIN:
            continue
        t = n.table
        stream_serde = n.parent.key_serde if not post[n.parent.name] else part_serde[n.parent.name]
        table_serde = part_serde[t.name]
        if rekeyed.get(t.name) is not None:
            raise TopologyError(f"{n.name} joins a table whose key changed inside the task; it is "
                                f"not co-partitioned with the stream")
        if serde_label(stream_serde) != serde_label(table_serde) or (
                not isinstance(stream_serde, str) and stream_serde != table_serde):
            raise TopologyError(
                f"{n.name} joins a stream keyed with serde {serde_label(stream_serde)!r} to a table "
                f"keyed with {serde_label(table_serde)!r}: they are not co-partitioned (the same key "
                f"would land in different tasks); give both the same key serde")
        if _materialized(t) is None:
            raise TopologyError(f"{n.name}: the joined table has no store")

    # sources, routes, sinks, stores
    sources: list[SourceSpec] = []
    src_index: dict[str, int] = {}
    for n in nodes:
        if n.kind == g.SOURCE:
            src_index[n.name] = len(sources)
            sources.append(SourceSpec(len(sources), n.params["topic"], n.params["role"], n.key_serde,
                                      n.value_serde, n.name))
    routes: list[RouteSpec] = []
    for n in nodes:
        if post[n.name] and n.parent is not None and not post[n.parent.name]:
            s = n.parent
            while s.parent is not None:
                s = s.parent
            routes.append(RouteSpec(len(routes), src_index[s.name], n.name, n.parent.key_serde,
                                    n.kind in g.KEY_DEPENDENT))
    sinks: dict[str, SinkSpec] = {}
    for n in nodes:
        if n.kind == g.SINK:
            topic = n.params["topic"]
            spec = SinkSpec(topic, n.key_serde, n.value_serde)
            old = sinks.get(topic)
            if old is not None and (serde_label(old.key_serde), serde_label(old.value_serde)) != (
                    serde_label(spec.key_serde), serde_label(spec.value_serde)):
                raise TopologyError(f"sink topic {topic!r} is written with two different serdes "
                                    f"({serde_label(old.key_serde)}/{serde_label(old.value_serde)} and "
                                    f"{serde_label(spec.key_serde)}/{serde_label(spec.value_serde)})")
            sinks[topic] = spec
    return Plan(sources=sources, store_decls=decls, sinks=list(sinks.values()), routes=routes,
                nodes=nodes, post=post)


def _materialized(t: Node) -> Optional[Node]:
    """The node holding the store behind a (possibly derived) table."""
    n = t
    while n is not None:
        if n.kind in (g.TABLE_SOURCE, g.AGGREGATE, g.WINDOW_AGGREGATE):
            return n
        if n.kind not in (g.TABLE_FILTER, g.TABLE_MAP_VALUES):
            return None
        n = n.parent
    return None


# -- record metadata and errors ------------------------------------------------------------------

class _Rec:
    """The source record being processed (shared by every step of a task or of stage 1)."""

    __slots__ = ("topic", "partition", "offset", "timestamp")

    def __init__(self) -> None:
        self.topic = None
        self.partition = None
        self.offset = None
        self.timestamp = None


def _abbrev(obj: Any, n: int = 60) -> str:
    try:
        s = repr(obj)
    except Exception:  # pragma: no cover
        s = f"<{type(obj).__name__}>"
    s = " ".join(s.split())
    return s if len(s) <= n else s[: n - 1] + "…"


def _fail(node: Node, rec: _Rec, key: Any, value: Any, exc: BaseException) -> ProcessorError:
    where = f"{rec.topic} partition {rec.partition} offset {rec.offset}"
    msg = " ".join((str(exc) or "(no message)").split())
    if len(msg) > 160:
        msg = msg[:159] + "…"
    return ProcessorError(f"{node.name} ({_describe_step(node)}) failed on key={_abbrev(key)} "
                          f"value={_abbrev(value)} from {where}: {type(exc).__name__}: {msg}")


# -- building the steps --------------------------------------------------------------------------

def _fanout(funcs: list):
    if not funcs:
        return lambda k, v: None
    if len(funcs) == 1:
        return funcs[0]

    def out(k, v):
        for f in funcs:
            f(k, v)
    return out


def _stateless(n: Node, down, rec: _Rec):
    """The function running a stateless step n, forwarding to `down(k, v)`; None if n is stateful."""
    fn = n.fn
    kind = n.kind
    if kind in (g.SOURCE, g.TO_STREAM):
        return down
    if kind in (g.MAP,):
        def f(k, v):
            try:
                k2, v2 = fn(k, v)
            except StatekitError:
                raise
            except Exception as e:
                raise _fail(n, rec, k, v, e) from e
            down(k2, v2)
    elif kind == g.KEY_SELECT:
        def f(k, v):
            try:
                k2 = fn(k, v)
            except StatekitError:
                raise
            except Exception as e:
                raise _fail(n, rec, k, v, e) from e
            down(k2, v)
    elif kind == g.MAP_VALUES:
        def f(k, v):
            try:
                v2 = fn(v)
            except StatekitError:
                raise
            except Exception as e:
                raise _fail(n, rec, k, v, e) from e
            down(k, v2)
    elif kind == g.FILTER:
        def f(k, v):
            try:
                keep = fn(k, v)
            except StatekitError:
                raise
            except Exception as e:
                raise _fail(n, rec, k, v, e) from e
            if keep:
                down(k, v)
    elif kind == g.FLAT_MAP:
        def f(k, v):
            try:
                out = list(fn(k, v))
            except StatekitError:
                raise
            except Exception as e:
                raise _fail(n, rec, k, v, e) from e
            for item in out:
                try:
                    k2, v2 = item
                except Exception as e:
                    raise _fail(n, rec, k, v, TypeError(f"flat_map must yield (key, value) pairs, "
                                                        f"got {_abbrev(item, 30)}")) from e
                down(k2, v2)
    elif kind == g.FLAT_MAP_VALUES:
        def f(k, v):
            try:
                out = list(fn(v))
            except StatekitError:
                raise
            except Exception as e:
                raise _fail(n, rec, k, v, e) from e
            for v2 in out:
                down(k, v2)
    elif kind == g.PEEK:
        def f(k, v):
            try:
                fn(k, v)
            except StatekitError:
                raise
            except Exception as e:
                raise _fail(n, rec, k, v, e) from e
            down(k, v)
    elif kind == g.TABLE_FILTER:
        def f(k, v):
            if v is not None:
                try:
                    if not fn(k, v):
                        v = None
                except StatekitError:
                    raise
                except Exception as e:
                    raise _fail(n, rec, k, v, e) from e
            down(k, v)
    elif kind == g.TABLE_MAP_VALUES:
        def f(k, v):
            if v is not None:
                try:
                    v = fn(v)
                except StatekitError:
                    raise
                except Exception as e:
                    raise _fail(n, rec, k, v, e) from e
            down(k, v)
    else:
        return None
    return f


# -- the plan ------------------------------------------------------------------------------------

class Plan:
    """What an engine runs. Picklable with cloudpickle (user functions included); compiled
    closures are rebuilt lazily in each process.

    Attributes: `sources` (SourceSpec: index, topic, role "stream"|"table", serdes), `stores`
    (statekit.stores.StoreSpec), `sinks` (SinkSpec: topic, serdes), `routes` (RouteSpec)."""

    def __init__(self, sources, store_decls, sinks, routes, nodes, post) -> None:
        self.sources: list[SourceSpec] = sources
        self.store_decls: list[StoreDecl] = store_decls
        self.sinks: list[SinkSpec] = sinks
        self.routes: list[RouteSpec] = routes
        self.nodes: list[Node] = nodes
        self.post: dict = post
        self._by_name = {n.name: n for n in nodes}
        self._stores = None
        self._pre = None
        self._serdes = None
        self._task_memo = None          # {partitions: {key bytes: task}} (shuffle's memo)
        self._pickle_memo: dict = {}    # {short str: its pickle}
        self._route_to_bytes = None

    # pickling: only the graph travels; compiled closures and serde objects are rebuilt
    def __getstate__(self):
        st = dict(self.__dict__)
        st["_stores"] = None
        st["_pre"] = None
        st["_serdes"] = None
        st["_task_memo"] = None
        st["_pickle_memo"] = {}
        st["_route_to_bytes"] = None
        return st

    def __setstate__(self, st):
        st.setdefault("_task_memo", None)
        st.setdefault("_pickle_memo", {})
        st.setdefault("_route_to_bytes", None)
        self.__dict__.update(st)

    # -- static facts ---------------------------------------------------------------------------
    @property
    def stores(self) -> list:
        """StoreSpecs of the user's stores (statekit.stores.StoreSpec)."""
        if self._stores is None:
            self._stores = [d.to_spec() for d in self.store_decls]
        return self._stores

    @property
    def store_names(self) -> list:
        return [d.name for d in self.store_decls]

    def store(self, name: str):
        for s in self.stores:
            if s.name == name:
                return s
        raise KeyError(name)

    def changelog_topics(self, application: str) -> dict:
        """{store: changelog topic} for the logged stores."""
        return {d.name: f"{application}-{d.name}-changelog" for d in self.store_decls if d.logging}

    @property
    def source_topics(self) -> list:
        return [s.topic for s in self.sources]

    @property
    def sink_topics(self) -> list:
        return [s.topic for s in self.sinks]

    @property
    def has_windows(self) -> bool:
        return any(n.kind == g.WINDOW_AGGREGATE for n in self.nodes)

    def source_index(self, topic: str) -> int:
        for s in self.sources:
            if s.topic == topic:
                return s.index
        raise TopologyError(f"topic {topic!r} is not a source of this topology "
                            f"(sources: {', '.join(self.source_topics)})")

    def _serde_cache(self):
        if self._serdes is None:
            self._serdes = {
                "src": [(resolve_serde(s.key_serde), resolve_serde(s.value_serde)) for s in self.sources],
                "route": [resolve_serde(r.key_serde) for r in self.routes],
                "sink": {s.topic: (resolve_serde(s.key_serde), resolve_serde(s.value_serde))
                         for s in self.sinks},
            }
        return self._serdes

    def sink_serdes(self, topic: str):
        """(key_serde, value_serde) objects of a sink topic."""
        return self._serde_cache()["sink"][topic]

    def source_serdes(self, source_index: int):
        return self._serde_cache()["src"][source_index]

    # -- stage 1 --------------------------------------------------------------------------------
    def _pre_funcs(self):
        if self._pre is None:
            rec = _Rec()
            out: list = []  # the (route, key, value) of the current call
            route_of = {r.target: r.index for r in self.routes}
            post = self.post

            def build(n: Node):
                downs = []
                for c in n.children:
                    if post[c.name]:
                        ri = route_of[c.name]
                        downs.append(lambda k, v, _r=ri: out.append((_r, k, v)))
                    else:
                        downs.append(build(c))
                f = _stateless(n, _fanout(downs), rec)
                if f is None:  # pragma: no cover - compile() keeps stateful steps after the shuffle
                    raise TopologyError(f"{n.name} cannot run before the shuffle")
                return f

            funcs = [build(self._by_name[s.node]) for s in self.sources]
            self._pre = (rec, out, funcs)
        return self._pre

    def pre_shuffle_routed(self, source_index: int, key: Any, value: Any, timestamp: int,
                           partition: Optional[int] = None, offset: Optional[int] = None) -> list:
        """[(route, key, value)]: the stateless steps before the shuffle, for one source record."""
        rec, out, funcs = self._pre_funcs()
        rec.topic = self.sources[source_index].topic
        rec.partition, rec.offset, rec.timestamp = partition, offset, timestamp
        out.clear()
        try:
            funcs[source_index](key, value)
            return list(out)
        finally:
            out.clear()

    def pre_shuffle(self, source_index: int, key: Any, value: Any, timestamp: int) -> Iterator:
        """(key, value) pairs leaving the stateless steps before the shuffle (ARCHITECTURE.md seam).
        When a source branches before the shuffle, use pre_shuffle_routed (or shuffle): a pair alone
        does not say which branch it belongs to."""
        for _r, k, v in self.pre_shuffle_routed(source_index, key, value, timestamp):
            yield k, v

    def shuffle(self, source_index: int, key_bytes: Optional[bytes], value_bytes: Optional[bytes],
                timestamp: int, partition: int, offset: int, partitions: int) -> list:
        """Stage 1 at the bytes level: decode with the source serdes, run pre_shuffle, pick the task.
        Returns a list of (task, record) (iterate it); `record` is what run_task_batch takes.

        Hot path (once per source record): the task of a key's bytes is memoized per `partitions`
        (murmur2 in Python is the expensive part; a bounded dict, cleared when full), and so is the
        pickle of a short `str` key or value (words repeat)."""
        ks, vs = self.source_serdes(source_index)
        try:
            key = None if key_bytes is None else ks.from_bytes(key_bytes)
            value = None if value_bytes is None else vs.from_bytes(value_bytes)
        except Exception as e:
            src = self.sources[source_index]
            raise ProcessorError(
                f"cannot decode a record of {src.topic} partition {partition} offset {offset} with "
                f"serdes {serde_label(src.key_serde)}/{serde_label(src.value_serde)}: "
                f"{type(e).__name__}: {e} (key={_abbrev(key_bytes)} value={_abbrev(value_bytes)})") from e
        rec, out, funcs = self._pre or self._pre_funcs()
        rec.topic = self.sources[source_index].topic
        rec.partition, rec.offset, rec.timestamp = partition, offset, timestamp
        out.clear()
        funcs[source_index](key, value)
        if not out:
            return []
        memo = self._task_memo.get(partitions) if self._task_memo is not None else None
        if memo is None:
            memo = self._memo_for(partitions)
        pk = self._pickle_memo
        to_bytes = self._route_to_bytes or self._route_encoders()
        result = []
        for r, k, v in out:
            if k is None:
                if self.routes[r].keyed:
                    continue  # Kafka Streams skips records with a null key before keyed steps
                task = partition % partitions
                kp = _NONE_PICKLE
            else:
                try:
                    kb = to_bytes[r](k)
                except Exception as e:
                    out.clear()
                    raise ProcessorError(
                        f"key {_abbrev(k)} ({type(k).__name__}) from {self.sources[source_index].topic} "
                        f"partition {partition} offset {offset} cannot be serialized with key serde "
                        f"{serde_label(self.routes[r].key_serde)!r} to pick its task; pass key_serde= "
                        f"to the map/group_by that made it: {type(e).__name__}: {e}") from e
                task = memo.get(kb)
                if task is None:
                    if len(memo) >= _MEMO_MAX:
                        memo.clear()
                    task = memo[kb] = partition_for(kb, partitions)
                if type(k) is str and len(k) <= _PICKLE_MEMO_LEN:
                    kp = pk.get(k)
                    if kp is None:
                        if len(pk) >= _MEMO_MAX:
                            pk.clear()
                        kp = pk[k] = _DUMPS(k, _PROTO)
                else:
                    kp = _DUMPS(k, _PROTO)
            if v is k:
                vp = kp
            elif type(v) is str and len(v) <= _PICKLE_MEMO_LEN:
                vp = pk.get(v)
                if vp is None:
                    if len(pk) >= _MEMO_MAX:
                        pk.clear()
                    vp = pk[v] = _DUMPS(v, _PROTO)
            else:
                vp = _DUMPS(v, _PROTO)
            result.append((task, (r, partition, offset, timestamp, kp, vp)))
        out.clear()
        return result

    def _memo_for(self, partitions: int) -> dict:
        if self._task_memo is None:
            self._task_memo = {}
        return self._task_memo.setdefault(partitions, {})

    def _route_encoders(self) -> list:
        self._route_to_bytes = [s.to_bytes for s in self._serde_cache()["route"]]
        return self._route_to_bytes

    def task_for_key(self, key: Any, partitions: int, key_serde: Any) -> int:
        """The task owning `key` (interactive queries): partition_for(serde bytes)."""
        return partition_for(resolve_serde(key_serde).to_bytes(key), partitions)

    # -- stage 2 --------------------------------------------------------------------------------
    def new_processor(self, context) -> "TaskProcessor":
        """A task's processor. `context` has task_id, batch_id, get_store(name),
        forward(sink_topic, key, value) and optionally stream_time (int, -1 when unknown)."""
        return TaskProcessor(self, context)

    # -- drawing --------------------------------------------------------------------------------
    def describe(self, application: Optional[str] = None) -> dict:
        """{"nodes": [...], "edges": [...], "routes": [...]} for drawing the topology.

        node: {"id", "type": source|processor|sink|store|changelog, "kind", "label", "phase":
        "pre-shuffle"|"task"|"state", ...}; edge: {"from", "to", "kind": flow|shuffle|store|
        changelog|lookup}. Changelog ids are the topic names when `application` is given."""
        nodes, edges = [], []
        for n in self.nodes:
            if n.kind == g.SOURCE:
                typ = "source"
            elif n.kind == g.SINK:
                typ = "sink"
            else:
                typ = "processor"
            d = {"id": n.name, "type": typ, "kind": n.kind, "label": _describe_step(n),
                 "phase": "task" if self.post[n.name] else "pre-shuffle",
                 "stores": [s.name for s in n.stores],
                 "key_serde": serde_label(n.key_serde), "value_serde": serde_label(n.value_serde)}
            if n.kind in (g.SOURCE, g.SINK):
                d["topic"] = n.params["topic"]
                d["label"] = n.params["topic"]
            if n.kind == g.SOURCE:
                d["role"] = n.params["role"]
            if n.kind == g.WINDOW_AGGREGATE:
                d["windows"] = n.params["windows"].describe()
                d["grace_ms"] = n.params["grace_ms"]
            nodes.append(d)
            if n.parent is not None:
                crosses = self.post[n.name] and not self.post[n.parent.name]
                edges.append({"from": n.parent.name, "to": n.name,
                              "kind": "shuffle" if crosses else "flow"})
            if n.kind == g.JOIN:
                edges.append({"from": _materialized(n.table).stores[0].name, "to": n.name,
                              "kind": "lookup"})
        for d in self.store_decls:
            nodes.append({"id": d.name, "type": "store", "kind": d.kind, "label": d.name,
                          "phase": "state", "key_serde": serde_label(d.key_serde),
                          "value_serde": serde_label(d.value_serde), "logging": d.logging,
                          "backend": d.backend, "retention_ms": d.retention_ms,
                          "window_size_ms": d.window_size_ms})
            for n in self.nodes:
                if any(s.name == d.name for s in n.stores):
                    edges.append({"from": n.name, "to": d.name, "kind": "store"})
            if d.logging:
                topic = f"{application}-{d.name}-changelog" if application else f"{d.name}-changelog"
                nodes.append({"id": topic, "type": "changelog", "kind": "topic", "label": topic,
                              "phase": "state", "store": d.name,
                              "cleanup_policy": "compact,delete" if d.kind == "window" else "compact"})
                edges.append({"from": d.name, "to": topic, "kind": "changelog"})
        routes = [{"index": r.index, "source": self.sources[r.source_index].topic, "target": r.target,
                   "key_serde": serde_label(r.key_serde), "keyed": r.keyed} for r in self.routes]
        return {"nodes": nodes, "edges": edges, "routes": routes}

    def describe_text(self, application: Optional[str] = None) -> str:
        """A Kafka-Streams-like text rendering of describe()."""
        d = self.describe(application)
        outs: dict = {}
        for e in d["edges"]:
            outs.setdefault(e["from"], []).append(e)
        lines = []
        for phase, title in (("pre-shuffle", "Stage 1 (stateless, where records are read)"),
                             ("task", "Stage 2 (one task per partition, after the shuffle)")):
            lines.append(title + ":")
            for nd in d["nodes"]:
                if nd["phase"] != phase:
                    continue
                extra = f" topic={nd['topic']}" if "topic" in nd else ""
                if nd["stores"]:
                    extra += f" stores={nd['stores']}"
                lines.append(f"  {nd['id']} [{nd['label']}]{extra}")
                for e in outs.get(nd["id"], []):
                    arrow = {"shuffle": "==shuffle==>", "store": "-- store -->"}.get(e["kind"], "-->")
                    lines.append(f"      {arrow} {e['to']}")
        lines.append("State:")
        for nd in d["nodes"]:
            if nd["type"] == "store":
                cl = [e["to"] for e in outs.get(nd["id"], []) if e["kind"] == "changelog"]
                lines.append(f"  {nd['id']} ({nd['kind']}, {nd['key_serde']}/{nd['value_serde']})"
                             + (f" --> changelog {cl[0]}" if cl else " (not logged)"))
        return "\n".join(lines)

    def __repr__(self) -> str:
        return (f"Plan(sources={self.source_topics}, stores={self.store_names}, "
                f"sinks={self.sink_topics}, routes={len(self.routes)})")


class TaskProcessor:
    """The task half of a plan, for one task and one batch. `process(route, key, value, timestamp,
    offset, partition)` runs a record through the task's steps; `process_record(record)` takes the
    tuples `Plan.shuffle` yields. `stream_time` is the highest timestamp seen (persist it).
    `flush()` at the end of the batch (before its commit) forwards what cached aggregations held
    back; `close()` flushes too, then closes the user processors.

    Forwarding rule of aggregations (count/reduce/aggregate, windowed or not), as Kafka Streams'
    KTable record cache does:

    * caching on — the store was declared with `caching=True` (the default) *and* the task has a
      record cache (`context.cache_bytes > 0`; a context without `cache_bytes`, e.g. the Spark-native
      engine's, has none): an update is not forwarded when it happens; `flush()` forwards the latest
      value of every key updated in the batch, once per key (per (key, window start) for windowed
      aggregations), in **first-update order** (the order in which keys were first updated in the
      batch), each with the metadata (timestamp, offset, partition, topic) of that key's last update.
      With one commit per micro-batch that is one output per key per commit. Aggregations are flushed
      in topology order, so a cached aggregation downstream of another one sees its flushed updates
      and is flushed after it. Unlike Kafka Streams, an eviction from a full store cache does not
      forward early: outputs come only at flush.
    * caching off (`caching=False`, or `cache_bytes <= 0`): every update is forwarded at once.

    Table sources (`builder.table`) and joins forward every update either way."""

    def __init__(self, plan: Plan, context) -> None:
        self.plan = plan
        self.context = context
        self.task_id = getattr(context, "task_id", None)
        self.batch_id = getattr(context, "batch_id", None)
        st = getattr(context, "stream_time", None)
        self.stream_time = -1 if st is None else int(st)
        cb = getattr(context, "cache_bytes", None)
        self.record_cache = cb is not None and cb > 0   # forward-on-flush for caching stores
        self.rec = _Rec()
        self.dropped_late = 0      # records dropped for windows that had closed
        self.skipped_null = 0      # records skipped for a None key/value before a keyed step
        self.records = 0
        self._stores: dict = {}
        self._processors: list = []
        self._entry = {}
        self._held: list = []      # (node index, node, {key: (value, ts, offset, partition, topic)}, down)
        self._loads_memo: dict = {}
        self._build()

    def store(self, name: str):
        s = self._stores.get(name)
        if s is None:
            s = self._stores[name] = self.context.get_store(name)
        return s

    def _build(self) -> None:
        plan = self.plan
        rec = self.rec
        built: dict = {}

        def build(n: Node):
            if n.name in built:
                return built[n.name]
            down = _fanout([build(c) for c in n.children])
            f = _stateless(n, down, rec)
            if f is None:
                f = self._stateful(n, down)
            built[n.name] = f
            return f

        for r in plan.routes:
            self._entry[r.index] = build(plan._by_name[r.target])
        self._held.sort(key=lambda h: h[0])   # flush upstream aggregations first
        self._topics = [s.topic for s in plan.sources]
        self._route_src = [r.source_index for r in plan.routes]
        self._route_topic = [self._topics[i] for i in self._route_src]
        for inst, ctx, n in self._processors:   # init user processors once everything exists
            init = getattr(inst, "init", None)
            if init is None:
                continue
            try:
                init(ctx)
            except StatekitError:
                raise
            except Exception as e:
                raise ProcessorError(f"{n.name} ({_describe_step(n)}): init() failed in task "
                                     f"{self.task_id}: {type(e).__name__}: {e}") from e

    def _holder(self, n: Node, down):
        """For an aggregation n: (emit(k, v), cached). Caching on: emit remembers the latest value per
        key (and its record's metadata) for flush(); caching off: emit is `down`."""
        if not (self.record_cache and n.stores[0].caching):
            return down, False
        held: dict = {}
        idx = next(i for i, m in enumerate(self.plan.nodes) if m is n)
        self._held.append((idx, n, held, down))
        rec = self.rec

        def emit(k, v):
            held[k] = (v, rec.timestamp, rec.offset, rec.partition, rec.topic)
        return emit, True

    def flush(self) -> int:
        """Forward what cached aggregations held back (see the class docstring); returns how many
        records were forwarded. Call it once the batch's records are processed, before the outputs
        are read and committed."""
        if not self._held:
            return 0
        rec = self.rec
        saved = (rec.topic, rec.partition, rec.offset, rec.timestamp)
        n = 0
        try:
            for _i, _node, held, down in self._held:
                if not held:
                    continue
                items = list(held.items())
                held.clear()
                n += len(items)
                for k, (v, ts, off, part, topic) in items:
                    rec.topic, rec.partition, rec.offset, rec.timestamp = topic, part, off, ts
                    down(k, v)
        finally:
            rec.topic, rec.partition, rec.offset, rec.timestamp = saved
        return n

    def _stateful(self, n: Node, down):
        rec = self.rec
        kind = n.kind
        tp = self
        if kind == g.SINK:
            topic = n.params["topic"]
            fwd = self.context.forward
            return lambda k, v: fwd(topic, k, v)
        if kind == g.TABLE_SOURCE:
            store = self.store(n.stores[0].name)

            def f(k, v):
                if k is None:
                    tp.skipped_null += 1
                    return
                store.put(k, v)
                down(k, v)
            return f
        if kind == g.AGGREGATE:
            store = self.store(n.stores[0].name)
            op = n.params["op"]
            down, cached = self._holder(n, down)
            if op == "count":
                get, put = store.get, store.put
                if cached:
                    held = self._held[-1][2]

                    def f(k, v):
                        if k is None or v is None:
                            tp.skipped_null += 1
                            return
                        c = get(k)
                        c = 1 if c is None else c + 1
                        put(k, c)
                        held[k] = (c, rec.timestamp, rec.offset, rec.partition, rec.topic)
                    return f

                def f(k, v):
                    if k is None or v is None:
                        tp.skipped_null += 1
                        return
                    c = (get(k) or 0) + 1
                    put(k, c)
                    down(k, c)
            elif op == "reduce":
                fn = n.fn

                def f(k, v):
                    if k is None or v is None:
                        tp.skipped_null += 1
                        return
                    old = store.get(k)
                    if old is None:
                        new = v
                    else:
                        try:
                            new = fn(old, v)
                        except StatekitError:
                            raise
                        except Exception as e:
                            raise _fail(n, rec, k, v, e) from e
                    store.put(k, new)
                    down(k, new)
            else:
                init, agg = n.fn

                def f(k, v):
                    if k is None or v is None:
                        tp.skipped_null += 1
                        return
                    try:
                        old = store.get(k)
                        if old is None:
                            old = init()
                        new = agg(k, v, old)
                    except StatekitError:
                        raise
                    except Exception as e:
                        raise _fail(n, rec, k, v, e) from e
                    store.put(k, new)
                    down(k, new)
            return f
        if kind == g.WINDOW_AGGREGATE:
            store = self.store(n.stores[0].name)
            down, _cached = self._holder(n, down)
            op = n.params["op"]
            windows = n.params["windows"]
            size = windows.size_ms
            grace = n.params["grace_ms"]
            fn = n.fn

            def f(k, v):
                if k is None or v is None:
                    tp.skipped_null += 1
                    return
                ts = rec.timestamp
                close = tp.stream_time - grace   # stream time already includes this record
                for start in windows.starts(ts):
                    if start + size <= close:
                        tp.dropped_late += 1
                        continue
                    old = store.get(k, start)
                    try:
                        if op == "count":
                            new = (old or 0) + 1
                        elif op == "reduce":
                            new = v if old is None else fn(old, v)
                        else:
                            new = fn[1](k, v, fn[0]() if old is None else old)
                    except StatekitError:
                        raise
                    except Exception as e:
                        raise _fail(n, rec, k, v, e) from e
                    store.put(k, new, start)
                    down((k, start), new)
            return f
        if kind == g.JOIN:
            getter = self._getter(n.table)
            how = n.params["how"]
            joiner = n.fn

            def f(k, v):
                if k is None:
                    tp.skipped_null += 1
                    return
                tv = getter(k)
                if tv is None and how == "inner":
                    return
                try:
                    out = joiner(v, tv)
                except StatekitError:
                    raise
                except Exception as e:
                    raise _fail(n, rec, k, v, e) from e
                down(k, out)
            return f
        if kind == g.PROCESS:
            try:
                inst = n.fn()
            except Exception as e:
                raise ProcessorError(f"{n.name}: could not create processor {n.params['processor']}: "
                                     f"{type(e).__name__}: {e}") from e
            ctx = ProcessorContext(self, n.name, [s.name for s in n.stores], down)
            self._processors.append((inst, ctx, n))
            proc = inst.process

            def f(k, v):
                try:
                    proc(k, v)
                except StatekitError:
                    raise
                except Exception as e:
                    raise _fail(n, rec, k, v, e) from e
            return f
        raise TopologyError(f"{n.name}: step kind {kind!r} cannot run in a task")  # pragma: no cover

    def _getter(self, t: Node):
        """key -> current value of a (possibly derived) table, reading its store."""
        chain = []
        n = t
        while n.kind in (g.TABLE_FILTER, g.TABLE_MAP_VALUES):
            chain.append(n)
            n = n.parent
        store = self.store(n.stores[0].name)
        chain.reverse()
        rec = self.rec

        def get(k):
            v = store.get(k)
            for c in chain:
                if v is None:
                    return None
                try:
                    if c.kind == g.TABLE_FILTER:
                        v = v if c.fn(k, v) else None
                    else:
                        v = c.fn(v)
                except StatekitError:
                    raise
                except Exception as e:
                    raise _fail(c, rec, k, v, e) from e
            return v
        return get

    # -- running --------------------------------------------------------------------------------
    def process(self, route: int, key: Any, value: Any, timestamp: int, offset: int,
                partition: Optional[int] = None) -> None:
        rec = self.rec
        rec.topic = self._topics[self._route_src[route]]
        rec.partition = partition
        rec.offset = offset
        rec.timestamp = timestamp
        if timestamp is not None and timestamp > self.stream_time:
            self.stream_time = timestamp
        self.records += 1
        self._entry[route](key, value)

    def process_record(self, record) -> None:
        """One tuple from Plan.shuffle: (route, partition, offset, timestamp, key_pickle, value_pickle)."""
        r, p, o, ts, kp, vp = record
        self.process(r, _LOADS(kp), _LOADS(vp), ts, o, p)

    def process_records(self, records, on_record=None) -> int:
        """Every tuple of `records` (as process_record), in order; the per-record path of a batch.
        A short `str` key or value is unpickled once per batch (memoized by its pickle).
        `on_record(n)`, when given, is called after the n-th record. Returns the count."""
        rec = self.rec
        topics = self._route_topic
        entry = self._entry
        memo = self._loads_memo
        loads = _LOADS
        st = self.stream_time
        n = 0
        try:
            for r, p, o, ts, kp, vp in records:
                k = memo.get(kp)
                if k is None:
                    k = loads(kp)
                    if type(k) is str and len(kp) <= _LOADS_MEMO_BYTES and len(memo) < _MEMO_MAX:
                        memo[kp] = k
                if vp == kp and type(k) is str:   # word count: value == key (a str is immutable)
                    v = k
                else:
                    v = memo.get(vp)
                    if v is None:
                        v = loads(vp)
                        if type(v) is str and len(vp) <= _LOADS_MEMO_BYTES and len(memo) < _MEMO_MAX:
                            memo[vp] = v
                rec.topic = topics[r]
                rec.partition = p
                rec.offset = o
                rec.timestamp = ts
                if ts is not None and ts > st:
                    st = self.stream_time = ts
                n += 1
                entry[r](k, v)
                if on_record is not None:
                    on_record(n)
        finally:
            self.records += n
        return n

    def close(self) -> None:
        self.flush()
        errors = []
        for inst, _ctx, n in self._processors:
            close = getattr(inst, "close", None)
            if close is not None:
                try:
                    close()
                except Exception as e:  # close every processor, report the first failure
                    errors.append(ProcessorError(f"{n.name}: close() failed: {type(e).__name__}: {e}"))
        self._processors = []
        if errors:
            raise errors[0]
