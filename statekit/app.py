"""``statekit.App``: one stream-processing application, its lifecycle, instances, crashes, restarts,
standby replicas, interactive queries and lag.

    app = statekit.App("wordcount", partitions=4, instances=2, standby_replicas=1)
    words = app.stream("lines").flat_map_values(str.split).group_by(lambda k, w: w)
    words.count(store="counts").to_stream().to("counts")
    app.start()
    app.process_all_available()
    app.query("counts", "the")
    app.crash("disk-loss", instance=0, after_records=10)
    app.restart()

How the pieces fit (docs/ARCHITECTURE.md, "Runtime seams"): the App is the front of a
``topology.TopologyBuilder``; ``start()`` compiles it to a ``Plan``, assigns tasks to instances
(``runtime.assignment``), starts the standby replicas (``runtime.standbys``) and hands a ``RunSpec`` to
the engine. Every simulated instance is a state directory (its disk) plus a set of tasks; all of them
run inside one engine query, so a worker killed on one instance fails the whole query, and
``restart()`` brings every instance back (a "disk-loss" instance comes back empty).
"""
from __future__ import annotations

import logging
import os
import threading
import time
from typing import Any, Callable, Optional

from statekit.errors import (
    BrokerUnreachable, ProcessorError, StatekitError, TopologyError, UnknownTopic,
)
from statekit.runtime.assignment import Assignment, assign, moves
from statekit.runtime.layout import Layout, default_state_dir
from statekit.runtime.lifecycle import AppState, Lifecycle
from statekit.runtime import crash as crash_mod

__all__ = ["App", "AppState"]

log = logging.getLogger("statekit.app")

ENGINES = ("changelog", "spark", "local")


class AppStateError(StatekitError):
    """An operation that the application's current state does not allow."""


def _progress_dict(p) -> dict:
    if isinstance(p, dict):
        return p
    for attr in ("asDict", "as_dict"):
        fn = getattr(p, attr, None)
        if callable(fn):
            try:
                return fn()
            except Exception:
                pass
    j = getattr(p, "json", None)
    if j is not None:
        import json

        try:
            return json.loads(j() if callable(j) else j)
        except Exception:
            pass
    return {}


def _norm_progress(p) -> dict:
    """One micro-batch's progress with the engine's names (batch_id, num_input_rows, ...), whether it
    came as Spark's own JSON names or already translated by the engine."""
    d = _progress_dict(p)
    if "batch_id" in d:
        return d
    dur = d.get("durationMs") or {}
    return {
        "batch_id": d.get("batchId"),
        "num_input_rows": d.get("numInputRows") or 0,
        "input_rows_per_second": d.get("inputRowsPerSecond") or 0.0,
        "processed_rows_per_second": d.get("processedRowsPerSecond") or 0.0,
        "batch_duration_ms": (dur.get("triggerExecution") if isinstance(dur, dict) else None) or 0,
        "timestamp": d.get("timestamp"),
    }


class App:
    """A stateful stream-processing application (the Kafka Streams ``KafkaStreams`` object).

    ``engine``: ``"changelog"`` (default: statekit's RocksDB stores + changelog topics, run on Spark),
    ``"local"`` (the same stores and protocol, micro-batches in a worker subprocess, no Spark), or
    ``"spark"`` (Spark's own RocksDB state store: returns a ``statekit.engine.spark_native.NativeApp``,
    which has no instances or standby replicas; ``engine_options`` passes its knobs, e.g.
    ``{"min_deltas_for_snapshot": 5, "maintenance_interval": "5s"}``).

    ``commit_interval`` (seconds) is Kafka Streams' ``commit.interval.ms``: tasks commit at the end of
    every micro-batch, so it is the default micro-batch trigger interval (``start(trigger=...)``
    overrides it)."""

    def __new__(cls, *args, **kwargs):
        import inspect

        if cls is App:
            try:
                bound = inspect.signature(App.__init__).bind(None, *args, **kwargs)
            except TypeError:
                return super().__new__(cls)
            a = bound.arguments
            if a.get("engine") == "spark":
                if a.get("instances", 1) != 1 or a.get("standby_replicas", 0) != 0:
                    raise StatekitError("engine='spark' (Spark's own state store) runs one instance "
                                        "without standby replicas; use engine='changelog' for those")
                from statekit.engine.spark_native import NativeApp

                kw = {k: a[k] for k in ("bootstrap", "partitions", "state_dir") if k in a}
                kw.update(a.get("engine_options") or {})
                return NativeApp(a["name"], **kw)
        return super().__new__(cls)

    def __init__(self, name: str, bootstrap: Optional[str] = None, partitions: int = 4,
                 instances: int = 1, standby_replicas: int = 0, state_dir: Optional[str] = None,
                 commit_interval: Optional[float] = None, cache_bytes: int = 10 << 20,
                 engine: Any = "changelog", engine_options: Optional[dict] = None):
        if not name or any(c in name for c in "/\\ "):
            raise StatekitError(f"app name {name!r} must be a non-empty word (it prefixes topic names)")
        if int(partitions) < 1:
            raise StatekitError(f"partitions must be >= 1, got {partitions}")
        if int(instances) < 1:
            raise StatekitError(f"instances must be >= 1, got {instances}")
        if int(standby_replicas) < 0:
            raise StatekitError(f"standby_replicas must be >= 0, got {standby_replicas}")
        self.name = name
        self.partitions = int(partitions)
        self.instances = int(instances)
        self.standby_replicas = int(standby_replicas)
        self.commit_interval = commit_interval
        self.cache_bytes = int(cache_bytes)
        self.engine_name = engine if isinstance(engine, str) else type(engine).__name__
        if isinstance(engine, str) and engine not in ENGINES:
            raise StatekitError(f"unknown engine {engine!r}; use one of {', '.join(ENGINES)}")
        self._engine_arg = engine
        self._engine = None
        self.layout = Layout(state_dir or default_state_dir(name), name)
        self.state_dir = self.layout.root
        self._bootstrap_arg = bootstrap
        self._bootstrap: Optional[str] = None
        self._kafka = None

        from statekit.topology import TopologyBuilder

        self.builder = TopologyBuilder()
        self.plan = None

        self._life = Lifecycle()
        self._life.add_listener(self._on_state_change)
        self._lock = threading.RLock()
        self.assignment: Optional[Assignment] = None
        self._query = None
        self._run = None
        self._run_opts: dict = {}
        self._generation = 0
        self._started_at = 0.0
        self._start_batch: Optional[int] = None
        self._stopping = False
        self._error: Optional[StatekitError] = None
        self._crash: Optional[dict] = None  # the pending/last crash request
        self.crashes: list[dict] = []
        self.restarts: list[dict] = []
        self._monitor: Optional[threading.Thread] = None
        self._monitor_stop = threading.Event()
        self._progress: dict[int, dict] = {}
        self._records_processed = 0

        self._standbys = None
        self._router = None
        self._event_cond = threading.Condition()
        self._callbacks: list[Callable[[dict], None]] = []
        self._event_reader = None
        self._publisher = None
        self._restores: list[dict] = []
        self._restored_tasks: set[int] = set()
        self._task_errors: list[dict] = []

    # ------------------------------------------------------------------ topology front
    def stream(self, topic: str, *args, **kwargs):
        """A ``KStream`` over ``topic`` (delegates to the ``TopologyBuilder``)."""
        return self.builder.stream(topic, *args, **kwargs)

    def table(self, topic: str, *args, **kwargs):
        """A ``KTable`` over ``topic`` materialized in ``store=`` (delegates to the builder)."""
        return self.builder.table(topic, *args, **kwargs)

    def __getattr__(self, item):
        # Other DSL / processor-API entry points of the builder (add_source, add_processor, ...).
        if item.startswith("_") or item in ("builder",):
            raise AttributeError(item)
        builder = self.__dict__.get("builder")
        if builder is not None and hasattr(builder, item):
            return getattr(builder, item)
        raise AttributeError(f"'App' object has no attribute {item!r}")

    def describe(self):
        """The topology graph (nodes and edges): ``Plan.describe()``."""
        plan = self.plan or self._compile()
        try:
            return plan.describe(self.name)
        except TypeError:
            return plan.describe()

    def _compile(self):
        try:
            plan = self.builder.compile()
        except StatekitError:
            raise
        except Exception as exc:  # a DSL mistake: one line
            raise TopologyError(f"the topology does not compile: {type(exc).__name__}: {exc}") from None
        return plan

    # ------------------------------------------------------------------ state
    @property
    def state(self) -> AppState:
        return self._life.state

    @property
    def error(self) -> Optional[StatekitError]:
        """The one-line error that put the app in ERROR (None otherwise)."""
        return self._error

    def wait_for_state(self, states, timeout: Optional[float] = 60) -> AppState:
        return self._life.wait_for(states, timeout)

    def _on_state_change(self, new: AppState, old: AppState) -> None:
        ev = {"type": "state", "app": self.name, "state": str(new), "old": str(old),
              "ts": time.time(), "generation": self._generation}
        if self._life.reason:
            ev["reason"] = self._life.reason
        self._publish(ev)

    @property
    def bootstrap(self) -> str:
        if self._bootstrap is None:
            from statekit.kafka import resolve_bootstrap

            try:
                self._bootstrap = resolve_bootstrap(self._bootstrap_arg)
            except StatekitError:
                raise
            except Exception as exc:
                raise BrokerUnreachable(f"could not reach or start a Kafka broker ({exc}); "
                                        f"pass bootstrap= or set STATEKIT_BOOTSTRAP") from None
        return self._bootstrap

    @property
    def kafka(self):
        if self._kafka is None:
            from statekit.kafka import Kafka

            self._kafka = Kafka(self.bootstrap)
        return self._kafka

    # ------------------------------------------------------------------ engine
    def _get_engine(self):
        if self._engine is not None:
            return self._engine
        e = self._engine_arg
        if not isinstance(e, str):
            self._engine = e
        elif e == "changelog":
            from statekit.engine.spark import SparkEngine

            self._engine = SparkEngine()
        elif e == "local":
            # Spark's micro-batch contract without Spark; batches run in a worker subprocess
            from statekit.runtime.local_query import LocalStreamingEngine

            self._engine = LocalStreamingEngine()
        else:  # "spark" never gets here: App(engine="spark") is a NativeApp (see __new__)
            raise StatekitError(f"unknown engine {e!r}: use 'changelog' (Kafka changelogs, the default), "
                                "'spark' (Spark's own RocksDB state store) or 'local' (no Spark)")
        return self._engine

    def _spark_engine(self) -> bool:
        e = self._get_engine()
        return type(e).__module__.startswith("statekit.engine.spark")

    def changelog_topic(self, store: str) -> str:
        return f"{self.name}-{store}-changelog"

    @property
    def events_topic(self) -> str:
        return f"{self.name}-events"

    def _store_specs(self) -> dict:
        plan = self.plan or self._compile()
        return {s.name: s for s in plan.stores}

    def store_spec(self, store: str):
        """The ``StoreSpec`` of ``store`` (``.kind`` says which query reads it: ``query`` for
        "kv", ``query_window`` for "window")."""
        from statekit.runtime.queries import UnknownStore

        specs = self._store_specs()
        if store not in specs:
            known = ", ".join(sorted(specs)) or "none"
            raise UnknownStore(f"no store named '{store}' in app '{self.name}' (stores: {known})")
        return specs[store]

    def _check_topics(self, plan, sink: str) -> None:
        topics = self.kafka.topics()
        for src in plan.sources:
            topic = getattr(src, "topic", src if isinstance(src, str) else None)
            if topic and topic not in topics:
                raise UnknownTopic(
                    f"source topic '{topic}' does not exist on {self.bootstrap}; create it first "
                    f"(statekit produce / Kafka.ensure_topic('{topic}', partitions={self.partitions}))")
        from statekit.state.task import changelog_configs

        for spec in plan.stores:
            if not getattr(spec, "logging", True):
                continue
            self.kafka.ensure_topic(self.changelog_topic(spec.name), self.partitions,
                                    changelog_configs(spec))
        if sink == "kafka":
            for s in getattr(plan, "sinks", ()) or ():
                topic = getattr(s, "topic", s if isinstance(s, str) else None)
                if topic and topic not in topics:
                    self.kafka.ensure_topic(topic, self.partitions)

    # ------------------------------------------------------------------ assignment
    def _state_report(self, alive) -> dict:
        """task -> {instance: lag or None}: who holds a local copy of each task's state."""
        from statekit.state import checkpoint as cp_mod

        ends = {}
        out: dict[int, dict] = {t: {} for t in range(self.partitions)}
        for i in alive:
            for t in self.layout.tasks_on_disk(i):
                if t >= self.partitions:
                    continue
                lag = None
                cp = cp_mod.read(self.layout.task_dir(i, t), warn=lambda m: None)
                if cp:
                    try:
                        lag = 0
                        for store, c in cp.items():
                            topic = self.changelog_topic(store)
                            if topic not in ends:
                                ends[topic] = self.kafka.end_offsets(topic)
                            lag += max(0, ends[topic].get(t, 0) - c.changelog_offset)
                    except Exception:
                        lag = None
                out[t][i] = lag
        return out

    def _check_partitions(self) -> None:
        saved = self.layout.load_assignment()
        if saved and saved.get("partitions") not in (None, self.partitions) and \
                os.path.isdir(self.layout.checkpoint_dir):
            raise StatekitError(
                f"app '{self.name}' ran with {saved['partitions']} partitions before (state in "
                f"{self.state_dir}); tasks cannot be re-partitioned: keep partitions="
                f"{saved['partitions']}, or use another name / state_dir")

    def _previous_assignment(self) -> Optional[Assignment]:
        if self.assignment is not None:
            return self.assignment
        saved = self.layout.load_assignment()
        if saved and saved.get("partitions") == self.partitions:
            try:
                return Assignment.from_dict(saved)
            except Exception:
                return None
        return None

    def _reassign(self) -> tuple[Assignment, list]:
        alive = list(range(self.instances))
        prev = self._previous_assignment()
        state = self._state_report(alive)
        new = assign(self.partitions, alive, self.standby_replicas, previous=prev, state=state)
        mv = moves(prev, new, state)
        self.assignment = new
        body = new.to_dict()
        body["partitions"] = self.partitions
        body["instances"] = self.instances
        self.layout.save_assignment(body)
        return new, mv

    def assignment_frame(self):
        """The current assignment as a DataFrame: task, instance, role."""
        import pandas as pd

        rows = []
        if self.assignment is not None:
            for t in self.assignment.tasks:
                for inst, role in self.assignment.instances_of(t):
                    rows.append({"task": t, "instance": inst, "role": role,
                                 "state_dir": self.layout.task_dir(inst, t)})
        return pd.DataFrame(rows, columns=["task", "instance", "role", "state_dir"])

    # ------------------------------------------------------------------ start / stop
    def start(self, trigger=None, max_records_per_trigger: Optional[int] = None, sink: str = "memory",
              starting_offsets: str = "earliest") -> "App":
        """Compile, assign, start standbys and the engine query. Returns self."""
        with self._lock:
            if self.state not in (AppState.CREATED, AppState.NOT_RUNNING):
                raise AppStateError(f"app '{self.name}' is {self.state}; start() needs CREATED or "
                                    f"NOT_RUNNING (use restart() after a crash)")
            if sink not in ("memory", "kafka", "none"):
                raise StatekitError(f"unknown sink {sink!r}; use 'memory' or 'kafka'")
            self.plan = self._compile()
            _ = self.bootstrap
            self._check_topics(self.plan, sink)
            self._run_opts = dict(trigger=trigger, max_records_per_trigger=max_records_per_trigger,
                                  sink=sink, starting_offsets=starting_offsets)
            self.layout.ensure(self.instances)
            crash_mod.clear(self.layout.control_dir)  # a directive left over from another session
            self._check_partitions()
            self._start_events()
            self._reassign()
            self._start_standbys(promote=False)
            self._launch(kind="start")
        return self

    def _launch(self, kind: str) -> None:
        from statekit.engine.spec import RunSpec

        a = self.assignment
        self._generation += 1
        self._error = None
        self._restored_tasks = set()
        self._progress = {}
        opts = self._run_opts
        sink = opts.get("sink") or "memory"
        run = RunSpec(
            app=self.name,
            bootstrap=self.bootstrap,
            plan=self.plan,
            partitions=self.partitions,
            checkpoint_dir=self.layout.checkpoint_dir,
            control_dir=self.layout.control_dir,
            state_dirs={t: self.layout.instance_dir(i) for t, i in a.active.items()},
            task_instances=dict(a.active),
            cache_bytes=self.cache_bytes,
            commit_interval=self.commit_interval,
            # a task commits at the end of every micro-batch, so Kafka Streams' commit interval is
            # the micro-batch trigger interval here
            trigger=opts.get("trigger") if opts.get("trigger") is not None else self.commit_interval,
            max_records_per_trigger=opts.get("max_records_per_trigger"),
            starting_offsets=opts.get("starting_offsets") or "earliest",
            sink=sink,
            extra={"generation": self._generation},
        )
        self._run = run
        self._started_at = time.time()
        self._stopping = False
        self._life.transition(AppState.RESTORING, f"{kind}: generation {self._generation}")
        try:
            self._query = self._get_engine().start(run)
        except StatekitError as exc:
            self._fail(exc)
            raise
        except Exception as exc:
            err = self._one_line(exc)
            self._fail(err)
            raise err from None
        try:
            self._start_batch = self._query.last_batch_id
        except Exception:
            self._start_batch = None
        self._start_monitor()

    def _fail(self, err: StatekitError) -> None:
        self._error = err
        self._life.transition(AppState.ERROR, str(err), strict=False)

    def stop(self, timeout: float = 60) -> None:
        """Stop the query gracefully (the current batch finishes and commits), the standbys, the
        readers. The state directories stay; ``start()`` or ``restart()`` continues from them."""
        with self._lock:
            if self.state in (AppState.CREATED,):
                self._life.transition(AppState.NOT_RUNNING, "stopped before start")
                self._close_helpers()
                return
            if self.state == AppState.NOT_RUNNING:
                if self._standbys is not None:
                    self._standbys.stop_all()
                self._close_router()
                self._close_helpers()
                return
            self._stopping = True
            self.cancel_crash()
            self._life.transition(AppState.PENDING_SHUTDOWN, "stop()", strict=False)
            q, self._query = self._query, None
            if q is not None:
                try:
                    q.stop()
                except Exception as exc:
                    log.info("stopping the query: %s", exc)
            self._stop_monitor()
            if self._standbys is not None:
                self._standbys.stop_all()
            self._close_router()
            self._life.transition(AppState.NOT_RUNNING, "stopped", strict=False)
            self._close_helpers()

    def close(self) -> None:
        """stop() and release every client (event reader, Kafka connection)."""
        self.stop()

    def reset(self, topics: bool = True) -> dict:
        """Forget everything this application did (like ``kafka-streams-application-reset``): delete
        its state directories, engine checkpoint and control files and, with ``topics``, its
        changelog and events topics. The app must not run. Input and output topics are left alone."""
        import shutil

        with self._lock:
            if self.state.is_running() or self.state == AppState.PENDING_SHUTDOWN:
                raise AppStateError(f"app '{self.name}' is {self.state}: stop() it before reset()")
            deleted_topics = []
            if topics:
                plan = self.plan or self._compile()
                names = [self.changelog_topic(s.name) for s in plan.stores]
                names.append(self.changelog_topic("_task"))
                names.append(self.events_topic)
                for t in names:
                    try:
                        if self.kafka.delete_topic(t, missing_ok=True):
                            deleted_topics.append(t)
                    except StatekitError:
                        raise
                    except Exception as exc:
                        log.info("could not delete %s: %s", t, exc)
                self._close_helpers()
            shutil.rmtree(self.layout.root, ignore_errors=True)
            self.assignment = None
            return {"state_dir": self.layout.root, "topics": deleted_topics}

    def _close_helpers(self) -> None:
        self._stop_events()
        if self._kafka is not None:
            try:
                self._kafka.close()
            except Exception:
                pass
            self._kafka = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------------------ monitor
    def _start_monitor(self) -> None:
        self._stop_monitor()
        self._monitor_stop = threading.Event()
        t = threading.Thread(target=self._monitor_loop, args=(self._query, self._monitor_stop),
                             name=f"statekit-monitor-{self.name}", daemon=True)
        self._monitor = t
        t.start()

    def _stop_monitor(self) -> None:
        if self._monitor is not None:
            self._monitor_stop.set()
            if self._monitor is not threading.current_thread():
                self._monitor.join(timeout=10)
            self._monitor = None

    def _monitor_loop(self, query, stop: threading.Event) -> None:
        while not stop.wait(0.1):
            try:
                self._poll_progress(query)
                active = query.is_active
            except Exception:
                active = False
            if not active:
                if self._stopping or stop.is_set():
                    return
                self._on_query_died(query)
                return
            if self.state == AppState.RESTORING and self._looks_restored(query):
                self._life.transition(AppState.RUNNING, "tasks restored", strict=False)

    def _poll_progress(self, query) -> None:
        if query is None:
            return
        try:
            recent = list(query.recent_progress or [])
        except Exception:
            return
        for p in recent:
            d = _norm_progress(p)
            bid = d.get("batch_id")
            if bid is None or bid < 0:
                continue
            key = (self._generation, bid)
            if key not in self._progress:
                self._progress[key] = d
                self._records_processed += int(d.get("num_input_rows") or 0)

    def _looks_restored(self, query) -> bool:
        # a batch completed in this generation, or every active task reported its restore end
        if any(g == self._generation for g, _ in self._progress):
            return True
        try:
            last = query.last_batch_id
        except Exception:
            last = None
        if last is not None and (self._start_batch is None or last > self._start_batch):
            return True
        if self.assignment is not None and self._restored_tasks >= set(self.assignment.active):
            return True
        # nothing to do at all: the query looked at its sources and found no data
        fn = getattr(query, "caught_up", None)
        if callable(fn):
            try:
                return bool(fn())
            except Exception:
                return False
        try:
            st = query.status() if callable(getattr(query, "status", None)) else {}
        except Exception:
            st = {}
        return bool(st) and not st.get("isTriggerActive", True) and not st.get("isDataAvailable", True) \
            and "waiting" in str(st.get("message", "")).lower()

    def _one_line(self, exc) -> StatekitError:
        """Any failure of the query as one ``StatekitError`` line; a processor that raised inside a
        worker becomes a ``ProcessorError`` (the task runner's ERROR event carries its line)."""
        if isinstance(exc, StatekitError):
            err = exc
        elif isinstance(exc, str):
            err = StatekitError(exc)
        else:
            try:
                from statekit.engine.spark.session import one_line

                err = one_line(exc)
            except Exception:
                err = StatekitError(f"{type(exc).__name__}: {exc}")
        if isinstance(err, (ProcessorError, UnknownTopic, BrokerUnreachable, TopologyError)):
            return err
        for ev in reversed(self._task_errors):
            if ev.get("generation") == self._generation and ev.get("error"):
                return ProcessorError(ev["error"])
        if "failed on key=" in str(err):
            return ProcessorError(str(err))
        return err

    def _on_query_died(self, query) -> None:
        exc = None
        try:
            exc = query.exception()
        except Exception as e:  # the engine could not even tell
            exc = e
        crash = self._crash
        if crash is not None and crash.get("status") in ("pending", "aborting"):
            claim = crash_mod.claimed(self.layout.control_dir, crash["id"]) if crash.get("id") else None
            if claim is not None or crash.get("status") == "aborting":
                crash["status"] = "claimed"
                crash["claim"] = claim
        if crash is not None and crash.get("status") == "claimed" and not crash.get("applied"):
            self._apply_crash(crash)
            err = StatekitError(f"instance {crash['instance']} crashed ({crash['mode']}) "
                                f"{self._crash_where(crash)}; restart() to recover")
        elif exc is None and self._finite_trigger():
            # trigger "once" / "availableNow": the query ends when the input available at start
            # is processed
            self._life.transition(AppState.PENDING_SHUTDOWN, "the query finished", strict=False)
            if self._standbys is not None:
                self._standbys.stop_all()
            self._life.transition(AppState.NOT_RUNNING, "the query finished", strict=False)
            return
        elif exc is None:
            err = StatekitError("the query stopped on its own; restart() to run it again")
        else:
            # the task runner's ERROR event (a processor that raised) may trail the failure a bit
            deadline = time.monotonic() + 2.0
            while time.monotonic() < deadline and not any(
                    e.get("generation") == self._generation for e in self._task_errors):
                time.sleep(0.05)
            err = self._one_line(exc)
        self._fail(err)

    def _finite_trigger(self) -> bool:
        t = (self._run_opts or {}).get("trigger")
        return isinstance(t, str) and t.replace("_", "").lower() in ("availablenow", "available", "once")

    @staticmethod
    def _crash_where(crash: dict) -> str:
        c = crash.get("claim") or {}
        if c.get("task") is not None:
            return f"in task {c['task']} at {crash['point']} of batch {c.get('batch')}"
        return "while idle" if crash.get("status") == "claimed" and crash.get("aborted") else ""

    # ------------------------------------------------------------------ crash
    def crash(self, mode: str = "process", instance: Optional[int] = None,
              after_records: Optional[int] = None, point: str = "records", wait: bool = True,
              timeout: float = 120) -> dict:
        """Kill an instance's work for real.

        With ``after_records=n`` (or another ``point``: "before_send", "after_ack", "after_rocksdb",
        "mid_restore"), write the crash directive: the first task of that instance that has processed
        ``n`` records of one batch (or reaches the commit/restore point) SIGKILLs its own worker
        process mid-batch. With ``after_records=None`` and ``point="records"``: when the query is
        idle, abort it hard (the worker is killed, nothing in flight is committed); while a batch
        runs, die at that batch's next commit on the instance ("before_send").
        ``mode="disk-loss"`` also deletes the instance's state directories once the worker is dead.
        With ``wait`` (default) block until the query is dead when the crash was triggered now; a
        directive that needs more input returns at once (feed it; the app goes to ERROR when it fires).
        Returns the crash record.
        """
        if mode not in ("process", "disk-loss"):
            raise StatekitError(f"unknown crash mode {mode!r}; use 'process' or 'disk-loss'")
        if point not in crash_mod.POINTS:
            raise StatekitError(f"unknown crash point {point!r}; use one of {', '.join(crash_mod.POINTS)}")
        with self._lock:
            if instance is None:
                instance = self._default_crash_instance()
            instance = int(instance)
            if not 0 <= instance < self.instances:
                raise StatekitError(f"instance {instance} does not exist (instances: 0..{self.instances - 1})")
            rec = {"mode": mode, "instance": instance, "point": point, "after_records": after_records,
                   "requested_at": time.time(), "generation": self._generation, "status": "pending",
                   "deleted": [], "tasks": self.assignment.active_tasks(instance) if self.assignment else []}
            self.crashes.append(rec)
            q = self._query
            running = q is not None and self.state in (AppState.RESTORING, AppState.RUNNING) and _active(q)
            if not running:
                # nothing runs: the instance "dies" with nothing in flight
                rec["status"] = "claimed"
                rec["aborted"] = True
                self._crash = rec
                if q is not None:
                    self._abort_query(q)
                self._apply_crash(rec)
                if self.state not in (AppState.ERROR, AppState.NOT_RUNNING, AppState.CREATED):
                    self._fail(StatekitError(f"instance {instance} crashed ({mode}) while stopped"))
                return rec
            self._crash = rec
            idle = after_records is None and point == "records" and self._is_idle(q)
            if after_records is None and point == "records" and not idle:
                # a batch is in flight: die at its next commit on that instance (the task runner
                # reads a "records" directive only when a batch starts)
                point = rec["point"] = "before_send"
            if idle:
                rec["status"] = "aborting"
                rec["aborted"] = True
                self._abort_query(q)
            else:
                d = crash_mod.write_directive(self.layout.control_dir, instance, point,
                                              0 if after_records is None else after_records, mode)
                rec["id"] = d["id"]
        if wait and rec.get("status") == "aborting":
            self._life.wait_for([AppState.ERROR, AppState.NOT_RUNNING], timeout)
        return rec

    def _arm_crash(self, mode: str, instance: Optional[int], point: str, after_records) -> dict:
        if mode not in ("process", "disk-loss"):
            raise StatekitError(f"unknown crash mode {mode!r}; use 'process' or 'disk-loss'")
        instance = self._default_crash_instance() if instance is None else int(instance)
        rec = {"mode": mode, "instance": instance, "point": point, "after_records": after_records,
               "requested_at": time.time(), "generation": self._generation, "status": "pending",
               "deleted": [], "tasks": self.assignment.active_tasks(instance) if self.assignment else []}
        d = crash_mod.write_directive(self.layout.control_dir, instance, point,
                                      0 if after_records is None else after_records, mode)
        rec["id"] = d["id"]
        self.crashes.append(rec)
        self._crash = rec
        return rec

    @property
    def pending_crash(self) -> Optional[dict]:
        """The crash directive written but not fired yet (None otherwise)."""
        rec = self._crash
        return rec if rec is not None and rec.get("status") == "pending" else None

    def cancel_crash(self) -> Optional[dict]:
        """Withdraw a crash directive that has not fired yet; returns it (None if there was none)."""
        with self._lock:
            rec = self._crash
            if rec is None or rec.get("status") != "pending":
                return None
            crash_mod.clear(self.layout.control_dir)
            if rec.get("id") and crash_mod.claimed(self.layout.control_dir, rec["id"]) is not None:
                return None  # it fired meanwhile
            rec["status"] = "withdrawn"
            self._crash = None
            return rec

    def _default_crash_instance(self) -> int:
        if self.assignment is None:
            return 0
        counts = {i: len(self.assignment.active_tasks(i)) for i in range(self.instances)}
        return max(sorted(counts), key=lambda i: counts[i])

    def _is_idle(self, q) -> bool:
        fn = getattr(q, "is_idle", None)
        if callable(fn):
            try:
                return bool(fn())
            except Exception:
                pass
        st = getattr(q, "status", None)
        try:
            st = st() if callable(st) else st
            st = _progress_dict(st) if st is not None else None
        except Exception:
            st = None
        if st:
            # Spark probes its sources in short triggers even when there is nothing to do: the query
            # is idle when no data is waiting (a running batch has isDataAvailable=True)
            return not st.get("isDataAvailable", False)
        return True

    def _abort_query(self, q) -> None:
        fn = getattr(q, "abort", None) or getattr(q, "stop")
        try:
            fn()
        except Exception as exc:
            log.info("abort: %s", exc)

    def _apply_crash(self, rec: dict) -> None:
        """After the worker died: the crashed instance's standbys die with it; disk-loss wipes it."""
        if rec.get("applied"):
            return
        rec["applied"] = True
        rec["died_at"] = time.time()
        inst = rec["instance"]
        if self._standbys is not None:
            self._standbys.stop_instance(inst)
        self._close_router()
        if rec["mode"] == "disk-loss":
            self.layout.wait_unlocked(inst, timeout=15)  # no live process still holds a task
            rec["deleted"] = self.layout.wipe_instance(inst)
        self._publish({"type": "crash", "app": self.name, "instance": inst, "mode": rec["mode"],
                       "point": rec["point"], "task": (rec.get("claim") or {}).get("task"),
                       "deleted": len(rec["deleted"]), "ts": time.time()})

    # ------------------------------------------------------------------ restart
    def restart(self, timeout: float = 120, wait: bool = False, crash_during: Optional[dict] = None) -> dict:
        """Reassign tasks, promote standbys whose task moves to them, start a new query from the same
        engine checkpoint. Tasks restore when they open (checkpoint, scratch, or a standby's lag).
        Returns the restart record (moves, promotions); ``restore_summary()`` fills in as tasks
        report. With ``wait``, block until RUNNING (or ERROR).

        ``crash_during={"mode": ..., "instance": ..., "point": "mid_restore"}`` arms a crash
        directive for the new query before it starts (a crash during the restore itself)."""
        if crash_during is not None:
            cd = dict(crash_during)
            if cd.get("mode", "process") not in ("process", "disk-loss"):
                raise StatekitError(f"unknown crash mode {cd.get('mode')!r}; use 'process' or 'disk-loss'")
            if cd.get("point", "mid_restore") not in crash_mod.POINTS:
                raise StatekitError(f"unknown crash point {cd.get('point')!r}; use one of "
                                    f"{', '.join(crash_mod.POINTS)}")
        with self._lock:
            if self.state in (AppState.RESTORING, AppState.RUNNING):
                # restart of a live app: the hard way (as if the process was killed while idle)
                q = self._query
                if q is not None:
                    self._stopping = True
                    self._abort_query(q)
                    self._fail(StatekitError("restarted"))
            if self.state == AppState.CREATED:
                raise AppStateError(f"app '{self.name}' was never started; use start()")
            q, self._query = self._query, None
            self._stop_monitor()
            if q is not None and _active(q):
                self._abort_query(q)
            crash = self._crash
            if crash is not None and not crash.get("applied"):
                # a directive that never fired: withdraw it
                crash_mod.clear(self.layout.control_dir)
                crash["status"] = "withdrawn"
            crash_mod.clear(self.layout.control_dir)
            self._crash = None
            old = self.assignment
            self.layout.ensure(self.instances)
            self._start_events()
            new, mv = self._reassign()
            promotions = []
            if self._standbys is not None:
                for t in new.tasks:
                    inst = new.active[t]
                    if self._standbys.has(t, inst):
                        info = self._standbys.promote(t, inst)
                        promotions.append(info)
            self._start_standbys(promote=False)
            rec = {"at": time.time(), "generation": self._generation + 1,
                   "moves": [m.__dict__ for m in mv], "promotions": promotions,
                   "old": old.to_dict() if old else None, "new": new.to_dict()}
            self.restarts.append(rec)
            self._publish({"type": "rebalance", "app": self.name, "assignment": new.to_dict(),
                           "promotions": [{"task": p.get("task"), "instance": p.get("instance"),
                                           "lag": p.get("lag")} for p in promotions],
                           "ts": time.time()})
            if crash_during:
                cd = dict(crash_during)
                self._arm_crash(cd.get("mode", "process"), cd.get("instance"),
                                cd.get("point", "mid_restore"), cd.get("after_records", 0))
            self._launch(kind="restart")
            if self._crash is not None:
                self._crash["generation"] = self._generation
        if wait:
            self._life.wait_for([AppState.RUNNING, AppState.ERROR], timeout)
        return rec

    # ------------------------------------------------------------------ progress
    def process_all_available(self, timeout: Optional[float] = None) -> bool:
        """Block until the query has processed every record available now. Returns True; False when
        the query died of an induced crash meanwhile (the app is in ERROR). Any other failure raises
        its one-line error."""
        q = self._query
        if q is None:
            raise AppStateError(f"app '{self.name}' is {self.state}: nothing is running")
        err = None
        try:
            if timeout is None:
                q.process_all_available()
            else:
                q.process_all_available(timeout=timeout)
        except Exception as exc:
            err = exc
        if err is None and _active(q):
            if self.state == AppState.RESTORING:
                self._life.transition(AppState.RUNNING, "caught up", strict=False)
            return True
        if err is not None:
            # a failure leaves the query inactive within moments; a timeout leaves it running
            deadline = time.monotonic() + 5.0
            while _active(q) and time.monotonic() < deadline:
                time.sleep(0.05)
            if _active(q):
                return False
        # the query died: let the monitor (or us) settle the state
        self._life.wait_for([AppState.ERROR, AppState.NOT_RUNNING], 30)
        if self.state == AppState.NOT_RUNNING:
            return True
        if self._crash is not None and self._crash.get("applied"):
            return False
        if self._error is not None:
            raise self._error
        raise self._one_line(err) if err is not None else StatekitError("the query stopped")

    def wait_until_idle(self, timeout: float = 60) -> bool:
        """``process_all_available`` with a timeout; True when idle, False on timeout or crash."""
        try:
            return self.process_all_available(timeout=timeout)
        except AppStateError:
            return False

    def metrics(self) -> dict:
        """Records processed, input rate, last batch latency (from the engine's progress)."""
        q = self._query
        if q is not None:
            self._poll_progress(q)
        prog = dict(self._progress)  # the monitor thread adds to it
        last = prog[max(prog)] if prog else {}
        return {
            "state": str(self.state),
            "generation": self._generation,
            "records_processed": self._records_processed,
            "batches": len(prog),
            "last_batch_id": last.get("batch_id"),
            "last_batch_records": last.get("num_input_rows"),
            "input_rate": last.get("input_rows_per_second"),
            "processed_rate": last.get("processed_rows_per_second"),
            "last_batch_latency_ms": last.get("batch_duration_ms"),
        }

    def output(self):
        """The memory sink's rows (pandas: batch, topic, key, value decoded with the sink serdes),
        when started with ``sink="memory"``. Rows are kept per micro-batch id, so a batch replayed
        after a crash replaces its first attempt's rows."""
        import pandas as pd

        run = self._run
        if run is None or run.sink != "memory":
            raise StatekitError("no memory sink output: start(sink='memory') first")
        eng = self._get_engine()
        pdf = eng.output(run)
        rows = []
        for batch, topic, kb, vb in zip(pdf["batch"], pdf["topic"], pdf["key"], pdf["value"]):
            ks, vs = self.plan.sink_serdes(topic)
            rows.append((int(batch), topic, None if kb is None else ks.from_bytes(bytes(kb)),
                         None if vb is None else vs.from_bytes(bytes(vb))))
        return pd.DataFrame(rows, columns=["batch", "topic", "key", "value"])

    # ------------------------------------------------------------------ standbys & lag
    def _start_standbys(self, promote: bool = False) -> None:
        if self.standby_replicas <= 0 or self.instances < 2:
            return
        from statekit.runtime.standbys import StandbyManager

        if self._standbys is None:
            self._standbys = StandbyManager(self)
        self._standbys.sync(self.assignment)

    @property
    def standbys(self):
        """The ``StandbyManager`` (None without standby replicas)."""
        return self._standbys

    def lag(self):
        """pandas DataFrame: task, instance, role, store, checkpoint_offset, changelog_end, lag."""
        from statekit.runtime.lag import lag_frame

        return lag_frame(self)

    # ------------------------------------------------------------------ queries
    def _get_router(self):
        from statekit.runtime.queries import QueryRouter

        if self._router is None:
            self._router = QueryRouter(self)
        return self._router

    def _close_router(self) -> None:
        r, self._router = self._router, None
        if r is not None:
            r.close()

    def key_owner(self, store: str, key):
        """``KeyOwner(task, instance, role)`` of the active copy of ``key`` in ``store``."""
        return self._get_router().key_owner(store, key)

    def key_owners(self, store: str, key) -> list:
        """Every copy of ``key``: the active and the standbys."""
        return self._get_router().key_owners(store, key)

    def query(self, store: str, key, stale: bool = False):
        """The value of ``key`` in ``store`` (None when absent), read from the owning task's RocksDB
        through a secondary instance while the query runs. ``stale=True`` may answer from a standby
        when the active copy is unavailable."""
        return self._get_router().get(store, key, stale=stale)

    def query_range(self, store: str, lo, hi, stale: bool = False):
        """``[(key, value)]`` with ``lo <= key <= hi`` in serialized-key order, over all tasks."""
        return self._get_router().range(store, lo, hi, stale=stale)

    def query_all(self, store: str, stale: bool = False):
        """The whole store as a DataFrame (key, value, task, instance)."""
        return self._get_router().all(store, stale=stale)

    def query_window(self, store: str, key, t_from: int, t_to: int, stale: bool = False):
        """``[(window_start, value)]`` of a windowed store for ``t_from <= start <= t_to``."""
        return self._get_router().window(store, key, t_from, t_to, stale=stale)

    # ------------------------------------------------------------------ events
    def _start_events(self) -> None:
        if self._event_reader is not None:
            return
        from statekit.runtime.events import EventReader

        self._event_reader = EventReader(self.bootstrap, self.name, start="end")
        self._event_reader.subscribe(self._handle_event)

    def _stop_events(self) -> None:
        r, self._event_reader = self._event_reader, None
        if r is not None:
            try:
                r.close()
            except Exception:
                pass
        p, self._publisher = self._publisher, None
        if p is not None:
            try:
                p.close()
            except Exception:
                pass

    def _handle_event(self, ev: dict) -> None:
        """Called by the EventReader's thread for every event of the app's events topic."""
        typ = ev.get("type")
        gen = ev.get("generation")
        if typ == "task_opened" and gen == self._generation and ev.get("task") is not None:
            self._restored_tasks.add(int(ev["task"]))
        if typ in ("task_opened", "restore_end") and ev.get("task") is not None:
            self._restores.append(ev)
        if typ == "state_change" and ev.get("new") == "ERROR" and ev.get("task") is not None:
            self._task_errors.append(ev)
        with self._event_cond:
            self._event_cond.notify_all()
        for cb in list(self._callbacks):
            try:
                cb(ev)
            except Exception as exc:  # a callback never stops the reader
                log.info("event callback failed: %s", exc)

    def _publish(self, ev: dict) -> None:
        """App-level events (state changes, crashes, rebalances) go to the same topic."""
        try:
            if self._publisher is None:
                if self._bootstrap is None:
                    return  # no broker yet: nothing to publish to (CREATED -> NOT_RUNNING)
                from statekit.runtime.events import EventPublisher

                self._publisher = EventPublisher(self._bootstrap, self.name)
            self._publisher.publish(ev)
        except Exception as exc:
            log.info("could not publish an event: %s", exc)

    def events(self, since: Optional[float] = None, types=None) -> list:
        """The events read so far from ``<app>-events`` since start() (dicts, oldest first),
        optionally from time ``since`` on and of some ``types``."""
        r = self._event_reader
        if r is None:
            return []
        return r.events(since_ts=since, types=types)

    def events_frame(self, **kw):
        import pandas as pd

        return pd.DataFrame(self.events(**kw))

    def wait_for_event(self, predicate: Callable[[dict], bool], timeout: float = 30) -> Optional[dict]:
        """The first event (already read or new) matching ``predicate``, or None after ``timeout``."""
        r = self._event_reader
        if r is None:
            return None
        return r.wait_for(predicate, timeout)

    def on_event(self, callback: Callable[[dict], None]) -> Callable[[dict], None]:
        """Call ``callback(event)`` for every event from now on (from the reader thread)."""
        self._callbacks.append(callback)
        return callback

    def restore_summary(self, generation: Optional[int] = None):
        """Restores seen in the events, one row per (task, store) that replayed changelog records:
        generation, task, instance, store, source (checkpoint / scratch / meta / standby), records
        (changelog records read, data + markers), applied, seconds, start/end offsets. Default: the
        latest generation (the last start or restart)."""
        import pandas as pd

        gen = self._generation if generation is None else generation
        promoted = {}
        for r in self.restarts:
            if r.get("generation") == gen:
                promoted = {(p["task"], p["instance"]): p for p in r.get("promotions", ())}
        rows = []
        for ev in list(self._restores):
            if ev.get("type") != "restore_end" or ev.get("generation") != gen:
                continue
            t, i = ev.get("task"), ev.get("instance")
            src = ev.get("from")
            if (t, i) in promoted:
                src = "standby"
            rows.append({"generation": gen, "task": t, "instance": i, "store": ev.get("store"),
                         "source": src, "records": ev.get("restored"), "applied": ev.get("applied"),
                         "seconds": ev.get("duration_s"), "start_offset": ev.get("start_offset"),
                         "end_offset": ev.get("end_offset"), "batch": ev.get("batch")})
        cols = ["generation", "task", "instance", "store", "source", "records", "applied", "seconds",
                "start_offset", "end_offset", "batch"]
        return pd.DataFrame(rows, columns=cols)

    def task_opens(self, generation: Optional[int] = None):
        """``task_opened`` events of a generation: how each task found its state."""
        import pandas as pd

        gen = self._generation if generation is None else generation
        rows = [{"task": e.get("task"), "instance": e.get("instance"), "batch": e.get("batch"),
                 "replayed_from": e.get("replayed_from"), "open_ms": e.get("open_ms")}
                for e in list(self._restores) if e.get("type") == "task_opened" and e.get("generation") == gen]
        return pd.DataFrame(rows, columns=["task", "instance", "batch", "replayed_from", "open_ms"])

    def __repr__(self) -> str:
        return (f"App({self.name!r}, state={self.state}, partitions={self.partitions}, "
                f"instances={self.instances}, standby_replicas={self.standby_replicas})")


def _active(q) -> bool:
    try:
        return bool(q.is_active)
    except Exception:
        return False
