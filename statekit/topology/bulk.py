"""Bulk aggregation: a micro-batch's records of one cached aggregation applied per key, at once.

With the record cache on, an aggregation forwards once per key per commit (the latest value, at
flush, in first-update order, with the metadata of the key's last record). Nothing between the
records of a batch can see the aggregation's intermediate values when its store is its own (no other
step reads it, no join looks it up, no processor declares it): its results wait in the holder until
flush. So the task can collect the batch's records for that aggregation and apply them per key,
touching each key's store entry once (one get, one put) instead of once per record — the result, the
outputs and their order are the same:

* count: the records of a key are counted at C speed (`collections.Counter` over the keys'
  pickles; values are not even unpickled, only checked against None);
* reduce / aggregate: the user's function still gets every record, in the batch's order (offset
  order within a partition), and between two calls the aggregate goes through the store's value
  serde, as it would through the store, so the function sees exactly the values it would see one
  record at a time.

A route is applied in bulk when it leads straight into such an aggregation (`TaskProcessor` decides,
see `bulk_routes`); the host's per-record callback (crash directives) turns bulk off for the batch.
When every route of the task is applied in bulk and no stream-time punctuator waits, the task does
not even loop over the records: they are handed over as they are (`TaskProcessor.process_records`).
"""
from __future__ import annotations

import pickle
from collections import Counter
from operator import itemgetter

from statekit.errors import StatekitError
from statekit.topology import graph as g
from statekit.topology.steps import _fail

_LOADS = pickle.loads
_NONE = pickle.dumps(None, pickle.HIGHEST_PROTOCOL)
_KP, _VP = itemgetter(4), itemgetter(5)


def _getter_nodes(t) -> list:
    """The table nodes a read of table t goes through."""
    out = [t]
    if t.kind in (g.TABLE_FILTER, g.TABLE_MAP_VALUES, g.SUPPRESS):
        out += _getter_nodes(t.parent)
    elif t.kind == g.TABLE_MERGE:
        out += _getter_nodes(t.parent.parent) + _getter_nodes(t.extra_parents[0].parent)
    return out


def bulk_routes(tp) -> dict:
    """{route index: _BulkAggregate} for the routes that lead straight into an aggregation that can
    be applied in bulk (see the module docstring)."""
    plan = tp.plan
    out = {}
    read = set()
    for m in plan.nodes:
        if m.table is not None:
            read.update(n.name for n in _getter_nodes(m.table))
    users: dict = {}
    for m in plan.nodes:
        for d in m.stores:
            users.setdefault(d.name, set()).add(m.name)
    for r in plan.routes:
        n = plan._by_name[r.target]
        if n.kind != g.AGGREGATE or n.name in read or len(users.get(n.stores[0].name, ())) != 1:
            continue
        if not (tp.record_cache and n.stores[0].caching):
            continue
        out[r.index] = _BulkAggregate(tp, n, tp._route_topic[r.index])
    return out


class _BulkAggregate:
    __slots__ = ("tp", "n", "store", "held", "op", "fn", "topic", "records", "roundtrip")

    def __init__(self, tp, n, topic: str) -> None:
        self.tp = tp
        self.n = n
        self.store = tp.store(n.stores[0].name)
        self.held = tp.held_of(n)   # its holder (built already): the dict flush() forwards from
        self.op = n.params["op"]
        self.fn = n.fn
        self.topic = topic
        self.records: list = []   # the batch's record tuples (route, partition, offset, ts, kp, vp)
        vs = getattr(self.store, "value_serde", None)
        self.roundtrip = None if vs is None else (vs.to_bytes, vs.from_bytes)

    def apply(self) -> None:
        recs, self.records = self.records, []
        if not recs:
            return
        if self.op == "count":
            self._count(recs)
        else:
            self._fold(recs)

    def _key(self, kp):
        memo = self.tp._loads_memo
        k = memo.get(kp)
        if k is None:
            k = _LOADS(kp)
            if type(k) is str and len(kp) <= 80 and len(memo) < (1 << 16):
                memo[kp] = k
        return k

    def _count(self, recs: list) -> None:
        tp = self.tp
        kps = list(map(_KP, recs))
        nulls = kps.count(_NONE) + list(map(_VP, recs)).count(_NONE)
        if nulls:
            recs = [r for r in recs if r[4] != _NONE and r[5] != _NONE]
            tp.skipped_null += len(kps) - len(recs)
            kps = list(map(_KP, recs))
        counts = Counter(kps)                      # first-appearance order
        last = dict(zip(kps, recs))                # each key's last record
        get, put, held, topic = self.store.get, self.store.put, self.held, self.topic
        for kp, c in counts.items():
            k = self._key(kp)
            old = get(k)
            new = c if old is None else old + c
            put(k, new)
            _r, part, off, ts, _kp, _vp = last[kp]
            h = held.get(k)
            held[k] = (new, old if h is None else h[1], ts, off, part, topic)

    def _fold(self, recs: list) -> None:
        tp = self.tp
        rec = tp.rec
        groups: dict = {}
        for r in recs:
            if r[4] == _NONE or r[5] == _NONE:
                tp.skipped_null += 1
                continue
            groups.setdefault(r[4], []).append(r)
        get, put, held, topic, n = self.store.get, self.store.put, self.held, self.topic, self.n
        enc_dec = self.roundtrip
        reduce = self.op == "reduce"
        fn = self.fn
        saved = (rec.topic, rec.partition, rec.offset, rec.timestamp)
        rec.topic = topic
        try:
            for kp, items in groups.items():
                k = self._key(kp)
                old = acc = get(k)
                for i, (_r, part, off, ts, _kp, vp) in enumerate(items):
                    v = _LOADS(vp)
                    rec.partition, rec.offset, rec.timestamp = part, off, ts
                    if i and acc is not None and enc_dec is not None:
                        acc = enc_dec[1](enc_dec[0](acc))    # what the store would give back
                    try:
                        if reduce:
                            acc = v if acc is None else fn(acc, v)
                        else:
                            acc = fn[1](k, v, fn[0]() if acc is None else acc)
                    except StatekitError:
                        raise
                    except Exception as e:
                        raise _fail(n, rec, k, v, e) from e
                put(k, acc)
                _r, part, off, ts, _kp, _vp = items[-1]
                h = held.get(k)
                held[k] = (acc, old if h is None else h[1], ts, off, part, topic)
        finally:
            rec.topic, rec.partition, rec.offset, rec.timestamp = saved
