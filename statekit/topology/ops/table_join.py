"""Joins that read a table: stream-table (each stream record looks its key up) and table-table on
the key (either side's change is joined with the other side's current value, Kafka Streams'
KTableKTable{Inner,Left,Outer,Right}Join; the result table is computed, not stored)."""
from __future__ import annotations


def stream_table_join(tp, n, down):
    getter = tp.getter(n.table)
    how = n.params["how"]
    joiner = n.fn

    def f(k, v):
        if k is None:
            tp.skipped_null += 1
            return
        tv = getter(k)
        if tv is None and how == "inner":
            return
        down(k, tp.call(n, k, v, joiner, v, tv))
    return f


def _result(how: str, left, right, joiner, call):
    """One row of the join result (None: no row)."""
    if how == "inner":
        return None if left is None or right is None else call(joiner, left, right)
    if how == "left":
        return None if left is None else call(joiner, left, right)
    return None if left is None and right is None else call(joiner, left, right)


def table_join(tp, n, down):
    """One side of a table-table join: a change (new, old) of this side's row is joined with the
    other side's current row. Nothing is forwarded when neither the row nor its old value joins
    (Kafka Streams skips those)."""
    how = n.params["how"]
    left_side = n.params["side"] == "left"
    other = tp.getter(n.table)
    joiner = n.fn
    send_old = n.params.get("send_old", False)

    def f(k, change):
        if k is None:
            tp.skipped_null += 1
            return
        new, old = change
        o = other(k)

        def call(fn, a, b):
            return tp.call(n, k, new, fn, a, b)

        if left_side:
            res_new = _result(how, new, o, joiner, call)
            res_old = _result(how, old, o, joiner, call) if send_old else None
            if how == "inner" and o is None:
                return
            if how != "inner" and o is None and new is None and old is None:
                return
        else:
            res_new = _result(how, o, new, joiner, call)
            res_old = _result(how, o, old, joiner, call) if send_old else None
            if how in ("inner", "left") and o is None:
                return
            if how == "outer" and o is None and new is None and old is None:
                return
        down(k, (res_new, res_old))
    return f


def merge_getter(tp, t):
    """The joined table's row for a key, from both sides' current rows."""
    this, that = t.parent, t.extra_parents[0]
    left, right = tp.getter(this.parent), tp.getter(that.parent)
    how = this.params["how"]
    joiner = this.fn

    def get(k):
        return _result(how, left(k), right(k), joiner,
                       lambda fn, a, b: tp.call(this, k, a, fn, a, b))
    return get
