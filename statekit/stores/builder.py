"""Compose store stacks from specs: Metered -> Caching -> ChangeLogging -> [Segmented ->] inner.

Kinds: "kv" (MeteredStore), "window" (MeteredWindowStore over a SegmentedStore), "session"
(MeteredSessionStore: the window layout keyed by session end, see session.py) and "buffer"
(MeteredBufferStore: a time-ordered suppression buffer on the kv layout, see buffer.py). The
segmented kinds ("window", "session") keep a retention and write `compact,delete` changelogs.

All stores of a task share one TaskDB (one RocksDB, one commit) and one record-cache budget.
Caching and logging can each be switched off per store (a store without logging cannot be restored
from Kafka: after a disk loss it comes back empty).
"""
from __future__ import annotations

import os
from dataclasses import asdict, dataclass
from typing import Any, Callable, Iterable, Optional

from statekit.stores.buffer import MeteredBufferStore
from statekit.stores.caching import CachingStore, RecordCache
from statekit.stores.changelogging import ChangeLoggingStore
from statekit.stores.metered import MeteredStore
from statekit.stores.rocksdb import DB_SUBDIR, TaskDB
from statekit.stores.serdes import bound, get_serde, serde_name
from statekit.stores.session import MeteredSessionStore
from statekit.stores.window import MeteredWindowStore, SegmentedStore, default_segment_ms

DEFAULT_CACHE_BYTES = 10 * 1024 * 1024  # Kafka Streams' default statestore.cache.max.bytes
KINDS = ("kv", "window", "session", "buffer")
SEGMENTED_KINDS = ("window", "session")


@dataclass(frozen=True)
class StoreSpec:
    name: str
    kind: str = "kv"                 # "kv" | "window" | "session" | "buffer"
    key_serde: Any = "json"
    value_serde: Any = "json"
    backend: str = "rocksdb"         # "rocksdb" | "memory"
    caching: bool = True
    logging: bool = True
    retention_ms: Optional[int] = None
    window_size_ms: Optional[int] = None
    segment_ms: Optional[int] = None

    def __post_init__(self) -> None:
        if not self.name or not isinstance(self.name, str) or self.name.startswith("__"):
            raise ValueError(f"store name {self.name!r}: a non-empty str not starting with '__'")
        if self.kind not in KINDS:
            raise ValueError(f"store {self.name!r}: kind must be one of {', '.join(KINDS)}, not "
                             f"{self.kind!r}")
        if self.backend not in ("rocksdb", "memory"):
            raise ValueError(f"store {self.name!r}: backend must be 'rocksdb' or 'memory', "
                             f"not {self.backend!r}")
        if not self.segmented and (self.retention_ms or self.segment_ms):
            raise ValueError(f"store {self.name!r}: retention_ms/segment_ms are for window and "
                             f"session stores")
        for f in ("retention_ms", "window_size_ms", "segment_ms"):
            v = getattr(self, f)
            if v is not None and v <= 0:
                raise ValueError(f"store {self.name!r}: {f} must be > 0")
        get_serde(self.key_serde)
        get_serde(self.value_serde)

    @property
    def segmented(self) -> bool:
        """Window and session stores: time segments, retention, changelog keys `key + time`."""
        return self.kind in SEGMENTED_KINDS

    @property
    def changelog_cleanup_policy(self) -> str:
        """`compact` for kv and buffer stores, `compact,delete` for window and session stores (old
        windows and sessions age out)."""
        return "compact,delete" if self.segmented else "compact"

    def effective_segment_ms(self) -> int:
        return self.segment_ms or default_segment_ms(self.retention_ms)

    def describe(self) -> dict:
        """JSON-able description (recorded in the task meta, used by inspection)."""
        d = asdict(self)
        for f in ("key_serde", "value_serde"):
            s = getattr(self, f)
            d[f] = s if isinstance(s, str) else (serde_name(get_serde(s)) or "custom")
        if self.segmented:
            d["segment_ms"] = self.effective_segment_ms()
        return d


def build_stores(specs: Iterable[StoreSpec], task_dir: Optional[str], sink: Any = None,
                 cache_bytes: int = DEFAULT_CACHE_BYTES, *, sync: bool = True,
                 changelog_topic: Optional[Callable[[str], str]] = None):
    """Build every store of one task. Returns ({name: outermost store}, TaskDB).

    RocksDB stores live in `<task_dir>/rocksdb` (created when missing; CorruptState if unreadable).
    `sink` receives changelog records of logged stores. `cache_bytes` is the task's record-cache
    budget shared by its caching stores (<= 0: no caching anywhere). `sync`: fsync each commit.
    `changelog_topic(store)`: the topic a logged store's bytes go to, which names the subject a
    schema serde registers a new schema under (the store's bytes are the changelog's).
    """
    specs = list(specs)
    names = [s.name for s in specs]
    if len(set(names)) != len(names):
        raise ValueError(f"duplicate store names in {names}")
    needs_db = any(s.backend == "rocksdb" for s in specs)
    if needs_db and task_dir is None:
        raise ValueError("RocksDB stores need a task_dir")
    if sink is None and any(s.logging for s in specs):
        raise ValueError("logged stores need a changelog sink (pass sink=, or logging=False)")
    db = TaskDB(os.path.join(task_dir, DB_SUBDIR) if needs_db else None, sync=sync)
    cache = RecordCache(cache_bytes) if cache_bytes and cache_bytes > 0 else None
    stores = {}
    try:
        for spec in specs:
            inner = db.kv_store(spec.name) if spec.backend == "rocksdb" else db.memory_store(spec.name)
            layer = inner
            seg = None
            if spec.segmented:
                seg = layer = SegmentedStore(
                    inner, spec.effective_segment_ms(), spec.retention_ms,
                    stream_time_source=lambda n=spec.name: db.committed_stream_time(n))
            if spec.logging:
                layer = ChangeLoggingStore(layer, sink)
            caching = None
            if spec.caching and cache is not None:
                caching = layer = CachingStore(layer, cache)
            ks, vs = spec.key_serde, spec.value_serde
            if spec.logging and changelog_topic is not None:
                topic = changelog_topic(spec.name)
                ks, vs = bound(get_serde(ks), topic, True), bound(get_serde(vs), topic, False)
            if spec.kind == "window":
                top = MeteredWindowStore(layer, seg, ks, vs, spec.window_size_ms)
            elif spec.kind == "session":
                top = MeteredSessionStore(layer, seg, ks, vs)
            elif spec.kind == "buffer":
                top = MeteredBufferStore(layer, ks, vs)
            else:
                top = MeteredStore(layer, ks, vs)
            top.spec = spec
            reload = seg.reload if seg is not None else getattr(top, "reset_floor", None)
            db.register(spec.name, top=top, cache=caching, restore_target=seg, reload=reload,
                        spec=spec.describe())
            stores[spec.name] = top
    except BaseException:
        db.close()
        raise
    return stores, db
