"""compile(): checks a topology graph and turns it into the engine-agnostic `Plan`.

1. Store names are resolved (explicit names first, then readable generated ones).
2. The graph is cloned (compiling twice, or with another application name, never changes the
   builder's graph) and checked: windows, suppressions, processors' punctuators.
3. Repartitions. A task is its source partition, as in Kafka Streams: its records arrive
   partitioned by their key as the producer wrote it, and every step runs in the task. A step that
   needs its input partitioned by key (an aggregation, a join, a store lookup:
   `graph.KEY_DEPENDENT`) must not see records whose key was changed before it (by a map, a
   group_by, a process step, a windowed aggregation, a table's group_by...): the records go out
   through a *repartition topic* `<application>-<name>-repartition` (a sink of this part of the
   topology) and come back in as a source, partitioned by their new key — Kafka Streams' rule.
   `engine_shuffle=True` compiles for an engine that partitions records itself between the
   stateless steps and the task (Spark's own state store, `statekit.NativeApp`): key changes before
   the first keyed step then need no topic.
4. Sub-topologies: the connected parts of the graph once repartition topics cut it (flow edges,
   table lookups and shared stores connect), in topological order (upstream first). Each becomes a
   `Plan` with one shuffle, as before; a topology without repartition topics is one Plan.
"""
from __future__ import annotations

from typing import Any, Optional

from statekit.contracts import repartition_name, repartition_topic
from statekit.errors import TopologyError
from statekit.topology import graph as g
from statekit.topology.graph import Node, StoreDecl, same_serde, serde_label
from statekit.topology.plan import Plan, RouteSpec, SinkSpec, SourceSpec
from statekit.topology.serdes import RepartitionSerde
from statekit.topology.steps import describe_step

# Names reserved for stores statekit adds to a task (`_task`: the outbox, stream time, meta).
RESERVED_PREFIX = "_"

# Key-dependent steps that still want records with a None key (a left/outer stream-stream join
# emits them as unmatched; a left foreign-key join answers a None foreign key with None).
NULL_KEY_OK = {g.STREAM_JOIN, g.FK_RECEIVE}


def compile_plan(builder, application: Optional[str] = None, *, engine_shuffle: bool = False) -> Plan:
    if not builder.nodes:
        raise TopologyError("the topology is empty: read a topic with builder.stream(...) or "
                            "builder.table(...)")
    if application is not None and (not isinstance(application, str) or not application):
        raise TopologyError(f"application must be a non-empty string, got {application!r}")
    decls = _resolve_stores(builder)
    nodes = _clone(builder.nodes)
    _check_suppressions(nodes)
    _probe_processors(nodes)
    _insert_repartitions(nodes, application, engine_shuffle)
    post = _phases(nodes, engine_shuffle)
    _check_partitioning(nodes, post)
    _mark_send_old(nodes)
    _check_sink_serdes(nodes)
    comps = _components(nodes)
    subplans = [_subplan(i, comp, decls, post, application, engine_shuffle)
                for i, comp in enumerate(comps)]
    if len(subplans) == 1:
        return subplans[0]
    return Plan.composite(subplans, application)


# -- store names ------------------------------------------------------------------------------------

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


# -- the working copy ---------------------------------------------------------------------------------

def _clone(nodes: list) -> list:
    """Fresh Node objects with the same links (functions, params and store declarations shared)."""
    m = {}
    for n in nodes:
        m[id(n)] = Node(name=n.name, kind=n.kind, fn=n.fn, params=dict(n.params),
                        stores=list(n.stores), key_serde=n.key_serde, value_serde=n.value_serde,
                        origin=n.origin)
    for n in nodes:
        c = m[id(n)]
        c.parent = None if n.parent is None else m[id(n.parent)]
        c.extra_parents = [m[id(p)] for p in n.extra_parents]
        c.children = [m[id(ch)] for ch in n.children]
        c.table = None if n.table is None else m[id(n.table)]
    return [m[id(n)] for n in nodes]


def _where(n: Node) -> str:
    return f"{n.name} ({describe_step(n)})"


# -- checks before repartitioning ----------------------------------------------------------------------

def _window_grace(n: Node, seen: str = "") -> tuple:
    """(grace that closes a window, kind of window) of the windowed table behind n (Kafka
    Streams' GraphGraceSearchUtil): session windows close gap + grace after their end."""
    chain = n.name if not seen else f"{n.name} -> {seen}"
    if n.kind == g.WINDOW_AGGREGATE:
        return n.params["grace_ms"], ("time", n.params["windows"].size_ms)
    if n.kind == g.SLIDING_AGGREGATE:
        w = n.params["windows"]
        return w.grace_ms, ("sliding", w.difference_ms)
    if n.kind == g.SESSION_AGGREGATE:
        w = n.params["windows"]
        return w.grace_ms + w.gap_ms, ("session", 0)
    if n.kind in (g.TABLE_FILTER, g.TABLE_MAP_VALUES, g.SUPPRESS) and n.parent is not None:
        return _window_grace(n.parent, chain)
    raise TopologyError(f"suppress(until_window_closes()) needs a windowed table, but {chain} has "
                        f"no window to close; use until_time_limit(ms) or suppress a windowed "
                        f"count/reduce/aggregate")


def _check_suppressions(nodes: list) -> None:
    for n in nodes:
        if n.kind == g.SUPPRESS and n.params["until"].kind == "window_close":
            grace, window = _window_grace(n.parent)
            n.params["grace_ms"] = grace
            n.params["window"] = window


class _NullStore:
    """What a processor's init() gets from the probe context: reads find nothing, writes vanish."""

    def __getattr__(self, name):
        def nothing(*a, **k):
            return None if name not in ("all", "fetch", "range", "prefix_scan", "fetch_all",
                                        "find_sessions") else iter(())
        return nothing


class _ProbeContext:
    """The context compile() hands each processor's init() once, to check its schedule() calls."""

    task_id = 0
    batch_id = -1
    timestamp = 0
    offset = None
    partition = None
    topic = None
    stream_time = -1

    def __init__(self, node: Node) -> None:
        self._node = node
        self.schedules = []

    def get_store(self, name: str):
        return _NullStore()

    def forward(self, key, value) -> None:
        pass

    def schedule(self, interval_ms, punctuation_type, callback):
        from statekit.topology.processor import Cancellable
        from statekit.topology.punctuation import check_schedule

        check_schedule(_where(self._node), interval_ms, punctuation_type, callback, TopologyError)
        self.schedules.append((int(interval_ms), punctuation_type.value))

        class _S:
            cancelled = False

            def cancel(self):
                self.cancelled = True
        return Cancellable(_S())


def _probe_processors(nodes: list) -> None:
    """Refuse a punctuator interval <= 0 when the topology compiles: run each processor's init()
    once against a probe context (reads find nothing). An init() that fails on the probe is not
    judged here (its task reports it when it runs)."""
    for n in nodes:
        if n.kind != g.PROCESS:
            continue
        try:
            inst = n.fn()
        except Exception:
            continue
        init = getattr(inst, "init", None)
        if init is None or not callable(init):
            continue
        probe = _ProbeContext(n)
        try:
            init(probe)
        except TopologyError:
            raise
        except Exception:
            continue
        n.params["schedules"] = probe.schedules


# -- repartitions ---------------------------------------------------------------------------------------

def _phases(nodes: list, engine_shuffle: bool = False) -> dict:
    """post[name]: the node runs in a task. Without an engine shuffle every node does (the task reads
    its source partition). With one, a node runs in the task when it needs keyed input, runs user
    processors or writes a sink, or follows a node that runs in the task; the others run before the
    engine's shuffle."""
    post: dict[str, bool] = {}
    for n in nodes:   # parents first
        post[n.name] = (not engine_shuffle or n.kind in g.KEY_DEPENDENT
                        or n.kind in (g.PROCESS, g.SINK) or any(post[p.name] for p in n.parents()))
    return post


def _keying(nodes: list, post: dict) -> tuple:
    """For task nodes: rekeyed[name] (the node that changed the key in this task since its records
    were partitioned, or None) and part[name] (the serde whose bytes partitioned them; None when
    the inputs disagree)."""
    rekeyed: dict = {}
    part: dict = {}
    for n in nodes:
        if not post[n.name]:
            continue
        ins = [_edge_keying(p, post, rekeyed, part) for p in n.parents()]
        rk = next((r for r, _ in ins if r is not None), None)
        serdes = [s for _, s in ins]
        ps = serdes[0] if serdes else n.key_serde
        if any(s is None or not same_serde(s, ps) for s in serdes[1:]) or ps is None:
            ps = None
            rk = rk or n
        part[n.name] = ps
        rekeyed[n.name] = n if n.kind in g.KEY_CHANGING else rk
    return rekeyed, part


def _edge_keying(p: Node, post: dict, rekeyed: dict, part: dict) -> tuple:
    """(rekeyed, partition serde) of the records flowing out of p into a task node."""
    if not post[p.name]:
        return None, p.key_serde
    return rekeyed[p.name], part[p.name]


def _repartition_name(n: Node) -> str:
    if n.kind == g.FK_RECEIVE:
        return f"{n.stores[0].name}-registration"
    if n.kind == g.FK_RESPONSE:
        recv = next(p for p in n.parent.parents() if p.kind == g.FK_RECEIVE)
        return f"{recv.stores[0].name}-response"
    if n.stores:
        return n.stores[0].name
    return n.name.lower()


def _insert_repartitions(nodes: list, application: Optional[str], engine_shuffle: bool) -> None:
    while True:
        post = _phases(nodes, engine_shuffle)
        rekeyed, part = _keying(nodes, post)
        hit = None
        for n in nodes:
            if n.kind not in g.KEY_DEPENDENT or not post[n.name]:
                continue
            for p in n.parents():
                rk, _ = _edge_keying(p, post, rekeyed, part)
                if rk is not None:
                    hit = (n, p, rk)
                    break
            if hit:
                break
        if hit is None:
            return
        n, p, rk = hit
        if p.kind in g.TABLE_KINDS and n.kind != g.TABLE_AGGREGATE:
            raise TopologyError(f"{_where(n)} reads a table whose key was changed by {_where(rk)}: "
                                f"a table cannot be repartitioned; to_stream() it, change the key "
                                f"and group or join the stream")
        name = _repartition_name(n)
        if application is None:
            raise TopologyError(
                f"{_where(n)} needs its records partitioned by key, but {_where(rk)} changed the "
                f"key before it: this topology needs a repartition topic "
                f"({repartition_topic('<application>', name)}); compile it with the application name, "
                f"builder.compile(application=...)")
        _insert(nodes, p, n, application, name)


def _insert(nodes: list, p: Node, n: Node, application: str, name: str) -> None:
    """Replace the edge p -> n by p -> sink(topic) ... source(topic) -> n."""
    topic = repartition_topic(application, name)
    changes = p.kind in g.TABLE_KINDS
    vs = RepartitionSerde(p.value_serde) if changes else p.value_serde
    params = {"topic": topic, "repartition": True, "changes": changes,
              "keep_null_keys": n.kind in NULL_KEY_OK}
    sink = Node(name=f"KSTREAM-SINK-{repartition_name(name)}", kind=g.SINK, parent=p,
                params=dict(params), key_serde=p.key_serde, value_serde=vs, origin=p.origin)
    src = Node(name=f"KSTREAM-SOURCE-{repartition_name(name)}", kind=g.SOURCE,
               params=dict(params, role="stream"), key_serde=p.key_serde, value_serde=vs,
               origin=p.origin, children=[n])
    p.children = [sink if c is n else c for c in p.children]
    if n.parent is p:
        n.parent = src
    else:
        n.extra_parents = [src if q is p else q for q in n.extra_parents]
    nodes.insert(nodes.index(p) + 1, sink)
    nodes.insert(nodes.index(n), src)


# -- checks after repartitioning ----------------------------------------------------------------------

def _check_partitioning(nodes: list, post: dict) -> None:
    rekeyed, part = _keying(nodes, post)

    def input_serde(n: Node) -> Any:
        ins = [_edge_keying(p, post, rekeyed, part)[1] for p in n.parents()]
        return ins[0] if ins else n.key_serde

    for n in nodes:
        if not post[n.name]:
            continue
        # stores keyed by the partitioning key: interactive queries look a key up in
        # partition_for(store key bytes), so the store's key serde must be the partitioning one
        if n.kind in (g.AGGREGATE, g.WINDOW_AGGREGATE, g.TABLE_SOURCE, g.SESSION_AGGREGATE,
                      g.SLIDING_AGGREGATE, g.TABLE_AGGREGATE):
            d = n.stores[0]
            sk = "json" if d.key_serde is None else d.key_serde
            ps = part[n.name]
            if ps is not None and not same_serde(sk, ps):
                raise TopologyError(
                    f"store {d.name!r} has key serde {serde_label(sk)!r} but {_where(n)} receives "
                    f"keys partitioned by their {serde_label(ps)!r} bytes: interactive queries would "
                    f"look for a key in the wrong task; leave the store's key_serde out or make "
                    f"them equal")
        # lookups: the table read must live in the same task, keyed by the same bytes
        if n.table is not None:
            t = n.table
            mine = input_serde(n)
            if rekeyed.get(t.name) is not None:
                raise TopologyError(f"{_where(n)} reads a table whose key was changed by "
                                    f"{_where(rekeyed[t.name])}: the two are not co-partitioned")
            theirs = part.get(t.name)
            if mine is None or theirs is None or not same_serde(mine, theirs):
                raise TopologyError(
                    f"{_where(n)} joins inputs keyed with serde {serde_label(mine)!r} and a table "
                    f"keyed with {serde_label(theirs)!r}: they are not co-partitioned (the same key "
                    f"would land in different tasks); give both the same key serde (key_serde= on "
                    f"the map/group_by/source that sets it)")
            if _getter_root(t) is None:
                raise TopologyError(f"{_where(n)} reads {_where(t)}, which keeps no store to read: "
                                    f"materialize it (store=...) before joining it")
        if n.kind == g.STREAM_JOIN and n.params["side"] == "right":
            left = next(m for m in nodes if m.kind == g.STREAM_JOIN
                        and m.params.get("join") == n.params["join"] and m.params["side"] == "left")
            a, b = input_serde(left), input_serde(n)
            if a is None or b is None or not same_serde(a, b):
                raise TopologyError(
                    f"{_where(left)} joins streams keyed with serde {serde_label(a)!r} and "
                    f"{serde_label(b)!r}: they are not co-partitioned, even through a repartition "
                    f"(the same key gives other bytes); give both the same key serde (key_serde= "
                    f"on the map/select_key/source that sets it)")


def _getter_root(t: Node) -> Optional[Node]:
    """Can a table's current value be read by key? The node its reads bottom out in, else None."""
    k = t.kind
    if k in (g.TABLE_SOURCE, g.AGGREGATE, g.TABLE_AGGREGATE):
        return t
    if k in (g.TABLE_FILTER, g.TABLE_MAP_VALUES, g.SUPPRESS):
        return _getter_root(t.parent)
    if k == g.TABLE_MERGE:
        return t if _getter_root(t.parent.parent) and _getter_root(t.extra_parents[0].parent) else None
    if k == g.FK_RESPONSE:
        return t if t.stores else None
    return None


def _mark_send_old(nodes: list) -> None:
    """Table steps forward old values only where a later step needs them (Kafka Streams'
    sendOldValues): a table's group_by, a foreign-key join's subscriptions, suppression's prior
    value, the outer side(s) of a table-table join, and the views and joins between."""
    need: dict = {}
    for n in reversed(nodes):   # children first
        wants = False
        for c in n.children:
            if c.kind in (g.TABLE_GROUP_BY, g.FK_SEND, g.SUPPRESS):
                wants = True
            elif c.kind == g.TABLE_JOIN and (c.params["how"] == "outer" or (
                    c.params["how"] == "left" and c.params["side"] == "left")):
                wants = True     # the join tells a deleted row from a never-present one by it
            elif c.kind in (g.TABLE_FILTER, g.TABLE_MAP_VALUES, g.TABLE_JOIN, g.TABLE_MERGE) and \
                    need.get(c.name):
                wants = True
            elif c.kind == g.SINK and c.params.get("changes"):
                wants = True
        need[n.name] = wants
        if n.kind in g.TABLE_KINDS:
            n.params["send_old"] = wants


def _check_sink_serdes(nodes: list) -> None:
    sinks: dict = {}
    for n in nodes:
        if n.kind != g.SINK:
            continue
        topic = n.params["topic"]
        old = sinks.get(topic)
        if old is not None and (serde_label(old.key_serde), serde_label(old.value_serde)) != (
                serde_label(n.key_serde), serde_label(n.value_serde)):
            raise TopologyError(f"sink topic {topic!r} is written with two different serdes "
                                f"({serde_label(old.key_serde)}/{serde_label(old.value_serde)} and "
                                f"{serde_label(n.key_serde)}/{serde_label(n.value_serde)})")
        sinks[topic] = n


# -- sub-topologies ---------------------------------------------------------------------------------------

def _components(nodes: list) -> list:
    """The sub-topologies: lists of nodes (in graph order), upstream first (see _group)."""
    index = {n.name: i for i, n in enumerate(nodes)}
    parent = list(range(len(nodes)))

    def find(i):
        while parent[i] != i:
            parent[i] = parent[parent[i]]
            i = parent[i]
        return i

    def union(a, b):
        ra, rb = find(index[a.name]), find(index[b.name])
        if ra != rb:
            parent[max(ra, rb)] = min(ra, rb)

    by_store: dict = {}
    for n in nodes:
        for p in n.parents():
            union(n, p)
        if n.table is not None:
            union(n, n.table)
        for d in n.stores:
            if d.name in by_store:
                union(n, by_store[d.name])
            else:
                by_store[d.name] = n
    groups: dict = {}
    for n in nodes:
        groups.setdefault(find(index[n.name]), []).append(n)
    comps = list(groups.values())
    # a repartition topic inside one part would have it read its own output
    cid = {n.name: i for i, comp in enumerate(comps) for n in comp}
    writes: dict = {}
    for n in nodes:
        if n.kind == g.SINK and n.params.get("repartition"):
            writes[n.params["topic"]] = cid[n.name]
    deps: dict = {i: set() for i in range(len(comps))}
    for n in nodes:
        if n.kind == g.SOURCE and n.params.get("repartition"):
            up = writes[n.params["topic"]]
            if up == cid[n.name]:
                raise TopologyError(
                    f"{n.params['topic']} would be read back by the same part of the topology that "
                    f"writes it ({_where(n.children[0])} shares a store or a table with the steps "
                    f"before the repartition); split the topology with .to(topic) and a second "
                    f"stream(topic)")
            deps[cid[n.name]].add(up)
    return [[n for n in nodes if cid[n.name] in group] for group in _group(comps, deps, index)]


def _group(comps: list, deps: dict, index: dict) -> list:
    """Sub-topologies as sets of connected parts: parts at the same depth of the repartition graph
    run together (one query each; a topology without repartition topics is one sub-topology), in
    depth order. A foreign-key join's answers go back upstream (a cycle): the parts of a cycle stay
    separate, in graph order, at the depth where the cycle starts."""
    n = len(comps)
    sccs = _sccs(n, deps)
    scc_of = {c: i for i, members in enumerate(sccs) for c in members}
    depth: dict = {}

    def scc_depth(i):
        if i not in depth:
            ups = {scc_of[u] for c in sccs[i] for u in deps[c]} - {i}
            depth[i] = 1 + max((scc_depth(u) for u in ups), default=-1)
        return depth[i]

    first = {i: min(index[comps[c][0].name] for c in sccs[i]) for i in range(len(sccs))}
    groups: list = []
    for d in sorted({scc_depth(i) for i in range(len(sccs))}):
        level = sorted((i for i in range(len(sccs)) if depth[i] == d), key=lambda i: first[i])
        merged = set()
        cyclic = []
        for i in level:
            if len(sccs[i]) == 1:
                merged |= set(sccs[i])
            else:
                cyclic.append(i)
        if merged:
            groups.append(merged)
        for i in cyclic:
            for c in sorted(sccs[i], key=lambda c: index[comps[c][0].name]):
                groups.append({c})
    return groups


def _sccs(n: int, deps: dict) -> list:
    """Strongly connected parts of the dependency graph (Tarjan), each a list of part indexes."""
    order, low, on, stack, out = {}, {}, set(), [], []

    def visit(v):
        order[v] = low[v] = len(order)
        stack.append(v)
        on.add(v)
        for w in deps[v]:
            if w not in order:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], order[w])
        if low[v] == order[v]:
            members = []
            while True:
                w = stack.pop()
                on.discard(w)
                members.append(w)
                if w == v:
                    break
            out.append(members)

    for v in range(n):
        if v not in order:
            visit(v)
    return out


def _subplan(idx: int, comp: list, decls: list, post: dict, application,
             engine_shuffle: bool = False) -> Plan:
    names = {n.name for n in comp}
    sources: list[SourceSpec] = []
    src_index: dict = {}
    for n in comp:
        if n.kind == g.SOURCE:
            src_index[n.name] = len(sources)
            sources.append(SourceSpec(len(sources), n.params["topic"], n.params["role"],
                                      n.key_serde, n.value_serde, n.name,
                                      bool(n.params.get("repartition"))))
    # which sources reach each stage-1 node (a merge of two sources is reached by both)
    reach: dict = {}
    for n in comp:
        if post[n.name]:
            continue
        if n.kind == g.SOURCE:
            reach[n.name] = [src_index[n.name]]
        else:
            seen = []
            for p in n.parents():
                for s in reach[p.name]:
                    if s not in seen:
                        seen.append(s)
            reach[n.name] = seen
    routes: list[RouteSpec] = []
    have = set()
    if not engine_shuffle:   # no shuffle: a route per source, straight into the task
        routes = [RouteSpec(s.index, s.index, s.node, s.key_serde, False) for s in sources]
    for n in comp if engine_shuffle else ():
        if not post[n.name]:
            continue
        for p in n.parents():
            if post[p.name]:
                continue
            for si in reach[p.name]:
                if (si, n.name) in have:
                    continue
                have.add((si, n.name))
                routes.append(RouteSpec(len(routes), si, n.name, p.key_serde,
                                        n.kind in g.KEY_DEPENDENT and n.kind not in NULL_KEY_OK))
    sinks: dict = {}
    for n in comp:
        if n.kind == g.SINK:
            sinks[n.params["topic"]] = SinkSpec(n.params["topic"], n.key_serde, n.value_serde,
                                                bool(n.params.get("repartition")))
    used = []
    for d in decls:
        if any(d in n.stores for n in comp) and d not in used:
            used.append(d)
    rp = [s.topic for s in sources if s.internal] + [s.topic for s in sinks.values() if s.internal]
    return Plan(sources=sources, store_decls=used, sinks=list(sinks.values()), routes=routes,
                nodes=comp, post={k: v for k, v in post.items() if k in names},
                subtopology_index=idx, repartition_topics=rp, application=application,
                engine_shuffle=engine_shuffle)

