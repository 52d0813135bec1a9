"""Stream-stream windowed joins, Kafka Streams' KStreamKStreamJoin (with its spurious-result fix).

Each side has a window store (`<join>-left`, `<join>-right`): every record with a key and a value
waits there, at its timestamp, for the other side's records (a list per (key, timestamp): records
with equal keys and timestamps all wait). A record at time t, on arrival:

1. advances the join's stream time (both sides share it, kept in the task's meta);
2. left/outer join, a None key and a value: forwarded at once as unmatched, joiner(v, None);
   otherwise a None key or value is skipped;
3. if it carries the join's stream time, emits the unmatched records whose window has closed (see
   below);
4. meets every other-side record with the same key and a timestamp in [t - before, t + after]
   (reversed for the right side) still held by the other store: one joiner(left, right) result each,
   at time max(t, other's time); a record it meets leaves the outer store;
5. left/outer join without a match: if its window already ended (t + after < stream time) it is
   forwarded at once as unmatched, else it waits in the outer store (`<join>-outer`, in
   (time, side, key) order);
6. waits in its own side's store (after the join: a record never meets itself).

Unmatched records leave the outer store when stream time passes their window's end + grace: a left
record at t once `t + after + grace < stream time`, a right one once `t + before + grace < stream
time`, forwarded as joiner(v, None) / joiner(None, v) at their own time. The window stores keep a
record while `t > store's stream time - (before + after + grace)` (Kafka's retention): an older one
no longer joins, which is how late records lose their partners. Kafka Streams throttles the emission
of unmatched records by wall-clock time; statekit does not (results depend on the data only).
"""
from __future__ import annotations


def stream_join(tp, n, down):
    p = n.params
    w = p["windows"]
    is_left = p["side"] == "left"
    how = p["how"]
    before, after = (w.before_ms, w.after_ms) if is_left else (w.after_ms, w.before_ms)
    outer_this = how in ("left", "outer") if is_left else how == "outer"
    grace = w.grace_ms
    retention = w.before_ms + w.after_ms + grace
    this_buf = tp.store(n.stores[0].name)
    other_buf = tp.store(n.stores[1].name)
    outer = tp.store(n.stores[2].name) if len(n.stores) > 2 else None
    joiner = n.fn
    jid = p["join"]
    times = tp.times
    key_this = f"{jid}.{'left' if is_left else 'right'}"
    key_other = f"{jid}.{'right' if is_left else 'left'}"
    smallest_lookback = min(w.after_ms, w.before_ms)
    rec = tp.rec
    forward_at = tp.forward_at

    def joined(k, mine, theirs):
        if is_left:
            return tp.call(n, k, mine, joiner, mine, theirs)
        return tp.call(n, k, mine, joiner, theirs, mine)

    def emit_unmatched(st):
        closed = []
        for key, (side_left, values) in outer.all():
            ots = key[0]
            if ots + smallest_lookback + grace >= st:
                break      # this one and every later one (time order) is still open
            lookback = w.after_ms if side_left else w.before_ms
            if ots + lookback + grace >= st:
                continue
            closed.append((key, side_left, values))
        for key, side_left, values in closed:
            ots, _s, k = key
            for v in values:
                out = (tp.call(n, k, v, joiner, v, None) if side_left
                       else tp.call(n, k, v, joiner, None, v))
                forward_at(down, k, out, ots)
            outer.delete(key)

    def f(k, v):
        ts = rec.timestamp
        st = times.get(jid, -1)
        if ts > st:
            st = times[jid] = ts
        if outer_this and k is None and v is not None:
            forward_at(down, k, joined(k, v, None), ts)
            return
        if k is None or v is None:
            tp.skipped_null += 1
            return
        if outer is not None and ts == st:
            emit_unmatched(st)
        t_from = max(0, ts - before)
        t_to = max(0, ts + after)
        other_st = times.get(key_other, -1)
        lo = max(t_from, other_st - retention + 1) if other_st >= 0 else t_from
        found = False
        if lo <= t_to:
            for ots, values in other_buf.fetch(k, lo, t_to):
                for ov in values:
                    found = True
                    if outer is not None:
                        okey = (ots, not is_left, k)
                        if outer.get(okey) is not None:
                            outer.delete(okey)
                    forward_at(down, k, joined(k, v, ov), max(ts, ots))
        if outer_this and not found:
            if outer is None or t_to < st:
                forward_at(down, k, joined(k, v, None), ts)
            else:
                okey = (ts, is_left, k)
                cur = outer.get(okey)
                outer.put(okey, (is_left, (cur[1] if cur else []) + [v]))
        # the record waits for the other side (unless already too old to be seen)
        this_st = times.get(key_this, -1)
        if ts > this_st:
            this_st = times[key_this] = ts
        if ts > this_st - retention:
            cur = this_buf.get(k, ts)
            this_buf.put(k, (cur or []) + [v], ts)
    return f
