"""Bulk aggregation: a micro-batch's records of one cached aggregation applied column-wise, per key.

With the record cache on, an aggregation forwards once per key per commit (the latest value, at
flush, in first-update order, with the metadata of the key's last record). Nothing between the
records of a batch can see the aggregation's intermediate values when its store is its own (no other
step reads it, no join looks it up, no processor declares it) and a source feeds it directly: its
results wait until flush. So the task hands that source's records to the aggregation as columns and
it touches each key's store entry once — one bulk read of the batch's keys, one bulk write — and
the results, the outputs and their order are those of one record at a time:

* count: counted per key bytes at C speed; values are never decoded (a null check on the bytes),
  and its task does not even cut them out of the fetched batches (`TaskProcessor.values_kept`);
* reduce / aggregate: the user's function still gets every record of a key, in offset order, on
  decoded values; between two calls the aggregate goes through the store's value serde, as it would
  through the store;
* the key's bytes are the source's when the source and the store share a key serde (and, for JSON,
  the bytes are the canonical encoding); otherwise each distinct key is decoded and encoded once;
* at flush the held results go on as columns when the next steps are `to_stream()` and a sink with
  the store's serdes (no object is made per key), else one key at a time as before.

A host that crashes "after N records" cuts the batch in two `process_batch` calls; applying the two
halves one after the other stores and forwards the same as applying the whole.
"""
from __future__ import annotations

import re
import struct
from collections import Counter

from statekit.errors import StatekitError
from statekit.stores.serdes import decode_column
from statekit.topology import graph as g
from statekit.topology.graph import same_serde, serde_label
from statekit.topology.steps import _fail

_Q = struct.Struct(">q")
_ONE = _Q.pack(1)
_BYTES = object()    # a held new value to decode from its bytes at flush
JSON_NULL_FIRST = b" \t\n\rn"   # the bytes a JSON null document can begin with
_CANONICAL_JSON_KEY = re.compile(rb'"[\x20\x21\x23-\x5b\x5d-\x7e]*"|0|-?[1-9][0-9]*').fullmatch


def _getter_nodes(t) -> list:
    """The table nodes a read of table t goes through."""
    out = [t]
    if t.kind in (g.TABLE_FILTER, g.TABLE_MAP_VALUES, g.SUPPRESS):
        out += _getter_nodes(t.parent)
    elif t.kind == g.TABLE_MERGE:
        out += _getter_nodes(t.parent.parent) + _getter_nodes(t.extra_parents[0].parent)
    return out


def bulk_routes(tp) -> dict:
    """{route (= source index): BulkAggregate} for the sources whose records go straight into an
    aggregation that can be applied in bulk (see the module docstring)."""
    plan = tp.plan
    read = set()
    for m in plan.nodes:
        if m.table is not None:
            read.update(n.name for n in _getter_nodes(m.table))
    users: dict = {}
    for m in plan.nodes:
        for d in m.stores:
            users.setdefault(d.name, set()).add(m.name)
    out = {}
    for r in plan.routes:
        src = plan._by_name[r.target]
        if src.kind != g.SOURCE or len(src.children) != 1:
            continue
        n = src.children[0]
        if n.kind != g.AGGREGATE or n.parents() != [src] or n.name in read:
            continue
        if len(users.get(n.stores[0].name, ())) != 1 or not n.stores[0].caching:
            continue
        out[r.index] = BulkAggregate(tp, n, r.source_index)
    return out


def _kind(serde) -> str:
    return serde_label(serde)


class BulkAggregate:
    """One aggregation fed in bulk by one source; `apply` per batch (or half batch), `forward` at
    flush."""

    def __init__(self, tp, n, source_index: int) -> None:
        from statekit.topology.graph import resolve_serde

        self.tp = tp
        self.n = n
        self.op = n.params["op"]
        self.fn = n.fn
        src = tp.plan.sources[source_index]
        self.topic = src.topic
        self.source_index = source_index
        top = tp.store(n.stores[0].name)
        self.top = top
        self.bytes_store = top.inner                # the bytes stack under the metered layer
        self.src_kdec = resolve_serde(src.key_serde).from_bytes
        self.vdec = tp._decoder(source_index, 1)
        self.src_vserde = tp.plan.source_serdes(source_index)[1]
        self.kser, self.vser = top.key_serde, top.value_serde
        self.kenc, self.kdec = top.key_serde.to_bytes, top.key_serde.from_bytes
        self.venc, self.vdec_store = top.value_serde.to_bytes, top.value_serde.from_bytes
        self.same_key = same_serde(src.key_serde, n.stores[0].key_serde or "json")
        self.json_key = _kind(n.stores[0].key_serde or "json") == "json"
        self.null_value = b"null" if _kind(src.value_serde) == "json" else None
        self.int64 = _kind(n.stores[0].value_serde) in ("int64", "long")
        # what flush forwards, in first-update order: per store key bytes, its position
        self._pos = None            # key -> position in the held lists (made on demand)
        self._keys: list = []      # store key bytes
        self._new: list = []       # new value bytes (None: deleted)
        self._old: list = []       # value bytes before the batch
        self._ts: list = []        # timestamp, offset, partition of the key's last record
        self._off: list = []
        self._part: list = []
        self._obj: list = []       # the new value as the user's function returned it, else _BYTES
        self.sink = self._columnar_sink()

    # -- keys ------------------------------------------------------------------------------------
    def _canonical(self, kb: bytes) -> bool:
        """Are these JSON key bytes what the store's serde writes (so a query finds them)? A
        string of printable ASCII without escapes, or an integer without leading zeros (the
        serde reads b"01" as 1 and writes b"1"; it escapes control characters and DEL)."""
        return _CANONICAL_JSON_KEY(kb) is not None

    def _store_keys(self, kbs: list, values, offs, parts) -> list:
        """The store's key bytes for the source's key bytes; None for a key whose bytes decode
        to None (JSON null: skipped, as one record at a time)."""
        if self.same_key and (not self.json_key or all(map(self._canonical, set(kbs)))):
            return kbs
        conv: dict = {}
        dec, enc = self.src_kdec, self.kenc
        out = []
        for i, kb in enumerate(kbs):
            sk = conv.get(kb, conv)
            if sk is conv:
                try:
                    k = dec(kb)
                except Exception as e:
                    raise self.tp._undecodable(self.source_index, parts[i], offs[i], kb,
                                               values[i], e) from e
                sk = conv[kb] = None if k is None else enc(k)
            out.append(sk)
        return out

    def _null_values(self, values) -> set:
        """The values of the batch a count skips: None, and for a JSON source every value the
        source's decoder reads as None (``null``, whitespace around it too); only the distinct
        values that can begin such a document are decoded. Values read with ``values_kept`` are
        mostly NOT_READ: one object, looked at once."""
        out = set()
        for vb in set(values):
            if vb is None:
                out.add(vb)
            elif (self.null_value is not None and isinstance(vb, bytes)
                  and vb[:1] in JSON_NULL_FIRST and self._decodes_to_none(vb)):
                out.add(vb)
        return out

    def _decodes_to_none(self, vb: bytes) -> bool:
        try:
            return self.vdec(vb) is None
        except Exception:  # noqa: BLE001 - a count never decodes its values: not JSON is counted
            return False

    # -- applying --------------------------------------------------------------------------------
    def apply(self, records, idx) -> None:
        """Apply the records at positions `idx` of `records` (None: all of them)."""
        if idx is None:
            keys, values = records.keys, records.values
            stamps, offs, parts = records.timestamps, records.offsets, records.partitions
        else:
            keys = [records.keys[i] for i in idx]
            values = [records.values[i] for i in idx]
            stamps = [records.timestamps[i] for i in idx]
            offs = [records.offsets[i] for i in idx]
            parts = [records.partitions[i] for i in idx]
        if not keys:
            return
        keep = None
        if None in keys:
            keep = [kb is not None for kb in keys]
        nulls = self._null_values(values) if self.op == "count" else None
        if nulls:
            vk = [vb not in nulls for vb in values]
            keep = vk if keep is None else [a and b for a, b in zip(keep, vk)]
        if keep is not None:
            self.tp.skipped_null += keep.count(False)
            sel = [i for i, k in enumerate(keep) if k]
            keys = [keys[i] for i in sel]
            values = [values[i] for i in sel]
            stamps = [stamps[i] for i in sel]
            offs = [offs[i] for i in sel]
            parts = [parts[i] for i in sel]
            if not keys:
                return
        skeys = self._store_keys(keys, values, offs, parts)
        if None in skeys:                            # keys that decode to None
            sel = [i for i, sk in enumerate(skeys) if sk is not None]
            self.tp.skipped_null += len(skeys) - len(sel)
            keys, values, skeys = [keys[i] for i in sel], [values[i] for i in sel], \
                [skeys[i] for i in sel]
            stamps, offs, parts = [stamps[i] for i in sel], [offs[i] for i in sel], \
                [parts[i] for i in sel]
            if not keys:
                return
        if self.op == "count":
            self._count(skeys, stamps, offs, parts)
        else:
            self._fold(skeys, keys, values, stamps, offs, parts)

    def _hold(self, uniq: list, news: list, olds: list, last, stamps, offs, parts,
              objs=None) -> None:
        """Remember what flush forwards; `objs`: the new values as the user's function returned
        them (one record at a time forwards those, not the store's copy), None for a count;
        `last`: each key's last record, None when `uniq` are the records' keys, each once. An
        aggregation nothing follows forwards nothing: it holds nothing either."""
        if not self.n.children:
            return
        keys_, new_, old_ = self._keys, self._new, self._old
        obj_, ts_, off_, part_ = self._obj, self._ts, self._off, self._part
        if objs is None:
            objs = [_BYTES] * len(uniq)
        if not keys_:   # the first (usually only) apply of the batch: columns as they are
            keys_.extend(uniq)
            new_.extend(news)
            old_.extend(olds)
            obj_.extend(objs)
            if last is None:
                ts_.extend(stamps)
                off_.extend(offs)
                part_.extend(parts)
            else:
                at = list(map(last.__getitem__, uniq))
                ts_.extend(map(stamps.__getitem__, at))
                off_.extend(map(offs.__getitem__, at))
                part_.extend(map(parts.__getitem__, at))
            self._pos = None         # made when a second apply comes (a batch cut in two)
            return
        if last is None:
            last = dict(zip(uniq, range(len(uniq))))
        pos = self._pos
        if pos is None:
            pos = self._pos = dict(zip(keys_, range(len(keys_))))
        for kb, nb, ob, o in zip(uniq, news, olds, objs):
            i = last[kb]
            p = pos.get(kb)
            if p is None:
                pos[kb] = len(keys_)
                keys_.append(kb)
                new_.append(nb)
                old_.append(ob)
                obj_.append(o)
                ts_.append(stamps[i])
                off_.append(offs[i])
                part_.append(parts[i])
            else:
                new_[p] = nb
                obj_[p] = o
                ts_[p], off_[p], part_[p] = stamps[i], offs[i], parts[i]

    def _count(self, skeys: list, stamps, offs, parts) -> None:
        counts = Counter(skeys)                      # first-appearance order
        if len(counts) == len(skeys):                # every key once (a build): the records' order
            uniq, last = skeys, None
        else:
            uniq = list(counts)
            last = dict(zip(skeys, range(len(skeys))))   # each key's last record
        store = self.bytes_store
        olds = store.get_many(uniq)
        if self.int64:
            unpack, pack = _Q.unpack, _Q.pack
            if olds.count(None) == len(olds):
                news = [_ONE] * len(uniq) if last is None else [pack(c) for c in counts.values()]
            else:
                news = [pack(c if o is None else unpack(o)[0] + c)
                        for o, c in zip(olds, counts.values())]
        else:
            dec, enc = self.vdec_store, self.venc
            news = [enc(c if o is None else dec(o) + c) for o, c in zip(olds, counts.values())]
        store.put_many(uniq, news)
        self.top._n_put += len(uniq)
        self.top._n_get += len(uniq)
        self._hold(uniq, news, olds, last, stamps, offs, parts)

    def _fold(self, skeys, keys, values, stamps, offs, parts) -> None:
        tp, n, fn = self.tp, self.n, self.fn
        rec = tp.rec
        groups = None                   # key -> its records' positions; None: every key once
        if len(set(skeys)) < len(skeys):
            groups = {}
            for i, sk in enumerate(skeys):
                g_ = groups.get(sk)
                if g_ is None:
                    groups[sk] = [i]
                else:
                    g_.append(i)
            uniq = list(groups)
        else:                           # a build's batch: no grouping, no map of last records
            uniq = skeys
        store = self.bytes_store
        olds = store.get_many(uniq)
        vdec, kdec = self.vdec, self.kdec
        # the batch's values and keys decoded column-wise where the serde can (None: one at a
        # time, below, which also names a record that does not decode)
        vals = decode_column(self.src_vserde, values)
        kobjs = decode_column(self.kser, uniq)
        sdec, senc = self.vdec_store, self.venc
        reduce = self.op == "reduce"
        news, keep_uniq, keep_olds, last, objs, firsts = [], [], [], {}, [], []
        saved = (rec.topic, rec.partition, rec.offset, rec.timestamp)
        rec.topic = self.topic
        try:
            for j, (sk, ob) in enumerate(zip(uniq, olds)):
                pos = (j,) if groups is None else groups[sk]
                k = kdec(sk) if kobjs is None else kobjs[j]
                acc = None if ob is None else sdec(ob)
                first = True
                for i in pos:
                    rec.partition, rec.offset, rec.timestamp = parts[i], offs[i], stamps[i]
                    if vals is not None:
                        v = vals[i]
                    else:
                        try:
                            v = vdec(values[i])
                        except Exception as e:
                            raise tp._undecodable(self.source_index, parts[i], offs[i], keys[i],
                                                  values[i], e) from e
                    if v is None:
                        tp.skipped_null += 1
                        continue
                    if not first and acc is not None:
                        acc = sdec(senc(acc))            # what the store would give back
                    elif first:
                        firsts.append(i)
                    first = False
                    try:
                        if reduce:
                            acc = v if acc is None else fn(acc, v)
                        else:
                            acc = fn[1](k, v, fn[0]() if acc is None else acc)
                    except StatekitError:
                        raise
                    except Exception as e:
                        raise _fail(n, rec, k, v, e) from e
                    if groups is not None:
                        last[sk] = i
                if first:
                    continue                             # every value of the key was None
                keep_uniq.append(sk)
                keep_olds.append(ob)
                news.append(None if acc is None else senc(acc))
                objs.append(acc)
        finally:
            rec.topic, rec.partition, rec.offset, rec.timestamp = saved
        if not keep_uniq:
            return
        if groups is None:      # each kept key's one record is its first: already in order
            last = None if len(keep_uniq) == len(uniq) else dict(zip(keep_uniq, firsts))
        elif any(a > b for a, b in zip(firsts, firsts[1:])):
            # a key whose first records had None values was first updated later: flush forwards
            # in first-update order
            order = sorted(range(len(firsts)), key=firsts.__getitem__)
            keep_uniq, news, keep_olds, objs = ([c[j] for j in order] for c in
                                                (keep_uniq, news, keep_olds, objs))
        store.put_many(keep_uniq, news)
        self.top._n_put += len(keep_uniq)
        self.top._n_get += len(uniq)
        self._hold(keep_uniq, news, keep_olds, last, stamps, offs, parts, objs)

    # -- forwarding at flush ---------------------------------------------------------------------
    def _columnar_sink(self):
        """(topic, repartition) when the steps after the aggregation are to_stream() and a sink
        writing the store's key and value bytes unchanged; None otherwise."""
        kids = self.n.children
        if len(kids) != 1 or kids[0].kind != g.TO_STREAM or len(kids[0].children) != 1:
            return None
        sink = kids[0].children[0]
        if sink.kind != g.SINK or sink.params.get("changes"):
            return None
        store = self.n.stores[0]
        if not (same_serde(sink.key_serde, store.key_serde or "json")
                and same_serde(sink.value_serde, store.value_serde or "json")):
            return None
        return sink.params["topic"]

    def forward(self, down, send_old: bool) -> int:
        """Forward the held results (flush): columns to the sink, or one key at a time."""
        keys, news, olds, objs = self._keys, self._new, self._old, self._obj
        stamps, offs, parts = self._ts, self._off, self._part
        self._pos, self._keys, self._new, self._old, self._obj = None, [], [], [], []
        self._ts, self._off, self._part = [], [], []
        if not keys:
            return 0
        kids = self.n.children
        if not kids:
            return len(keys)
        tp = self.tp
        if self.sink is not None and hasattr(tp.context, "forward_columns"):
            if None in news:   # a deleted key forwards a tombstone only if it existed before
                sel = [i for i, (nb, ob) in enumerate(zip(news, olds))
                       if nb is not None or ob is not None]
                keys = [keys[i] for i in sel]
                news = [news[i] for i in sel]
                stamps = [stamps[i] for i in sel]
            tp.context.forward_columns(self.sink, keys, news, stamps)
            return len(keys)
        rec = tp.rec
        kdec, vdec = self.kdec, self.vdec_store
        n = 0
        for kb, nb, ob, o, ts, off, part in zip(keys, news, olds, objs, stamps, offs, parts):
            if nb is None and ob is None:
                continue
            n += 1
            rec.topic, rec.partition, rec.offset, rec.timestamp = self.topic, part, off, ts
            down(kdec(kb), (o if o is not _BYTES else None if nb is None else vdec(nb),
                            None if (ob is None or not send_old) else vdec(ob)))
        return n
