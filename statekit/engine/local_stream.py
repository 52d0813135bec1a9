"""A streaming query without Spark, for fast tests and laptops without Java: ``App(engine="local")``.

It keeps Spark's micro-batch contract, so everything above it (instances, crashes, rebalances,
restoration, exactly-once state) behaves as on Spark:

* a driver thread (in the App's process) plans micro-batches over the Kafka source topics and keeps
  an *offset log* and a *commit log* in the query checkpoint directory, as Spark does: the offset
  range of batch ``b`` is written before ``b`` runs, ``commits/b`` after it finished. A new query on
  the same checkpoint first re-runs the last batch that has no commit, with the same id and ranges;
* each task's part of a batch — the offset ranges of its partition — goes to the instance that
  owns the task (``statekit.worker.exchange``), all tasks of a batch at once; the instance reads
  its ranges from Kafka itself, as on Spark. The instances are real processes: a crash kills one
  of them, never this query.

``RunningQuery`` surface: ``stop()``, ``abort()``, ``is_active``, ``exception()``,
``process_all_available(timeout)``, ``recent_progress``, ``last_batch_id``, ``status()``.
"""
from __future__ import annotations

import json
import os
import threading
import time
from collections import deque
from typing import Optional

from statekit.errors import ProcessorError, StatekitError

__all__ = ["LocalStreamingEngine", "LocalQuery"]


class QueryFailed(StatekitError):
    pass


def _atomic_json(path: str, body) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(body, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class _Log:
    """``<checkpoint>/<name>/<batch id>`` JSON files (the offset log, the commit log)."""

    def __init__(self, root: str, name: str):
        self.dir = os.path.join(root, name)
        os.makedirs(self.dir, exist_ok=True)

    def ids(self) -> list:
        return sorted(int(n) for n in os.listdir(self.dir) if n.isdigit())

    def latest(self) -> Optional[int]:
        ids = self.ids()
        return ids[-1] if ids else None

    def get(self, batch: int):
        try:
            with open(os.path.join(self.dir, str(batch))) as f:
                return json.load(f)
        except (FileNotFoundError, ValueError):
            return None

    def put(self, batch: int, body) -> None:
        _atomic_json(os.path.join(self.dir, str(batch)), body)


def _ranges_to_json(r: dict) -> dict:
    out: dict = {}
    for (topic, p), (s, e) in sorted(r.items()):
        out.setdefault(topic, {})[str(p)] = [s, e]
    return out


def _ranges_from_json(d: dict) -> dict:
    return {(t, int(p)): (int(se[0]), int(se[1])) for t, ps in d.items() for p, se in ps.items()}


class LocalStreamingEngine:
    """``start(run: RunSpec) -> LocalQuery``."""

    def __init__(self, poll_interval: float = 0.05):
        self.poll_interval = poll_interval

    def start(self, run) -> "LocalQuery":
        q = LocalQuery(run, poll_interval=self.poll_interval)
        q._start()
        return q


class LocalQuery:
    def __init__(self, run, poll_interval: float = 0.05):
        self.run = run
        self.name = run.query_name or run.app
        self.poll_interval = poll_interval
        self.checkpoint = run.checkpoint_dir
        os.makedirs(self.checkpoint, exist_ok=True)
        self.offsets = _Log(self.checkpoint, "offsets")
        self.commits = _Log(self.checkpoint, "commits")
        self._progress: deque = deque(maxlen=100)
        self._thread: Optional[threading.Thread] = None
        self._stop = threading.Event()
        self._abort = False
        self._active = False
        self._error: Optional[StatekitError] = None
        self._cond = threading.Condition()
        self._trigger_active = False
        self._idle_since: Optional[float] = None   # start time of the last check that found nothing
        self._pool = None
        self._kafka = None
        self.last_batch_id = -1
        self._interval = self._parse_trigger(run.trigger)
        self._once = isinstance(run.trigger, str) and run.trigger.replace("_", "").lower() in (
            "availablenow", "available", "once")

    # -- trigger
    @staticmethod
    def _parse_trigger(trigger) -> float:
        if trigger is None:
            return 0.0
        if isinstance(trigger, (int, float)):
            return float(trigger)
        t = str(trigger).strip().lower()
        if t.replace("_", "") in ("availablenow", "available", "once"):
            return 0.0
        parts = t.split()
        try:
            n = float(parts[0])
        except (ValueError, IndexError):
            raise StatekitError(f"unknown trigger {trigger!r}: use None, seconds, '2 seconds', "
                                f"'availableNow' or 'once'") from None
        unit = parts[1] if len(parts) > 1 else "seconds"
        return n / 1000.0 if unit.startswith("milli") or unit == "ms" else n * (60 if unit.startswith("min") else 1)

    # -- lifecycle
    def _start(self) -> None:
        from statekit.kafka import Kafka

        from concurrent.futures import ThreadPoolExecutor

        from statekit.kafka.retry import request_timeout_for

        self._kafka = Kafka(self.run.bootstrap, timeout=request_timeout_for(self.run.task_timeout))
        self._pool = ThreadPoolExecutor(max_workers=max(1, min(8, self.run.partitions)),
                                        thread_name_prefix=f"statekit-local-{self.name}")
        self._active = True
        self._thread = threading.Thread(target=self._loop, name=f"statekit-local-{self.name}", daemon=True)
        self._thread.start()

    @property
    def is_active(self) -> bool:
        return self._active

    def exception(self) -> Optional[StatekitError]:
        return self._error

    def status(self) -> dict:
        return {"isTriggerActive": self._trigger_active, "isDataAvailable": self._trigger_active,
                "message": "processing" if self._trigger_active else "waiting for data"}

    def is_idle(self) -> bool:
        """No batch in flight."""
        return not self._trigger_active

    def caught_up(self) -> bool:
        """No batch in flight and the last look at the sources found nothing new."""
        return self._idle_since is not None and not self._trigger_active

    @property
    def recent_progress(self) -> list:
        return list(self._progress)

    @property
    def last_progress(self) -> dict:
        return self._progress[-1] if self._progress else {}

    def stop(self, timeout: float = 60.0) -> None:
        """Stop after the running batch (if any) finishes."""
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)
        self._finish()

    def abort(self) -> None:
        """Stop without waiting for the batch in flight (its tasks are replayed on the next start)."""
        self._abort = True
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(30)
        self._finish()

    def _finish(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            pool.shutdown(wait=False, cancel_futures=True)
        k, self._kafka = self._kafka, None
        if k is not None:
            try:
                k.close()
            except Exception:
                pass
        with self._cond:
            self._active = False
            self._cond.notify_all()

    def await_termination(self, timeout: Optional[float] = None) -> bool:
        if self._thread is not None:
            self._thread.join(timeout)
        return not self._active

    def process_all_available(self, timeout: Optional[float] = None) -> None:
        """Block until every record available now is processed; raise the query's error if it fails."""
        t0 = time.time()
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                if self._error is not None:
                    raise self._error
                if not self._active:
                    return
                if self._idle_since is not None and self._idle_since >= t0:
                    return
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise QueryFailed(f"query {self.name} did not catch up within {timeout:.0f}s")
                self._cond.wait(0.5 if left is None else min(left, 0.5))

    # -- the driver loop
    def _topics(self) -> list:
        return list(dict.fromkeys(s.topic for s in self.run.plan.sources))

    def _next_ranges(self, start: dict) -> dict:
        """Offset ranges of the next batch (empty when there is no new data)."""
        ranges = {}
        for topic in self._topics():
            ends = self._kafka.end_offsets(topic, None, self.run.isolation)
            begins = None
            for p, e in ends.items():
                s = start.get((topic, p))
                if s is None:
                    if begins is None:
                        begins = self._kafka.begin_offsets(topic)
                    s = e if self.run.starting_offsets == "latest" else begins.get(p, 0)
                if e > s:
                    ranges[(topic, p)] = (s, e)
                else:
                    ranges[(topic, p)] = (s, s)
        limit = self.run.max_records_per_trigger
        if limit:
            budget = int(limit)
            out = {k: (s, s) for k, (s, e) in ranges.items()}
            live = [k for k, (s, e) in sorted(ranges.items()) if e > s]
            while budget > 0 and live:  # round-robin, as even as the partitions allow
                share = max(1, budget // len(live))
                nxt = []
                for k in live:
                    s0, e = ranges[k]
                    cs, ce = out[k]
                    take = min(share, e - ce, budget)
                    out[k] = (cs, ce + take)
                    budget -= take
                    if out[k][1] < e:
                        nxt.append(k)
                    if budget <= 0:
                        break
                live = nxt
            ranges = out
        return ranges

    def _loop(self) -> None:
        try:
            self._run_loop()
        except StatekitError as exc:
            if not self._abort and not self._stop.is_set():
                self._error = exc
        except Exception as exc:  # noqa: BLE001
            if not self._abort:
                self._error = QueryFailed(f"query {self.name} failed: {type(exc).__name__}: {exc}")
        finally:
            self._trigger_active = False
            if self._error is not None or self._once:
                self._finish()
            else:
                with self._cond:
                    self._cond.notify_all()

    def _run_loop(self) -> None:
        last_off = self.offsets.latest()
        last_commit = self.commits.latest()
        # a batch planned but never committed: run it again with the same id and ranges
        if last_off is not None and (last_commit is None or last_commit < last_off):
            body = self.offsets.get(last_off)
            self._run_batch(last_off, _ranges_from_json(body["ranges"]))
            if self._stop.is_set():
                return
        next_start = self._committed_end()
        next_time = 0.0
        while not self._stop.is_set():
            now = time.monotonic()
            if now < next_time:
                self._stop.wait(min(next_time - now, 0.2))
                continue
            check_started = time.time()
            latest = self.offsets.latest()
            batch = 0 if latest is None else latest + 1
            ranges = self._ranges_retrying(next_start)
            if not any(e > s for s, e in ranges.values()):
                with self._cond:
                    self._idle_since = check_started
                    self._cond.notify_all()
                if self._once:
                    return
                self._stop.wait(self.poll_interval)
                continue
            self.offsets.put(batch, {"ranges": _ranges_to_json(ranges), "ts": time.time()})
            self._run_batch(batch, ranges)
            next_start = {k: e for k, (s, e) in ranges.items()}
            next_time = now + self._interval

    def _ranges_retrying(self, start: dict) -> dict:
        """``_next_ranges``, riding out a broker that is away (``statekit.kafka.retry``): the
        query waits, with backoff, up to the task timeout, then fails in one line."""
        from statekit.kafka import Kafka
        from statekit.kafka.retry import request_timeout_for, retrying

        def fresh_client():
            k, self._kafka = self._kafka, None
            if k is not None:
                k.close()

        def attempt():
            if self._kafka is None:
                self._kafka = Kafka(self.run.bootstrap, timeout=request_timeout_for(self.run.task_timeout))
            return self._next_ranges(start)

        return retrying(attempt, timeout=self.run.task_timeout, what=f"query {self.name}",
                        bootstrap=self.run.bootstrap, stop=self._stop.is_set, on_failure=fresh_client)

    def _committed_end(self) -> dict:
        c = self.commits.latest()
        if c is None:
            return {}
        body = self.offsets.get(c)
        return {k: e for k, (s, e) in _ranges_from_json(body["ranges"]).items()} if body else {}

    def _run_batch(self, batch: int, ranges: dict) -> None:
        from statekit.worker.exchange import range_records, split

        self._trigger_active = True
        t0 = time.perf_counter()
        by_task = split(ranges, self.run.partitions)
        n_in = sum(range_records(r) for r in by_task.values())
        self._deliver(batch, by_task)
        self.commits.put(batch, {"ts": time.time()})
        dt = time.perf_counter() - t0
        self.last_batch_id = batch
        prev = self._progress[-1] if self._progress else None
        since = (time.time() - prev["wall"]) if prev else dt
        by_topic: dict = {}
        for (topic, _p), (s, e) in ranges.items():
            by_topic[topic] = by_topic.get(topic, 0) + max(0, e - s)
        self._progress.append({
            "batch_id": batch, "num_input_rows": n_in, "records_by_topic": by_topic,
            "input_rows_per_second": (n_in / since) if since > 0 else 0.0,
            "processed_rows_per_second": (n_in / dt) if dt > 0 else 0.0,
            "batch_duration_ms": dt * 1000.0, "timestamp": time.strftime("%Y-%m-%dT%H:%M:%S"),
            "wall": time.time(), "tasks": {t: range_records(r) for t, r in by_task.items()},
        })
        self._trigger_active = False

    def _deliver(self, batch: int, by_task: dict) -> None:
        """Every task's ranges to its owner at once; a failed task fails the batch."""
        from statekit.contracts import TaskId
        from statekit.worker.exchange import deliver

        publish = None
        if self.run.events:
            from statekit.event_bus import EventPublisher

            publish = EventPublisher(self.run.bootstrap, self.run.app).publish
        sub = int(self.run.subtopology)
        futures = [self._pool.submit(deliver, self.run.control_dir, TaskId(sub, t), batch,
                                     ranges, publish)
                   for t, ranges in sorted(by_task.items())]
        first = None
        for f in futures:
            try:
                f.result()
            except BaseException as exc:  # noqa: BLE001 - wait for every task before failing
                first = first or exc
        if first is not None:
            if isinstance(first, ProcessorError):
                self._error = first
            elif isinstance(first, StatekitError):
                self._error = QueryFailed(str(first))
            else:
                self._error = QueryFailed(f"query {self.name} failed: {type(first).__name__}: {first}")
            raise self._error
