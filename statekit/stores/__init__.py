"""statekit.stores — the state stores of one task, as layers with one interface (no Kafka here).

Public API (stable; `statekit/state/` codes against it)
======================================================

Building a task's stores::

    from statekit.stores import StoreSpec, build_stores, RecordingSink

    stores, db = build_stores(
        [StoreSpec("counts"),                                    # kv, json/json, rocksdb, cached, logged
         StoreSpec("clicks", kind="window", window_size_ms=60_000, retention_ms=3_600_000)],
        task_dir="/state/app/0_3",      # RocksDB lives in <task_dir>/rocksdb; the dir is yours otherwise
        sink=my_sink,                   # any object with append(store_name, key_bytes, value_or_None)
        cache_bytes=10 * 1024 * 1024)   # one record-cache budget shared by the task's stores
    counts = stores["counts"]           # MeteredStore: typed get/put/put_if_absent/delete/range/...
    clicks = stores["clicks"]           # MeteredWindowStore: put(key, value, window_start), fetch, ...

StoreSpec(name, kind="kv"|"window"|"session"|"buffer", key_serde="json", value_serde="json", backend="rocksdb"|"memory",
caching=True, logging=True, retention_ms=None, window_size_ms=None, segment_ms=None).

The commit protocol, as the task state manager drives it (`db` is a `TaskDB`)::

    db.flush()                 # 1. every store's cache -> change-logging layer -> sink.append(...)
                               #    (and into the inner stores' pending overlays)
    ...send sink records + markers, wait for acks...              # 2. yours
    db.commit({"batch": b, "offsets": {...}})                     # 3. ONE atomic RocksDB WriteBatch:
                               #    all stores' pending writes + these meta keys
    ...write <task_dir>/.checkpoint...                            # 4. yours

- `db.commit(meta=None)`: meta is a dict of str -> JSON value; keys are merged into the stored meta
  (keys not named keep their value). Raises StatekitError if a cache still holds dirty entries
  (call `db.flush()` first: the changelog must be sent before RocksDB is written).
- `db.read_meta() -> dict`: the meta of the last commit ({} for a fresh task).
- `db.discard()`: drop every cache and every uncommitted write: the stores read as of the last commit
  (a failed batch that Spark will replay).
- `db.write_batch_raw(store_name, items, meta=None) -> int`: the restore path. `items` is an iterable
  of (key_bytes, value_bytes_or_None) exactly as they appear in the changelog (None = tombstone);
  written straight to RocksDB in one WriteBatch together with `meta` (atomic), bypassing caches,
  overlays and the sink. Call it only while the task does not process (restoring / standby).
  Returns the number of records applied. Window stores translate keys and apply retention themselves.
- `db.wipe()`: delete every store's data and the meta (the local state is untrusted); store objects
  stay usable; `TaskDB.destroy(path_or_task_dir)` removes a task's RocksDB directory from disk.
- `db.close()`; `db.path` (the RocksDB dir or None when every store is in memory); `db.store_names`;
  `db.persistent(name) -> bool` (False for memory stores: they always restore from the log start);
  `db.logged_stores() -> [name]`; `db.store(name)` (outermost layer; `.spec` is its StoreSpec).
- `db.flush() -> int` (entries forwarded); `db.commit(...)` returns {"records", "bytes", "ms"}.
- `db.stats() -> {store: metrics dict}`; `db.items(name)` / `db.to_pandas(name)`: committed data
  as RocksDB holds it; `db.changelog_items(name)`: committed data in changelog form (window keys
  without their segment prefix) — what re-seeding a lost changelog sends.
- Meta keys are str not starting with "__" (reserved); values are anything JSON can hold.
- Iterators returned by range/prefix_scan/all read RocksDB lazily; `close()` ends the ones still
  open (they stop early) so the RocksDB lock is released.

- `db.verify() -> int` reads every committed record with checksums on (CorruptState on damage
  that opening cannot see). `db.sync_wal()` fsyncs restore batches (written without fsync; commits
  are fsynced unless `build_stores(..., sync=False)`).
- Window stores keep their stream time in the meta (reserved key), written by every commit and
  restore batch, so retention means the same after a restart.

Opening a DB that cannot be opened raises `statekit.errors.CorruptState` (one line, says what to
do); a DB held by another live writer (or an unclosed TaskDB in this process) raises
`statekit.errors.StateLocked`.

Inspection while another process writes (RocksDB secondary instance, read only)::

    from statekit.stores import open_readonly
    with open_readonly(task_dir) as ro:       # or the RocksDB dir itself
        ro.read_meta(); ro.store_names; ro.refresh()   # catch up with the writer
        ro.items("counts")                    # raw (key_bytes, value_bytes) of the last commit
        ro.to_pandas("counts")                # decoded with the serdes recorded at commit

Typed window store (`MeteredWindowStore`): put(key, value, window_start), get(key, window_start),
delete(key, window_start), fetch(key, t_from, t_to) -> (window_start, value) ascending (inclusive
bounds), fetch_all(t_from, t_to) / all() -> (key, window_start, value). Changelog keys of window
stores are `key_bytes + 8-byte big-endian window_start`.

Typed session store (`MeteredSessionStore`, kind "session"): put(key, start, end, value),
remove(key, start, end), fetch_session(key, start, end), find_sessions(key, earliest_end, latest_start)
-> [(start, end, value)] in end order, fetch(key), all() -> (key, start, end, value). Changelog keys are
`key_bytes + 8-byte end`, values `8-byte start + value bytes` (see session.py).

Suppression buffer (`MeteredBufferStore`, kind "buffer"): put(key, time, value, old, prior, timestamp, ...),
get(key), delete(key), evict_until(time) and pop_oldest() (oldest first), min_time(), count(), all()
-> BufferedRecord; a kv layout with a compacted changelog (see buffer.py).

Composite serdes (`ListSerde`, `TimestampedSerde`) are named `list(json)`, `timestamped(int64)`;
`get_serde` parses such names back.

Bytes-level layers (every one implements `KeyValueStore`, see api.py):
`MeteredStore(inner, key_serde, value_serde)` -> `CachingStore(inner, cache)` ->
`ChangeLoggingStore(inner, sink)` -> `RocksDBStore` | `MemoryStore`. Ranges are inclusive at both
ends (Kafka Streams semantics); `scan(lo, hi)` is the half-open primitive; prefix_scan(prefix).
Window stores: `MeteredWindowStore` over the same KV layers on composite keys
`key_bytes + 8-byte big-endian window_start`, with a `SegmentedStore` above the inner store
(see window.py). Serdes: `get_serde("json"|"str"|"int64"|"bytes"|obj)`, `register_serde(name, serde)`.
"""
from __future__ import annotations

from statekit.stores.api import ChangelogSink, KeyValueStore, RecordingSink, WindowStore
from statekit.stores.buffer import BufferedRecord, MeteredBufferStore
from statekit.stores.builder import StoreSpec, build_stores
from statekit.stores.caching import CachingStore, RecordCache
from statekit.stores.changelogging import ChangeLoggingStore
from statekit.stores.memory import MemoryStore
from statekit.stores.metered import MeteredStore
from statekit.stores.rocksdb import ReadOnlyTaskDB, RocksDBStore, TaskDB, open_readonly
from statekit.stores.serdes import ListSerde, Serde, TimestampedSerde, get_serde, register_serde
from statekit.stores.session import MeteredSessionStore
from statekit.stores.window import MeteredWindowStore, SegmentedStore

__all__ = [
    "BufferedRecord", "CachingStore", "ChangeLoggingStore", "ChangelogSink", "KeyValueStore",
    "ListSerde", "MemoryStore", "MeteredBufferStore", "MeteredSessionStore", "MeteredStore",
    "MeteredWindowStore", "ReadOnlyTaskDB", "RecordCache", "RecordingSink", "RocksDBStore",
    "SegmentedStore", "Serde", "StoreSpec", "TaskDB", "TimestampedSerde", "WindowStore",
    "build_stores", "get_serde", "open_readonly", "register_serde",
]
