"""RocksDB: one instance per task, one column family per store plus `__meta__`.

Why one instance per task: a task commit must cover all of its stores and its metadata at once.
RocksDB applies a WriteBatch atomically across column families (through the WAL), so the commit is a
single `db.write(batch)`, and a process killed at any instant leaves RocksDB at exactly the last
commit (WAL recovery is point-in-time: a torn tail is dropped, a batch is all or nothing).

Between commits `RocksDBStore` never writes RocksDB (see overlay.py). The restore path
(`TaskDB.write_batch_raw`) is the one exception: whole changelog groups go straight to RocksDB in one
batch, with the meta saying how far the restore got.
"""
from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
import weakref
from collections import deque
from itertools import repeat as _repeat
from typing import Any, Iterable, Iterator, Optional

import rocksdict as rd

from statekit.errors import CorruptState, StateLocked, StatekitError, is_disk_full, store_disk_full
from statekit.stores.api import KV
from statekit.stores.memory import MemoryStore
from statekit.stores.overlay import OverlayStore

_drain = deque  # deque(iterator, 0) runs an iterator to its end in C

META_CF = "__meta__"
SPECS_KEY = "__stores__"  # meta key (reserved: keys starting "__" are not returned by read_meta)
STREAM_TIME_KEY = "__stream_time."  # + window store name
COUNT_KEY = "__count."              # + store name: its exact key count (when known)
DB_SUBDIR = "rocksdb"

_block_cache = None
_write_buffers = None


# The memtable bloom filter's size, as a share of the write buffer (32 MiB): ~1 MiB, 12 bits a key
# for a memtable of small entries (~50 bytes each), under 0.5% false positives. RocksDB allocates
# it whole with every memtable of the column family, written or not: at 0.1 on every column family
# (the default one and the meta's too) a task's database took ~13 MiB before its first record, a
# 2-instance app of 4 tasks ~50 MiB of memtable blooms, and each database a query reads as a
# secondary as much again.
MEMTABLE_BLOOM_RATIO = 0.03


def _options(memtable_bloom: bool = False) -> rd.Options:
    """Options for the DB and every column family: small and quick, WAL kept (it makes the commit
    batch atomic and crash-safe), lz4, bloom filters for point lookups; one block cache and one
    memtable budget shared by every task db of the process (a Spark worker hosts several tasks).
    ``memtable_bloom``: a bloom filter over the memtable's keys too (a store's column family in the
    process that writes it, see ``_cf_options``)."""
    global _block_cache, _write_buffers
    if _block_cache is None:
        _block_cache = rd.Cache(32 << 20)
        _write_buffers = rd.WriteBufferManager(128 << 20, False)
    o = rd.Options(raw_mode=True)
    o.set_write_buffer_manager(_write_buffers)
    o.create_if_missing(True)
    o.create_missing_column_families(True)
    o.set_compression_type(rd.DBCompressionType.lz4())
    o.set_write_buffer_size(32 << 20)   # fewer memtable switches and level-0 files per batch
    o.set_max_write_buffer_number(3)
    o.set_max_total_wal_size(64 << 20)
    o.set_max_background_jobs(2)
    o.set_keep_log_file_num(2)
    o.set_max_log_file_size(1 << 20)
    o.set_wal_recovery_mode(rd.DBRecoveryMode.point_in_time())
    if memtable_bloom:
        # a bloom filter over the memtable's keys: a key read that misses (every new key of a
        # batch that is being aggregated) skips the skiplist search
        o.set_memtable_whole_key_filtering(True)
        o.set_memtable_prefix_bloom_ratio(MEMTABLE_BLOOM_RATIO)
    bb = rd.BlockBasedOptions()
    bb.set_block_cache(_block_cache)
    bb.set_bloom_filter(10, False)
    bb.set_block_size(16 << 10)
    o.set_block_based_table_factory(bb)
    return o


def _cf_options(name: str) -> rd.Options:
    """A store's column family gets the memtable bloom; the meta's (a few keys per commit) not."""
    return _options(memtable_bloom=name != META_CF)


def _one_line(err: BaseException, limit: int = 200) -> str:
    text = " ".join(str(err).split())
    return text if len(text) <= limit else text[: limit - 3] + "..."


def _open_error(path: str, err: BaseException) -> StatekitError:
    msg = _one_line(err)
    if not msg.startswith("Corruption") and ("/LOCK" in msg or "lock hold" in msg):
        return StateLocked(f"RocksDB state in {path} is in use by another store or process ({msg}); "
                           f"close it there first")
    return CorruptState(f"RocksDB state in {path} cannot be opened ({msg}); wipe it "
                        f"(TaskDB.destroy) and restore the task from its changelog")


def _write(db: "TaskDB", wb, opts, stores) -> None:
    """``db._db.write``; a full disk as one ``DiskFull`` line (a batch is all or nothing)."""
    try:
        db._db.write(wb, opts)
    except Exception as e:  # noqa: BLE001 - rocksdict raises plain Exceptions
        if not is_disk_full(e):
            raise
        raise store_disk_full(stores, db.path) from None


def resolve_db_dir(path: str) -> str:
    """A task dir holds its RocksDB in <task_dir>/rocksdb; a RocksDB dir is taken as is."""
    sub = os.path.join(path, DB_SUBDIR)
    if os.path.isdir(sub) or not os.path.exists(os.path.join(path, "CURRENT")):
        return sub
    return path


def _cf_items(cf: rd.Rdict, lo: Optional[bytes], hi: Optional[bytes]) -> Iterator[KV]:
    """Ascending items of [lo, hi). The ReadOptions holding the upper bound must outlive the
    RocksDB iterator (the bound is not copied), so this generator keeps it referenced."""
    ro = rd.ReadOptions()
    if hi is not None:
        ro.set_iterate_upper_bound(hi)
    it = cf.items(from_key=lo, read_opt=ro)
    try:
        yield from it
    finally:
        del it, ro


class RocksDBStore(OverlayStore):
    """One store = one column family of the task's RocksDB; pending writes live in the overlay."""

    persistent = True

    def __init__(self, taskdb: "TaskDB", name: str) -> None:
        super().__init__(name)
        self._taskdb = taskdb
        self._bind()
        # The exact number of keys committed (None: unknown, RocksDB's estimate stands in: it
        # counts an overwritten key twice until compaction). A commit moves it by the keys it
        # creates and deletes: whether a key existed is known from the reads of the batch
        # (`_seen`, kept until the commit), else asked in one bulk read at the commit.
        self._seen: dict = {}
        self._next_count: Optional[int] = None   # what the count is once this commit is written
        # the batch's last bulk read: (its keys, them sorted, how many RocksDB did not have); when
        # a bulk write into the empty overlay puts exactly those keys, `_write_hint` is that read:
        # the commit writes the sorted keys as they are and counts the absent ones as new
        self._read: Optional[tuple] = None
        self._write_hint: Optional[tuple] = None

    def _bind(self) -> None:
        self._cf = self._taskdb._cf_dict(self.name)
        self._handle = self._taskdb._cf_handle(self.name)
        self._cf_get = self._cf.get
        count = self._taskdb._reserved_meta(COUNT_KEY + self.name)
        self.count = None if count is None else int(count)

    def _unbind(self) -> None:
        """Drop every reference into RocksDB (a live handle keeps the DB, and its lock, open)."""
        self._cf = None
        self._handle = None
        self._cf_get = self._closed

    def _closed(self, *a):
        raise StatekitError(f"store {self.name!r}: its task db is closed")

    def _committed_get(self, key: bytes) -> Optional[bytes]:
        v = self._cf_get(key)
        if self.count is not None:
            self._seen[key] = v is not None
        return v

    def _committed_get_many(self, keys: list) -> list:
        if self.count == 0:            # an empty store (a build's first batch): nothing to read
            self._seen.update(dict.fromkeys(keys, False))
            if len(keys) >= 16:         # sorted here rather than at the commit, as below
                self._read = (list(keys), sorted(keys), len(keys))
            return [None] * len(keys)
        get = self._cf_get
        if len(keys) < 16:
            out = list(map(get, keys))
        else:
            # point reads in key order: neighbouring keys share index and data blocks (a third
            # faster than the batch's order for keys that exist), and the commit writes the same
            # sorted list. One get at a time: rocksdict's MultiGet costs about twice as much per
            # key in its Python conversions, most for keys that are not there (a build's)
            srt = sorted(keys)
            vals = list(map(get, srt))
            absent = vals.count(None)
            self._read = (list(keys), srt, absent)
            if absent == len(vals):          # none exists (a build): no reordering to do
                if self.count is not None:
                    self._seen.update(dict.fromkeys(keys, False))
                return vals
            out = list(map(dict(zip(srt, vals)).__getitem__, keys))
        if self.count is not None:
            self._seen.update(zip(keys, [v is not None for v in out]))
        return out

    def _committed_scan(self, lo: Optional[bytes], hi: Optional[bytes]) -> Iterator[KV]:
        if self._cf is None:
            self._closed()
        it = _cf_items(self._cf, lo, hi)
        self._taskdb._iters.add(it)  # closed with the db: a live RocksDB iterator holds its lock
        return it

    def _committed_count(self) -> int:
        if self.count is not None:
            return self.count
        return self._cf.property_int_value("rocksdb.estimate-num-keys") or 0

    def recount(self) -> int:
        """Count the committed keys by walking them (after a restore, which does not keep count)."""
        n = 0
        for _ in self._cf.keys():
            n += 1
        self.count = n
        self._seen = {}
        return n

    def _count_after(self, keys: list, values: list) -> Optional[int]:
        """The exact count once this commit's writes are in (None: unknown)."""
        if self.count is None:
            return None
        seen = self._seen
        unknown = [k for k in keys if k not in seen]
        if unknown:
            self._committed_get_many(unknown)
        existed = list(map(seen.__getitem__, keys))
        if None in values:
            created = sum(1 for v, e in zip(values, existed) if v is not None and not e)
            deleted = sum(1 for v, e in zip(values, existed) if v is None and e)
        else:
            created, deleted = existed.count(False), 0
        return self.count + created - deleted

    def discard(self) -> None:
        super().discard()
        self._seen = {}
        self._read = self._write_hint = None

    def _fill(self, wb: rd.WriteBatch) -> int:
        """Write the pending operations into the task's commit batch; returns how many."""
        h = self._handle
        ranges, items = self._pending_ops()
        n = 0
        ov = self._ov
        puts_only = None not in ov.values()
        hint, self._write_hint, self._read = self._write_hint, None, None
        if hint is not None and (ranges or not puts_only or len(hint[1]) != len(ov)):
            hint = None
        if ranges:
            self._next_count = None
        elif hint is not None:
            # exactly the keys of the batch's read: the ones it found absent are the new ones
            self._next_count = None if self.count is None else self.count + hint[2]
        else:
            self._next_count = self._count_after(list(ov), list(ov.values()))
        for lo, hi in ranges:
            if hi is None:
                for k, _ in self._committed_scan(lo, None):
                    wb.delete(k, h)
            else:
                wb.delete_range(lo, hi, h)
            n += 1
        if puts_only:                     # the common case: puts only, no Python loop
            keys = self._write_keys(ov, hint)
            _drain(map(wb.put, keys, map(ov.__getitem__, keys), _repeat(h)), 0)
            return n + len(keys)
        keys = list(ov)
        values = list(ov.values())
        put = wb.put
        delete = wb.delete
        get = self._cf_get
        for k, v in zip(keys, values):
            if v is None:
                if get(k) is not None:  # no tombstone for a key RocksDB never had
                    delete(k, h)
            else:
                put(k, v, h)
            n += 1
        return n

    @staticmethod
    def _write_keys(ov: dict, hint: Optional[tuple]) -> list:
        """The overlay's keys in key order: RocksDB inserts a sorted run into its memtable about
        three times faster than the same keys in the batch's order. The keys of a hint (the
        batch's read, see `put_many`) are sorted already."""
        if hint is not None:
            return hint[1]
        return sorted(ov) if len(ov) > 64 else list(ov)

    def put_many(self, keys: list, values: list) -> None:
        fresh = not self._ov and not self._ranges
        super().put_many(keys, values)
        r = self._read
        # the same keys as the read (a list compares item by item, the same objects at once)
        # and no duplicate among them: the overlay holds exactly the sorted read's keys
        self._write_hint = r if (fresh and r is not None and len(self._ov) == len(keys)
                                 and keys == r[0]) else None

    def put(self, key: bytes, value: Optional[bytes]) -> None:
        self._write_hint = None
        super().put(key, value)

    def delete_range(self, lo: bytes, hi: Optional[bytes]) -> None:
        self._write_hint = None
        super().delete_range(lo, hi)

    def _restore_into(self, wb: rd.WriteBatch, items: Iterable[tuple]) -> int:
        h = self._handle
        put = wb.put
        delete = wb.delete
        n = 0
        for k, v in items:
            if v is None:
                delete(k, h)
            else:
                put(k, v, h)
            n += 1
        return n

    def _restore_columns(self, wb: rd.WriteBatch, keys: list, values: list) -> int:
        """``_restore_into`` for parallel key and value lists: without tombstones, one put per
        record with no Python loop around it."""
        if None in values:
            return self._restore_into(wb, zip(keys, values))
        _drain(map(wb.put, keys, values, _repeat(self._handle)), 0)
        return len(keys)

    def _restore_delete_range(self, wb: rd.WriteBatch, lo: bytes, hi: bytes) -> None:
        wb.delete_range(lo, hi, self._handle)

    def wipe(self) -> None:
        self.discard()

    def close(self) -> None:
        pass


class TaskDB:
    """The state of one task: its stores, their RocksDB (if any), the commit, restore and reset.

    `path` is the RocksDB directory (None: every store in memory, meta kept in memory). Stores are
    registered by the builder; see statekit/stores/__init__.py for the protocol the state manager
    drives (flush -> send changelog -> commit(meta) -> checkpoint).
    """

    def __init__(self, path: Optional[str], *, sync: bool = True) -> None:
        self.path = path
        self.sync = sync
        self._db: Optional[rd.Rdict] = None
        self._cfs: dict = {}
        self._handles: dict = {}
        self._stores: dict = {}      # name -> inner store (RocksDBStore | MemoryStore)
        self._targets: dict = {}     # name -> restore target (inner, or the window SegmentedStore)
        self._tops: dict = {}        # name -> outermost layer
        self._caches: dict = {}      # name -> CachingStore
        self._reloads: list = []     # callables run after discard / wipe / restore (window state)
        self._windows: dict = {}     # name -> SegmentedStore (its stream time goes into the meta)
        self._iters = weakref.WeakSet()  # open RocksDB iterators, ended on close
        self._specs: dict = {}
        self._specs_written = False
        self._mem_meta: dict = {}
        self.commits = 0
        self.last_commit: dict = {}
        if path is not None:
            self._open()

    # -- RocksDB lifecycle -----------------------------------------------------------------
    def _open(self) -> None:
        path = self.path
        try:
            os.makedirs(path, exist_ok=True)
            names = set(self._stores_on_disk(path)) | {META_CF} | {
                n for n, s in self._stores.items() if isinstance(s, RocksDBStore)}
            opts = _options()
            self._db = rd.Rdict(path, opts, column_families={n: _cf_options(n) for n in names})
        except StatekitError:
            raise
        except Exception as e:  # rocksdict raises plain Exception with RocksDB's status text
            raise _open_error(path, e) from None
        self._wopts = rd.WriteOptions()
        self._wopts.sync = self.sync
        self._restore_wopts = rd.WriteOptions()
        self._restore_wopts.sync = False

    @staticmethod
    def _stores_on_disk(path: str) -> list:
        if not os.path.exists(os.path.join(path, "CURRENT")):
            return []
        return [n for n in rd.Rdict.list_cf(path, rd.Options(raw_mode=True)) if n != "default"]

    def _cf_dict(self, name: str) -> rd.Rdict:
        cf = self._cfs.get(name)
        if cf is None:
            db = self._require_db()
            try:
                cf = db.get_column_family(name)
            except Exception:
                cf = db.create_column_family(name, _cf_options(name))
            self._cfs[name] = cf
        return cf

    def _cf_handle(self, name: str):
        h = self._handles.get(name)
        if h is None:
            self._cf_dict(name)
            h = self._handles[name] = self._require_db().get_column_family_handle(name)
        return h

    def _require_db(self) -> rd.Rdict:
        if self._db is None:
            if self.path is None:
                raise StatekitError("this task keeps its stores in memory: no RocksDB to use")
            raise StatekitError(f"the task db {self.path} is closed; open it again with build_stores")
        return self._db

    # -- stores ------------------------------------------------------------------------------
    def kv_store(self, name: str) -> RocksDBStore:
        """The RocksDB inner store `name` (its column family is created when missing)."""
        if name == META_CF or name.startswith("__"):
            raise ValueError(f"store name {name!r} is reserved")
        s = self._stores.get(name)
        if s is None:
            s = self._stores[name] = RocksDBStore(self, name)
            self._targets.setdefault(name, s)
        return s

    def memory_store(self, name: str) -> MemoryStore:
        s = self._stores.get(name)
        if s is None:
            s = self._stores[name] = MemoryStore(name)
            self._targets.setdefault(name, s)
        return s

    def register(self, name: str, *, top: Any = None, cache: Any = None, restore_target: Any = None,
                 reload: Any = None, spec: Optional[dict] = None) -> None:
        """The builder tells the task db about a store stack (for flush/discard/restore/inspection)."""
        if top is not None:
            self._tops[name] = top
        if cache is not None:
            self._caches[name] = cache
        if restore_target is not None:
            self._targets[name] = restore_target
            if getattr(restore_target, "segment_ms", None) is not None:
                self._windows[name] = restore_target
        if reload is not None:
            self._reloads.append(reload)
        if spec is not None:
            self._specs[name] = spec
            self._specs_written = False

    @property
    def store_names(self) -> list:
        return list(self._stores)

    def store(self, name: str) -> Any:
        """The outermost layer of store `name` (what build_stores returned for it)."""
        return self._tops.get(name) or self._stores[name]

    def persistent(self, name: str) -> bool:
        return bool(self._stores[name].persistent)

    # -- the commit protocol -----------------------------------------------------------------
    def flush(self) -> int:
        """Step 1 of a commit: every cache forwards its dirty entries (to the sink and overlays).
        Returns how many entries were forwarded."""
        n = 0
        for c in self._caches.values():
            n += c.dirty_count
            c.flush()
        return n

    def logged_stores(self) -> list:
        """Names of the stores that write a changelog (the ones restoration reads)."""
        return [n for n, t in self._tops.items()
                if getattr(getattr(t, "spec", None), "logging", False)]

    def dirty_count(self) -> int:
        return sum(c.dirty_count for c in self._caches.values())

    def pending_count(self) -> int:
        return sum(s.pending_count() for s in self._stores.values())

    def commit(self, meta: Optional[dict] = None) -> dict:
        """One atomic WriteBatch: every store's pending writes plus `meta`. Returns commit stats."""
        for name, c in self._caches.items():
            if c.dirty_count:
                raise StatekitError(
                    f"commit with {c.dirty_count} unflushed cache entries in store {name!r}: call "
                    f"flush() and send the changelog before commit()")
        t0 = time.perf_counter()
        records = 0
        nbytes = 0
        rocks = [s for s in self._stores.values() if isinstance(s, RocksDBStore)]
        if self.path is not None:
            self._require_db()
            wb = rd.WriteBatch(raw_mode=True)
            counts = {}
            for s in rocks:
                records += s._fill(wb)
                if s._next_count is not None or s.count is not None:
                    counts[s.name] = s._next_count
            self._put_meta(wb, meta, self._windows, counts)
            nbytes = wb.size_in_bytes()
            _write(self, wb, self._wopts, [s.name for s in rocks if s.pending_count()]
                   or [s.name for s in rocks])
            for s in rocks:
                s.count = s._next_count
        else:
            self._put_meta(None, meta, self._windows)
        for s in rocks:
            s.discard()
        for s in self._stores.values():
            if isinstance(s, MemoryStore):
                records += s.pending_count()
                s.commit()
        self.commits += 1
        self.last_commit = {"records": records, "bytes": nbytes,
                            "ms": (time.perf_counter() - t0) * 1000.0}
        return self.last_commit

    def _put_meta(self, wb: Optional[rd.WriteBatch], meta: Optional[dict], windows: dict,
                  counts: Optional[dict] = None) -> None:
        """User meta, plus reserved entries: window stream times, the store specs (once), the
        stores' exact key counts (None: unknown)."""
        entries = {}
        for k, v in (meta or {}).items():
            if not isinstance(k, str) or k.startswith("__"):
                raise ValueError(f"meta key {k!r}: use a str not starting with '__'")
            entries[k] = v
        for name, seg in windows.items():
            entries[STREAM_TIME_KEY + name] = seg.stream_time
        for name, n in (counts or {}).items():
            entries[COUNT_KEY + name] = n
        if not self._specs_written and self._specs:
            entries[SPECS_KEY] = self._specs
        if wb is None:
            self._mem_meta.update(json.loads(json.dumps(entries)))
        else:
            h = self._cf_handle(META_CF)
            for k, v in entries.items():
                wb.put(k.encode("utf-8"),
                       json.dumps(v, separators=(",", ":"), sort_keys=True).encode(), h)
        self._specs_written = True

    def read_meta(self) -> dict:
        """The meta of the last commit (or restore batch); {} for a fresh task."""
        if self.path is None:
            return {k: v for k, v in json.loads(json.dumps(self._mem_meta)).items()
                    if not k.startswith("__")}
        self._require_db()
        return _read_meta(self._cf_dict(META_CF))

    def _reserved_meta(self, key: str, default: Any = None) -> Any:
        if self.path is None:
            return self._mem_meta.get(key, default)
        raw = self._cf_dict(META_CF).get(key.encode("utf-8"))
        return default if raw is None else json.loads(raw)

    def committed_stream_time(self, name: str) -> int:
        """A window store's stream time as of the last commit (-1: none)."""
        return int(self._reserved_meta(STREAM_TIME_KEY + name, -1))

    def read_specs(self) -> dict:
        return dict(self._specs)

    def discard(self) -> None:
        """Roll back to the last commit: drop caches (dirty entries too) and pending writes."""
        for c in self._caches.values():
            c.clear()
        for s in self._stores.values():
            s.discard()
        for r in self._reloads:
            r()

    def write_batch_raw(self, store_name: str, items: Iterable[tuple],
                        meta: Optional[dict] = None) -> int:
        """Restore path: changelog records (key, value|None) straight to RocksDB with `meta`, in one
        batch. The store must have no uncommitted writes. Returns the number of records applied."""
        inner = self._stores[store_name]
        if inner.pending_count() or (store_name in self._caches
                                     and self._caches[store_name].dirty_count):
            raise StatekitError(f"store {store_name!r} has uncommitted writes: restore only into "
                                f"a store that does not process (commit or discard() first)")
        cache = self._caches.get(store_name)
        if cache is not None:
            cache.clear()  # clean entries could hide restored values
        reset = getattr(self._tops.get(store_name), "reset_floor", None)
        if reset is not None:
            reset()        # restored entries may be older than what it last evicted
        target = self._targets[store_name]
        windows = {store_name: self._windows[store_name]} if store_name in self._windows else {}
        if self.path is not None:
            self._require_db()
            wb = rd.WriteBatch(raw_mode=True)
            n = target._restore_into(wb, items)
            self._put_meta(wb, meta, windows, self._forget_count(store_name))
            _write(self, wb, self._restore_wopts, [store_name])
        else:
            n = target._restore_into(None, items)
            self._put_meta(None, meta, windows)
        return n

    def write_batch_columns(self, store_name: str, keys: list, values: list,
                            meta: Optional[dict] = None) -> int:
        """:meth:`write_batch_raw` for parallel ``keys`` / ``values`` lists (value None: delete),
        the restore path's shape: one WriteBatch, no per-record tuple."""
        target = self._targets[store_name]
        if self.path is None or not hasattr(target, "_restore_columns"):
            return self.write_batch_raw(store_name, zip(keys, values), meta)
        inner = self._stores[store_name]
        if inner.pending_count() or (store_name in self._caches
                                     and self._caches[store_name].dirty_count):
            raise StatekitError(f"store {store_name!r} has uncommitted writes: restore only into "
                                f"a store that does not process (commit or discard() first)")
        cache = self._caches.get(store_name)
        if cache is not None:
            cache.clear()  # clean entries could hide restored values
        reset = getattr(self._tops.get(store_name), "reset_floor", None)
        if reset is not None:
            reset()        # restored entries may be older than what it last evicted
        self._require_db()
        wb = rd.WriteBatch(raw_mode=True)
        n = target._restore_columns(wb, keys, values)
        self._put_meta(wb, meta, {}, self._forget_count(store_name))
        _write(self, wb, self._restore_wopts, [store_name])
        return n

    def _forget_count(self, store_name: str) -> dict:
        """A restore writes without keeping count: the count is unknown until `recount`."""
        inner = self._stores.get(store_name)
        if isinstance(inner, RocksDBStore) and inner.count is not None:
            inner.count = None
            return {store_name: None}
        return {}

    def recount(self) -> dict:
        """Count the keys of every kv store whose count is unknown (after a restore, or state
        written before counts were kept): {store: keys}. Walks the keys once."""
        out = {}
        for name, s in self._stores.items():
            if isinstance(s, RocksDBStore) and s.count is None and \
                    (self._specs.get(name) or {}).get("kind", "kv") == "kv":
                out[name] = s.recount()
        return out

    def wipe(self) -> None:
        """Delete all data and meta of this task (untrusted local state); store objects stay usable."""
        for c in self._caches.values():
            c.clear()
        for s in self._stores.values():
            s.wipe()
        self._mem_meta = {}
        if self.path is not None:
            self._close_db()
            self._destroy_dir(self.path)
            self._open()
            for s in self._stores.values():
                if isinstance(s, RocksDBStore):
                    s._bind()
            self._specs_written = False
        for r in self._reloads:
            r()

    def verify(self) -> int:
        """Read every committed record with checksums on; CorruptState if RocksDB finds damage
        (opening checks only the metadata). Returns the number of records read."""
        if self.path is None:
            return 0
        self._require_db()
        n = 0
        for name in [META_CF] + [k for k, s in self._stores.items() if isinstance(s, RocksDBStore)]:
            ro = rd.ReadOptions()
            ro.set_verify_checksums(True)
            try:
                for _ in self._cf_dict(name).items(read_opt=ro):
                    n += 1
            except Exception as e:
                raise CorruptState(f"RocksDB state in {self.path} is damaged (store {name!r}: "
                                   f"{_one_line(e)}); wipe it and restore the task from its "
                                   f"changelog") from None
        return n

    def sync_wal(self) -> None:
        """Make the restore batches written so far durable (they are written without fsync)."""
        if self._db is not None:
            self._db.flush_wal(True)

    @staticmethod
    def _destroy_dir(path: str) -> None:
        try:
            rd.Rdict.destroy(path, rd.Options(raw_mode=True))
        except Exception:
            pass
        shutil.rmtree(path, ignore_errors=True)

    @staticmethod
    def destroy(path: str) -> None:
        """Remove a task's RocksDB from disk (`path` = the task dir or the RocksDB dir itself)."""
        TaskDB._destroy_dir(resolve_db_dir(path))

    def _close_db(self) -> None:
        for it in list(self._iters):
            it.close()
        self._iters = weakref.WeakSet()
        for s in self._stores.values():
            if isinstance(s, RocksDBStore):
                s._unbind()
        for cf in self._cfs.values():
            try:
                cf.close()
            except Exception:
                pass
        self._cfs = {}
        self._handles = {}
        if self._db is not None:
            db, self._db = self._db, None
            db.close()

    def close(self) -> None:
        """Close RocksDB. Uncommitted writes are lost by design (they were never in RocksDB)."""
        self._close_db()

    @property
    def closed(self) -> bool:
        return self._db is None and self.path is not None

    def __enter__(self) -> "TaskDB":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- observation -------------------------------------------------------------------------
    def stats(self) -> dict:
        out = {}
        for name in self._stores:
            top = self._tops.get(name)
            m = top.metrics() if top is not None and hasattr(top, "metrics") else {}
            m = dict(m)
            m["pending"] = self._stores[name].pending_count()
            out[name] = m
        return out

    def items(self, store_name: str, lo: Optional[bytes] = None,
              hi: Optional[bytes] = None) -> Iterator[KV]:
        """Committed raw (key, value) pairs of a store, as RocksDB holds them."""
        s = self._stores[store_name]
        return s._committed_scan(lo, hi)

    def changelog_items(self, store_name: str) -> Iterator[KV]:
        """Committed records in changelog form, i.e. as the sink received them (window stores:
        without the segment prefix): what re-seeding a lost changelog must send."""
        it = self.items(store_name)
        if getattr(self._targets.get(store_name), "segment_ms", None) is None:
            return it
        return ((k[8:], v) for k, v in it)

    def to_pandas(self, store_name: str, key_serde: Any = None, value_serde: Any = None,
                  limit: Optional[int] = None):
        """Committed contents of a store as a DataFrame (decoded with the store's serdes)."""
        from statekit.stores.inspect import frame

        spec = self._specs.get(store_name, {})
        return frame(self.items(store_name), spec, key_serde, value_serde, limit)

    def __repr__(self) -> str:
        return f"TaskDB({self.path!r}, stores={self.store_names})"


def _read_meta(meta_cf: rd.Rdict, reserved: bool = False) -> dict:
    out = {}
    for k, v in meta_cf.items():
        key = k.decode("utf-8")
        if key.startswith("__") and not reserved:
            continue
        out[key] = json.loads(v)
    return out


class ReadOnlyTaskDB:
    """A RocksDB secondary instance over a task's state: reads the last commit while the writer
    process keeps the DB open (interactive queries, inspection). `refresh()` catches up."""

    def __init__(self, path: str) -> None:
        self.path = resolve_db_dir(path)
        self._db = None
        self._open(path)

    def _manifest(self) -> Optional[tuple]:
        """The MANIFEST the writer uses now (the CURRENT file) and its size, None when there is
        none: the size grows with every flush or compaction the writer records."""
        try:
            with open(os.path.join(self.path, "CURRENT"), "rb") as f:
                name = f.read()
            return name, os.path.getsize(os.path.join(self.path, name.decode().strip()))
        except (OSError, UnicodeDecodeError):
            return None

    def _open(self, path: str) -> None:
        self._manifest_seen = self._manifest()
        if self._manifest_seen is None:
            raise CorruptState(f"no RocksDB state in {path}: the task has not committed yet or its "
                               f"state dir is elsewhere")
        self._secondary = tempfile.mkdtemp(prefix="statekit-secondary-")
        try:
            names = rd.Rdict.list_cf(self.path, rd.Options(raw_mode=True))
            self._db = rd.Rdict(self.path, _options(),
                                column_families={n: _options() for n in names},
                                access_type=rd.AccessType.secondary(self._secondary))
            self._db.try_catch_up_with_primary()
        except StatekitError:
            shutil.rmtree(self._secondary, ignore_errors=True)
            raise
        except Exception as e:
            shutil.rmtree(self._secondary, ignore_errors=True)
            raise _open_error(self.path, e) from None
        self._names = [n for n in names if n not in ("default", META_CF)]
        self._cfs: dict = {}

    @property
    def store_names(self) -> list:
        return list(self._names)

    def _cf(self, name: str) -> rd.Rdict:
        cf = self._cfs.get(name)
        if cf is None:
            if name not in self._names and name != META_CF:
                raise KeyError(f"no store {name!r} in {self.path} (stores: {self._names})")
            cf = self._cfs[name] = self._db.get_column_family(name)
        return cf

    def refresh(self) -> None:
        """Catch up with the writer's latest commit. A secondary instance that catches up across a
        flush of one column family can lose that family's newer memtable entries (the meta looks
        current while some keys read an older value), and it does not follow the new MANIFEST of a
        writer that reopened the DB. So it catches up only while the MANIFEST stayed as it was
        (same file, same size, before and after), and otherwise opens afresh: a new secondary
        reads the flushed files and replays the live WAL whole."""
        current = self._manifest()
        if current is None or current == self._manifest_seen:
            self._db.try_catch_up_with_primary()
            if self._manifest() == current:
                return
        self.close()
        self._open(self.path)

    def read_meta(self) -> dict:
        return _read_meta(self._cf(META_CF))

    def read_specs(self) -> dict:
        raw = self._cf(META_CF).get(SPECS_KEY.encode())
        return json.loads(raw) if raw is not None else {}

    def get(self, store_name: str, key: bytes) -> Optional[bytes]:
        """Raw committed value (window stores: key = segment + key + window start)."""
        return self._cf(store_name).get(key)

    def items(self, store_name: str, lo: Optional[bytes] = None,
              hi: Optional[bytes] = None) -> Iterator[KV]:
        return _cf_items(self._cf(store_name), lo, hi)

    def to_pandas(self, store_name: str, key_serde: Any = None, value_serde: Any = None,
                  limit: Optional[int] = None):
        from statekit.stores.inspect import frame

        spec = self.read_specs().get(store_name, {})
        return frame(self.items(store_name), spec, key_serde, value_serde, limit)

    def close(self) -> None:
        for cf in self._cfs.values():
            try:
                cf.close()
            except Exception:
                pass
        self._cfs = {}
        if self._db is not None:
            self._db.close()
            self._db = None
        shutil.rmtree(self._secondary, ignore_errors=True)

    def __enter__(self) -> "ReadOnlyTaskDB":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def open_readonly(path: str) -> ReadOnlyTaskDB:
    """Open a task's RocksDB (task dir or RocksDB dir) read only, beside a live writer."""
    return ReadOnlyTaskDB(path)
