"""Tables and aggregations: a table topic materialized, count/reduce/aggregate per key and per time
window, and the re-aggregation of a table grouped by a new key (adder and subtractor)."""
from __future__ import annotations

from statekit.topology.held import held_key


def table_source(tp, n, down):
    """Each record upserts its key (a None value deletes); forwards (new, old)."""
    store = tp.store(n.stores[0].name)
    send_old = n.params.get("send_old", False)
    get, put = store.get, store.put

    def f(k, v):
        if k is None:
            tp.skipped_null += 1
            return
        old = get(k) if send_old else None
        put(k, v)
        down(k, (v, old))
    return f


def aggregate(tp, n, down):
    store = tp.store(n.stores[0].name)
    op = n.params["op"]
    emit, cached = tp.holder(n, down)
    get, put = store.get, store.put
    rec = tp.rec
    if op == "count":
        if cached:
            held = tp.held_of(n)

            def f(k, v):
                if k is None or v is None:
                    tp.skipped_null += 1
                    return
                old = get(k)
                c = 1 if old is None else old + 1
                put(k, c)
                hk = k if type(k) is str else held_key(k)
                h = held.get(hk)
                held[hk] = (c, old if h is None else h[1], rec.timestamp, rec.offset,
                            rec.partition, rec.topic)
            return f

        def f(k, v):
            if k is None or v is None:
                tp.skipped_null += 1
                return
            old = get(k)
            c = (old or 0) + 1
            put(k, c)
            emit(k, c, old)
        return f
    if op == "reduce":
        fn = n.fn

        def f(k, v):
            if k is None or v is None:
                tp.skipped_null += 1
                return
            old = get(k)
            new = v if old is None else tp.call(n, k, v, fn, old, v)
            put(k, new)
            emit(k, new, old)
        return f
    init, agg = n.fn

    def f(k, v):
        if k is None or v is None:
            tp.skipped_null += 1
            return
        old = get(k)
        new = tp.call(n, k, v, lambda: agg(k, v, init() if old is None else old))
        put(k, new)
        emit(k, new, old)
    return f


def window_aggregate(tp, n, down):
    """Time windows (tumbling, hopping): the task's stream time closes a window at end + grace."""
    store = tp.store(n.stores[0].name)
    emit, _cached = tp.holder(n, down)
    op = n.params["op"]
    windows = n.params["windows"]
    size = windows.size_ms
    grace = n.params["grace_ms"]
    fn = n.fn
    rec = tp.rec

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
            if op == "count":
                new = (old or 0) + 1
            elif op == "reduce":
                new = v if old is None else tp.call(n, k, v, fn, old, v)
            else:
                new = tp.call(n, k, v, lambda: fn[1](k, v, fn[0]() if old is None else old))
            store.put(k, new, start)
            emit((k, start), new, old)
    return f


def table_group_by(tp, n, down):
    """A table change becomes a subtraction from the old row's group and an addition to the new
    row's group — one record (new, old) when both are the same group (Kafka Streams'
    KTableRepartitionMap); a None group key drops that half."""
    fn = n.fn

    def f(k, change):
        if k is None:
            tp.skipped_null += 1
            return
        new, old = change
        nk = None if new is None else tp.call(n, k, new, fn, k, new)
        ok = None if old is None else tp.call(n, k, old, fn, k, old)
        if nk is not None and ok is not None and nk == ok:
            down(nk, (new, old))
            return
        if ok is not None:
            down(ok, (None, old))
        if nk is not None:
            down(nk, (new, None))
    return f


def table_aggregate(tp, n, down):
    """Subtract the old value (when the group has an aggregate), then add the new one (Kafka
    Streams' KTableAggregate / KTableReduce); a group that reaches None is deleted."""
    store = tp.store(n.stores[0].name)
    emit, _cached = tp.holder(n, down)
    op = n.params["op"]
    get, put = store.get, store.put
    if op == "count":
        init, add, sub = (lambda: 0), (lambda k, v, a: a + 1), (lambda k, v, a: a - 1)
    elif op == "aggregate":
        init, add, sub = n.fn
    else:
        radd, rsub = n.fn
        init = None
        add = lambda k, v, a: v if a is None else radd(a, v)   # noqa: E731
        sub = lambda k, v, a: rsub(a, v)                        # noqa: E731

    def f(k, change):
        if k is None:
            tp.skipped_null += 1
            return
        new, old = change
        agg = get(k)
        inter = agg
        if old is not None and agg is not None:
            inter = tp.call(n, k, old, sub, k, old, agg)
        if new is not None:
            if inter is None and init is not None:
                inter = tp.call(n, k, new, init)
            result = tp.call(n, k, new, add, k, new, inter)
        else:
            result = inter
        put(k, result)
        emit(k, result, agg)
    return f

