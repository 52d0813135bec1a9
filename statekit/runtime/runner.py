"""Running an application: ``start()`` (instances, then one engine query per sub-topology), the
monitor that turns the engines' progress and failures and the instances' reports into the App's
state, ``process_all_available()``, ``stop()`` and ``restart()``.

It is the only part of the App that starts or stops anything, so the order of those steps (events
before the first state change, the coordinator before the queries, the queries before the
instances at a stop) is written once, here.
"""
from __future__ import annotations

import logging
import threading
import time
import weakref
from typing import Optional

from statekit.errors import (BrokerUnreachable, DiskFull, KafkaTimeout, ProcessorError,
                             StatekitError, TopologyError, UnknownTopic)
from statekit.runtime import app_topics
from statekit.runtime.lifecycle import AppState, AppStateError, NoLiveInstance

log = logging.getLogger("statekit.app")

# A micro-batch reads at most this many records (start(max_records_per_trigger=0): no bound), so a
# big backlog shows its progress batch by batch instead of one silent first batch. Each micro-batch
# also costs Spark ~0.3-0.8 s of planning and logging here: at 250,000 a build of 1,000,000 keys
# spent a quarter of its time between batches (that build, bench/ingest.py's, alternating in one
# run: 218k records/s at 250,000, 258k at 500,000, 290k unbounded)
DEFAULT_MAX_RECORDS_PER_TRIGGER = 500_000

# Spark gives a Python worker it starts (a data source's planner, the streaming source's runner)
# ten seconds to connect back, hard-coded (PythonWorkerFactory); on a machine loaded beyond its
# cores that wait runs out now and then, and the query fails though nothing is wrong with it. Such
# a query is started again from its checkpoint, at most this many times in ENGINE_RETRY_WINDOW
# seconds: the tasks commit by micro-batch id, so a batch run again is counted once.
TRANSIENT_ENGINE_FAILURES = ("Python worker failed to connect back",)
ENGINE_RETRIES = 3
ENGINE_RETRY_WINDOW = 600.0
ENGINE_BACKOFF = 0.5             # seconds before the first retry, doubled at each
# The monitor asks the engine for its progress (and whether its queries still run) every
# PROGRESS_S while batches commit, and every PROGRESS_IDLE_S once none has for that long: each ask
# is a round trip into Spark's JVM (a Spark Connect server: a gRPC call to the shared server), and
# an idle app's asks were most of its JVM's idle CPU. Anyone who reads the progress (the
# dashboard, ``metrics()``) asks for it then; a query that dies while idle is seen within
# PROGRESS_IDLE_S.
PROGRESS_S = 1.0
PROGRESS_IDLE_S = 5.0
MONITOR_S = 0.1          # the monitor's own looks (failures, Kafka's outages, RUNNING)
MONITOR_IDLE_S = 1.0     # (what it reads while idle, the instances' reports and Kafka's probe, change every 2-3 s)


def transient(err) -> bool:
    """The engine failed for a reason of the moment (the machine's load), not of the app."""
    return err is not None and any(m in str(err) for m in TRANSIENT_ENGINE_FAILURES)


def _progress_dict(p) -> dict:
    if isinstance(p, dict):
        return p
    fn = getattr(p, "asDict", None) or getattr(p, "as_dict", None)
    if callable(fn):
        try:
            return fn()
        except Exception:  # noqa: BLE001
            pass
    return {}


def active(q) -> bool:
    try:
        return bool(q.is_active)
    except Exception:  # noqa: BLE001
        return False


def failed(q) -> bool:
    """The query has failed (Spark sets its exception a moment before it stops being active)."""
    try:
        return q.exception() is not None
    except Exception:  # noqa: BLE001 - the JVM went away
        return True


# The App of this process that last started on each state directory: an App made again under the
# same name (a notebook cell run twice) finds the earlier one that still holds its task directories
_HOLDERS: "weakref.WeakValueDictionary[str, object]" = weakref.WeakValueDictionary()


def _release_earlier(app) -> None:
    """An earlier App object of this process on the same state directory that failed is stopped
    (its instances end and release their task directories: it could run nothing anyway); one that
    runs is left alone, and this start is refused in one line."""
    other = _HOLDERS.get(app.layout.root)
    if other is None or other is app:
        return
    if other.state == AppState.ERROR:
        log.warning("stopping the earlier App('%s') of this process, in ERROR, that held %s",
                    other.name, app.layout.root)
        other.stop()
    elif other.state.is_running() or other.state == AppState.PENDING_SHUTDOWN:
        raise AppStateError(f"an earlier App('{other.name}') of this process is {other.state} on "
                            f"{app.layout.root}: stop() it before starting this one")


def _abort_query(q) -> None:
    fn = getattr(q, "abort", None) or getattr(q, "stop")
    try:
        fn()
    except Exception as exc:  # noqa: BLE001
        log.info("abort: %s", exc)


# a task's failure (TaskFailed.kind) as the App's error: what waited too long for Kafka, or a
# state directory's full disk, keeps its class; anything else is the task's processing error
TASK_ERRORS = {"KafkaTimeout": KafkaTimeout, "DiskFull": DiskFull}


class Runner:
    """The running side of one ``App`` (``app``: its façade, for its settings, plan, lifecycle
    and parts)."""

    def __init__(self, app):
        self.app = app
        self.queries: dict = {}         # sub-topology -> running query
        self.run_opts: dict = {}
        self.started_at = 0.0
        self.stopping = False
        self.progress: dict = {}        # (sub-topology, batch id, timestamp) -> progress dict
        self._last_batch: dict = {}     # sub-topology -> (batch id, ran) of the last progress seen
        self.records_processed = 0
        self._progress_at = 0.0
        self._monitor: Optional[threading.Thread] = None
        self._monitor_stop = threading.Event()
        self._monitor_wake = threading.Event()
        self.engine_retries: list = []  # monotonic times the engine's queries were started again

    # ------------------------------------------------------------------ start / stop
    def start(self, trigger, max_records_per_trigger: Optional[int], sink: str,
              starting_offsets: str) -> None:
        app = self.app
        if app.state in (AppState.CREATED, AppState.NOT_RUNNING):
            _release_earlier(app)
        with app._lock:
            if app.state not in (AppState.CREATED, AppState.NOT_RUNNING):
                raise AppStateError(f"app '{app.name}' is {app.state}; start() needs CREATED or "
                                    f"NOT_RUNNING (restart() after a crash)")
            _HOLDERS[app.layout.root] = app
            if sink not in ("memory", "kafka", "none"):
                raise StatekitError(f"unknown sink {sink!r}; use 'memory', 'kafka' or 'none'")
            app._deploy.boot_spark()
            app._set_plan(app._compile())
            _ = app.bootstrap
            app_topics.ensure_topics(app, sink)
            if max_records_per_trigger is None:
                max_records_per_trigger = DEFAULT_MAX_RECORDS_PER_TRIGGER
            self.run_opts = dict(trigger=trigger, max_records_per_trigger=max_records_per_trigger
                                 or None, sink=sink, starting_offsets=starting_offsets)
            app.layout.control.ensure()
            app_topics.check_partitions(app)
            app._crashes.clear_directives()  # a directive left over from another session
            spec = self.worker_spec(sink)
            app._bus.start()
            app._error = None
            app._transition(AppState.RESTORING, "start")
            placement = app._deploy.choose_placement(layout=app.layout, bootstrap=app.bootstrap,
                                                     sink=sink)
            app._coordinator = placement.coordinator(app, spec)
            self.watch_kafka_start()
            self.started_at = time.time()
            self.stopping = False
            try:
                placement.start(app._coordinator, app.initial_instances,
                                {"restore_rate": app.restore_rate}, self.launch)
            except StatekitError as exc:
                self.abort_all()
                app._fail(exc)
                raise
            self.start_monitor()

    def watch_kafka_start(self) -> None:
        """The App's KafkaWatch (``runtime.outage``) for this run; the coordinator reads it."""
        from statekit.contracts import events_topic
        from statekit.kafka.retry import request_timeout_for
        from statekit.runtime.outage import KafkaWatch

        app = self.app
        if app._outage is not None:
            app._outage.stop()
        app._outage = KafkaWatch(app.bootstrap, events_topic(app.name),
                                 request_timeout_for(app.task_timeout), app._bus.publish,
                                 every=self.probe_every).start()
        app._coordinator.kafka_down = app._outage.probe_down

    def worker_spec(self, sink: str):
        from statekit.worker.task import WorkerSpec

        app = self.app
        return WorkerSpec(application=app.name, bootstrap=app.bootstrap, plans=dict(app.subplans),
                          partitions=app.partitions, control_dir=app.layout.control_dir,
                          cache_bytes=app.cache_bytes, sink=sink, exactly_once=app.exactly_once,
                          repartition_topics=tuple(app_topics.repartition_topics(app.plan)),
                          task_timeout=app.task_timeout)

    def launch(self) -> None:
        """One engine query per sub-topology that has none running."""
        from statekit.engine.spec import RunSpec

        app, opts = self.app, self.run_opts
        trigger = opts.get("trigger") if opts.get("trigger") is not None else app.commit_interval
        engine = app._deploy.engine()
        for sub, plan in sorted(app.subplans.items()):
            q = self.queries.get(sub)
            if q is not None and active(q):
                continue
            run = RunSpec(app=app.name, bootstrap=app.bootstrap, plan=plan,
                          partitions=app.partitions,
                          checkpoint_dir=app._deploy.checkpoint_dir(app.layout, sub),
                          control_dir=app.layout.control_dir, subtopology=sub, trigger=trigger,
                          max_records_per_trigger=opts.get("max_records_per_trigger"),
                          starting_offsets=opts.get("starting_offsets") or "earliest",
                          query_name=app.name if sub == 0 else f"{app.name}_{sub}",
                          task_timeout=app.task_timeout,
                          extra=app._deploy.placement.run_extra(app._coordinator))
            app.runs[sub] = run
            while True:
                try:
                    self.queries[sub] = engine.start(run)
                    break
                except Exception as exc:
                    if not self.may_retry_engine(exc):
                        raise exc if isinstance(exc, StatekitError) else self.one_line(exc) from None

    def may_retry_engine(self, err) -> bool:
        """True (after a short pause) when the engine's failure is transient and the retries of
        the last ENGINE_RETRY_WINDOW seconds are not used up; said in the log (info: a notebook
        shows it only to whoever asked for statekit's log) each time."""
        if not transient(err) or self.stopping:
            return False
        now = time.monotonic()
        self.engine_retries = [t for t in self.engine_retries if now - t < ENGINE_RETRY_WINDOW]
        if len(self.engine_retries) >= ENGINE_RETRIES:
            return False
        self.engine_retries.append(now)
        n = len(self.engine_retries)
        log.info("app '%s': Spark did not hear from a Python worker in time (a busy machine); "
                    "its query starts again from its checkpoint (%d of %d)", self.app.name, n,
                    ENGINE_RETRIES)
        time.sleep(min(4.0, ENGINE_BACKOFF * 2 ** (n - 1)))
        return not self.stopping

    def abort_all(self) -> None:
        self.abort_queries()
        if self.app._coordinator is not None:
            self.app._coordinator.abort()

    def abort_queries(self) -> None:
        qs, self.queries = dict(self.queries), {}
        for q in qs.values():
            _abort_query(q)

    def stop(self) -> None:
        """The queries first (the batch in flight commits), then the instances."""
        app = self.app
        with app._lock:
            if app.state == AppState.CREATED:
                app._transition(AppState.NOT_RUNNING, "stopped before start")
                app._close_helpers()
                return
            if app.state == AppState.NOT_RUNNING:
                app._close_router()
                app._close_helpers()
                return
            self.stopping = True
            app._crashes.cancel()
            app._transition(AppState.PENDING_SHUTDOWN, "stop()")
            self.stop_monitor()
            for q in list(self.queries.values()):
                try:
                    q.stop()
                except Exception as exc:  # noqa: BLE001
                    log.info("stopping the query: %s", exc)
            self.queries = {}
            if app._coordinator is not None:
                app._coordinator.stop()
            if app._outage is not None:
                app._outage.stop()
            app._close_router()
            app._transition(AppState.NOT_RUNNING, "stopped")
            app._close_helpers()
            self.release_engine_helpers(self.query_names(), grace=1.0)

    def query_names(self, inactive_only: bool = False) -> list:
        """The engine queries' names of every sub-topology (only those not running, if asked)."""
        app = self.app
        names = [app.name if sub == 0 else f"{app.name}_{sub}" for sub in sorted(app.subplans)]
        if inactive_only:
            running = {sub for sub, q in self.queries.items() if active(q)}
            names = [n for sub, n in zip(sorted(app.subplans), names) if sub not in running]
        return names

    def release_engine_helpers(self, names: list, grace: float = 0.0) -> None:
        """The helper processes a Spark Connect server keeps for these stopped queries end
        (``engine.spark.helpers``), ``grace`` seconds after their stop (the executors' tasks close
        their copies first, on the stop the coordinator published)."""
        engine = self.app._deploy._engine
        keeps = getattr(engine, "keeps_helpers", None)
        if not names or keeps is None or not keeps():
            return
        if grace > 0 and self.app._deploy.placement_name == "executors":
            time.sleep(grace)
        try:
            engine.release_helpers(self.app.layout.control_dir, names)
        except Exception as exc:  # noqa: BLE001 - a best effort
            log.info("ending the engine's helpers: %s", exc)

    def restart(self, timeout: float = 120, wait: bool = False, crash_during: Optional[dict] = None,
                restore_rate: Optional[float] = None) -> dict:
        """Bring the application back after a crash: every dead instance is revived (with its disk;
        a disk-loss instance comes back empty), a failed engine query is started again from its
        checkpoint, and tasks restore (checkpoint, standby, or the whole changelog). On an app with
        nothing dead, every instance is restarted (a process crash of all of them). Returns the
        restart record.

        ``restore_rate`` (records/s) throttles the restores for teaching; ``crash_during={"mode":
        ..., "instance": ..., "point": "mid_restore"}`` arms a crash directive first (a crash during
        the restore itself). With ``wait``, block until RUNNING (or ERROR)."""
        app = self.app
        if restore_rate is not None and float(restore_rate) <= 0:
            raise StatekitError(f"restore_rate must be > 0 records/s, got {restore_rate}")
        app._crashes.check_during(crash_during)
        with app._lock:
            if app.state == AppState.CREATED or app._coordinator is None:
                raise AppStateError(f"app '{app.name}' was never started; use start()")
            if app.state in (AppState.NOT_RUNNING, AppState.PENDING_SHUTDOWN):
                raise AppStateError(f"app '{app.name}' is stopped; use start()")
            co = app._coordinator
            crash = app._crashes.cancel()
            if crash is not None:
                crash["status"] = "withdrawn"
            co.options["restore_rate"] = float(restore_rate) if restore_rate else app.restore_rate
            if crash_during:
                app._crashes.arm_during_restart(crash_during)
            gen0 = app.generation
            revived = co.restart_instances()
            app._error = None
            app._bus.forget_task_errors()
            app._transition(AppState.RESTORING, "restart")
            self.release_engine_helpers(self.query_names(inactive_only=True))
            self.launch()
            if self._monitor is None:
                self.start_monitor()
            rec = {"at": time.time(), "generation": app.generation, "from_generation": gen0,
                   "revived": revived, "restore_rate": restore_rate,
                   "moves": [m for r in co.rebalances if r["generation"] > gen0 for m in r["moves"]]}
            app.restarts.append(rec)
        if wait:
            app._life.wait_for([AppState.RUNNING, AppState.ERROR], timeout)
        return rec

    # ------------------------------------------------------------------ the monitor
    def start_monitor(self) -> None:
        self.stop_monitor()
        self._monitor_stop = threading.Event()
        t = threading.Thread(target=self._monitor_loop, args=(self._monitor_stop, self._monitor_wake),
                             name=f"statekit-monitor-{self.app.name}", daemon=True)
        self._monitor = t
        t.start()

    def stop_monitor(self) -> None:
        if self._monitor is not None:
            self._monitor_stop.set()
            self._monitor_wake.set()
            if self._monitor is not threading.current_thread():
                self._monitor.join(timeout=10)
            self._monitor = None

    def nudge(self, progress: bool = False) -> None:
        """Look now, not at the monitor's next look (a state change: an idle app's monitor
        sleeps half a second); ``progress``: ask the engine too (a query that failed)."""
        if progress:
            self._progress_at = 0.0
        self._monitor_wake.set()

    def _monitor_loop(self, stop: threading.Event, wake: threading.Event) -> None:
        """Engine progress, engine failures, and the state the instances report (RUNNING once every
        task is open with nothing spooled; ERROR when a task failed)."""
        while True:
            wake.wait(self.monitor_every())
            wake.clear()
            if stop.is_set():
                return
            try:
                self.monitor_once()
            except Exception as exc:  # noqa: BLE001 - the monitor must not die silently
                log.info("monitor: %s", exc)

    def monitor_once(self) -> None:
        app = self.app
        if self.stopping:
            return
        # the engines' progress (a Spark query answers through the JVM); a query that ended is
        # noticed at the same pace
        now = time.monotonic()
        if now - self._progress_at >= self.progress_every(now):
            self._progress_at = now
            for sub, q in list(self.queries.items()):
                self.poll_progress(sub, q)
                if not active(q) and not self.stopping:
                    self.on_query_ended(sub, q)
                    return
        co = app._coordinator
        if co is None or co.stopped or app.state in (AppState.ERROR, AppState.PENDING_SHUTDOWN,
                                                     AppState.NOT_RUNNING):
            return
        # (never waiting for the coordinator's lock: its loop may hold it for request timeouts
        # while Kafka is away, and the App must say WAITING meanwhile)
        failed = co.failed_tasks(wait=False)
        if failed:
            t, i, err, *kind = failed[0]
            self.abort_queries()
            cls = TASK_ERRORS.get(kind[0] if kind else None, ProcessorError)
            app._fail(cls(err or f"task {t} failed on instance {i}"))
            return
        if self.watch_kafka(co):
            return
        if app.state in (AppState.RESTORING, AppState.REBALANCING) and co.tasks_ready(wait=False):
            app._transition(AppState.RUNNING, "every task is open")

    def idle(self, now: float) -> bool:
        """RUNNING with no batch committed for PROGRESS_IDLE_S, past the start's first seconds,
        and not on a finite trigger (whose end is its result)."""
        app = self.app
        return (app.state == AppState.RUNNING and not self.finite_trigger()
                and now - app._bus.last_commit_at >= PROGRESS_IDLE_S
                and time.time() - self.started_at >= PROGRESS_IDLE_S)

    def monitor_every(self) -> float:
        """MONITOR_S, or MONITOR_IDLE_S while the app idles: each look is a wake-up of the
        kernel's process, and on a virtual machine's idle core a wake-up costs far more CPU than
        the look itself (10 a second were a third of an idle kernel's CPU)."""
        return MONITOR_IDLE_S if self.idle(time.monotonic()) else MONITOR_S

    def probe_every(self) -> float:
        """How often the App asks whether Kafka answers: PROBE_EVERY_S, PROBE_IDLE_S while the
        app idles (a broker that died or froze then shows within a few seconds, not one)."""
        from statekit.runtime.outage import PROBE_EVERY_S, PROBE_IDLE_S

        return PROBE_IDLE_S if self.idle(time.monotonic()) else PROBE_EVERY_S

    def progress_every(self, now: float) -> float:
        """PROGRESS_S while the app is busy, PROGRESS_IDLE_S while it idles."""
        return PROGRESS_IDLE_S if self.idle(now) else PROGRESS_S

    def watch_kafka(self, co) -> bool:
        """WAITING while Kafka is away (the App's probe, or tasks waiting for it); back by itself
        when it answers and nothing waits — RUNNING, or RESTORING while tasks replay. True while
        waiting."""
        app = self.app
        watch = app._outage
        if watch is None:
            return False
        w = watch.update(getattr(co, "last_statuses", dict)())
        if w is not None:
            if app.state in (AppState.RESTORING, AppState.REBALANCING, AppState.RUNNING):
                app._transition(AppState.WAITING, str(w))
            return True
        if app.state == AppState.WAITING:
            app._transition(AppState.RUNNING if co.tasks_ready() else AppState.RESTORING,
                            "Kafka is back")
        return False

    def on_membership(self, what: str) -> None:
        """The coordinator's news: a rebalance (REBALANCING until the moved tasks are open), or no
        live instance left (ERROR: nothing can process)."""
        app = self.app
        if what == "no-live-instance":
            app._fail(NoLiveInstance(f"every instance of '{app.name}' is dead: restart() or "
                                     f"revive() one"))
        elif what == "rebalance" and app.state == AppState.RUNNING:
            app._transition(AppState.REBALANCING, f"generation {app.generation}")

    def on_query_ended(self, sub: int, q) -> None:
        app = self.app
        exc = None
        try:
            exc = q.exception()
        except Exception as e:  # noqa: BLE001 - the engine could not even tell
            exc = e
        # the failed query stays in `queries` while it is started again (launch() replaces an
        # inactive one): process_all_available() never finds the app running nothing meanwhile
        if self.may_retry_engine(exc) and app.state not in (AppState.ERROR, AppState.NOT_RUNNING):
            try:
                self.launch()
                return
            except Exception as again:  # noqa: BLE001 - the start failed for good: said below
                exc = again
        self.queries.pop(sub, None)
        if exc is None and self.finite_trigger():
            if not self.queries:
                self.wait_drained(60)
                self.stopping = True
                app._transition(AppState.PENDING_SHUTDOWN, "the query finished")
                if app._coordinator is not None:
                    app._coordinator.stop()
                app._transition(AppState.NOT_RUNNING, "the query finished")
            return
        err = StatekitError("the query stopped on its own; restart() to run it again") if exc is None \
            else self.one_line(exc)
        self.abort_queries()
        app._fail(err)

    def finite_trigger(self) -> bool:
        t = (self.run_opts or {}).get("trigger")
        return isinstance(t, str) and t.replace("_", "").lower() in ("availablenow", "available",
                                                                     "once")

    def poll_progress(self, sub: int, query) -> None:
        """The micro-batches ``query`` completed since the last look. The last progress is one
        object through the JVM; the recent ones (up to 100, each converted) are asked for only
        when it changed: an idle query repeats a progress with its next batch id every 10 s, and
        the monitor looks once a second."""
        try:
            last = _progress_dict(getattr(query, "last_progress", None) or {})
            # an idle progress has the next batch's id, without addBatch; that batch's own has it
            seen = (last.get("batch_id"), "addBatch" in (last.get("duration_ms") or {}))
            if seen[0] is not None and self._last_batch.get(sub) == seen:
                return
            recent = list(query.recent_progress or [])
        except Exception:  # noqa: BLE001
            return
        self._last_batch[sub] = seen
        for p in recent:
            d = _progress_dict(p)
            bid = d.get("batch_id")
            if bid is None or bid < 0:
                continue
            key = (sub, bid, d.get("timestamp"))
            if key not in self.progress:
                self.progress[key] = dict(d, subtopology=sub, seen_at=time.time())
                self.records_processed += self._input_records(d)

    def poll_all(self) -> list:
        """Every micro-batch's progress seen so far, oldest first (the queries asked now)."""
        for sub, q in list(self.queries.items()):
            self.poll_progress(sub, q)
        return list(self.progress.values())

    def _input_records(self, progress: dict) -> int:
        """Records of the application's input topics in a micro-batch (a repartition topic's are
        the same records again, counted once where they came in)."""
        by_topic = progress.get("records_by_topic")
        if not by_topic:
            return int(progress.get("num_input_rows") or 0)
        repart = set(app_topics.repartition_topics(self.app.plan))
        return sum(n for t, n in by_topic.items() if t not in repart)

    def one_line(self, exc) -> StatekitError:
        """Any failure of a query as one ``StatekitError`` line; a task that failed becomes the
        ``ProcessorError`` its instance reported."""
        if isinstance(exc, StatekitError):
            err = exc
        elif isinstance(exc, str):
            err = StatekitError(exc)
        else:
            try:
                from statekit.engine.spark.session import one_line

                err = one_line(exc)
            except Exception:  # noqa: BLE001
                err = StatekitError(f"{type(exc).__name__}: {exc}")
        if isinstance(err, (ProcessorError, UnknownTopic, BrokerUnreachable, TopologyError, DiskFull)):
            return err
        for e in reversed(self.app._bus.task_errors):
            if e.error:
                return TASK_ERRORS.get(e.kind, ProcessorError)(e.error)
        if "failed on key=" in str(err):
            return ProcessorError(str(err))
        return err

    # ------------------------------------------------------------------ caught up
    def settled_false(self) -> bool:
        """False, once the app's state tells why: the coordinator marks the last member dead a
        moment before it tells the app, and whoever hears False should find ERROR already."""
        co = self.app._coordinator
        if co is not None and not co.stopped and not co.live():
            self.app._life.wait_for([AppState.ERROR, AppState.NOT_RUNNING], 10)
        return False

    def wait_drained(self, timeout: Optional[float]) -> bool:
        """Until every task is open with nothing spooled; False when no instance can do it."""
        app = self.app
        co = app._coordinator
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if co is None or co.stopped:
                return True
            if not co.live():
                return self.settled_false()
            if app.state == AppState.ERROR:
                return False
            if co.tasks_ready(fresh=True):
                return True
            if deadline is not None and time.monotonic() > deadline:
                return False
            time.sleep(0.05)

    def process_all_available(self, timeout: Optional[float] = None) -> bool:
        """Block until every record available now is processed and committed by its task — through
        every sub-topology: a round over the queries repeats until no repartition topic grew during
        it. Returns True; False when no live instance can process (every instance is dead) or the
        time ran out while tasks were still catching up. A failure raises its one-line error."""
        app = self.app
        if not self.queries:
            if app.state == AppState.ERROR and app._error is not None:
                raise app._error
            raise AppStateError(f"app '{app.name}' is {app.state}: nothing is running")
        t0 = time.monotonic()

        def left():
            return None if timeout is None else max(1.0, timeout - (time.monotonic() - t0))

        repart = app_topics.repartition_topics(app.plan)
        while True:
            before = self._topic_ends(repart)
            again = False
            for sub in sorted(self.queries):
                q = self.queries.get(sub)
                if q is None:
                    continue
                try:
                    if timeout is None:
                        q.process_all_available()
                    else:
                        q.process_all_available(timeout=left())
                except Exception as exc:  # noqa: BLE001
                    if self.replaced(sub, q, exc):
                        again = True  # the query failed transiently and runs again: a new round
                        break
                    if not active(q) or failed(q):
                        self.nudge(progress=True)   # the monitor says why, now
                        app._life.wait_for([AppState.ERROR, AppState.NOT_RUNNING], 30)
                        if app.state == AppState.NOT_RUNNING:
                            return True
                        raise app._error or self.one_line(exc) from None
                    return self.settled_false()
            if again:
                if timeout is not None and time.monotonic() - t0 > timeout:
                    return False
                continue
            if not self.wait_drained(left()):
                if app.state == AppState.ERROR and isinstance(app._error, ProcessorError):
                    raise app._error
                return False
            if self._topic_ends(repart) == before:
                break
            if timeout is not None and time.monotonic() - t0 > timeout:
                return False
        if app.state in (AppState.RESTORING, AppState.REBALANCING):
            app._transition(AppState.RUNNING, "caught up")
        return True

    def replaced(self, sub: int, q, exc) -> bool:
        """The monitor started query `q` of `sub` again after a transient failure (waited for
        while its retries last)."""
        if not transient(exc) and not transient(getattr(q, "exception", lambda: None)()):
            return False
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and self.app.state != AppState.ERROR:
            now = self.queries.get(sub)
            if now is not None and now is not q:
                return True
            time.sleep(0.1)
        return False

    def _topic_ends(self, topics: list) -> dict:
        """The repartition topics' ends; a broker that is away is waited for (the tasks wait too),
        up to the task timeout."""
        from statekit.kafka.retry import retrying

        app = self.app

        def fresh_client():
            k, app._kafka = app._kafka, None
            if k is not None:
                k.close()

        return retrying(lambda: {t: app.kafka.end_offsets(t) for t in topics},
                        timeout=app.task_timeout, what=f"app '{app.name}'", bootstrap=app.bootstrap,
                        on_failure=fresh_client) if topics else {}
