"""Plain-Python reference models of the topology operators, for the operator tests.

Each model takes records in the order one task processes them and returns the *updates* the operator
makes: (key, new, old, timestamp) for tables, (key, value, timestamp) for streams — with lists,
dicts and sorting only (no stores, serdes, caches). `cache_collapse` turns a table's update stream
into what a task with a record cache forwards (one per key per batch, first-update order, nothing
for a key created and deleted within the batch). Declarative references (the final state a topology
must reach, computed from scratch) sit beside the step-by-step ones where one exists.

`engine_order` reproduces how LocalEngine hands a batch to a task (Kafka Streams' order), with
`kstreams_merge` — a plain transcription of Kafka Streams' choice of the next record across a
task's partitions — in place of `Records.merge`.
"""
from __future__ import annotations

from collections import defaultdict

from statekit.partition import partition_for

# -- ordering --------------------------------------------------------------------------------------

def kstreams_merge(parts, timestamp):
    """Kafka Streams' PartitionGroup: `parts` is [(source index, partition, records in offset
    order)]; the next record is always the head (first unprocessed record) of the partition whose
    head has the lowest timestamp, ties to the lower source index, then the lower partition.
    Returns the records in that order (a record by itself, no sorting key)."""
    queues = [[src, part, list(recs), 0] for src, part, recs in parts if recs]
    out = []
    while queues:
        best = None
        for q in queues:
            if best is None or (timestamp(q[2][q[3]]), q[0], q[1]) < \
                    (timestamp(best[2][best[3]]), best[0], best[1]):
                best = q
        out.append(best[2][best[3]])
        best[3] += 1
        if best[3] == len(best[2]):
            queues.remove(best)
    return out


def engine_order(batch, partitions, source_index, key_bytes, offsets=None, null_task=None):
    """{task: [record...]} for one batch of (topic, key, value, ts[, partition]) as LocalEngine
    hands it to its tasks: a task is its source partition (given, else murmur2(key bytes) %
    partitions, 0 without a key); within a task each source's records in input (offset) order,
    the sources merged by `kstreams_merge`. Records without a key are merged with the others (they
    move the head of their partition) and then left out, unless `null_task` is given (a step that
    takes them, e.g. a stream-stream join: they stay, in task 0, where LocalEngine puts them).
    `offsets` ({(topic, partition): next offset}) carries offsets from batch to batch."""
    offsets = {} if offsets is None else offsets
    rows = defaultdict(lambda: defaultdict(list))     # task -> source index -> [(offset, record)]
    for r in batch:
        topic, key = r[0], r[1]
        if len(r) > 4 and r[4] is not None:
            part = r[4]
        else:
            part = 0 if key is None else partition_for(key_bytes(key), partitions)
        off = offsets.get((topic, part), 0)
        offsets[(topic, part)] = off + 1
        rows[part][source_index(topic)].append(r)
    out = {}
    for task, by_src in rows.items():
        recs = kstreams_merge([(si, task, rs) for si, rs in by_src.items()], lambda r: r[3])
        out[task] = [r[:4] for r in recs if null_task is not None or r[1] is not None]
    return out


def cache_collapse(updates):
    """A batch's table updates (key, new, old, ts) -> what a cached aggregation forwards at flush."""
    held = {}
    for k, new, old, ts in updates:
        if k in held:
            held[k] = (new, held[k][1], ts)
        else:
            held[k] = (new, old, ts)
    return [(k, new, old, ts) for k, (new, old, ts) in held.items() if not (new is None and old is None)]


# -- stream-stream join (Kafka Streams' KStreamKStreamJoin, spurious-result fix) ------------------------

class StreamJoinModel:
    """One task's stream-stream join: step(side "left"|"right", key, value, ts) -> [(key, value, ts)]
    forwarded, in order."""

    def __init__(self, before, after, grace, how, joiner, key_bytes):
        self.before, self.after, self.grace, self.how = before, after, grace, how
        self.joiner, self.key_bytes = joiner, key_bytes
        self.R = before + after + grace
        self.st = -1
        self.bufs = {"left": defaultdict(list), "right": defaultdict(list)}
        self.store_st = {"left": -1, "right": -1}
        self.outer = {}          # (ts, is_left, key) -> [values]
        self.has_outer = how in ("left", "outer")

    def _j(self, side, mine, theirs):
        return self.joiner(mine, theirs) if side == "left" else self.joiner(theirs, mine)

    def step(self, side, k, v, ts):
        out = []
        self.st = st = max(self.st, ts)
        how, outer = self.how, self.outer
        outer_this = how in ("left", "outer") if side == "left" else how == "outer"
        if outer_this and k is None and v is not None:
            return [(k, self._j(side, v, None), ts)]
        if k is None or v is None:
            return []
        if self.has_outer and ts == st:
            for key in sorted(outer, key=lambda x: (x[0], x[1], self.key_bytes(x[2]))):
                ots, is_l, kk = key
                look = self.after if is_l else self.before
                if ots + look + self.grace < st:
                    for val in outer.pop(key):
                        out.append((kk, self.joiner(val, None) if is_l else self.joiner(None, val), ots))
        b_this, a_this = (self.before, self.after) if side == "left" else (self.after, self.before)
        lo, hi = max(0, ts - b_this), max(0, ts + a_this)
        other = "right" if side == "left" else "left"
        matches = sorted([(ots, ov) for ots, ov in self.bufs[other][k]
                          if lo <= ots <= hi and ots > self.store_st[other] - self.R],
                         key=lambda x: x[0])
        for ots, ov in matches:
            outer.pop((ots, other == "left", k), None)
            out.append((k, self._j(side, v, ov), max(ts, ots)))
        if outer_this and not matches:
            if not self.has_outer or hi < st:
                out.append((k, self._j(side, v, None), ts))
            else:
                outer.setdefault((ts, side == "left", k), []).append(v)
        self.store_st[side] = max(self.store_st[side], ts)
        self.bufs[side][k].append((ts, v))
        return out


# -- session windows ------------------------------------------------------------------------------------

class SessionModel:
    """One task's session count: step(key, value, ts) -> updates [((key, start, end), new, old, ts)];
    `sessions()` the live sessions {(key, start, end): count}; `dropped`. None values count. A
    session is seen while its end > the store's stream time (the largest end written before this
    record) - retention: Kafka's store, whose time lags the record being processed."""

    def __init__(self, gap, grace, retention=None):
        self.gap, self.grace = gap, grace
        self.R = gap + grace if retention is None else retention
        self.st = -1
        self.store_st = -1                    # the store's stream time: the largest end written
        self.store = defaultdict(dict)        # key -> {(start, end): count}
        self.dropped = 0

    def step(self, k, v, ts):
        if k is None:
            return []
        self.st = st = max(self.st, ts)
        close = st - self.grace - self.gap
        found = sorted(((s, e, a) for (s, e), a in self.store[k].items()
                        if e >= ts - self.gap and s <= ts + self.gap and e > self.store_st - self.R),
                       key=lambda x: x[1])
        start = min([ts] + [s for s, _e, _a in found])
        end = max([ts] + [e for _s, e, _a in found])
        if end < close:
            self.dropped += 1
            return []
        out = []
        agg = sum(a for _s, _e, a in found)
        prior = None
        if (start, end) != (ts, ts):
            for s, e, a in found:
                del self.store[k][(s, e)]
                out.append(((k, s, e), None, a, e))
        elif found:
            prior = found[0][2]           # the one-point session [ts, ts], updated in place
        agg += 1
        self.store[k][(start, end)] = agg
        self.store_st = max(self.store_st, end)
        out.append(((k, start, end), agg, prior, end))
        return out

    def sessions(self):
        return {(k, s, e): a for k, d in self.store.items() for (s, e), a in d.items()
                if e > self.store_st - self.R}


def sessions_by_gap(timestamps_by_key, gap):
    """Declarative sessions of in-order data with nothing late: a key's sorted timestamps, cut
    where two neighbours are more than `gap` apart. {(key, start, end): count}."""
    out = {}
    for k, tss in timestamps_by_key.items():
        tss = sorted(tss)
        start = prev = tss[0]
        n = 0
        for t in tss:
            if t - prev > gap:
                out[(k, start, prev)] = n
                start, n = t, 0
            n += 1
            prev = t
        out[(k, start, prev)] = n
    return out


# -- sliding windows ---------------------------------------------------------------------------------------

def sliding_model(records, d, grace):
    """Declarative sliding windows (count): the windows Kafka Streams keeps for a key are the left
    window [t - d, t] of every record t >= d, [0, d] for records t < d, and the right window
    [t + 1, t + 1 + d] of a record t when another record falls in it; a window holds the accepted
    records in it. Returns ({(key, start): (count, max_ts)}, dropped). Exact for inputs whose late
    records are either within the grace period (t >= stream time - grace on arrival) or beyond it
    for every window they touch (t + d < stream time - grace: dropped); in between Kafka's algorithm
    seeds new windows from windows that may have closed (see the by-hand test). And d >= 2: with a
    smaller difference the store's retention (2 * d + grace) may hide a window still open."""
    st = -1
    seen = defaultdict(list)            # accepted records per key, in arrival order
    windows = {}                        # (key, start) -> [count, max_ts]
    dropped = 0
    for k, v, ts in records:
        if k is None or v is None:
            continue
        st = max(st, ts)
        close = st - grace
        if ts + d < close:
            dropped += 1
            continue
        seen[k].append(ts)
        needed = set()
        for t in seen[k]:
            needed.add(max(0, t - d) if t >= d else 0)
            if any(t < u <= t + 1 + d for u in seen[k]):
                needed.add(t + 1)
        for s in needed:
            if s + d < close:
                continue          # closed: neither created nor updated any more
            w = windows.get((k, s))
            if w is None:
                # created now: it holds every accepted record in it so far
                inside = [t for t in seen[k] if s <= t <= s + d]
                windows[(k, s)] = [len(inside), max(inside)]
            elif s <= ts <= s + d:
                w[0] += 1
                w[1] = max(w[1], ts)
    return {key: tuple(w) for key, w in windows.items()}, dropped


# -- tables ---------------------------------------------------------------------------------------------------

def join_result(how, left, right, joiner):
    if how == "inner":
        return None if left is None or right is None else joiner(left, right)
    if how == "left":
        return None if left is None else joiner(left, right)
    return None if left is None and right is None else joiner(left, right)


class TableJoinModel:
    """A table-table join on the key: step(side, key, value) (value None deletes) -> [(key, result)]
    forwarded (Kafka Streams' KTableKTable*Join rules, results only)."""

    def __init__(self, how, joiner):
        self.how, self.joiner = how, joiner
        self.tables = {"left": {}, "right": {}}

    def step(self, side, k, v):
        if k is None:
            return []
        how = self.how
        old = self.tables[side].get(k)
        if v is None:
            self.tables[side].pop(k, None)
        else:
            self.tables[side][k] = v
        other = self.tables["right" if side == "left" else "left"].get(k)
        if side == "left":
            if how == "inner" and other is None:
                return []
            if how != "inner" and other is None and v is None and old is None:
                return []
            return [(k, join_result(how, v, other, self.joiner))]
        if how in ("inner", "left") and other is None:
            return []
        if how == "outer" and other is None and v is None and old is None:
            return []
        return [(k, join_result(how, other, v, self.joiner))]

    def final(self):
        keys = set(self.tables["left"]) | set(self.tables["right"])
        out = {}
        for k in keys:
            r = join_result(self.how, self.tables["left"].get(k), self.tables["right"].get(k),
                            self.joiner)
            if r is not None:
                out[k] = r
        return out


def regroup_model(records, group_of, groups_seen=None):
    """records: (key, row) table updates in order (row None deletes) -> (updates [(group, count)],
    final {group: count}) of table.group_by(group_of).count() — each change subtracts from the old
    row's group and adds to the new one's (one update when the group is unchanged)."""
    rows, counts, out = {}, {}, []
    for k, row in records:
        old = rows.get(k)
        if row is None:
            rows.pop(k, None)
        else:
            rows[k] = row
        og = None if old is None else group_of(k, old)
        ng = None if row is None else group_of(k, row)
        if og is not None and ng is not None and og == ng:
            out.append((og, counts[og]))          # subtract then add: unchanged
            continue
        if og is not None:
            counts[og] -= 1
            out.append((og, counts[og]))
        if ng is not None:
            counts[ng] = counts.get(ng, 0) + 1
            out.append((ng, counts[ng]))
    return out, counts, rows


class SuppressModel:
    """Kafka Streams' suppression: step(key, new, ts) of the table updates it receives -> emitted
    [(key, new, ts)]. A key keeps the buffer time of its first held update; entries with buffer time
    <= stream time - duration leave in (time, key bytes) order; `final` drops tombstones."""

    def __init__(self, buffer_time, duration, final, key_bytes):
        self.buffer_time, self.duration, self.final = buffer_time, duration, final
        self.key_bytes = key_bytes
        self.st = -1
        self.buf = {}

    def step(self, key, new, ts):
        self.st = max(self.st, ts)
        t = self.buf[key][0] if key in self.buf else self.buffer_time(key, ts)
        self.buf[key] = (t, new, ts)
        due = sorted((k for k, (t, _n, _ts) in self.buf.items() if t <= self.st - self.duration),
                     key=lambda k: (self.buf[k][0], self.key_bytes(k)))
        out = []
        for k in due:
            _t, new, ts = self.buf.pop(k)
            if new is None and self.final:
                continue
            out.append((k, new, ts))
        return out
