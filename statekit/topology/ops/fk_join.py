"""Foreign-key table-table joins, Kafka Streams' KIP-213 design.

    left table ──► send: a subscription (instruction, hash of the left value, pk), keyed by fk
        ══ repartition <sub>-registration ══►
    receive: kept in the subscription store by (fk, pk), answered with the foreign row
    foreign table ──► foreign: a foreign row change answers every subscription to its key
        ══ repartition <sub>-response ══►
    response: kept only if its hash is still the left row's current one; joiner(left, foreign)

The hash check drops answers made for a left value that has changed since (a row that moved to
another foreign key, say), so the result always reflects the current left row. Instructions are
Kafka's: a left row that leaves a foreign key deletes its subscription there (and, when the row is
deleted, propagates a tombstone); an inner join only answers when the foreign row exists, a left
join always does.
"""
from __future__ import annotations

import hashlib

from statekit.topology.graph import resolve_serde

DELETE_KEY_NO_PROPAGATE = 0
DELETE_KEY_AND_PROPAGATE = 1
PROPAGATE_NULL_IF_NO_FK_VAL_AVAILABLE = 2
PROPAGATE_ONLY_IF_FK_VAL_AVAILABLE = 3


def value_hash(data: bytes) -> bytes:
    return hashlib.blake2b(data, digest_size=16).digest()


def send(tp, n, down):
    extract = n.fn
    left_join = n.params["how"] == "left"
    vs = resolve_serde(n.parent.value_serde)
    fks = resolve_serde(n.key_serde)

    def same_fk(a, b) -> bool:
        if a is None or b is None:
            return a is b
        return fks.to_bytes(a) == fks.to_bytes(b)

    def f(k, change):
        new, old = change
        h = None if new is None else value_hash(vs.to_bytes(new))

        def fk_of(v):
            return None if v is None else tp.call(n, k, v, extract, v)

        if left_join:
            if old is not None:
                ofk, nfk = fk_of(old), fk_of(new)
                if ofk is not None and not same_fk(nfk, ofk):
                    down(ofk, (DELETE_KEY_AND_PROPAGATE, h, k))
                down(nfk, (PROPAGATE_NULL_IF_NO_FK_VAL_AVAILABLE, h, k))
            elif new is not None:
                down(fk_of(new), (PROPAGATE_NULL_IF_NO_FK_VAL_AVAILABLE, h, k))
            return
        if old is not None:
            ofk = fk_of(old)
            if ofk is None:
                tp.skipped_null += 1
                return
            if new is not None:
                nfk = fk_of(new)
                if nfk is None:
                    tp.skipped_null += 1
                    return
                if not same_fk(nfk, ofk):
                    down(ofk, (DELETE_KEY_NO_PROPAGATE, h, k))
                down(nfk, (PROPAGATE_NULL_IF_NO_FK_VAL_AVAILABLE, h, k))
            else:
                down(ofk, (DELETE_KEY_AND_PROPAGATE, h, k))
        elif new is not None:
            nfk = fk_of(new)
            if nfk is None:
                tp.skipped_null += 1
            else:
                down(nfk, (PROPAGATE_ONLY_IF_FK_VAL_AVAILABLE, h, k))
    return f


def receive(tp, n, down):
    subs = tp.store(n.stores[0].name)
    foreign = tp.getter(n.table)

    def f(fk, sub):
        instruction, h, pk = sub
        if fk is None and instruction != PROPAGATE_NULL_IF_NO_FK_VAL_AVAILABLE:
            tp.skipped_null += 1
            return
        if fk is not None:
            ck = (fk, pk)
            if instruction in (DELETE_KEY_AND_PROPAGATE, DELETE_KEY_NO_PROPAGATE):
                if subs.get(ck) is not None:
                    subs.delete(ck)
            else:
                subs.put(ck, sub)
        fv = None if fk is None else foreign(fk)
        if instruction == DELETE_KEY_AND_PROPAGATE:
            down(pk, (h, None))
        elif instruction == PROPAGATE_NULL_IF_NO_FK_VAL_AVAILABLE:
            down(pk, (h, fv))
        elif instruction == PROPAGATE_ONLY_IF_FK_VAL_AVAILABLE and fv is not None:
            down(pk, (h, fv))
    return f


def foreign(tp, n, down):
    subs = tp.store(n.stores[0].name)
    prefix = subs.key_serde.prefix

    def f(fk, change):
        if fk is None:
            tp.skipped_null += 1
            return
        new = change[0]
        for (_fk, pk), (_i, h, _pk) in list(subs.prefix_scan(prefix(fk), raw=True)):
            down(pk, (h, new))
    return f


def response(tp, n, down):
    left = tp.getter(n.table)
    vs = resolve_serde(n.table.value_serde)
    left_join = n.params["how"] == "left"
    joiner = n.fn
    store = tp.store(n.stores[0].name)

    def f(pk, resp):
        h, fv = resp
        cur = left(pk)
        cur_h = None if cur is None else value_hash(vs.to_bytes(cur))
        if h != cur_h:
            return        # made for a left value that has changed since: a newer answer follows
        if fv is None and (not left_join or cur is None):
            result = None
        else:
            result = tp.call(n, pk, cur, joiner, cur, fv)
        old = store.get(pk)
        store.put(pk, result)
        down(pk, (result, old))
    return f
