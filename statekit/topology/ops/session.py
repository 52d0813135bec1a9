"""Session-windowed aggregation, Kafka Streams' KStreamSessionWindowAggregate.

A record at time t (its key not None; a None value still reaches the aggregator, as in Kafka
Streams) finds the key's sessions with end >= t - gap and start <= t + gap, merges them with [t, t]
(merger for their aggregates) and, unless the merged session ends before the close time (stream
time - grace - gap: then the record is dropped as late), removes the merged sessions (forwarding a
None for each), adds the record with the aggregator and writes the merged session (forwarding it).
Updates carry the session's end as their timestamp. A session is visible while its end is after
the store's stream time - retention (retention defaults to gap + grace; the session store applies
that rule)."""
from __future__ import annotations


def session_aggregate(tp, n, down):
    store = tp.store(n.stores[0].name)
    p = n.params
    w = p["windows"]
    gap, grace = w.gap_ms, w.grace_ms
    emit, _cached = tp.holder(n, down)
    op = p["op"]
    fn = n.fn
    if op == "count":
        init = lambda: 0                              # noqa: E731
        agg = lambda k, v, a: a + 1                   # noqa: E731
        merge = lambda k, a, b: a + b                 # noqa: E731
    elif op == "reduce":
        init = lambda: None                           # noqa: E731
        agg = lambda k, v, a: v if a is None else fn(a, v)        # noqa: E731
        merge = lambda k, a, b: b if a is None else fn(a, b)      # noqa: E731
    else:
        init, agg, merge = fn
    name = n.name
    times = tp.times
    rec = tp.rec

    def f(k, v):
        if k is None:
            tp.skipped_null += 1
            return
        ts = rec.timestamp
        st = times.get(name, -1)
        if ts > st:
            st = times[name] = ts
        close = st - grace - gap
        found = store.find_sessions(k, ts - gap, ts + gap)
        acc = tp.call(n, k, v, init)
        start = end = ts
        for s, e, a in found:
            acc = tp.call(n, k, v, merge, k, acc, a)
            start, end = min(start, s), max(end, e)
        if end < close:
            tp.dropped_late += 1
            return
        saved = rec.timestamp
        prior = None
        try:
            if (start, end) != (ts, ts):
                for s, e, a in found:
                    store.remove(k, s, e)
                    rec.timestamp = e
                    emit((k, s, e), None, a)
            elif found:
                # the record falls on the one-point session [ts, ts], updated in place: its old value
                # goes with the update (a record cache that saw the session created in an earlier
                # batch must forward its removal later in this one)
                prior = found[0][2]
            acc = tp.call(n, k, v, agg, k, v, acc)
            store.put(k, start, end, acc)
            rec.timestamp = end
            emit((k, start, end), acc, prior)
        finally:
            rec.timestamp = saved
    return f
