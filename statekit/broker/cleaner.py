"""The log cleaner: compaction of `cleanup.policy=compact` topics, never changing an offset.

A pass over one partition:
1. snapshot the cleanable segments and build a key -> latest offset map over their dirty part. As
   in Kafka, the cleanable range ends at the first uncleanable offset: the active segment's base,
   or earlier, the first segment holding a record younger than `min.compaction.lag.ms` or an offset
   at or past the last stable offset (an open transaction). Records past it neither go nor make
   others go: the newest records of a log may still be undecided (an open transaction, or a commit
   that crashed before its marker in statekit's changelogs), and they must not cost the committed
   value of their key its place before the writer has had its chance to settle them. Records of
   aborted transactions never enter the map;
2. rewrite each closed segment keeping only records that are the latest for their key (a batch
   whose records all survive is copied byte for byte; one that loses some is rebuilt with the same
   base offset and offset deltas; one that loses all is dropped). Tombstones that are the latest
   for their key survive until `delete.retention.ms` past their timestamp. Batches of aborted
   transactions go whole, whatever their keys. A transaction marker stays while any batch of its
   transaction is still in the log; once none is, the marker gets a delete horizon (KIP-534: the
   batch's base timestamp becomes now + `delete.retention.ms`, attribute bit 0x40) and a later pass
   past the horizon removes it, so a consumer that read the transaction's data also reads its
   marker (Kafka's LogCleaner rules). Consecutive cleaned segments merge while they fit in
   `segment.bytes`;
3. swap: the new files are written as `*.cleaned`, listed in `cleaner-swap.json`, then renamed over
   the first segment of each group while the others are deleted. A crash mid-swap is rolled
   forward on the next start (see `recover_swap`).

Steps 1-2 run in a worker thread (they only read immutable closed segments); the swap runs on the
event loop between requests.
A pass runs every `log.cleaner.backoff.ms` for partitions whose dirty ratio (bytes of closed
segments not cleaned yet / bytes of all closed segments) is at least `min.cleanable.dirty.ratio`,
and at once, for every compacted partition, when `request_clean` drops `DIR/clean-request`.
"""
from __future__ import annotations

import asyncio
import logging
import os
import struct
import time

from statekit.wire.compression import compress
from statekit.wire.records import decode_rows, encode_headers, encode_record
from statekit.wire.varint import read_varint

from . import records as R
from .log import SWAP_FILE, Segment, recover_swap, seg_name, write_json_atomic  # noqa: F401
# (SWAP_FILE and recover_swap live with the log, which opens before any cleaner runs)

log = logging.getLogger("statekit.broker.cleaner")

class LogCleaner:
    def __init__(self, broker):
        self.broker = broker
        self.done_token: str | None = None
        self._wake = asyncio.Event()
        self.request_path = os.path.join(broker.dir, "clean-request")
        self._closing = False

    def wake(self) -> None:
        self._wake.set()

    async def close(self) -> None:
        self._closing = True
        self._wake.set()

    def _read_request(self) -> str | None:
        try:
            with open(self.request_path) as f:
                return f.read().strip() or "request"
        except FileNotFoundError:
            return None

    async def run(self) -> None:
        cfg = self.broker.config
        backoff = cfg.get("log.cleaner.backoff.ms") / 1000.0
        enabled = cfg.get("log.cleaner.enable")
        last = time.monotonic()
        while not self._closing:
            token = self._read_request()
            due = enabled and (time.monotonic() - last >= backoff or self._wake.is_set())
            self._wake.clear()
            if token is not None or due:
                try:
                    await self.clean_pass(forced=token is not None)
                except asyncio.CancelledError:
                    raise
                except Exception:  # noqa: BLE001 - one bad pass must not stop the cleaner
                    log.exception("log cleaner pass failed")
                last = time.monotonic()
                if token is not None:
                    self.done_token = token
                    try:
                        if self._read_request() == token:
                            os.unlink(self.request_path)
                    except FileNotFoundError:
                        pass
                self.broker._write_stats()
            # until the next pass is due, a wake() or a request (request_clean signals SIGUSR1,
            # which wakes this; a request it could not signal is read at the next pass): an
            # idle broker wakes once per backoff (or its idle pace), not twenty times a second;
            # a write to an idle broker wakes this at once
            pace = self.broker.duties.pace(backoff)
            left = pace - (time.monotonic() - last) if enabled else pace
            try:
                await asyncio.wait_for(self._wake.wait(), timeout=max(0.01, left))
            except asyncio.TimeoutError:
                pass

    async def clean_pass(self, forced: bool) -> None:
        for plog in list(self.broker.topics.all_partitions()):
            if plog.deleted or not plog.config.compact or len(plog.segments) < 2:
                continue
            closed = plog.segments[:-1]
            clean_offset = plog.cleaner_state.get("clean_offset", 0)
            total = sum(s.size for s in closed)
            dirty = sum(s.size for s in closed if s.base >= clean_offset)
            if not forced:
                if not total or not dirty or dirty / total < plog.config.get("min.cleanable.dirty.ratio"):
                    continue
            await self.clean_partition(plog)

    async def clean_partition(self, plog) -> None:
        job = clean_job(plog, int(time.time() * 1000))
        if job is None:
            return
        closed = plog.segments[:len(job["closed"])]
        upper = job["upper"]
        result = await asyncio.to_thread(build_cleaned, job)
        # the world may have moved while the thread ran: only swap what is still there
        if plog.deleted or plog.segments[:len(closed)] != closed or any(s.size != sz for s, (_, _, sz) in zip(closed, job["closed"])):
            for g in result["groups"]:
                _unlink(os.path.join(plog.dir, g["tmp"]))
            return
        self._swap(plog, closed, result)
        st = plog.cleaner_state
        st["clean_offset"] = upper
        st["cleaner_runs"] = st.get("cleaner_runs", 0) + 1
        st["records_removed"] = st.get("records_removed", 0) + result["removed"]
        st["last_cleaned_at"] = time.time()
        plog.save_cleaner_state()
        log.info("cleaned %s-%d: %d records removed, %d segments -> %d", plog.topic, plog.partition,
                 result["removed"], len(closed), len(result["groups"]) + result["untouched"])

    def _swap(self, plog, closed, result) -> None:
        groups = result["groups"]
        if not groups:
            return
        write_json_atomic(os.path.join(plog.dir, SWAP_FILE), {"groups": groups})
        by_base = {s.base: s for s in closed}
        replaced = {}
        for g in groups:
            first = by_base[g["first"]]
            first.close()
            os.replace(os.path.join(plog.dir, g["tmp"]), first.log_path)
            _unlink(first.index_path)
            for b in g["others"]:
                by_base[b].delete_files()
            seg = Segment(plog.dir, g["first"])
            seg.open(recover=False, index_interval=plog.config.get("index.interval.bytes"))
            seg.close_index()
            seg.txn_events = []
            replaced[g["first"]] = seg
            for b in g["others"]:
                replaced[b] = None
        os.unlink(os.path.join(plog.dir, SWAP_FILE))
        new = []
        for s in plog.segments:
            if s.base in replaced and s is not plog.active:
                if replaced[s.base] is not None:
                    new.append(replaced[s.base])
            else:
                new.append(s)
        plog.segments = new


def cleanable_segments(plog, now_ms: int) -> list:
    """The closed segments before the first uncleanable offset (Kafka's rule): the active segment
    is never cleanable, nor is a segment holding a record younger than ``min.compaction.lag.ms`` or
    an offset at or past the last stable offset, nor anything after such a segment."""
    lag = plog.config.get("min.compaction.lag.ms")
    lso = plog.last_stable_offset
    out = []
    for seg in plog.segments[:-1]:
        if lag > 0 and seg.max_timestamp >= 0 and now_ms - seg.max_timestamp < lag:
            break
        if seg.size and seg.next_offset > lso:
            break
        out.append(seg)
    return out


def clean_job(plog, now_ms: int) -> dict | None:
    """What a pass over ``plog`` works on (plain data, for the worker thread); None: nothing is
    cleanable yet."""
    closed = cleanable_segments(plog, now_ms)
    if not closed:
        return None
    return {
        "dir": plog.dir,
        "closed": [(s.base, s.log_path, s.size) for s in closed],
        "upper": plog.segments[len(closed)].base,  # the first uncleanable offset
        "clean_offset": plog.cleaner_state.get("clean_offset", 0),
        "log_start": plog.log_start_offset,
        "segment_bytes": plog.config.get("segment.bytes"),
        "delete_retention_ms": plog.config.get("delete.retention.ms"),
        "now_ms": now_ms,
        "aborted": [a for a in plog.aborted if a[1] < plog.segments[len(closed)].base],
    }


def _is_dirty(job, base: int) -> bool:
    """A cleanable segment holding any offset at or past the clean offset."""
    bases = [b for b, _, _ in job["closed"]]
    i = bases.index(base)
    end = bases[i + 1] if i + 1 < len(bases) else job["upper"]
    return end > job["clean_offset"]


def _unlink(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _iter_file_batches(path: str, size: int):
    with open(path, "rb") as f:
        data = f.read(size)
    for pos, h in R.scan(data, 0, len(data)):
        yield h, memoryview(data)[pos:pos + h.size]


class Parsed:
    """The records of one batch as parallel lists: what compaction needs, nothing more.

    For an uncompressed batch `ends[i]` is where record i's bytes end in the batch (record i
    starts where i-1 ends): kept records are copied as they are, since a rebuilt batch keeps
    the base offset and first timestamp their deltas are relative to. A compressed batch is
    decoded by `statekit.wire` and `rows` holds its records (offset, timestamp, key, value,
    headers) for re-encoding.
    """

    __slots__ = ("offsets", "keys", "tombs", "ends", "rows")

    def __init__(self, offsets, keys, tombs, ends=None, rows=None):
        self.offsets, self.keys, self.tombs, self.ends, self.rows = offsets, keys, tombs, ends, rows


def _parse(h, raw) -> Parsed:
    if h.attributes & R.ATTR_COMPRESSION_MASK == 0:
        return _parse_uncompressed(raw, h.count, h.base_offset)
    rows: list = []
    decode_rows(raw, rows)  # CodecUnavailable for a codec we lack: the batch is left alone
    return Parsed([r[0] for r in rows], [r[2] for r in rows], [r[3] is None for r in rows], rows=rows)


def _parse_uncompressed(buf, count: int, base: int) -> Parsed:
    """Record lengths, offset deltas, keys and whether the value is null; one-byte varints inline
    (this loop is the cleaner's cost: about 3x faster than decoding full records)."""
    offs, keys, tombs, ends = [], [], [], []
    add_o, add_k, add_t, add_e = offs.append, keys.append, tombs.append, ends.append
    end_all = len(buf)
    varint = read_varint
    p = R.HEADER_SIZE
    for _ in range(count):
        b0 = buf[p]
        if b0 < 0x80:
            length = (b0 >> 1) ^ -(b0 & 1)
            p += 1
        else:
            length, p = varint(buf, p)
        end = p + length
        if length <= 0 or end > end_all:
            raise ValueError("bad record length")
        q = p + 1  # attributes
        while buf[q] >= 0x80:  # timestamp delta (a varlong): skipped, read again for tombstones
            q += 1
        q += 1
        b0 = buf[q]
        if b0 < 0x80:
            od = (b0 >> 1) ^ -(b0 & 1)
            q += 1
        else:
            od, q = varint(buf, q)
        b0 = buf[q]
        if b0 < 0x80:
            klen = (b0 >> 1) ^ -(b0 & 1)
            q += 1
        else:
            klen, q = varint(buf, q)
        if klen >= 0:
            add_k(bytes(buf[q:q + klen]))
            q += klen
        else:
            add_k(None)
        add_t(buf[q] == 1)  # value length -1 is the one-byte zigzag varint 0x01
        add_o(base + od)
        add_e(end)
        p = end
    return Parsed(offs, keys, tombs, ends=ends)


def _timestamp(h, raw, parsed: Parsed, i: int) -> int:
    if h.attributes & R.ATTR_TIMESTAMP_TYPE:
        return h.max_timestamp
    if parsed.rows is not None:
        return parsed.rows[i][1]
    start = parsed.ends[i - 1] if i else R.HEADER_SIZE
    _, p = read_varint(raw, start)
    delta, _ = read_varint(raw, p + 1)
    return h.first_timestamp + delta


CACHE_BYTES = 256 << 20  # parsed dirty segments kept between the two passes, at most


class _Aborted:
    """Is a transactional batch part of an aborted transaction? (producer id -> sorted
    (first offset, marker offset) of its aborted transactions)"""

    def __init__(self, aborted):
        self.by_pid: dict[int, list] = {}
        for pid, first, last in aborted:
            self.by_pid.setdefault(pid, []).append((first, last))
        for v in self.by_pid.values():
            v.sort()

    def __call__(self, h) -> bool:
        if not h.attributes & R.ATTR_TRANSACTIONAL or h.attributes & R.ATTR_CONTROL:
            return False
        spans = self.by_pid.get(h.producer_id)
        if not spans:
            return False
        import bisect

        i = bisect.bisect_right(spans, (h.base_offset, 1 << 62)) - 1
        return i >= 0 and spans[i][0] <= h.base_offset < spans[i][1]


def _with_horizon(raw, horizon_ms: int) -> bytes:
    """A marker batch carrying its delete horizon (KIP-534) in the base timestamp."""
    out = bytearray(raw)
    h = R.header_at(out, 0)
    struct.pack_into(">h", out, R.ATTRIBUTES_OFFSET, h.attributes | R.ATTR_DELETE_HORIZON)
    struct.pack_into(">q", out, 27, horizon_ms)
    R.recompute_crc(out)
    return bytes(out)


def build_cleaned(job: dict) -> dict:
    """Runs in a worker thread: writes `<base>.log.cleaned` files, returns the swap plan."""
    # pass 1: key -> latest offset over the dirty part of the cleanable range. The clean part
    # already holds one record per key, and each of them loses to any newer one in the map.
    latest: dict = {}
    clean_offset = job["clean_offset"]
    is_aborted = _Aborted(job.get("aborted", ()))
    cache: dict[int, list] = {}
    cached = 0
    dirty = [(b, p, sz) for b, p, sz in job["closed"] if _is_dirty(job, b)]
    for base, path, size in dirty:
        keep_it = cached + size <= CACHE_BYTES
        entries = []
        for h, raw in _iter_file_batches(path, size):
            if h.attributes & R.ATTR_CONTROL or is_aborted(h):
                entries.append((h, raw, None))
                continue
            try:
                parsed = _parse(h, raw)
            except Exception:  # noqa: BLE001 - e.g. a codec we lack: leave the batch alone
                entries.append((h, raw, None))
                continue
            if h.last_offset >= clean_offset:
                latest.update(zip(parsed.keys, parsed.offsets))
            entries.append((h, raw, parsed))
        if keep_it:
            cache[base] = entries
            cached += size
    latest.pop(None, None)
    now = job["now_ms"]
    horizon = now - job["delete_retention_ms"]
    log_start = job["log_start"]
    removed = 0
    groups = []
    cur = None  # the output group being filled
    in_txn: dict[int, bool] = {}  # producer id -> a batch of its current transaction is still here
    for base, path, size in job["closed"]:
        entries = cache.pop(base, None)
        if entries is None:
            entries = []
            for h, raw in _iter_file_batches(path, size):
                try:
                    parsed = None if h.attributes & R.ATTR_CONTROL or is_aborted(h) else _parse(h, raw)
                except Exception:  # noqa: BLE001
                    parsed = None
                entries.append((h, raw, parsed))
        out_chunks = []
        changed = False
        last = len(entries) - 1
        for bi, (h, raw, parsed) in enumerate(entries):
            if h.attributes & R.ATTR_CONTROL:
                # a marker stays while its transaction has batches in the log (read in this pass)
                if in_txn.pop(h.producer_id, False) or h.count == 0 and bi == last:
                    out_chunks.append(bytes(raw))
                elif not h.attributes & R.ATTR_DELETE_HORIZON:
                    out_chunks.append(_with_horizon(raw, now + job["delete_retention_ms"]))
                    changed = True
                elif h.first_timestamp > now:
                    out_chunks.append(bytes(raw))
                else:
                    changed = True
                    removed += h.count
                    if bi == last:  # keep the offset span reaching the next segment
                        out_chunks.append(_rebuild_empty(h, raw))
                continue
            if h.attributes & R.ATTR_TRANSACTIONAL and h.count > 0:
                in_txn[h.producer_id] = True
            if is_aborted(h):
                changed = True
                removed += h.count
                if bi == last:
                    out_chunks.append(_rebuild_empty(h, raw))
                continue
            if parsed is None:
                out_chunks.append(bytes(raw))
                continue
            keep = []
            get = latest.get
            for i, (off, key, tomb) in enumerate(zip(parsed.offsets, parsed.keys, parsed.tombs)):
                if off < log_start or key is None:
                    keep.append(i)  # below the log start DeleteRecords/retention decide
                elif get(key, off) != off:
                    continue
                elif tomb and _timestamp(h, raw, parsed, i) < horizon:
                    continue  # an expired tombstone
                else:
                    keep.append(i)
            n = len(parsed.offsets)
            removed += n - len(keep)
            if len(keep) == n:
                out_chunks.append(bytes(raw))
                continue
            changed = True
            if not keep and bi != last:
                continue
            # a segment's last batch stays, even empty, so that its last offset still reaches the
            # next segment: consumers move past removed records with the batch's last offset
            out_chunks.append(_rebuild(h, raw, parsed, keep))
        new_size = sum(len(c) for c in out_chunks)
        if cur is not None and cur["size"] + new_size <= job["segment_bytes"]:
            cur["others"].append(base)
            cur["size"] += new_size
            _group_write(cur, job, out_chunks)
            continue
        if cur is not None:
            _finish_group(cur, groups)
        cur = {"tmp": seg_name(base, ".log.cleaned"), "first": base, "others": [], "size": new_size,
               "file": None, "buffered": out_chunks}
        if changed:
            _group_write(cur, job, [])
    if cur is not None:
        _finish_group(cur, groups)
    untouched = len(job["closed"]) - sum(1 + len(g["others"]) for g in groups)
    return {"groups": groups, "removed": removed, "untouched": untouched}


def _group_write(cur, job, chunks) -> None:
    """Groups are written only once they differ from their source (changed or merged)."""
    if cur["file"] is None:
        cur["file"] = open(os.path.join(job["dir"], cur["tmp"]), "wb")
        cur["file"].write(b"".join(cur.pop("buffered")))
    if chunks:
        cur["file"].write(b"".join(chunks))


def _rebuild(h, raw, parsed: Parsed, keep: list[int]) -> bytes:
    """A batch of the kept records with the original base offset, offset span, timestamps,
    attributes and producer fields."""
    if parsed.ends is not None:
        ends = parsed.ends
        out = bytearray(raw[:R.HEADER_SIZE])
        for i in keep:
            out += raw[ends[i - 1] if i else R.HEADER_SIZE:ends[i]]
        struct.pack_into(">i", out, 8, len(out) - R.LOG_OVERHEAD)
        struct.pack_into(">i", out, 57, len(keep))
    else:
        # a compressed batch: the kept records encoded again, offset and timestamp deltas as
        # they were, compressed with the batch's codec (its library was there to decompress it)
        body = b"".join(
            encode_record(off - h.base_offset, key, value, encode_headers(list(hdrs)),
                          ts - h.first_timestamp)
            for off, ts, key, value, hdrs in (parsed.rows[i] for i in keep))
        codec = h.attributes & R.ATTR_COMPRESSION_MASK
        out = bytearray(raw[:R.HEADER_SIZE]) + compress(codec, body)
        struct.pack_into(">i", out, 8, len(out) - R.LOG_OVERHEAD)
        struct.pack_into(">i", out, 57, len(keep))
    R.recompute_crc(out)
    return bytes(out)


def _rebuild_empty(h, raw) -> bytes:
    """The batch with no records left: same base offset and offset span (readers move past it)."""
    if h.count == 0:
        return bytes(raw)
    out = bytearray(raw[:R.HEADER_SIZE])
    struct.pack_into(">i", out, 8, len(out) - R.LOG_OVERHEAD)
    struct.pack_into(">h", out, R.ATTRIBUTES_OFFSET, h.attributes & ~R.ATTR_COMPRESSION_MASK)
    struct.pack_into(">i", out, 57, 0)
    R.recompute_crc(out)
    return bytes(out)


def _finish_group(cur, groups) -> None:
    f = cur.pop("file")
    if f is None:
        return  # unchanged and alone: the segment stays as it is
    f.flush()
    os.fsync(f.fileno())
    f.close()
    groups.append({"tmp": cur["tmp"], "first": cur["first"], "others": cur["others"]})
