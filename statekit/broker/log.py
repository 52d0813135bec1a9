"""The partition log: segment files of producer batches, a sparse offset index, recovery.

Durability: a batch is handed to the OS with write() before its produce request is acknowledged,
so it survives a crash of the broker *process* (`kill -9`): the page cache belongs to the kernel.
A background flush fsyncs dirty segments every `log.flush.interval.ms` and on stop, which covers
most of an OS crash or power loss, as with Kafka's default (it relies on replication, not fsync).

Files, one directory per partition (`<dir>/logs/<topic>-<partition>/`):
- `<base offset:020d>.log`: record batches exactly as produced, base offset rewritten;
- `<base offset:020d>.index`: 8-byte entries (offset - base: int32, file position: int32), one every
  `index.interval.bytes` of log, used by Fetch to skip to the right place;
- `log-start-offset`: the log start set by DeleteRecords (above the first segment's base);
- `cleaner.json`: the cleaner's checkpoint and counters.

The transaction state of a partition (each producer's open transaction, the aborted ones, hence the
last stable offset) has no file: it is rebuilt from the batch headers, which `Segment.open` reads
anyway, when the log opens. Closed segments keep one open file (the log); only the active one keeps
its index file open for appends.
"""
from __future__ import annotations

import bisect
import json
import logging
import mmap
import os
import struct
import time
from array import array
from collections import deque

from statekit.wire.records import decode_rows

from . import records as R

log = logging.getLogger("statekit.broker")

INDEX_ENTRY = struct.Struct(">ii")
_BASE_LEN_LOD = struct.Struct(">qi")


def _now_ms() -> int:
    return int(time.time() * 1000)


def seg_name(base: int, suffix: str) -> str:
    return f"{base:020d}{suffix}"


def write_json_atomic(path: str, obj, durable: bool = True) -> None:
    """Readers never see a half-written file (temp + rename); durable adds an fsync of the file
    and of its directory (so the rename itself survives a power loss). Raises OSError and leaves
    the old file in place when anything fails."""
    tmp = path + ".tmp"
    try:
        with open(tmp, "w") as f:
            json.dump(obj, f, indent=1, sort_keys=True)
            f.flush()
            if durable:
                os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    if durable:
        fsync_dir(os.path.dirname(path) or ".")


SWAP_FILE = "cleaner-swap.json"


def recover_swap(directory: str) -> None:
    """Finish a cleaner swap (see cleaner.py) interrupted by a crash: called before a
    partition's segments are loaded, so it lives with the log the cleaner imports."""
    path = os.path.join(directory, SWAP_FILE)
    try:
        with open(path) as f:
            plan = json.load(f)
    except FileNotFoundError:
        return
    except ValueError:
        # the plan is written atomically: unreadable means it never completed; nothing was swapped
        os.unlink(path)
        return
    for g in plan.get("groups", []):
        tmp = os.path.join(directory, g["tmp"])
        first = os.path.join(directory, seg_name(g["first"], ".log"))
        if os.path.exists(tmp):
            os.replace(tmp, first)
        for suffix_base in [g["first"]] + list(g["others"]):
            idx = os.path.join(directory, seg_name(suffix_base, ".index"))
            if os.path.exists(idx):
                os.unlink(idx)
        for b in g["others"]:
            p = os.path.join(directory, seg_name(b, ".log"))
            if os.path.exists(p):
                os.unlink(p)
    os.unlink(path)
    log.warning("%s: finished a cleaner swap interrupted by a crash", directory)


def fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


class Segment:
    """One log file plus its sparse index; only the last segment of a log is appended to."""

    def __init__(self, directory: str, base: int):
        self.dir = directory
        self.base = base
        self.log_path = os.path.join(directory, seg_name(base, ".log"))
        self.index_path = os.path.join(directory, seg_name(base, ".index"))
        self.fd = -1
        self.index_fd = -1
        self.size = 0
        self.next_offset = base  # last offset + 1 of the last batch in this file
        self.records = 0
        self.batches = 0
        self.max_timestamp = -1
        self.created_ms = _now_ms()
        self.idx_off = array("q")  # absolute offsets
        self.idx_pos = array("q")
        self.last_index_pos = -1
        self.dirty = False
        self.txn_events: list = []  # filled by open(): see PartitionLog._replay_transactions

    # -- opening, recovery -------------------------------------------------------------------
    def open(self, recover: bool, index_interval: int = 4096) -> int | None:
        """Open, scan every batch header, rebuild the index if it disagrees with the log.

        Returns the byte position where the log was found torn (and truncated), or None.
        """
        self.fd = os.open(self.log_path, os.O_RDWR | os.O_CREAT, 0o644)
        size = os.fstat(self.fd).st_size
        torn_at = None
        idx_off, idx_pos = array("q"), array("q")
        last_idx = -1
        records = batches = 0
        max_ts = -1
        next_offset = self.base
        first_ts = None
        interval = max(index_interval, 1)
        # CRC checks: every batch after the last index entry of the stored index (the only ones
        # that may be torn by a crash), or all batches when the index is unusable.
        stored = self._read_index_file(size)
        crc_from = stored[1][-1] if stored and len(stored[1]) else 0
        events = []
        if size:
            with mmap.mmap(self.fd, size, access=mmap.ACCESS_READ) as mm:
                pos = 0
                try:
                    for pos, h in R.scan(mm, 0, size):
                        if recover and pos >= crc_from:
                            body = memoryview(mm)[pos + R.ATTRIBUTES_OFFSET:pos + h.size]
                            ok = R.crc32c(body) == h.crc
                            body.release()
                            if not ok:
                                raise R._invalid(pos, "CRC mismatch")
                        if h.base_offset < next_offset:
                            raise R._invalid(pos, "offsets go backwards")
                        if last_idx < 0 or pos - last_idx >= interval:
                            idx_off.append(h.base_offset)
                            idx_pos.append(pos)
                            last_idx = pos
                        records += h.count
                        batches += 1
                        if h.max_timestamp > max_ts:
                            max_ts = h.max_timestamp
                        if first_ts is None:
                            first_ts = h.first_timestamp
                        if h.attributes & R.ATTR_TRANSACTIONAL and h.producer_id >= 0:
                            if h.attributes & R.ATTR_CONTROL:
                                events.append((h.base_offset, h.producer_id, h.producer_epoch,
                                               R.control_type(mm, pos, h)))
                            elif h.count > 0:
                                events.append((h.base_offset, h.producer_id, h.producer_epoch, DATA))
                        next_offset = h.last_offset + 1
                        pos += h.size
                except R.InvalidBatch as e:
                    pos = e.position
                    log.warning("%s: invalid batch at byte %d (%s); truncating", self.log_path, pos, e)
                if pos != size:
                    torn_at = pos
        if torn_at is not None:
            os.ftruncate(self.fd, torn_at)
            size = torn_at
            events = [e for e in events if e[0] < next_offset]
        self.txn_events = events
        self.size = size
        self.records, self.batches, self.max_timestamp = records, batches, max_ts
        self.next_offset = next_offset
        self.idx_off, self.idx_pos, self.last_index_pos = idx_off, idx_pos, last_idx
        try:
            self.created_ms = int(os.stat(self.log_path).st_mtime * 1000) if size else _now_ms()
        except OSError:
            pass
        if first_ts is not None and first_ts > 0:
            self.created_ms = min(self.created_ms, first_ts)
        if stored is None or list(stored[0]) != list(idx_off) or list(stored[1]) != list(idx_pos):
            if stored is not None:
                log.info("%s: offset index rebuilt", self.index_path)
            self._write_index()
        self.index_fd = os.open(self.index_path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        return torn_at

    def _read_index_file(self, log_size: int):
        try:
            with open(self.index_path, "rb") as f:
                data = f.read()
        except FileNotFoundError:
            return None
        if len(data) % INDEX_ENTRY.size:
            return None
        offs, poss = array("q"), array("q")
        prev_o = prev_p = -1
        for o, p in INDEX_ENTRY.iter_unpack(data):
            o += self.base
            if o <= prev_o or p <= prev_p or p >= log_size:
                return None
            offs.append(o)
            poss.append(p)
            prev_o, prev_p = o, p
        return offs, poss

    def _write_index(self) -> None:
        tmp = self.index_path + ".tmp"
        with open(tmp, "wb") as f:
            f.write(b"".join(INDEX_ENTRY.pack(o - self.base, p) for o, p in zip(self.idx_off, self.idx_pos)))
        os.replace(tmp, self.index_path)

    # -- appending ---------------------------------------------------------------------------
    def append(self, data, first: R.BatchHeader, last_offset: int, count: int, batches: int,
               max_ts: int, index_interval: int) -> None:
        pos = self.size
        view = memoryview(data)
        n = 0
        while n < len(view):  # at our own idea of the end: a torn tail was truncated at open
            n += os.pwrite(self.fd, view[n:], pos + n)
        if self.last_index_pos < 0 or pos - self.last_index_pos >= index_interval:
            self.idx_off.append(first.base_offset)
            self.idx_pos.append(pos)
            self.last_index_pos = pos
            os.write(self.index_fd, INDEX_ENTRY.pack(first.base_offset - self.base, pos))
        if self.size == 0:
            self.created_ms = _now_ms()
        self.size += len(view)
        self.next_offset = last_offset + 1
        self.records += count
        self.batches += batches
        if max_ts > self.max_timestamp:
            self.max_timestamp = max_ts
        self.dirty = True

    # -- reading -----------------------------------------------------------------------------
    def position_for(self, offset: int) -> int:
        """Byte position of the first batch whose last offset is >= offset (or self.size)."""
        i = bisect.bisect_right(self.idx_off, offset) - 1
        pos = self.idx_pos[i] if i >= 0 else 0
        fd, size = self.fd, self.size
        while pos < size:
            hdr = os.pread(fd, 27, pos)
            if len(hdr) < 27:
                break
            base, length = _BASE_LEN_LOD.unpack_from(hdr, 0)
            (lod,) = struct.unpack_from(">i", hdr, 23)
            if base + lod >= offset:
                return pos
            pos += length + R.LOG_OVERHEAD
        return size

    def read(self, pos: int, max_bytes: int, min_one: bool) -> bytes:
        """Whole batches from pos, at most max_bytes unless min_one and the first batch is larger."""
        if pos >= self.size or max_bytes <= 0 and not min_one:
            return b""
        want = min(max(max_bytes, 0), self.size - pos)
        data = os.pread(self.fd, want, pos) if want else b""
        end = 0
        n = len(data)
        while end + R.LOG_OVERHEAD <= n:
            (length,) = struct.unpack_from(">i", data, end + 8)
            if end + R.LOG_OVERHEAD + length > n:
                break
            end += R.LOG_OVERHEAD + length
        if end == 0:
            if not min_one:
                return b""
            hdr = os.pread(self.fd, R.LOG_OVERHEAD, pos)
            (length,) = struct.unpack_from(">i", hdr, 8)
            return os.pread(self.fd, length + R.LOG_OVERHEAD, pos)
        return data[:end] if end < n else data

    def batches_from(self, pos: int = 0, end: int | None = None):
        """(position, header) of every batch from pos (reads headers only)."""
        end = self.size if end is None else end
        while pos + R.HEADER_SIZE <= end:
            h = R.header_at(os.pread(self.fd, R.HEADER_SIZE, pos), 0)
            yield pos, h
            pos += h.size

    def flush(self) -> None:
        if self.dirty:
            self.dirty = False
            os.fsync(self.fd)
            if self.index_fd >= 0:
                os.fsync(self.index_fd)

    def close_index(self) -> None:
        """A closed segment is never appended to: its index lives in memory, its file needs no fd."""
        if self.index_fd >= 0:
            try:
                os.close(self.index_fd)
            except OSError:
                pass
            self.index_fd = -1

    @property
    def open_fds(self) -> int:
        return (self.fd >= 0) + (self.index_fd >= 0)

    def close(self) -> None:
        for fd in (self.fd, self.index_fd):
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
        self.fd = self.index_fd = -1

    def delete_files(self) -> None:
        self.close()
        for p in (self.log_path, self.index_path):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass


class ProducerState:
    """Last few batches of one idempotent producer on one partition, for duplicate detection."""

    __slots__ = ("epoch", "batches")

    def __init__(self, epoch: int):
        self.epoch = epoch
        self.batches = deque(maxlen=5)  # (first_seq, last_seq, base_offset, last_offset)

    @property
    def last_seq(self) -> int:
        return self.batches[-1][1] if self.batches else -1


class ProduceError(Exception):
    def __init__(self, code: int, message: str = ""):
        super().__init__(message)
        self.code = code


# Kafka error codes used by the log
CORRUPT_MESSAGE = 2
MESSAGE_TOO_LARGE = 10
INVALID_PRODUCER_EPOCH = 47
INVALID_TXN_STATE = 48
OUT_OF_ORDER_SEQUENCE_NUMBER = 45
DUPLICATE_SEQUENCE_NUMBER = 46

DATA = -1  # a transactional data batch in Segment.txn_events (control batches carry their type)


class PartitionLog:
    def __init__(self, directory: str, topic: str, partition: int, config):
        self.dir = directory
        self.topic = topic
        self.partition = partition
        self.config = config  # TopicConfig, shared with the topic
        self.segments: list[Segment] = []
        self.log_start_offset = 0
        self.producers: dict[int, ProducerState] = {}
        # transactions (Kafka's ProducerStateManager and transaction index, in memory; rebuilt
        # from the batch headers when the log opens)
        self.ongoing: dict[int, int] = {}  # producer id -> first offset of its open transaction
        self.aborted: list[tuple[int, int, int]] = []  # (producer id, first offset, marker offset)
        self.cleaner_state = {"clean_offset": 0, "cleaner_runs": 0, "records_removed": 0,
                              "last_cleaned_at": None}
        self.deleted = False

    # -- lifecycle ---------------------------------------------------------------------------
    def open(self) -> None:
        os.makedirs(self.dir, exist_ok=True)
        recover_swap(self.dir)
        for name in os.listdir(self.dir):
            if name.endswith((".cleaned", ".tmp", ".swap")):
                os.unlink(os.path.join(self.dir, name))
        bases = sorted(int(n[:-4]) for n in os.listdir(self.dir) if n.endswith(".log") and n[:-4].isdigit())
        # a leftover index without its log is useless
        for n in os.listdir(self.dir):
            if n.endswith(".index") and n[:-6].isdigit() and int(n[:-6]) not in bases:
                os.unlink(os.path.join(self.dir, n))
        interval = self.config.get("index.interval.bytes")
        segs: list[Segment] = []
        truncated = False
        events: list = []
        for base in bases:
            seg = Segment(self.dir, base)
            if truncated or (segs and base < segs[-1].next_offset and segs[-1].size):
                # after a torn segment (all later data is suspect), or a leftover of a merge by
                # the cleaner (its records are already in the previous file)
                seg.delete_files()
                log.warning("%s: removed segment %d (%s)", self.dir, base,
                            "after a torn batch" if truncated else "overlaps the previous one")
                continue
            torn = seg.open(recover=True, index_interval=interval)
            segs.append(seg)
            events.extend(seg.txn_events)
            seg.txn_events = []
            if torn is not None and base != bases[-1]:
                truncated = True
        for seg in segs[:-1]:
            seg.close_index()
        self.segments = segs
        try:
            with open(os.path.join(self.dir, "log-start-offset")) as f:
                self.log_start_offset = int(f.read().strip() or 0)
        except (FileNotFoundError, ValueError):
            self.log_start_offset = 0
        try:
            with open(os.path.join(self.dir, "cleaner.json")) as f:
                self.cleaner_state.update(json.load(f))
        except (FileNotFoundError, ValueError):
            pass
        if not self.segments:
            self.segments.append(self._new_segment(self.log_start_offset))
        self.log_start_offset = max(self.log_start_offset, self.segments[0].base)
        if self.log_start_offset > self.log_end_offset:
            self.log_start_offset = self.log_end_offset
        self._rebuild_producer_state()
        self._replay_transactions(events)

    def _replay_transactions(self, events) -> None:
        """Open transactions and the aborted ones, from the transactional batch headers in offset
        order (a data batch opens its producer's transaction, a marker closes it). An empty batch
        left by the cleaner never opens one: its records are gone."""
        ongoing, aborted = {}, []
        for offset, pid, epoch, kind in events:
            if kind == DATA:
                ongoing.setdefault(pid, offset)
                continue
            first = ongoing.pop(pid, None)
            if first is not None and kind == R.CONTROL_ABORT:
                aborted.append((pid, first, offset))
            st = self.producers.get(pid)
            if st is None or epoch > st.epoch:
                self.producers[pid] = ProducerState(epoch)
        self.ongoing, self.aborted = ongoing, aborted

    def _rebuild_producer_state(self) -> None:
        self.producers.clear()
        for seg in self.segments[-2:]:
            for _, h in seg.batches_from(0):
                if h.producer_id >= 0 and h.base_sequence >= 0:
                    st = self.producers.get(h.producer_id)
                    if st is None or h.producer_epoch > st.epoch:
                        st = self.producers[h.producer_id] = ProducerState(h.producer_epoch)
                    st.batches.append((h.base_sequence, h.last_sequence, h.base_offset, h.last_offset))

    def _new_segment(self, base: int) -> Segment:
        seg = Segment(self.dir, base)
        seg.open(recover=False)
        return seg

    def close(self) -> None:
        for seg in self.segments:
            try:
                seg.flush()
            except OSError:
                pass
            seg.close()

    def delete(self) -> None:
        self.deleted = True
        for seg in self.segments:
            seg.delete_files()
        self.segments = []
        for name in os.listdir(self.dir):
            os.unlink(os.path.join(self.dir, name))
        os.rmdir(self.dir)

    # -- offsets -----------------------------------------------------------------------------
    @property
    def active(self) -> Segment:
        return self.segments[-1]

    @property
    def log_end_offset(self) -> int:
        a = self.segments[-1]
        return a.next_offset if a.size else a.base

    @property
    def high_watermark(self) -> int:
        # single replica: everything written has been acknowledged (or will be, same event loop turn)
        return self.log_end_offset

    @property
    def last_stable_offset(self) -> int:
        """The first offset of the oldest open transaction, else the high watermark: a
        read_committed consumer reads below it, and the cleaner never passes it."""
        hw = self.log_end_offset
        if not self.ongoing:
            return hw
        return max(self.log_start_offset, min(min(self.ongoing.values()), hw))

    def aborted_between(self, start: int, upper: int) -> list[tuple[int, int]]:
        """(producer id, first offset) of the aborted transactions a fetch of [start, upper) may
        meet: their marker is at or after start and they began before upper."""
        i = bisect.bisect_left(self.aborted, start, key=lambda a: a[2])
        return [(pid, first) for pid, first, last in self.aborted[i:] if first < upper]

    @property
    def open_fds(self) -> int:
        return sum(s.open_fds for s in self.segments)

    @property
    def size_bytes(self) -> int:
        return sum(s.size for s in self.segments)

    @property
    def records(self) -> int:
        return sum(s.records for s in self.segments)

    # -- append ------------------------------------------------------------------------------
    def append(self, data: bytearray, batches: list[tuple[int, R.BatchHeader]], now_ms: int) -> tuple[int, int]:
        """Assign offsets to the batches in data (already validated) and write them.

        Returns (base offset of the first batch, log append time or -1). Raises ProduceError.
        """
        cfg = self.config
        max_bytes = cfg.get("max.message.bytes")
        for _, h in batches:
            if h.size > max_bytes:
                raise ProduceError(MESSAGE_TOO_LARGE, f"The record batch of {h.size} bytes is larger than "
                                   f"the maximum allowed size {max_bytes} (max.message.bytes)")
        # idempotence: a whole-request duplicate is acknowledged with its original offset
        first_h = batches[0][1]
        if first_h.producer_id >= 0 and first_h.base_sequence >= 0:
            dup = self._check_sequences(batches)
            if dup is not None:
                return dup, -1
        for _, h in batches:
            if h.producer_id in self.ongoing and not h.attributes & R.ATTR_TRANSACTIONAL:
                raise ProduceError(INVALID_TXN_STATE, f"producer {h.producer_id} wrote a non-transactional "
                                   f"batch while its transaction is open")
        log_append = cfg.get("message.timestamp.type") == "LogAppendTime"
        next_off = self.log_end_offset
        seg = self.active
        if seg.size and (seg.size + len(data) > cfg.get("segment.bytes")
                         or now_ms - seg.created_ms >= cfg.get("segment.ms")):
            seg = self.roll(next_off)
        base = next_off
        total = 0
        max_ts = -1
        for pos, h in batches:
            R.set_base_offset(data, pos, next_off)
            if log_append:
                R.set_log_append_time(data, pos, h, now_ms)
                ts = now_ms
            else:
                ts = h.max_timestamp
            if ts > max_ts:
                max_ts = ts
            next_off += h.last_offset_delta + 1
            total += h.count
        seg.append(data, batches[0][1]._replace(base_offset=base), next_off - 1, total, len(batches),
                   max_ts, cfg.get("index.interval.bytes"))
        off = base
        for _, h in batches:
            if h.producer_id >= 0 and h.base_sequence >= 0:
                st = self.producers.get(h.producer_id)
                if st is None or h.producer_epoch != st.epoch:
                    st = self.producers[h.producer_id] = ProducerState(h.producer_epoch)
                st.batches.append((h.base_sequence, h.last_sequence, off, off + h.last_offset_delta))
                if h.attributes & R.ATTR_TRANSACTIONAL:
                    self.ongoing.setdefault(h.producer_id, off)
            off += h.last_offset_delta + 1
        return base, (now_ms if log_append else -1)

    def append_marker(self, producer_id: int, producer_epoch: int, control_type: int,
                      coordinator_epoch: int, now_ms: int) -> int:
        """Write a commit or abort marker for the producer's transaction (from the transaction
        coordinator, never from a client); returns its offset. The marker's epoch fences older
        epochs of the producer on this partition."""
        data = R.control_batch(producer_id, producer_epoch, control_type, coordinator_epoch, now_ms)
        h = R.header_at(data, 0)
        offset = self.log_end_offset
        seg = self.active
        if seg.size and (seg.size + len(data) > self.config.get("segment.bytes")
                         or now_ms - seg.created_ms >= self.config.get("segment.ms")):
            seg = self.roll(offset)
        R.set_base_offset(data, 0, offset)
        seg.append(data, h._replace(base_offset=offset), offset, 1, 1, now_ms,
                   self.config.get("index.interval.bytes"))
        first = self.ongoing.pop(producer_id, None)
        if first is not None and control_type == R.CONTROL_ABORT:
            self.aborted.append((producer_id, first, offset))
        st = self.producers.get(producer_id)
        if st is None or producer_epoch > st.epoch:
            self.producers[producer_id] = ProducerState(producer_epoch)
        return offset

    def _check_sequences(self, batches) -> int | None:
        expected = {}
        for _, h in batches:
            pid, epoch, seq = h.producer_id, h.producer_epoch, h.base_sequence
            st = self.producers.get(pid)
            if st is None:
                continue  # unknown producer: accept any first sequence (its state may have expired)
            if epoch < st.epoch:
                raise ProduceError(INVALID_PRODUCER_EPOCH, f"producer {pid} epoch {epoch} < {st.epoch}")
            if epoch > st.epoch:
                if seq != 0:
                    raise ProduceError(OUT_OF_ORDER_SEQUENCE_NUMBER,
                                       f"new epoch {epoch} of producer {pid} must start at sequence 0")
                continue
            for first, last, base_off, _ in st.batches:
                if first == seq and last == h.last_sequence:
                    if len(batches) == 1:
                        return base_off
                    raise ProduceError(DUPLICATE_SEQUENCE_NUMBER, "duplicate batch inside a multi-batch request")
            want = expected.get(pid, (st.last_seq + 1) % (1 << 31))
            if seq != want:
                raise ProduceError(OUT_OF_ORDER_SEQUENCE_NUMBER,
                                   f"producer {pid}: expected sequence {want}, got {seq}")
            expected[pid] = (h.last_sequence + 1) % (1 << 31)
        return None

    def roll(self, base: int | None = None) -> Segment:
        base = self.log_end_offset if base is None else base
        if self.active.size == 0:
            return self.active
        old = self.active
        seg = self._new_segment(base)
        try:
            old.flush()
        except OSError:
            pass
        old.close_index()
        self.segments.append(seg)
        return seg

    # -- read --------------------------------------------------------------------------------
    def segment_index_for(self, offset: int) -> int:
        bases = [s.base for s in self.segments]
        return max(bisect.bisect_right(bases, offset) - 1, 0)

    def read(self, offset: int, max_bytes: int, min_one: bool, max_offset: int | None = None) -> bytes:
        """Batches from offset (the batch holding it first), up to max_bytes (KIP-74 min_one),
        none starting at or past max_offset (the last stable offset of a read_committed fetch)."""
        data = self._read(offset, max_bytes, min_one)
        if max_offset is not None and data:
            data = _cut_at(data, max_offset)
        return data

    def _read(self, offset: int, max_bytes: int, min_one: bool) -> bytes:
        if offset >= self.log_end_offset:
            return b""
        i = self.segment_index_for(offset)
        chunks = []
        left = max_bytes
        while i < len(self.segments) and (left > 0 or (min_one and not chunks)):
            seg = self.segments[i]
            pos = seg.position_for(offset) if not chunks else 0
            data = seg.read(pos, left, min_one and not chunks)
            if data:
                chunks.append(data)
                left -= len(data)
            if pos + len(data) < seg.size and (data or not (min_one and not chunks)):
                break  # the segment has more but the limit is reached
            i += 1
        if not chunks:
            return b""
        return chunks[0] if len(chunks) == 1 else b"".join(chunks)

    def offset_for_timestamp(self, ts: int) -> tuple[int, int] | None:
        """(offset, timestamp) of the first record with timestamp >= ts, or None."""
        for seg in self.segments:
            if seg.max_timestamp < ts:
                continue
            for pos, h in seg.batches_from(0):
                if h.max_timestamp < ts or h.last_offset < self.log_start_offset:
                    continue
                rows: list = []
                decode_rows(os.pread(seg.fd, h.size, pos), rows, self.log_start_offset, control=True)
                for offset, rts, _k, _v, _h in rows:
                    if rts >= ts:
                        return offset, rts
        return None

    def max_timestamp_offset(self) -> tuple[int, int] | None:
        best = None
        for seg in self.segments:
            for pos, h in seg.batches_from(0):
                if h.last_offset < self.log_start_offset:
                    continue
                if best is None or h.max_timestamp > best[0]:
                    best = (h.max_timestamp, seg, pos, h)
        if best is None:
            return None
        ts, seg, pos, h = best
        rows: list = []
        decode_rows(os.pread(seg.fd, h.size, pos), rows, control=True)
        for offset, rts, _k, _v, _h in rows:
            if rts == ts:
                return offset, ts
        return h.last_offset, ts

    # -- deletion ----------------------------------------------------------------------------
    def delete_records(self, offset: int) -> int:
        """Move the log start to offset (<= high watermark); drop whole segments below it."""
        if offset > self.log_start_offset:
            self.log_start_offset = offset
            path = os.path.join(self.dir, "log-start-offset")
            tmp = path + ".tmp"
            with open(tmp, "w") as f:
                f.write(str(offset))
            os.replace(tmp, path)
            self._drop_segments_below_start()
        return self.log_start_offset

    def _drop_segments_below_start(self) -> int:
        n = 0
        while len(self.segments) > 1 and self.segments[1].base <= self.log_start_offset:
            self.segments.pop(0).delete_files()
            n += 1
        if self.active.size == 0 and self.active.base < self.log_start_offset:
            # everything is deleted: restart the (empty) active segment at the log start
            self.active.delete_files()
            self.segments[-1] = self._new_segment(self.log_start_offset)
        return n

    def apply_retention(self, now_ms: int) -> int:
        """cleanup.policy=delete: drop whole closed segments too old or beyond retention.bytes."""
        cfg = self.config
        if not cfg.delete:
            return 0
        removed = 0
        retention_ms = cfg.get("retention.ms")
        retention_bytes = cfg.get("retention.bytes")
        while len(self.segments) > 1:
            seg = self.segments[0]
            expired = _past_retention(seg, now_ms, retention_ms)
            too_big = retention_bytes >= 0 and self.size_bytes - seg.size >= retention_bytes
            if not (expired or too_big):
                break
            self.segments.pop(0).delete_files()
            removed += 1
        if removed:
            new_start = self.segments[0].base
            if new_start > self.log_start_offset:
                self.log_start_offset = new_start
                path = os.path.join(self.dir, "log-start-offset")
                with open(path + ".tmp", "w") as f:
                    f.write(str(new_start))
                os.replace(path + ".tmp", path)
        return removed

    def maybe_roll_by_time(self, now_ms: int) -> None:
        """Kafka's rule: `segment.ms` rolls a segment when a record is appended (see `append`), never
        an idle one; an idle active segment is rolled only when retention would delete all of it
        (cleanup.policy includes delete, every record past `retention.ms`). A compacted log's newest
        records therefore stay out of the cleaner's reach until its writer appends again: in a
        statekit changelog they may be a crashed commit the reopening task must settle first."""
        if self.config.delete and _past_retention(self.active, now_ms, self.config.get("retention.ms")):
            self.roll()

    def flush(self) -> None:
        for seg in self.segments[-2:]:
            seg.flush()

    def save_cleaner_state(self) -> None:
        write_json_atomic(os.path.join(self.dir, "cleaner.json"), self.cleaner_state)

    def stats(self) -> dict:
        closed = self.segments[:-1]
        clean_offset = self.cleaner_state.get("clean_offset", 0)
        total = sum(s.size for s in closed)
        dirty = sum(s.size for s in closed if s.base >= clean_offset)
        return {
            "topic": self.topic,
            "partition": self.partition,
            "log_start_offset": self.log_start_offset,
            "high_watermark": self.high_watermark,
            "segments": len(self.segments),
            "bytes": self.size_bytes,
            "records": self.records,
            "dirty_ratio": round(dirty / total, 4) if total and self.config.compact else 0.0,
            "last_stable_offset": self.last_stable_offset,
            "open_transactions": len(self.ongoing),
            "cleaner_runs": self.cleaner_state.get("cleaner_runs", 0),
            "records_removed": self.cleaner_state.get("records_removed", 0),
            "last_cleaned_at": self.cleaner_state.get("last_cleaned_at"),
            "cleanup_policy": self.config.raw("cleanup.policy"),
        }


def _cut_at(data: bytes, max_offset: int) -> bytes:
    """The leading whole batches of data that start below max_offset."""
    pos, n = 0, len(data)
    while pos + R.LOG_OVERHEAD <= n:
        base, length = _BASE_LEN_LOD.unpack_from(data, pos)
        if base >= max_offset:
            return data[:pos]
        pos += R.LOG_OVERHEAD + length
    return data


def _past_retention(seg, now_ms: int, retention_ms: int) -> bool:
    """Every record of a non-empty ``seg`` is older than ``retention.ms`` (by its newest record
    timestamp, or by the segment's age when its records carry none)."""
    if retention_ms < 0 or not seg.size:
        return False
    newest = seg.max_timestamp if seg.max_timestamp >= 0 else seg.created_ms
    return now_ms - newest > retention_ms
