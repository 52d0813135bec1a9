"""The keys under which a cached aggregation holds back its updates until ``flush()``.

A record key may be a JSON object or array (unhashable), and 1, 1.0 and True are three keys of a
JSON store though Python hashes them alike; ``held_key`` gives each a hashable stand-in. Its own
module because the task processor (``task.py``) and the aggregation operators (``ops/``), which the
task processor builds, both use it.
"""
from __future__ import annotations


def held_key(k):
    """The key of a record key in a cached aggregation's held-back updates: the key itself when it
    is a str (or a window's (str, ...) tuple); else a `HeldKey`, so that a JSON object or array key
    (unhashable) can be held, and 1, 1.0 and True (three keys of a JSON store) stay three."""
    t = type(k)
    if t is str or (t is tuple and k and type(k[0]) is str):
        return k
    return HeldKey(k)


def _freeze(x):
    """A hashable token equal for keys the JSON serde writes alike (object keys in any order)."""
    t = type(x)
    if t is dict:
        return (dict, frozenset((_freeze(a), _freeze(b)) for a, b in x.items()))
    if t is list or t is tuple:
        return (list, tuple(map(_freeze, x)))
    try:
        hash(x)
    except TypeError:
        return (t, repr(x))
    return (t, x)


class HeldKey:
    """A key that is not a str, hashed and compared by what the JSON serde would write."""

    __slots__ = ("key", "token")

    def __init__(self, key) -> None:
        self.key = key
        self.token = _freeze(key)

    def __hash__(self) -> int:
        return hash(self.token)

    def __eq__(self, other) -> bool:
        return type(other) is HeldKey and other.token == self.token
