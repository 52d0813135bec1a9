"""The pieces every step shares: the record being processed, one-line errors, and the stateless
steps (map, filter, flat_map, ..., the table views), which run before the shuffle (Spark stage 1)
as well as inside a task.

Table steps receive and forward *changes*: `(new, old)` pairs (old is None unless a later step needs
it, Kafka Streams' "send old values"); stream steps plain values.
"""
from __future__ import annotations

from typing import Any

from statekit.errors import ProcessorError, StatekitError
from statekit.topology import graph as g
from statekit.topology.graph import Node


def describe_step(n: Node) -> str:
    """A few words for a node in errors and drawings (`count`, `left join`, `process(P)`)."""
    k = n.kind
    if k in (g.AGGREGATE, g.WINDOW_AGGREGATE, g.SESSION_AGGREGATE, g.SLIDING_AGGREGATE,
             g.TABLE_AGGREGATE):
        prefix = {g.WINDOW_AGGREGATE: "windowed ", g.SESSION_AGGREGATE: "session ",
                  g.SLIDING_AGGREGATE: "sliding ", g.TABLE_AGGREGATE: "table "}.get(k, "")
        return prefix + n.params.get("op", "aggregate")
    if k == g.PROCESS:
        return f"process({n.params.get('processor')})"
    if k == g.JOIN:
        return f"{n.params.get('how')} join"
    if k == g.STREAM_JOIN:
        return f"{n.params.get('how')} stream-stream join, {n.params.get('side')} side"
    if k == g.TABLE_JOIN:
        return f"{n.params.get('how')} table-table join, {n.params.get('side')} side"
    if k in (g.FK_SEND, g.FK_RECEIVE, g.FK_FOREIGN, g.FK_RESPONSE):
        return f"{n.params.get('how')} foreign-key join ({k[3:]})"
    if k == g.SUPPRESS:
        return f"suppress {n.params['until'].describe()}"
    if k in (g.SOURCE, g.SINK) and n.params.get("repartition"):
        return "repartition " + ("source" if k == g.SOURCE else "sink")
    return k.replace("_", " ")


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
    return ProcessorError(f"{node.name} ({describe_step(node)}) failed on key={_abbrev(key)} "
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
    if kind in (g.SOURCE, g.MERGE, g.TABLE_MERGE):
        return down
    if kind == g.TO_STREAM:
        def f(k, change):
            down(k, change[0])
        return f
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
        send_old = n.params.get("send_old", False)

        def keep(k, v):
            if v is None:
                return None
            try:
                return v if fn(k, v) else None
            except StatekitError:
                raise
            except Exception as e:
                raise _fail(n, rec, k, v, e) from e

        def f(k, change):
            new, old = change
            new = keep(k, new)
            if send_old:
                old = keep(k, old)
                if new is None and old is None:
                    return      # neither side passes: nothing changed in the view (Kafka Streams)
            down(k, (new, old))
    elif kind == g.TABLE_MAP_VALUES:
        send_old = n.params.get("send_old", False)

        def apply(k, v):
            if v is None:
                return None
            try:
                return fn(v)
            except StatekitError:
                raise
            except Exception as e:
                raise _fail(n, rec, k, v, e) from e

        def f(k, change):
            new, old = change
            down(k, (apply(k, new), apply(k, old) if send_old else None))
    else:
        return None
    return f
