"""The stateful operators a task runs, one module per family; `build(tp, node, down)` returns the
function that processes one record (key, value) of `node` and calls `down(key, value)` for what it
forwards. `tp` is the `TaskProcessor` (stores, record metadata, per-operator stream time in
`tp.times`, the forward-on-flush holder).

Table operators receive and forward changes `(new, old)` (see statekit.topology.steps).
"""
from __future__ import annotations

from statekit.errors import TopologyError
from statekit.topology import graph as g


def build(tp, n, down):
    from statekit.topology.ops import aggregate, fk_join, session, sliding, stream_join, suppress
    from statekit.topology.ops import table_join

    k = n.kind
    builders = {
        g.TABLE_SOURCE: aggregate.table_source, g.AGGREGATE: aggregate.aggregate,
        g.WINDOW_AGGREGATE: aggregate.window_aggregate, g.TABLE_GROUP_BY: aggregate.table_group_by,
        g.TABLE_AGGREGATE: aggregate.table_aggregate, g.JOIN: table_join.stream_table_join,
        g.STREAM_JOIN: stream_join.stream_join, g.TABLE_JOIN: table_join.table_join,
        g.SESSION_AGGREGATE: session.session_aggregate, g.SLIDING_AGGREGATE: sliding.sliding_aggregate,
        g.SUPPRESS: suppress.suppress, g.FK_SEND: fk_join.send, g.FK_RECEIVE: fk_join.receive,
        g.FK_FOREIGN: fk_join.foreign, g.FK_RESPONSE: fk_join.response,
    }
    f = builders.get(k)
    if f is None:  # pragma: no cover - compile() only lets known kinds into a task
        raise TopologyError(f"{n.name}: step kind {k!r} cannot run in a task")
    return f(tp, n, down)


def table_getter(tp, t):
    """key -> current value of the table `t` (what a join or a lookup reads)."""
    from statekit.topology.ops import suppress, table_join

    k = t.kind
    if k in (g.TABLE_SOURCE, g.AGGREGATE, g.TABLE_AGGREGATE) or (k == g.FK_RESPONSE and t.stores):
        return tp.store(t.stores[0].name).get
    if k == g.TABLE_FILTER:
        parent = tp.getter(t.parent)

        def get(key):
            v = parent(key)
            if v is None:
                return None
            return v if tp.call(t, key, v, t.fn, key, v) else None
        return get
    if k == g.TABLE_MAP_VALUES:
        parent = tp.getter(t.parent)

        def get(key):
            v = parent(key)
            return None if v is None else tp.call(t, key, v, t.fn, v)
        return get
    if k == g.TABLE_MERGE:
        return table_join.merge_getter(tp, t)
    if k == g.SUPPRESS:
        return suppress.getter(tp, t)
    raise TopologyError(f"{t.name}: this table keeps no store to read; materialize it first")
