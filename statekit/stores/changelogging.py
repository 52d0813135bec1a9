"""Change-logging: every write that reaches this layer is also handed to the changelog sink.

It sits below the cache, so it sees only what the cache forwards (one record per dirty key per
flush or eviction), and above the inner store, so the sink sees exactly what the inner store will
commit. Deletes become tombstones (value None), which compaction later removes from the topic.
The sink (the task state manager) buffers and sends; this layer never talks to Kafka.
"""
from __future__ import annotations

from typing import Iterator, Optional

from statekit.stores.api import KV, StoreBase


class ChangeLoggingStore(StoreBase):
    def __init__(self, inner, sink) -> None:
        self.name = inner.name
        self.inner = inner
        self.sink = sink
        self._inner_put = inner.put
        self._append = sink.append
        self.logged = 0

    def get(self, key: bytes) -> Optional[bytes]:
        return self.inner.get(key)

    def scan(self, lo: Optional[bytes] = None, hi: Optional[bytes] = None) -> Iterator[KV]:
        return self.inner.scan(lo, hi)

    def approximate_count(self) -> int:
        return self.inner.approximate_count()

    def put(self, key: bytes, value: Optional[bytes]) -> None:
        self._inner_put(key, value)
        self._append(self.name, key, value)
        self.logged += 1

    def get_many(self, keys: list) -> list:
        return self.inner.get_many(keys)

    def put_many(self, keys: list, values: list) -> None:
        self.inner.put_many(keys, values)
        extend = getattr(self.sink, "extend", None)   # (a sink may only have append)
        if extend is not None:
            extend(self.name, keys, values)
        else:
            for k, v in zip(keys, values):
                self._append(self.name, k, v)
        self.logged += len(keys)

    def put_if_absent(self, key: bytes, value: bytes) -> Optional[bytes]:
        old = self.inner.get(key)
        if old is None:
            self.put(key, value)
        return old

    def delete(self, key: bytes) -> Optional[bytes]:
        old = self.inner.get(key)
        self.put(key, None)
        return old

    def flush(self) -> None:
        self.inner.flush()

    def close(self) -> None:
        self.inner.close()
