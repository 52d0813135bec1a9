"""Restore forecast: how long restoring a task would take *now*, before anything crashes.

A restore reads each of the task's changelog partitions from where its local state stands (a
checkpoint, a standby replica's position, or the log start when there is nothing) to the end, and
applies what it reads at a rate that depends on this machine and on the records. So:

* records a restore would read, per store: from scratch, every record the partition holds now —
  after compaction the live keys of the cleaned part plus the uncleaned tail. On the embedded
  broker that count is exact and free (the ``log_figures`` the caller gives, by default
  ``statekit.kafka.log_figures.log_figures_for``). From a position ``o``: the
  records in ``[o, end)`` (the lag), exact when nothing was compacted away, else counted from the
  record batch headers (``Kafka.count_records``) when the range is at most ``SCAN_MAX`` offsets;
  past that, and off the embedded broker, the offset span: an upper bound (``exact=False``);
* seconds = records / apply rate, where the rate is the one given, else the rate of the last
  full-speed restore of this process (``restore.last_restore_rate``), else a calibration: a real
  restore (``restore_stores``) of up to ``CALIBRATE_RECORDS`` offsets of the task's own changelog
  into a throw-away RocksDB, timed as a restore times itself (the median of a few passes when one
  takes a fraction of a second; cached per process and changelog),
  scaled to the machine's load now (``rate_now``: a restore of the same changelog for a fraction
  of a second, set against the calibration's first records). A sample much smaller than the task
  would overstate the rate: RocksDB takes the first memtables two to four times faster than the
  rest, once flushes and level-0 compactions begin.

``forecast_task`` is what ``App.restore_forecast()`` calls once per task and source (scratch,
checkpoint, standby).
"""
from __future__ import annotations

import shutil
import tempfile
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Iterable, Optional

from statekit.contracts import changelog_topic
from statekit.errors import UnknownTopic
from statekit.kafka.log_figures import LogFigures, log_figures_for
from statekit.state.restore import (NO_BATCH, RESTORE_FETCH_BYTES, StoreReplay,
                                    last_restore_rate, meta_key)

CALIBRATE_RECORDS = 1_000_000  # offsets: a restore of up to this many is measured whole
CALIBRATE_MIN = 40_000       # a changelog shorter than this is calibrated on synthetic records
CALIBRATE_PASSES = 5         # a short partition is restored again, up to this many times ...
CALIBRATE_REPEAT_S = 1.0     # ... while the passes have taken less than this: the median pass
PROBE_S = 0.4                # seconds of the restore that measures the machine's load now
PROBE_ASKED_S = 1.0          # ... for a caller who waits for a quiet moment (``settle``): a cell
LOAD_TTL = 10.0              # seconds a load measured stands (a dashboard forecasts every few)
LOAD_FRESH = 1.0             # ... for a caller who waits for a quiet moment
LOAD_MAX = 30.0              # a load figure stays within [1/30, 30]
SCAN_MAX = 2_000_000  # offsets: a range up to this long is counted from batch headers
_calibrated: dict = {}  # (bootstrap, topic, partition) -> Calibration
_load: dict = {}        # (bootstrap, topic, partition) -> (load, when measured)
_lock = threading.Lock()
_measuring = threading.Lock()   # one calibration or probe at a time in a process


@dataclass
class StoreForecast:
    store: str
    topic: str
    start_offset: int        # where the restore would begin reading
    end_offset: int          # the changelog end now
    records: int             # changelog records it would read
    exact: bool              # False: an upper bound (compaction gaps unknown off the embedded broker)


@dataclass
class TaskForecast:
    task: int
    source: str              # "scratch" | "checkpoint" | "standby" | ... | "none" (nothing to read)
    records: int
    seconds: float
    apply_rate: float        # records/s the seconds are based on
    rate_source: str         # "given" | "last restore" | "calibrated"
    per_store: dict = field(default_factory=dict)  # store -> StoreForecast
    load: float = 1.0        # a calibrated rate: how much slower a restore runs now than then

    @property
    def exact(self) -> bool:
        return all(s.exact for s in self.per_store.values())

    def describe(self) -> str:
        """One line: "≈ 4.1 s from scratch (1,002,003 records at 245,000 records/s)"."""
        approx = "≈" if self.exact else "≤"
        return (f"{approx} {_secs(self.seconds)} from {self.source} ({self.records:,} records at "
                f"{self.apply_rate:,.0f} records/s, {self.rate_source})")

    def versus(self, metrics: dict) -> str:
        """The forecast beside what a restore measured (``TaskState.restore_metrics``)."""
        took = sum(m.duration_s for m in metrics.values())
        read = sum(m.records_restored for m in metrics.values())
        ratio = took / self.seconds if self.seconds > 0 else float("inf") if took else 1.0
        return (f"forecast {_secs(self.seconds)} ({self.records:,} records), measured "
                f"{_secs(took)} ({read:,} records): {ratio:.2f}x the forecast")


def _secs(s: float) -> str:
    return f"{s:.1f} s" if s >= 0.1 else f"{s * 1000:.0f} ms"


def forecast_task(kafka, application: str, task: int, store_specs: Iterable,
                  positions: Optional[dict] = None, *, source: Optional[str] = None,
                  apply_rate: Optional[float] = None, rate_source: Optional[str] = None,
                  calibrator: Optional[Callable[[str, int], Optional[float]]] = None,
                  log_figures: Optional[LogFigures] = None) -> TaskForecast:
    """How long restoring task ``task`` of ``application`` would take now.

    ``positions``: ``{store: changelog offset | None}`` where the local copy stands (a checkpoint,
    or a standby's ``positions()``); None or a missing store = from scratch. ``source`` labels the
    positions ("checkpoint" by default, "standby", ...); without positions it is "scratch".
    ``apply_rate``: records/s (default: the last restore's, else a calibration), labelled
    ``rate_source`` ("given" by default). ``calibrator(topic, partition)``: the calibration, done
    where the restore would run (an instance): records/s, or ``(records/s, load)``; None or no
    answer: in this process.
    ``log_figures(topics, partition)``: the records each partition holds, for exact counts
    (default: the default embedded broker's, when ``kafka`` talks to it; see
    ``statekit.kafka.log_figures``)."""
    specs = [s for s in store_specs if getattr(s, "logging", True)]
    positions = dict(positions or {})
    topics = {s.name: changelog_topic(application, s.name) for s in specs}
    if log_figures is None:
        log_figures = log_figures_for(kafka.bootstrap)
    try:
        offs = kafka.offsets_many(list(topics.values()), task) if topics else {}
    except UnknownTopic:
        existing = kafka.partition_counts(topics.values())
        there = [t for t in topics.values() if existing.get(t, 0) > task]
        offs = kafka.offsets_many(there, task) if there else {}
    stats = log_figures(offs, task) if (log_figures is not None and offs) else {}
    per_store = {}
    for spec in specs:
        t = topics[spec.name]
        if t not in offs:
            per_store[spec.name] = StoreForecast(spec.name, t, 0, 0, 0, True)
            continue
        begin, end = offs[t]
        pos = positions.get(spec.name)
        start = begin if pos is None or pos < begin else min(int(pos), end)
        st = stats.get(t)
        n, exact = end - start, start >= end
        if st is not None:
            # the broker's count is refreshed every second: records appended since are all there
            held = int(st["records"]) + max(0, end - int(st["high_watermark"]))
            dense = held >= end - begin   # nothing compacted away: every offset holds a record
            if start <= begin or dense:
                n, exact = (held if start <= begin else end - start), True
            else:
                n = min(end - start, held)
        if not exact and end - start <= SCAN_MAX:
            # a lag (checkpoint, standby) is short: count it from the batch headers
            n, exact = kafka.count_records(t, task, start, end), True
        per_store[spec.name] = StoreForecast(spec.name, t, start, end, max(0, n), exact)
    records = sum(s.records for s in per_store.values())
    load = 1.0
    if apply_rate is not None:
        rate, rate_source = float(apply_rate), rate_source or "given"
    elif last_restore_rate() is not None:
        rate, rate_source = last_restore_rate(), "last restore"
    else:
        biggest = max(per_store.values(), key=lambda s: s.end_offset - s.start_offset, default=None)
        topic = biggest.topic if biggest else None
        rate = calibrator(topic, task) if calibrator is not None and topic is not None else None
        if isinstance(rate, tuple):
            rate, load = rate
        if rate is None:
            rate, load = rate_now(kafka, topic, task)
        rate_source = "calibrated"
    if records == 0:
        src = "none"
    elif not any(positions.get(s.name) is not None for s in specs):
        src = "scratch"
    else:
        src = source or "checkpoint"
    return TaskForecast(task, src, records, records / rate if rate > 0 else 0.0, rate,
                        rate_source, per_store, load)


@dataclass
class Calibration:
    """A restore of a changelog partition into a throw-away RocksDB, measured: its rate, the
    offsets it covered and how it went (``curve``: seconds and records read at each WriteBatch)."""

    rate: float
    span: int
    busy: bool                 # measured beside the caller's own work (measured again when idle)
    curve: list = field(default_factory=list)


def _busy_now(busy) -> bool:
    """``busy`` is a bool, or a callable asked each time (the caller's work comes and goes)."""
    return bool(busy() if callable(busy) else busy)


def _wait_for_pause(busy, seconds: float) -> None:
    """Up to ``seconds`` for the caller's own work (``busy``) to pause."""
    deadline = time.monotonic() + seconds
    while _busy_now(busy) and time.monotonic() < deadline:
        time.sleep(0.05)


def calibrate(kafka, topic: Optional[str], partition: int = 0,
              records: int = CALIBRATE_RECORDS, busy=False, settle: float = 0.0) -> float:
    """Records/s of a restore on this machine, measured by doing one: up to ``records`` offsets of
    ``topic`` (a changelog; synthetic records when it has too few) restored by ``restore_stores``
    itself — read_committed Fetches, column decoding, WriteBatches sized as a restore sizes them —
    into a throw-away RocksDB, first record to last, as a restore's metrics time it.

    The whole partition is the sample: RocksDB takes the first few memtables at two to four times
    the rate of the rest (flushes, then level-0 compactions share the CPU), so a sample smaller
    than the task would promise a restore much faster than the real one. A partition restored in
    less than ``CALIBRATE_REPEAT_S`` is restored again, and the median pass is the rate
    (``_median_pass``). It is measured once per
    process and changelog, again when the changelog has grown by a quarter, whatever the machine's
    load (``rate_now`` scales it to the load of the moment). Beside the caller's own work (``busy``,
    a bool or a callable: a micro-batch, which a restore would not have beside it) it waits up to
    ``settle`` seconds for it to pause, then measures anyway, and measures again next time."""
    begin = end = 0
    if topic is not None:
        try:
            begin, end = kafka.offsets_many([topic], partition)[topic]
        except UnknownTopic:
            begin = end = 0
    span = min(end - begin, records)
    key = (kafka.bootstrap, topic, partition)
    with _lock:
        hit = _calibrated.get(key)
    # still fits: grown by less than a quarter, or still short (below CALIBRATE_MIN the sample is
    # synthetic: the same however the changelog grew)
    fits = hit is not None and (span <= hit.span * 5 // 4 or span < CALIBRATE_MIN)
    if fits and not hit.busy:
        return hit.rate
    _wait_for_pause(busy, settle if span >= CALIBRATE_MIN else 0.0)
    now_busy = _busy_now(busy)
    if fits and now_busy:
        return hit.rate
    curve: list = []
    rate = (_median_pass(kafka, topic, partition, begin, begin + span, curve)
            if span >= CALIBRATE_MIN else None)
    if rate is None:   # too short, or nothing committed to read yet: synthetic records
        rate = _measure(lambda: _decoding(_synthetic(CALIBRATE_MIN)))
    with _lock:
        _calibrated[key] = Calibration(rate, span, now_busy, curve)
        # measured just now: the load of the moment (a cell's moment only when a cell asked)
        _load[key] = (1.0, time.monotonic(), settle > 0)
    return rate


def rate_now(kafka, topic: Optional[str], partition: int = 0, busy=False, settle: float = 0.0,
             probe_s: float = PROBE_S) -> tuple:
    """``(records/s, load)``: the rate a restore of the partition would run at now — the
    calibration's (``calibrate``) divided by ``load``, how much slower than during the calibration a
    restore runs now. ``load`` is measured by a short restore of the same partition (``probe_s``
    seconds) set against the calibration's first seconds: the same code, broker and disk, in the
    same process group, so a busy machine (other notebooks, CPU hogs, a shared server) and a
    quiet one are both seen as a restore sees them. Remembered for ``LOAD_TTL`` seconds (a
    dashboard's forecasts do not measure it each time); a caller who waits up to ``settle``
    seconds for a quiet moment (a cell's forecast: a person asked, right before a crash) gets the
    load of its own moment: its own calibration's, or one measured at most ``LOAD_FRESH`` ago for
    such a caller over ``PROBE_ASKED_S`` once the caller's own work (``busy``) paused, never a
    dashboard's (a dashboard's calibration, made while notebook 02's kernel ran its heaviest
    cell, had the restore that followed forecast 1.4 to 2 times too slow). Not measured
    beside the caller's own work: the last figure stands. One measurement at a time in a
    process: a dashboard's forecast and a cell's would measure each other; the second waits and
    finds the first's."""
    with _measuring:
        return _rate_now(kafka, topic, partition, busy, settle, probe_s)


def _rate_now(kafka, topic, partition, busy, settle, probe_s) -> tuple:
    rate = calibrate(kafka, topic, partition, busy=busy, settle=settle)
    key = (kafka.bootstrap, topic, partition)
    with _lock:
        cal = _calibrated.get(key)
        last = _load.get(key)
    if cal is None or len(cal.curve) < 2:
        return rate, 1.0
    # a caller who waits for a quiet moment (a cell's forecast) gets the load of its own moment,
    # measured for a caller who waited too (its own calibration just now is): a calibration made
    # for a dashboard while the kernel ran the heaviest cell of notebook 02 had the restore that
    # followed forecast 1.4 to 2 times too slow
    ttl = LOAD_FRESH if settle > 0 else LOAD_TTL
    if last is not None and (last[2] or settle <= 0) and time.monotonic() - last[1] < ttl:
        return rate / last[0], last[0]
    _wait_for_pause(busy, settle)
    if last is not None and _busy_now(busy):
        return rate / last[0], last[0]
    try:
        begin, _end = kafka.offsets_many([topic], partition)[topic]
    except UnknownTopic:
        return rate, 1.0
    took, read = _probe(kafka, topic, partition, begin, begin + cal.span,
                        max(probe_s, PROBE_ASKED_S) if settle > 0 else probe_s)
    then = _seconds_at(cal.curve, read)
    load = min(LOAD_MAX, max(1.0 / LOAD_MAX, took / then)) if then and read else 1.0
    with _lock:
        _load[key] = (load, time.monotonic(), settle > 0)
    return rate / load, load


def _median_pass(kafka, topic: str, partition: int, start: int, end: int,
                 curve: list) -> Optional[float]:
    """The rate of the median of up to ``CALIBRATE_PASSES`` restores of ``[start, end)``, repeated
    while they have taken less than ``CALIBRATE_REPEAT_S`` (``curve``: the median pass's). A
    partition restored in a fraction of a second is one sample of a busy machine's scheduler:
    beside two CPU hogs and a browser drawing the dashboard, single passes of the same 105,000
    records ran at 265,000 to 950,000 records/s, and the restore that followed at 500,000."""
    passes: list = []
    for _ in _passes(CALIBRATE_REPEAT_S):
        c: list = []
        rate = _measure_restore(kafka, topic, partition, start, end, curve=c)
        if rate is None:
            break
        passes.append((rate, c))
    if not passes:
        return None
    rate, median = sorted(passes, key=lambda p: p[0])[len(passes) // 2]
    curve[:] = median
    return rate


def _passes(seconds: float):
    """One pass, then more while they have taken less than ``seconds``, ``CALIBRATE_PASSES`` at
    most (the calibration's and the probe's)."""
    t0 = time.monotonic()
    for n in range(CALIBRATE_PASSES):
        if n and time.monotonic() - t0 >= seconds:
            return
        yield n


def _seconds_at(curve: list, records: int) -> Optional[float]:
    """When the calibration had read ``records`` (linear between its WriteBatches)."""
    prev = (0.0, 0)
    for t, n in curve:
        if n >= records:
            if n == prev[1]:
                return t
            return prev[0] + (t - prev[0]) * (records - prev[1]) / (n - prev[1])
        prev = (t, n)
    return None


class _Enough(Exception):
    pass


class _Timeline:
    """A restore listener keeping (seconds, records read) at each WriteBatch; with ``stop_after``,
    it ends the restore after that many seconds."""

    def __init__(self, stop_after: Optional[float] = None):
        self.t0 = time.perf_counter()
        self.read = 0
        self.curve: list = []
        self.stop_after = stop_after

    def on_restore_start(self, store, partition, start, end):
        pass

    def on_batch_restored(self, store, partition, offset, n):
        self.read += n
        t = time.perf_counter() - self.t0
        self.curve.append((t, self.read))
        if self.stop_after is not None and t >= self.stop_after:
            raise _Enough()

    def on_restore_end(self, store, partition, total):
        pass


def _probe(kafka, topic: str, partition: int, start: int, end: int, seconds: float) -> tuple:
    """(seconds, records) of a restore of ``[start, end)`` cut after ``seconds``. A partition
    restored whole sooner is restored again while ``seconds`` last (up to ``CALIBRATE_PASSES``
    passes), and the median pass answers, as the calibration's median pass is set against it."""
    passes: list = []
    for _ in _passes(seconds):
        tl = _Timeline(stop_after=seconds)
        try:
            _measure_restore(kafka, topic, partition, start, end, listener=tl)
        except _Enough:
            return tl.curve[-1]   # cut: a partition longer than the probe
        if not tl.curve:
            break
        passes.append(tl.curve[-1])
    if not passes:
        return 0.0, 0
    return sorted(passes)[len(passes) // 2]


def _measure_restore(kafka, topic: str, partition: int, start: int, end: int,
                     curve: Optional[list] = None, listener=None) -> Optional[float]:
    from statekit.state.restore import restore_stores
    from statekit.stores import StoreSpec, build_stores

    d = tempfile.mkdtemp(prefix="statekit-calibrate-")
    try:
        _stores, db = build_stores([StoreSpec("calibrate", logging=False)], task_dir=d,
                                   cache_bytes=0, sync=False)
        try:
            tl = listener or _Timeline()
            tl.t0 = time.perf_counter()
            metrics, _batch = restore_stores(db, kafka, partition,
                                             {"calibrate": (topic, start, end, NO_BATCH, "scratch")},
                                             listener=tl, remember=False)
        finally:
            db.close()
        if curve is not None:
            curve[:] = tl.curve
        m = metrics["calibrate"]
        return m.rate if m.rate > 0 else None
    finally:
        shutil.rmtree(d, ignore_errors=True)


def _synthetic(n: int) -> list:
    """Record batches of a changelog as a task writes it (12-byte keys, short values, a marker
    per 10,000 records), ``RESTORE_FETCH_BYTES`` each, as a restore's Fetch responses bring them."""
    import json

    from statekit.wire import encode_batches
    from statekit.state.restore import BATCH_HEADER, MARKER_HEADER, MARKER_KEY

    recs = []
    for b in range(0, n, 10_000):
        bh = [(BATCH_HEADER, str(b).encode())]
        recs += [(b'"k%09d"' % i, b"%d" % i, bh) for i in range(b, min(n, b + 10_000))]
        recs.append((MARKER_KEY, json.dumps({"batch": b}).encode(),
                     [(MARKER_HEADER, b"1"), (BATCH_HEADER, str(b).encode())]))
    off, out = 0, []
    for raw, count in encode_batches(recs, None, RESTORE_FETCH_BYTES, 0):
        out.append(off.to_bytes(8, "big") + raw[8:])  # its base offset
        off += count
    return out


class _Decoded:
    def __init__(self, columns, next_offset):
        self.columns, self.next_offset = columns, next_offset


def _decoding(batches: list):
    """A restore's read, minus the broker: each batch decoded as it comes."""
    from statekit.wire import decode_columns

    pos = 0
    for raw in batches:
        cols = decode_columns([raw], pos)
        pos = cols.offsets[-1] + 1
        yield _Decoded(cols, pos)


def _measure(make_reader) -> float:
    """Records/s of replaying and writing what ``make_reader()`` yields (a changelog too short
    to measure on: synthetic batches, decoded and written as a restore does)."""
    from statekit.stores import StoreSpec, build_stores

    d = tempfile.mkdtemp(prefix="statekit-calibrate-")
    try:
        _stores, db = build_stores([StoreSpec("calibrate", logging=False)], task_dir=d,
                                   cache_bytes=0, sync=False)
        try:
            rp = StoreReplay("calibrate", 0)
            mk = meta_key("calibrate")
            t0 = time.perf_counter()
            for chunk in make_reader():
                keys, values = rp.feed_columns(chunk.columns, chunk.next_offset)
                db.write_batch_columns("calibrate", keys, values, {mk: rp.meta()})
            keys, values = rp.release_held_columns()
            db.write_batch_columns("calibrate", keys, values, {mk: rp.meta()})
            dt = time.perf_counter() - t0
        finally:
            db.close()
        n = rp.records_read
        return n / dt if dt > 0 and n > 0 else 1_000_000.0
    finally:
        shutil.rmtree(d, ignore_errors=True)


def clear_calibration() -> None:
    """Forget calibrated rates and loads (tests)."""
    with _lock:
        _calibrated.clear()
        _load.clear()


__all__ = ["forecast_task", "calibrate", "rate_now", "clear_calibration", "TaskForecast",
           "StoreForecast", "CALIBRATE_RECORDS"]
