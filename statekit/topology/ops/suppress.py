"""Suppression, Kafka Streams' KTableSuppressProcessor over a buffer store with a changelog.

Every table update enters the buffer (one entry per key; a key keeps the buffer time of its first
held update: "non-resetting"). Then every entry whose buffer time <= stream time - duration leaves,
oldest first, forwarded with its latest change and the metadata of its last update:

* until_window_closes(): buffer time = the window's end (time window: start + size; sliding:
  start + difference; session: its end), duration = the windows' grace (sessions: gap + grace), so a
  window's final value goes out once, when it can no longer change; tombstones are dropped.
* until_time_limit(ms): buffer time = the update's timestamp, duration = ms; tombstones go out.

Stream time here is the largest timestamp of the updates the suppression has seen. A full buffer
(`max_records`) emits its oldest entries early (time limit) or fails the task (window close: a
final result can never be emitted early). The buffer is committed with the batch: a crash neither
loses nor repeats an emitted result."""
from __future__ import annotations

from statekit.errors import ProcessorError


def suppress(tp, n, down):
    buf = tp.store(n.stores[0].name)
    p = n.params
    until = p["until"]
    final = until.kind == "window_close"
    if final:
        duration = p["grace_ms"]
        wkind, size = p["window"]
    else:
        duration = until.time_limit_ms
    max_records = until.max_records
    name = n.name
    times = tp.times
    rec = tp.rec

    def buffer_time(k):
        if not final:
            return rec.timestamp
        if wkind == "session":
            return k[2]
        return k[1] + size

    def emit(r):
        if r.value is None and final:
            return
        saved = (rec.topic, rec.partition, rec.offset, rec.timestamp)
        rec.topic, rec.partition, rec.offset, rec.timestamp = r.topic, r.partition, r.offset, r.timestamp
        try:
            down(r.key, (r.value, r.old))
        finally:
            rec.topic, rec.partition, rec.offset, rec.timestamp = saved

    def f(k, change):
        new, old = change
        ts = rec.timestamp
        st = times.get(name, -1)
        if ts > st:
            st = times[name] = ts
        held = buf.get(k)
        if held is None:
            t, prior = buffer_time(k), old
        else:
            t, prior = held.time, held.prior
        buf.put(k, t, new, old, prior, ts, rec.offset, rec.partition, rec.topic)
        for r in buf.evict_until(st - duration):
            emit(r)
        if max_records is not None and buf.count() > max_records:
            if final:
                raise ProcessorError(
                    f"{name} (suppress until window closes): its buffer {buf.name!r} holds more "
                    f"than max_records={max_records} open windows in task {tp.task_id}; raise "
                    f"max_records (or leave it None: unbounded)")
            while buf.count() > max_records:
                emit(buf.pop_oldest())
    return f


def getter(tp, t):
    """A suppressed table's value: what it last emitted (the prior value of a held key), else the
    table before it (Kafka Streams' suppression view)."""
    buf = tp.store(t.stores[0].name)
    parent = tp.getter(t.parent)

    def get(k):
        held = buf.get(k)
        return held.prior if held is not None else parent(k)
    return get
