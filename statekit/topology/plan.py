"""The `Plan`: what an engine runs, engine-agnostic and picklable (compile.py builds it).

A plan is one Kafka Streams sub-topology. Its tasks are its source partitions: task p reads
partition p of every source topic (the sources of a sub-topology are co-partitioned: the App checks
that they have as many partitions as the application has tasks), and every step of the plan runs in
the task, from the source records on. A key change before a step that needs its records partitioned
by key goes through a repartition topic `<application>-<name>-repartition`, as in Kafka Streams:
`compile()` then returns a plan whose `subtopologies` are the plans to run (upstream first), each
with this same interface; a repartition topic is a sink of the sub-topology before it and a stream
source of the one after it. Without repartition topics `plan.subtopologies == [plan]`.

A task runs its micro-batch with `new_processor(context).process_batch(records)`, `records` a
`statekit.topology.records.Records` (the batch column-wise, in processing order). Keys and values
inside the plan are Python objects; bytes only at the edges (the source, store and sink serdes).
A *route* is how records of a source enter the task: one per source (its source node).

`engine_shuffle=True` plans (`compile(..., engine_shuffle=True)`, for Spark's own state store
engine) keep an engine-side shuffle instead: their stateless steps before the first keyed step run
where the records are read (`pre_shuffle_routed`), their routes are the edges across that shuffle,
and each route names the key serde whose bytes pick the task.

Forwarding rule (see `TaskProcessor`): an aggregation whose store has caching on (the default) in a
task with a record cache (`context.cache_bytes > 0`) forwards, at `TaskProcessor.flush()` (once per
commit, i.e. per micro-batch), the latest value of each key it updated, in first-update order;
with caching off it forwards every update as it happens — Kafka Streams' KTable cache behaviour.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Iterator, Optional

from statekit.contracts import changelog_name, changelog_topic
from statekit.errors import TopologyError
from statekit.partition import partition_for
from statekit.stores.serdes import bound
from statekit.topology import graph as g
from statekit.topology.graph import Node, StoreDecl, resolve_serde, serde_label
from statekit.topology.steps import _abbrev, _fanout, _Rec, _stateless, describe_step

if TYPE_CHECKING:
    from statekit.topology.task import TaskProcessor

# node kinds that need the task's internal `_task` store (stream time, outbox, meta)
_TASK_STORE_KINDS = {g.WINDOW_AGGREGATE, g.SESSION_AGGREGATE, g.SLIDING_AGGREGATE, g.STREAM_JOIN,
                     g.SUPPRESS, g.PROCESS}
_WINDOW_KINDS = {g.WINDOW_AGGREGATE, g.SESSION_AGGREGATE, g.SLIDING_AGGREGATE, g.STREAM_JOIN}


@dataclass(frozen=True)
class SourceSpec:
    index: int
    topic: str
    role: str            # "stream" | "table"
    key_serde: Any
    value_serde: Any
    node: str
    internal: bool = False   # a repartition topic (written by another sub-topology)


@dataclass(frozen=True)
class SinkSpec:
    topic: str
    key_serde: Any
    value_serde: Any
    internal: bool = False   # a repartition topic (read by another sub-topology)


@dataclass(frozen=True)
class RouteSpec:
    """How records of `source_index` enter the task: at `target`, its source node (with an engine
    shuffle: the first task node after the stateless steps, `key_serde` picking the task)."""

    index: int
    source_index: int
    target: str
    key_serde: Any       # the bytes that partition the route's records
    keyed: bool          # (engine shuffle) the target needs a key: None keys are dropped there


class Plan:
    """What an engine runs. Picklable with cloudpickle (user functions included); compiled
    closures are rebuilt lazily in each process.

    Attributes: `sources` (SourceSpec: index, topic, role "stream"|"table", serdes, internal),
    `stores` (statekit.stores.StoreSpec), `sinks` (SinkSpec: topic, serdes, internal), `routes`
    (RouteSpec); `subtopologies` (the plans to run, upstream first), `subtopology_index`,
    `repartition_topics` (those it reads or writes; all of them on a composite plan).

    A *composite* plan (several sub-topologies) describes the whole application — its stores are
    every sub-topology's, its sources and sinks the external topics — but does not run: shuffle and
    new_processor raise; run each of `plan.subtopologies`."""

    def __init__(self, sources, store_decls, sinks, routes, nodes, post, subtopology_index: int = 0,
                 repartition_topics=(), application: Optional[str] = None,
                 engine_shuffle: bool = False) -> None:
        self.sources: list[SourceSpec] = sources
        self.store_decls: list[StoreDecl] = store_decls
        self.sinks: list[SinkSpec] = sinks
        self.routes: list[RouteSpec] = routes
        self.nodes: list[Node] = nodes
        self.post: dict = post
        self.subtopology_index = subtopology_index
        self.repartition_topics: list = list(repartition_topics)
        self.application = application
        self.engine_shuffle = bool(engine_shuffle)
        self._subs: Optional[list] = None     # composite plans only
        self._by_name = {n.name: n for n in nodes}
        self._stores = None
        self._pre = None
        self._serdes = None

    @classmethod
    def composite(cls, subplans: list, application: Optional[str]) -> "Plan":
        """The application's plan when it has several sub-topologies (see the class docstring)."""
        nodes = [n for sp in subplans for n in sp.nodes]
        post = {k: v for sp in subplans for k, v in sp.post.items()}
        sources, seen = [], set()
        for sp in subplans:
            for s in sp.sources:
                if not s.internal and s.topic not in seen:
                    seen.add(s.topic)
                    sources.append(SourceSpec(len(sources), s.topic, s.role, s.key_serde,
                                              s.value_serde, s.node))
        sinks: dict = {}
        for sp in subplans:
            for s in sp.sinks:
                if not s.internal:
                    sinks[s.topic] = s
        decls = [d for sp in subplans for d in sp.store_decls]
        topics = []
        for sp in subplans:
            for t in sp.repartition_topics:
                if t not in topics:
                    topics.append(t)
        plan = cls(sources, decls, list(sinks.values()), [], nodes, post, 0, topics, application,
                   subplans[0].engine_shuffle)
        plan.subtopology_index = None
        plan._subs = list(subplans)
        return plan

    # pickling: only the graph travels; compiled closures and serde objects are rebuilt
    def __getstate__(self):
        st = dict(self.__dict__)
        st["_stores"] = None
        st["_pre"] = None
        st["_serdes"] = None
        return st

    def __setstate__(self, st):
        self.__dict__.update(st)

    # -- sub-topologies --------------------------------------------------------------------------
    @property
    def subtopologies(self) -> list:
        """The plans to run, upstream first ([self] without repartition topics)."""
        return [self] if self._subs is None else list(self._subs)

    @property
    def is_composite(self) -> bool:
        return self._subs is not None

    def subtopology_of(self, store_or_topic: str) -> "Plan":
        """The sub-topology that owns a store, or reads a source topic."""
        for sp in self.subtopologies:
            if store_or_topic in sp.store_names or store_or_topic in sp.source_topics:
                return sp
        raise KeyError(store_or_topic)

    def _runnable(self, what: str) -> None:
        if self._subs is not None:
            raise TopologyError(f"this plan has {len(self._subs)} sub-topologies joined by "
                                f"repartition topics ({', '.join(self.repartition_topics)}): "
                                f"{what} each of plan.subtopologies, not the whole plan")

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
        return {d.name: changelog_topic(application, d.name) for d in self.store_decls if d.logging}

    @property
    def source_topics(self) -> list:
        return [s.topic for s in self.sources]

    @property
    def sink_topics(self) -> list:
        return [s.topic for s in self.sinks]

    @property
    def has_windows(self) -> bool:
        """Time-windowed state: windowed, session and sliding aggregations, stream-stream joins."""
        return any(n.kind in _WINDOW_KINDS for n in self.nodes)

    @property
    def needs_task_store(self) -> bool:
        """Does a task of this plan need the runtime's internal `_task` store (its outbox for the
        sinks; its stream time and meta for windows, joins, suppression and punctuation)?"""
        return bool(self.sinks) or any(n.kind in _TASK_STORE_KINDS for n in self.nodes)

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
                "sink": {s.topic: (bound(resolve_serde(s.key_serde), s.topic, True),
                                   bound(resolve_serde(s.value_serde), s.topic, False))
                         for s in self.sinks},
            }
        return self._serdes

    def sink_serdes(self, topic: str):
        """(key_serde, value_serde) objects of a sink topic."""
        return self._serde_cache()["sink"][topic]

    def source_serdes(self, source_index: int):
        return self._serde_cache()["src"][source_index]

    # -- the engine-side stateless steps (engine_shuffle plans) ---------------------------------
    def _pre_funcs(self):
        if self._pre is None:
            self._runnable("shuffle")
            if not self.engine_shuffle:
                raise TopologyError("this plan runs every step in its tasks (compile it with "
                                    "engine_shuffle=True for an engine that shuffles)")
            rec = _Rec()
            out: list = []  # the (route, key, value) of the current call
            route_of = {(r.source_index, r.target): r.index for r in self.routes}
            post = self.post

            def build(n: Node, si: int):
                downs = []
                for c in n.children:
                    if post[c.name]:
                        ri = route_of[(si, c.name)]
                        downs.append(lambda k, v, _r=ri: out.append((_r, k, v)))
                    else:
                        downs.append(build(c, si))
                f = _stateless(n, _fanout(downs), rec)
                if f is None:  # pragma: no cover - compile() keeps stateful steps after the shuffle
                    raise TopologyError(f"{n.name} cannot run before the shuffle")
                return f

            funcs = [build(self._by_name[s.node], s.index) for s in self.sources]
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

    def task_for_key(self, key: Any, partitions: int, key_serde: Any) -> int:
        """The task owning `key` (interactive queries): partition_for(serde bytes)."""
        return partition_for(resolve_serde(key_serde).to_bytes(key), partitions)

    # -- the task ---------------------------------------------------------------------------------
    def new_processor(self, context) -> "TaskProcessor":
        """A task's processor. `context` has task_id, batch_id, get_store(name),
        forward(sink_topic, key, value) and optionally stream_time (int, -1 when unknown),
        cache_bytes and meta (a JSON-able dict the host persists with the commit)."""
        self._runnable("run")
        from statekit.topology.task import TaskProcessor

        return TaskProcessor(self, context)

    # -- drawing --------------------------------------------------------------------------------
    def describe(self, application: Optional[str] = None) -> dict:
        """{"nodes", "edges", "routes", "subtopologies"} for drawing the topology.

        node: {"id", "type": source|processor|sink|store|changelog|topic, "kind", "label", "phase":
        "pre-shuffle"|"task"|"state"|"topic", "subtopology", ...}; edge: {"from", "to", "kind":
        flow|shuffle|store|changelog|lookup|repartition}; subtopology: {"index", "sources", "sinks",
        "stores", "repartition_in", "repartition_out"}. A repartition topic is a node of type
        "topic" (kind "repartition") between the sink that writes it and the source that reads it.
        Changelog ids are the topic names when `application` is given."""
        application = application or self.application
        out = {"nodes": [], "edges": [], "routes": [], "subtopologies": []}
        for sp in self.subtopologies:
            d = sp._describe_one(application)
            for k in ("nodes", "edges", "routes"):
                out[k].extend(d[k])
            out["subtopologies"].append(d["subtopology"])
        writers: dict = {}
        readers: dict = {}
        for sp in self.subtopologies:
            for n in sp.nodes:
                if n.params.get("repartition"):
                    (writers if n.kind == g.SINK else readers).setdefault(n.params["topic"], []).append(n.name)
        for topic in sorted(set(writers) | set(readers)):
            out["nodes"].append({"id": topic, "type": "topic", "kind": "repartition", "label": topic,
                                 "phase": "topic", "subtopology": None, "stores": []})
            for w in writers.get(topic, ()):
                out["edges"].append({"from": w, "to": topic, "kind": "repartition"})
            for r in readers.get(topic, ()):
                out["edges"].append({"from": topic, "to": r, "kind": "repartition"})
        return out

    def _describe_one(self, application: Optional[str]) -> dict:
        nodes, edges = [], []
        idx = self.subtopology_index
        for n in self.nodes:
            if n.kind == g.SOURCE:
                typ = "source"
            elif n.kind == g.SINK:
                typ = "sink"
            else:
                typ = "processor"
            d = {"id": n.name, "type": typ, "kind": n.kind, "label": describe_step(n),
                 "phase": "task" if self.post[n.name] else "pre-shuffle", "subtopology": idx,
                 "stores": [s.name for s in n.stores],
                 "key_serde": serde_label(n.key_serde), "value_serde": serde_label(n.value_serde)}
            if n.kind in (g.SOURCE, g.SINK):
                d["topic"] = n.params["topic"]
                d["label"] = n.params["topic"]
                d["repartition"] = bool(n.params.get("repartition"))
            if n.kind == g.SOURCE:
                d["role"] = n.params["role"]
            if n.kind in (g.WINDOW_AGGREGATE, g.SESSION_AGGREGATE, g.SLIDING_AGGREGATE, g.STREAM_JOIN):
                d["windows"] = n.params["windows"].describe()
                d["grace_ms"] = (n.params["windows"].grace_ms if n.kind != g.WINDOW_AGGREGATE
                                 else n.params["grace_ms"])
            if n.kind == g.PROCESS and n.params.get("schedules"):
                d["punctuators"] = [f"every {ms}ms of {t.replace('_', ' ')}"
                                    for ms, t in n.params["schedules"]]
            nodes.append(d)
            for p in n.parents():
                crosses = self.post[n.name] and not self.post[p.name]
                edges.append({"from": p.name, "to": n.name,
                              "kind": "shuffle" if crosses else "flow"})
            if n.table is not None:
                for store in _lookup_stores(n.table):
                    edges.append({"from": store, "to": n.name, "kind": "lookup"})
        for d in self.store_decls:
            nodes.append({"id": d.name, "type": "store", "kind": d.kind, "label": d.name,
                          "phase": "state", "subtopology": idx,
                          "key_serde": serde_label(d.key_serde),
                          "value_serde": serde_label(d.value_serde), "logging": d.logging,
                          "backend": d.backend, "retention_ms": d.retention_ms,
                          "window_size_ms": d.window_size_ms})
            for n in self.nodes:
                if any(s.name == d.name for s in n.stores):
                    edges.append({"from": n.name, "to": d.name, "kind": "store"})
            if d.logging:
                topic = changelog_topic(application, d.name) if application else changelog_name(d.name)
                nodes.append({"id": topic, "type": "changelog", "kind": "topic", "label": topic,
                              "phase": "state", "store": d.name, "subtopology": idx,
                              "cleanup_policy": ("compact,delete" if d.kind in ("window", "session")
                                                 else "compact")})
                edges.append({"from": d.name, "to": topic, "kind": "changelog"})
        routes = [{"index": r.index, "source": self.sources[r.source_index].topic, "target": r.target,
                   "key_serde": serde_label(r.key_serde), "keyed": r.keyed, "subtopology": idx}
                  for r in self.routes]
        sub = {"index": idx, "sources": [s.topic for s in self.sources if not s.internal],
               "sinks": [s.topic for s in self.sinks if not s.internal], "stores": self.store_names,
               "repartition_in": [s.topic for s in self.sources if s.internal],
               "repartition_out": [s.topic for s in self.sinks if s.internal]}
        return {"nodes": nodes, "edges": edges, "routes": routes, "subtopology": sub}

    def describe_text(self, application: Optional[str] = None) -> str:
        """A Kafka-Streams-like text rendering of describe(): one block per sub-topology."""
        d = self.describe(application)
        outs: dict = {}
        for e in d["edges"]:
            outs.setdefault(e["from"], []).append(e)
        lines = []
        multi = len(d["subtopologies"]) > 1
        for sub in d["subtopologies"]:
            i = sub["index"]
            pad = "  " if multi else ""
            if multi:
                extra = ""
                if sub["repartition_in"]:
                    extra += f" reads {', '.join(sub['repartition_in'])}"
                if sub["repartition_out"]:
                    extra += f" writes {', '.join(sub['repartition_out'])}"
                lines.append(f"Sub-topology {i}:{extra}")
            stages = ((("pre-shuffle", "Stage 1 (stateless, where records are read)"),
                       ("task", "Stage 2 (one task per partition, after the shuffle)"))
                      if self.engine_shuffle else
                      (("task", "Tasks (one per source partition, every step)"),))
            for phase, title in stages:
                lines.append(pad + title + ":")
                for nd in d["nodes"]:
                    if nd["phase"] != phase or nd.get("subtopology") != i:
                        continue
                    extra = f" topic={nd['topic']}" if "topic" in nd else ""
                    if nd["stores"]:
                        extra += f" stores={nd['stores']}"
                    lines.append(f"{pad}  {nd['id']} [{nd['label']}]{extra}")
                    for e in outs.get(nd["id"], []):
                        arrow = {"shuffle": "==shuffle==>", "store": "-- store -->",
                                 "repartition": "==repartition topic==>"}.get(e["kind"], "-->")
                        lines.append(f"{pad}      {arrow} {e['to']}")
            lines.append(pad + "State:")
            for nd in d["nodes"]:
                if nd["type"] == "store" and nd.get("subtopology") == i:
                    cl = [e["to"] for e in outs.get(nd["id"], []) if e["kind"] == "changelog"]
                    lines.append(f"{pad}  {nd['id']} ({nd['kind']}, {nd['key_serde']}/"
                                 f"{nd['value_serde']})"
                                 + (f" --> changelog {cl[0]}" if cl else " (not logged)"))
        topics = [nd["id"] for nd in d["nodes"] if nd["type"] == "topic"]
        if topics:
            lines.append("Repartition topics:")
            for t in topics:
                ws = [e["from"] for e in d["edges"] if e["to"] == t]
                rs = [e["to"] for e in d["edges"] if e["from"] == t]
                lines.append(f"  {t}: {', '.join(ws)} ==> {', '.join(rs)}")
        return "\n".join(lines)

    def __repr__(self) -> str:
        if self._subs is not None:
            return (f"Plan({len(self._subs)} sub-topologies, stores={self.store_names}, "
                    f"repartition_topics={self.repartition_topics})")
        return (f"Plan(sources={self.source_topics}, stores={self.store_names}, "
                f"sinks={self.sink_topics}, routes={len(self.routes)})")


def _lookup_stores(t: Node) -> list:
    """The stores a read of table t looks into (a lookup edge in the drawing)."""
    if t.kind in (g.TABLE_FILTER, g.TABLE_MAP_VALUES):
        return _lookup_stores(t.parent)
    if t.kind == g.TABLE_MERGE:
        return _lookup_stores(t.parent.parent) + _lookup_stores(t.extra_parents[0].parent)
    if t.kind == g.SUPPRESS:
        return [t.stores[0].name] + _lookup_stores(t.parent)
    return [t.stores[0].name] if t.stores else []
