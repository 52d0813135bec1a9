"""Sliding-window aggregation, Kafka Streams' KStreamSlidingWindowAggregate (its reverse-iterator
path), so results match Kafka's window for window.

Windows are [start, start + d] (both ends included) and stored at `start` with their aggregate and
the largest record timestamp in them. A record at t updates every existing window that contains it,
creates its own left window [t - d, t] (seeded with the aggregate of the records already in it,
taken from the window just before) unless it exists, the right window [t + 1, t + 1 + d] when a
later record already falls in it, and the previous record's right window when this record falls in
it. Records before d ms go to the window [0, d] ("early" records). A record is dropped when its
window [t, t + d] ends before stream time - grace; a window that ended before that is no longer
updated. Windows are visible while their start is after the store's stream time - retention
(retention defaults to 2 * d + grace)."""
from __future__ import annotations

from statekit.errors import ProcessorError


def sliding_aggregate(tp, n, down):
    store = tp.store(n.stores[0].name)
    p = n.params
    w = p["windows"]
    d, grace = w.difference_ms, w.grace_ms
    retention = p["retention_ms"]
    emit, _cached = tp.holder(n, down)
    op = p["op"]
    fn = n.fn
    if op == "count":
        init = lambda: 0                              # noqa: E731
        agg = lambda k, v, a: a + 1                   # noqa: E731
    elif op == "reduce":
        init = lambda: None                           # noqa: E731
        agg = lambda k, v, a: v if a is None else fn(a, v)   # noqa: E731
    else:
        init, agg = fn
    name = n.name
    store_key = f"{name}.store"
    times = tp.times
    rec = tp.rec

    def fetch(k, lo, hi):
        """Visible windows of k with lo <= start <= hi, ascending: [(start, (max_ts, agg))]."""
        sst = times.get(store_key, -1)
        if sst >= 0:
            lo = max(lo, sst - retention + 1)
        return list(store.fetch(k, lo, hi)) if lo <= hi else []

    def put(k, start, value):
        store.put(k, value, start)
        if start > times.get(store_key, -1):
            times[store_key] = start

    def forward(k, start, new, old, ts):
        saved = rec.timestamp
        rec.timestamp = ts
        try:
            emit((k, start), new, old)
        finally:
            rec.timestamp = saved

    def update(k, v, start, end, vat, ts, close):
        if end < close:
            return
        old = None if vat is None else vat[1]
        new = tp.call(n, k, v, agg, k, v, old)
        new_ts = ts if old is None else max(ts, vat[0])
        put(k, start, (new_ts, new))
        forward(k, start, new, old, new_ts)

    def create_current_right(k, ts, right):
        put(k, ts + 1, right)
        forward(k, ts + 1, right[1], None, right[0])

    def create_windows(k, v, ts, close, starts, right, left, left_made, right_made, prev):
        if prev is not None:
            prs = prev + 1
            if prs not in starts and prs + d >= ts:
                update(k, v, prs, prs + d, (ts, tp.call(n, k, v, init)), ts, close)
        if not left_made:
            if prev is not None and ts - d <= prev:
                vat = (ts, left[1])
            else:
                vat = (ts, tp.call(n, k, v, init))
            update(k, v, ts - d, ts, vat, ts, close)
        if not right_made and right is not None and right[0] > ts:
            create_current_right(k, ts, right)

    def process_reverse(k, v, ts, close):
        starts = set()
        left = right = None
        left_made = right_made = False
        prev = None
        for start, vat in reversed(fetch(k, max(0, ts - 2 * d), ts + 1)):
            starts.add(start)
            end = start + d
            wmax = vat[0]
            if start == ts + 1:
                right_made = True
            elif end > ts:
                if right is None:
                    right = vat
                update(k, v, start, end, vat, ts, close)
            elif end == ts:
                left_made = True
                update(k, v, start, end, vat, ts, close)
                if wmax < ts:
                    prev = wmax
                else:
                    return
            else:   # end < ts
                left = vat
                prev = wmax
                break
        create_windows(k, v, ts, close, starts, right, left, left_made, right_made, prev)

    def process_early(k, v, ts, close):
        combined = None
        right = None
        right_made = False
        starts = set()
        prev = None
        for start, vat in fetch(k, 0, ts + 1):
            starts.add(start)
            wmax = vat[0]
            if start == 0:
                combined = vat
                if wmax < ts:
                    prev = wmax
            elif start <= ts:
                right = vat
                update(k, v, start, start + d, vat, ts, close)
            elif start == ts + 1:
                right_made = True
        if right is None and combined is not None and combined[0] > ts:
            right = combined
        if not right_made and right is not None and right[0] > ts:
            create_current_right(k, ts, right)
        if prev is not None and prev + 1 not in starts:
            update(k, v, prev + 1, prev + 1 + d, (ts, tp.call(n, k, v, init)), ts, close)
        if combined is None:
            update(k, v, 0, d, (ts, tp.call(n, k, v, init)), ts, close)
        else:
            update(k, v, 0, d, combined, ts, close)

    def f(k, v):
        if k is None or v is None:
            tp.skipped_null += 1
            return
        ts = rec.timestamp
        if ts is None or ts < 0:
            raise ProcessorError(f"{name} (sliding windows): record timestamp {ts!r} from "
                                 f"{rec.topic} partition {rec.partition} offset {rec.offset} is "
                                 f"negative; sliding windows need timestamps >= 0")
        st = times.get(name, -1)
        if ts > st:
            st = times[name] = ts
        close = st - grace
        if ts + d < close:
            tp.dropped_late += 1
            return
        if ts < d:
            process_early(k, v, ts, close)
        else:
            process_reverse(k, v, ts, close)
    return f
