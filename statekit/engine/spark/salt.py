"""Salts: for every task `p` an int whose Spark hash partitioning lands in partition `p`.

`groupBy("salt")` before a stateful operator (and `df.repartition(N, "salt")`) is
`HashPartitioning`: partition = pmod(Murmur3Hash(salt, seed=42), N), with Spark's Murmur3 `hashInt`
for an IntegerType column. A column `salt = salts(N)[task]` therefore puts task `p` alone in Spark
partition `p` — and, for the executors placement's stateful operator, in state partition `p`
(`engine.spark.executors`; verified against Spark in tests/cluster/test_salt.py).
"""
from __future__ import annotations

from functools import lru_cache

_M32 = 0xFFFFFFFF


def _rotl(x: int, r: int) -> int:
    return ((x << r) | (x >> (32 - r))) & _M32


def spark_hash_int(value: int, seed: int = 42) -> int:
    """Spark's `Murmur3_x86_32.hashInt(value, seed)` (what `hash(int_col)` returns), signed."""
    k1 = value & _M32
    k1 = (k1 * 0xCC9E2D51) & _M32
    k1 = _rotl(k1, 15)
    k1 = (k1 * 0x1B873593) & _M32
    h1 = (seed & _M32) ^ k1
    h1 = _rotl(h1, 13)
    h1 = (h1 * 5 + 0xE6546B64) & _M32
    h1 ^= 4
    h1 ^= h1 >> 16
    h1 = (h1 * 0x85EBCA6B) & _M32
    h1 ^= h1 >> 13
    h1 = (h1 * 0xC2B2AE35) & _M32
    h1 ^= h1 >> 16
    return h1 - (1 << 32) if h1 & 0x80000000 else h1


def spark_partition_of(value: int, n: int) -> int:
    """The shuffle partition `repartition(n, int_col)` sends `value` to."""
    return spark_hash_int(value) % n  # Python's % is pmod for a positive n


@lru_cache(maxsize=64)
def salts(n: int) -> tuple:
    """`salts(n)[p]` = the smallest int >= 0 that lands in shuffle partition p of n."""
    out: list = [None] * n
    missing = n
    v = 0
    while missing:
        p = spark_partition_of(v, n)
        if out[p] is None:
            out[p] = v
            missing -= 1
        v += 1
    return tuple(out)
