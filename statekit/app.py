"""``statekit.App``: one stream-processing application, the Kafka Streams ``KafkaStreams`` façade.

    app = statekit.App("wordcount", partitions=4, instances=3, standby_replicas=1)
    words = app.stream("lines").flat_map_values(str.split).group_by(lambda k, w: w)
    words.count(store="counts").to_stream().to("counts")
    app.start()
    app.process_all_available()
    app.query("counts", "the")
    app.kill(1)                      # instance 1 dies; its tasks move, the others keep going
    app.revive(1)
    app.add_instance()               # a warmup replica catches up before a task moves to it
    app.crash("disk-loss", instance=0, after_records=10)

How the pieces fit (docs/ARCHITECTURE.md): the App is the front of a ``topology.TopologyBuilder``.
``start()`` compiles it to a ``Plan``, starts the instances — child processes, each with its own
state directory — through the ``runtime.coordinator.Coordinator`` (membership, assignment,
rebalances, warmups, deaths), and one engine query per sub-topology. The engine reads the input and
hands every task's micro-batch to the instance that owns the task (``worker.router``); the instances
process, commit, restore and publish events (``statekit.events``), which the App reads back.
"""
from __future__ import annotations

import difflib
import logging
import threading
import time
from typing import Any, Callable, Optional

from statekit import events as ev
from statekit.contracts import Layout, TaskId, changelog_topic, default_state_dir, events_topic
from statekit.errors import (
    BrokerUnreachable, ProcessorError, StatekitError, TopologyError, UnknownTopic,
)
from statekit.runtime.coordinator import Coordinator, MembershipError, Settings
from statekit.runtime.lifecycle import AppState, Lifecycle
from statekit.worker import crash as crash_mod

__all__ = ["App", "AppState", "AppStateError", "MembershipError"]

log = logging.getLogger("statekit.app")

ENGINES = ("changelog", "local")


class AppStateError(StatekitError):
    """An operation that the application's current state does not allow."""


class CopartitionError(StatekitError):
    """A source topic's partition count is not the application's task count."""


DEFAULT_PARTITIONS = 4
# A micro-batch reads at most this many records (start(max_records_per_trigger=0): no bound), so a
# big backlog shows its progress batch by batch instead of one silent first batch
DEFAULT_MAX_RECORDS_PER_TRIGGER = 250_000


class NoLiveInstance(StatekitError):
    """Every instance is dead: nothing processes until one is revived (or the app restarted)."""


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


def engine_is_local(engine) -> bool:
    return isinstance(engine, str) and engine == "local"


def _active(q) -> bool:
    try:
        return bool(q.is_active)
    except Exception:  # noqa: BLE001
        return False


class App:
    """A stateful stream-processing application run by ``instances`` instance processes.

    ``engine``: ``"changelog"`` (default: Spark Structured Streaming reads and shuffles, statekit's
    RocksDB stores and changelog topics keep the state) or ``"local"`` (the same, with micro-batches
    planned in this process instead of Spark). Spark's own RocksDB state store is
    ``statekit.NativeApp``.

    ``commit_interval`` (seconds) is Kafka Streams' ``commit.interval.ms``: tasks commit at the end
    of every micro-batch, so it is the default micro-batch trigger (``start(trigger=...)`` overrides
    it). ``acceptable_recovery_lag``, ``max_warmup_replicas`` and ``probing_rebalance_interval``
    (seconds) are Kafka Streams' high-availability assignment settings. ``restore_rate``
    (records/s) holds every restore to that pace, so that it lasts long enough to watch.

    ``processing_guarantee``: ``"exactly_once"`` (the default: each task's commit of a micro-batch —
    changelog records, commit markers, sink and repartition records — is one Kafka transaction, so
    a read_committed consumer sees every output once, whatever crashes) or ``"at_least_once"``
    (no transactions: a crash may repeat a batch's output). Against a broker without transactions
    the app says so once and runs at-least-once.

    Spark (docs/ARCHITECTURE.md, "Running on a cluster"): ``spark`` is a SparkSession to use (a
    cluster's, a managed notebook's; statekit leaves it running at ``stop()``), else statekit's
    own (master ``$STATEKIT_SPARK_MASTER``, default ``local[2]``). ``placement``: ``"instances"``
    (instance processes beside the driver), ``"executors"`` (tasks run in Spark's Python workers on
    the executors, state on their local disks, queries on the driver's query replicas) or
    ``"auto"`` (executors when the master is not local). ``checkpoint_location``: where the Spark
    checkpoint goes (a shared path or an object store URI; required on a cluster).
    ``executor_state_dir``: the tasks' state root on every executor host (default
    ``$STATEKIT_EXECUTOR_STATE_DIR``, else under Spark's local dirs)."""

    def __init__(self, name: str, bootstrap: Optional[str] = None, partitions: Optional[int] = None,
                 instances: int = 1, standby_replicas: int = 0, state_dir: Optional[str] = None,
                 commit_interval: Optional[float] = None, cache_bytes: int = 10 << 20,
                 engine: Any = "changelog", acceptable_recovery_lag: int = 10_000,
                 max_warmup_replicas: int = 2, probing_rebalance_interval: float = 10.0,
                 restore_rate: Optional[float] = None,
                 processing_guarantee: str = "exactly_once", spark: Any = None,
                 placement: str = "auto", checkpoint_location: Optional[str] = None,
                 executor_state_dir: Optional[str] = None):
        if not name or any(c in name for c in "/\\ "):
            raise StatekitError(f"app name {name!r} must be a non-empty word (it prefixes topic names)")
        for what, v, low in (("partitions", 1 if partitions is None else partitions, 1),
                             ("instances", instances, 1),
                             ("standby_replicas", standby_replicas, 0),
                             ("acceptable_recovery_lag", acceptable_recovery_lag, 0),
                             ("max_warmup_replicas", max_warmup_replicas, 0)):
            if int(v) < low:
                raise StatekitError(f"{what} must be >= {low}, got {v}")
        if restore_rate is not None and float(restore_rate) <= 0:
            raise StatekitError(f"restore_rate must be > 0 records/s, got {restore_rate}")
        self.restore_rate = float(restore_rate) if restore_rate else None
        if float(probing_rebalance_interval) <= 0:
            raise StatekitError(f"probing_rebalance_interval must be > 0 seconds, got "
                                f"{probing_rebalance_interval}")
        if engine == "spark":
            raise StatekitError("engine='spark' is Spark's own state store: use "
                                "statekit.NativeApp(name, ...) (one instance, no standby replicas)")
        if isinstance(engine, str) and engine not in ENGINES:
            raise StatekitError(f"unknown engine {engine!r}; use one of {', '.join(ENGINES)} "
                                f"(or statekit.NativeApp for Spark's own state store)")
        if processing_guarantee not in ("exactly_once", "at_least_once"):
            raise StatekitError(f"processing_guarantee must be 'exactly_once' or 'at_least_once', "
                                f"not {processing_guarantee!r}")
        self.processing_guarantee = processing_guarantee
        self.name = name
        self._partitions = None if partitions is None else int(partitions)
        self._partitions_given = partitions is not None
        self.initial_instances = int(instances)
        self.settings = Settings(standby_replicas=int(standby_replicas),
                                 acceptable_recovery_lag=int(acceptable_recovery_lag),
                                 max_warmup_replicas=int(max_warmup_replicas),
                                 probing_rebalance_interval=float(probing_rebalance_interval))
        self.commit_interval = commit_interval
        self.cache_bytes = int(cache_bytes)
        self.engine_name = engine if isinstance(engine, str) else type(engine).__name__
        self._engine_arg = engine
        self._engine = None
        self.layout = Layout(state_dir or default_state_dir(name), name)
        self.state_dir = self.layout.root
        self._bootstrap_arg = bootstrap
        self._bootstrap: Optional[str] = None
        self._kafka = None
        self._txn_support: Optional[bool] = None
        self._init_placement(spark, placement, checkpoint_location, executor_state_dir)

        from statekit.topology import TopologyBuilder

        self.builder = TopologyBuilder()
        self.plan = None
        self._subplans: dict = {}

        from statekit.runtime import supervisor

        supervisor.warm(instances)   # spare processes: start() does not wait for imports
        self._life = Lifecycle()
        self._life.add_listener(self._on_state_change)
        self._lock = threading.RLock()
        self._coordinator: Optional[Coordinator] = None
        self._queries: dict = {}           # sub-topology -> running query
        self.runs: dict = {}               # sub-topology -> its engine.spec.RunSpec
        self._run_opts: dict = {}
        self._started_at = 0.0
        self._stopping = False
        self._error: Optional[StatekitError] = None
        self._crash: Optional[dict] = None
        self.crashes: list[dict] = []
        self.restarts: list[dict] = []
        self._monitor: Optional[threading.Thread] = None
        self._monitor_stop = threading.Event()
        self._progress: dict = {}
        self._records_processed = 0
        self._router = None
        self._callbacks: list[Callable[[ev.Event], None]] = []
        self._event_reader = None
        self._publisher = None
        self._task_errors: list[ev.TaskFailed] = []

    # ------------------------------------------------------------------ topology front
    def stream(self, topic: str, *args, **kwargs):
        """A ``KStream`` over ``topic`` (delegates to the ``TopologyBuilder``)."""
        return self.builder.stream(topic, *args, **kwargs)

    def table(self, topic: str, *args, **kwargs):
        """A ``KTable`` over ``topic`` materialized in ``store=`` (delegates to the builder)."""
        return self.builder.table(topic, *args, **kwargs)

    def __getattr__(self, item):
        # the builder's other DSL / processor-API entry points (add_source, add_processor, ...)
        if item.startswith("_") or item in ("builder",):
            raise AttributeError(item)
        builder = self.__dict__.get("builder")
        if builder is not None and hasattr(builder, item):
            return getattr(builder, item)
        raise AttributeError(f"'App' object has no attribute {item!r}")

    def validate(self) -> "App":
        """Compile the topology and check its source topics now (what ``start()`` would refuse,
        refused here, in one line): ``%%statekit app`` calls it when the cell runs."""
        self._set_plan(self._compile())
        self.check_topics()
        return self

    def describe(self):
        """The topology graph (nodes and edges): ``Plan.describe()``."""
        plan = self.plan or self._compile()
        try:
            return plan.describe(self.name)
        except TypeError:
            return plan.describe()

    def _compile(self):
        try:
            try:
                plan = self.builder.compile(application=self.name)
            except TypeError:
                plan = self.builder.compile()
        except StatekitError:
            raise
        except Exception as exc:  # a DSL mistake: one line
            raise TopologyError(f"the topology does not compile: {type(exc).__name__}: {exc}") from None
        return plan

    def _set_plan(self, plan) -> None:
        self.plan = plan
        subs = list(getattr(plan, "subtopologies", None) or [plan])
        self._subplans = {i: p for i, p in enumerate(subs)}

    @property
    def subplans(self) -> dict:
        if not self._subplans:
            self._set_plan(self.plan or self._compile())
        return self._subplans

    @property
    def partitions(self) -> int:
        """Tasks per sub-topology (= changelog partitions). A task reads its own partition of every
        source topic, so by default it is the source topics' partition count."""
        if self._partitions is None:
            counts = self._source_partitions()
            if counts:
                self._partitions = max(counts.values())
                self.check_copartitioned(counts)
            else:
                self._partitions = DEFAULT_PARTITIONS
        return self._partitions

    @partitions.setter
    def partitions(self, n: int) -> None:
        self._partitions = int(n)

    def _source_partitions(self) -> dict:
        """{external source topic: its partition count} (topics that exist)."""
        topics = self.kafka.topics()
        plan = self.plan or self._compile()
        repart = set(getattr(plan, "repartition_topics", ()) or ())
        out = {}
        for p in self.subplans.values():
            for src in p.sources:
                t = getattr(src, "topic", None)
                if t and t not in repart and t in topics:
                    out[t] = int(topics[t])
        return out

    def check_copartitioned(self, counts: Optional[dict] = None) -> None:
        """Every source topic must have one partition per task: a task reads its own partition of
        each (Kafka Streams' co-partitioning). Refused in one line that says what to do."""
        counts = self._source_partitions() if counts is None else counts
        n = self.partitions
        for topic, have in sorted(counts.items()):
            if have != n:
                given = "" if self._partitions_given else " (the largest source topic's)"
                raise CopartitionError(
                    f"source topic '{topic}' has {have} partition(s) but app '{self.name}' runs "
                    f"{n} task(s) per sub-topology{given}: a task reads its own partition of every "
                    f"source, so each needs {n}; give the app partitions={have}, or create "
                    f"'{topic}' with {n} partitions (%statekit produce {topic} --partitions {n} "
                    f"...)")

    def tasks(self) -> list[TaskId]:
        """Every task: one per partition of every sub-topology."""
        return [TaskId(s, p) for s in sorted(self.subplans) for p in range(self.partitions)]

    # ------------------------------------------------------------------ state
    @property
    def state(self) -> AppState:
        return self._life.state

    @property
    def error(self) -> Optional[StatekitError]:
        """The one-line error that put the app in ERROR (None otherwise)."""
        return self._error

    @property
    def generation(self) -> int:
        """The current rebalance generation (0 before the first assignment)."""
        c = self._coordinator
        return (c.generation or 0) if c is not None else 0

    @property
    def instances(self) -> int:
        """The number of live instances (before start: the number it will start)."""
        c = self._coordinator
        return len(c.live()) if c is not None and not c.stopped else self.initial_instances

    @property
    def standby_replicas(self) -> int:
        return self.settings.standby_replicas

    def wait_for_state(self, states, timeout: Optional[float] = 60) -> AppState:
        return self._life.wait_for(states, timeout)

    def _transition(self, new: AppState, reason: str) -> bool:
        return self._life.transition(new, reason, strict=False)

    def _on_state_change(self, new: AppState, old: AppState) -> None:
        self._publish(ev.StateChanged(state=str(new), old=str(old), reason=self._life.reason or "",
                                      generation=self.generation))

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

    # ------------------------------------------------------------------ names
    def changelog_topic(self, store: str) -> str:
        return changelog_topic(self.name, store)

    @property
    def events_topic(self) -> str:
        return events_topic(self.name)

    def _store_specs(self) -> dict:
        return {s.name: s for p in self.subplans.values() for s in p.stores}

    def store_spec(self, store: str):
        """The ``StoreSpec`` of ``store`` (``.kind`` says which query reads it: ``query`` for
        "kv", ``query_window`` for "window")."""
        from statekit.runtime.queries import UnknownStore

        specs = self._store_specs()
        if store not in specs:
            known = ", ".join(sorted(specs)) or "none"
            raise UnknownStore(f"no store named '{store}' in app '{self.name}' (stores: {known})")
        return specs[store]

    def store_subtopology(self, store: str) -> int:
        """The sub-topology whose tasks own ``store``."""
        self.store_spec(store)
        for sub, p in self.subplans.items():
            if any(s.name == store for s in p.stores):
                return sub
        return 0

    def check_topics(self) -> None:
        """Raise ``UnknownTopic`` (one line, with the closest existing name) for a source topic that
        does not exist. ``%%statekit app`` calls it when the cell runs, not only at start."""
        plan = self.plan or self._compile()
        topics = self.kafka.topics()
        repart = set(getattr(plan, "repartition_topics", ()) or ())
        for p in self.subplans.values():
            for src in p.sources:
                topic = getattr(src, "topic", src if isinstance(src, str) else None)
                if topic and topic not in topics and topic not in repart:
                    close = difflib.get_close_matches(topic, [t for t in topics if not t.startswith("__")],
                                                      n=1, cutoff=0.6)
                    hint = f"did you mean '{close[0]}'? " if close else ""
                    raise UnknownTopic(
                        f"source topic '{topic}' does not exist on {self.bootstrap}: {hint}create it "
                        f"first (%statekit produce {topic} ... in a notebook, or "
                        f"statekit.datagen.produce('{topic}', ...))")
        self.check_copartitioned()

    def _ensure_topics(self, sink: str) -> None:
        from statekit.state.task import changelog_configs
        from statekit.worker.task import store_specs

        self.check_topics()
        topics = self.kafka.topics()
        for sub, p in self.subplans.items():
            for spec in store_specs(p, sub):
                if getattr(spec, "logging", True):
                    self.kafka.ensure_topic(self.changelog_topic(spec.name), self.partitions,
                                            changelog_configs(spec))
        for t in getattr(self.plan, "repartition_topics", ()) or ():
            self.kafka.ensure_topic(t, self.partitions)
        if sink == "kafka":
            for p in self.subplans.values():
                for s in getattr(p, "sinks", ()) or ():
                    topic = getattr(s, "topic", s if isinstance(s, str) else None)
                    if topic and topic not in topics:
                        self.kafka.ensure_topic(topic, self.partitions)

    def _check_partitions(self) -> None:
        import json

        try:
            with open(self.layout.control.assignment) as f:
                saved = json.load(f)
        except (FileNotFoundError, ValueError):
            return
        if saved.get("partitions") not in (None, self.partitions):
            raise StatekitError(
                f"app '{self.name}' ran with {saved['partitions']} partitions before (state in "
                f"{self.state_dir}); tasks cannot be re-partitioned: keep partitions="
                f"{saved['partitions']}, or use another name / state_dir")

    # ------------------------------------------------------------------ engine
    def _get_engine(self):
        if self._engine is not None:
            return self._engine
        e = self._engine_arg
        if not isinstance(e, str):
            self._engine = e
        elif e == "changelog":
            self._engine = self._spark_engine()
        else:
            from statekit.engine.local_stream import LocalStreamingEngine

            self._engine = LocalStreamingEngine()
        return self._engine

    def _worker_spec(self, sink: str):
        from statekit.worker.task import WorkerSpec

        return WorkerSpec(application=self.name, bootstrap=self.bootstrap, plans=dict(self.subplans),
                          partitions=self.partitions, control_dir=self.layout.control_dir,
                          cache_bytes=self.cache_bytes, sink=sink, exactly_once=self.exactly_once,
                          repartition_topics=tuple(getattr(self.plan, "repartition_topics", ()) or ()))

    @property
    def exactly_once(self) -> bool:
        """Whether commits are transactions: asked for, and the broker has transactions."""
        if self.processing_guarantee != "exactly_once":
            return False
        if self._txn_support is None:
            self._txn_support = bool(self.kafka.supports_transactions())
            if not self._txn_support:
                log.warning("statekit: %s has no Kafka transactions; app '%s' runs at-least-once "
                            "(a crash may repeat a micro-batch's output)", self.bootstrap, self.name)
        return self._txn_support

    def _launch_queries(self) -> None:
        from statekit.engine.spec import RunSpec

        opts = self._run_opts
        trigger = opts.get("trigger") if opts.get("trigger") is not None else self.commit_interval
        engine = self._get_engine()
        for sub, plan in sorted(self.subplans.items()):
            q = self._queries.get(sub)
            if q is not None and _active(q):
                continue
            run = RunSpec(app=self.name, bootstrap=self.bootstrap, plan=plan,
                          partitions=self.partitions,
                          checkpoint_dir=self._checkpoint_dir(sub),
                          control_dir=self.layout.control_dir, subtopology=sub, trigger=trigger,
                          max_records_per_trigger=opts.get("max_records_per_trigger"),
                          starting_offsets=opts.get("starting_offsets") or "earliest",
                          query_name=self.name if sub == 0 else f"{self.name}_{sub}",
                          extra=self._run_extra())
            self.runs[sub] = run
            try:
                self._queries[sub] = engine.start(run)
            except StatekitError:
                raise
            except Exception as exc:
                raise self._one_line(exc) from None

    # ------------------------------------------------------------------ start / stop
    def start(self, trigger=None, max_records_per_trigger: Optional[int] = None, sink: str = "memory",
              starting_offsets: str = "earliest") -> "App":
        """Compile, start the instances (they restore their tasks) and the engine. Returns self.

        ``sink``: ``"memory"`` (``output()``), ``"kafka"`` (the plan's ``.to()`` topics) or ``"none"``.
        ``max_records_per_trigger``: records per micro-batch at most (default
        ``DEFAULT_MAX_RECORDS_PER_TRIGGER``; 0: no bound)."""
        with self._lock:
            if self.state not in (AppState.CREATED, AppState.NOT_RUNNING):
                raise AppStateError(f"app '{self.name}' is {self.state}; start() needs CREATED or "
                                    f"NOT_RUNNING (restart() after a crash)")
            if sink not in ("memory", "kafka", "none"):
                raise StatekitError(f"unknown sink {sink!r}; use 'memory', 'kafka' or 'none'")
            self._boot_spark()
            self._set_plan(self._compile())
            _ = self.bootstrap
            self._ensure_topics(sink)
            if max_records_per_trigger is None:
                max_records_per_trigger = DEFAULT_MAX_RECORDS_PER_TRIGGER
            self._run_opts = dict(trigger=trigger, max_records_per_trigger=max_records_per_trigger
                                  or None, sink=sink, starting_offsets=starting_offsets)
            self.layout.control.ensure()
            self._check_partitions()
            crash_mod.clear(self.layout.control_dir)  # a directive left over from another session
            spec = self._worker_spec(sink)
            self._start_events()
            self._error = None
            self._transition(AppState.RESTORING, "start")
            self._coordinator = self._new_coordinator(spec, sink)
            try:
                self._coordinator.start(self.initial_instances,
                                        options={"restore_rate": self.restore_rate})
                self._started_at = time.time()
                self._stopping = False
                self._launch_queries()
            except StatekitError as exc:
                self._abort_all()
                self._fail(exc)
                raise
            self._start_monitor()
        return self

    def _fail(self, err: StatekitError) -> None:
        self._error = err
        self._transition(AppState.ERROR, str(err))

    def _abort_all(self) -> None:
        for q in list(self._queries.values()):
            self._abort_query(q)
        self._queries = {}
        if self._coordinator is not None:
            self._coordinator.abort()

    @staticmethod
    def _abort_query(q) -> None:
        fn = getattr(q, "abort", None) or getattr(q, "stop")
        try:
            fn()
        except Exception as exc:  # noqa: BLE001
            log.info("abort: %s", exc)

    def stop(self, timeout: float = 60) -> None:
        """Stop the queries gracefully (the batch in flight finishes and commits), then the instances
        (every task closes cleanly). The state stays; ``start()`` continues from it."""
        with self._lock:
            if self.state == AppState.CREATED:
                self._transition(AppState.NOT_RUNNING, "stopped before start")
                self._close_helpers()
                return
            if self.state == AppState.NOT_RUNNING:
                self._close_router()
                self._close_helpers()
                return
            self._stopping = True
            self.cancel_crash()
            self._transition(AppState.PENDING_SHUTDOWN, "stop()")
            self._stop_monitor()
            for q in list(self._queries.values()):
                try:
                    q.stop()
                except Exception as exc:  # noqa: BLE001
                    log.info("stopping the query: %s", exc)
            self._queries = {}
            if self._coordinator is not None:
                self._coordinator.stop()
            self._close_router()
            self._transition(AppState.NOT_RUNNING, "stopped")
            self._close_helpers()

    def close(self) -> None:
        """stop() and release every client (event reader, Kafka connection)."""
        self.stop()

    def reset(self, topics: bool = True) -> dict:
        """Forget everything this application did (like ``kafka-streams-application-reset``): delete
        its state directories, engine checkpoints and control files and, with ``topics``, its
        changelog, repartition and events topics. The app must not run. Input and output topics are
        left alone."""
        import shutil

        from statekit.worker.task import store_specs

        with self._lock:
            if self.state.is_running() or self.state == AppState.PENDING_SHUTDOWN:
                raise AppStateError(f"app '{self.name}' is {self.state}: stop() it before reset()")
            deleted_topics = []
            if topics:
                names = [self.changelog_topic(s.name) for sub, p in self.subplans.items()
                         for s in store_specs(p, sub) if getattr(s, "logging", True)]
                names += [self.changelog_topic("_task")]
                names += list(getattr(self.plan, "repartition_topics", ()) or ())
                names.append(self.events_topic)
                for t in dict.fromkeys(names):
                    try:
                        if self.kafka.delete_topic(t, missing_ok=True):
                            deleted_topics.append(t)
                    except StatekitError:
                        raise
                    except Exception as exc:  # noqa: BLE001
                        log.info("could not delete %s: %s", t, exc)
                self._close_helpers()
            self._reset_checkpoint_location()
            shutil.rmtree(self.layout.root, ignore_errors=True)
            self._coordinator = None
            return {"state_dir": self.layout.root, "topics": deleted_topics}

    def _close_helpers(self) -> None:
        self._stop_events()
        if self._kafka is not None:
            try:
                self._kafka.close()
            except Exception:  # noqa: BLE001
                pass
            self._kafka = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # ------------------------------------------------------------------ the monitor
    def _start_monitor(self) -> None:
        self._stop_monitor()
        self._monitor_stop = threading.Event()
        t = threading.Thread(target=self._monitor_loop, args=(self._monitor_stop,),
                             name=f"statekit-monitor-{self.name}", daemon=True)
        self._monitor = t
        t.start()

    def _stop_monitor(self) -> None:
        if self._monitor is not None:
            self._monitor_stop.set()
            if self._monitor is not threading.current_thread():
                self._monitor.join(timeout=10)
            self._monitor = None

    def _monitor_loop(self, stop: threading.Event) -> None:
        """Engine progress, engine failures, and the state the instances report (RUNNING once every
        task is open with nothing spooled; ERROR when a task failed)."""
        while not stop.wait(0.1):
            try:
                self._monitor_once()
            except Exception as exc:  # noqa: BLE001 - the monitor must not die silently
                log.info("monitor: %s", exc)

    _progress_at = 0.0

    def _monitor_once(self) -> None:
        if self._stopping:
            return
        # the engines' progress once a second (a Spark query answers through the JVM); a query
        # that ended is noticed at the same pace
        now = time.monotonic()
        if now - self._progress_at >= 1.0:
            self._progress_at = now
            for sub, q in list(self._queries.items()):
                self._poll_progress(sub, q)
                if not _active(q) and not self._stopping:
                    self._on_query_ended(sub, q)
                    return
        co = self._coordinator
        if co is None or co.stopped or self.state in (AppState.ERROR, AppState.PENDING_SHUTDOWN,
                                                      AppState.NOT_RUNNING):
            return
        failed = co.failed_tasks()
        if failed:
            t, i, err = failed[0]
            self._abort_queries()
            self._fail(ProcessorError(err or f"task {t} failed on instance {i}"))
            return
        if self.state in (AppState.RESTORING, AppState.REBALANCING) and co.tasks_ready():
            self._transition(AppState.RUNNING, "every task is open")

    def _on_membership(self, what: str) -> None:
        """The coordinator's news: a rebalance (REBALANCING until the moved tasks are open), or no
        live instance left (ERROR: nothing can process)."""
        if what == "no-live-instance":
            self._fail(NoLiveInstance(f"every instance of '{self.name}' is dead: restart() or "
                                      f"revive() one"))
        elif what == "rebalance" and self.state == AppState.RUNNING:
            self._transition(AppState.REBALANCING, f"generation {self.generation}")

    def _abort_queries(self) -> None:
        qs, self._queries = dict(self._queries), {}
        for q in qs.values():
            self._abort_query(q)

    def _on_query_ended(self, sub: int, q) -> None:
        exc = None
        try:
            exc = q.exception()
        except Exception as e:  # noqa: BLE001 - the engine could not even tell
            exc = e
        self._queries.pop(sub, None)
        if exc is None and self._finite_trigger():
            if not self._queries:
                self._wait_drained(60)
                self._stopping = True
                self._transition(AppState.PENDING_SHUTDOWN, "the query finished")
                if self._coordinator is not None:
                    self._coordinator.stop()
                self._transition(AppState.NOT_RUNNING, "the query finished")
            return
        err = StatekitError("the query stopped on its own; restart() to run it again") if exc is None \
            else self._one_line(exc)
        self._abort_queries()
        self._fail(err)

    def _finite_trigger(self) -> bool:
        t = (self._run_opts or {}).get("trigger")
        return isinstance(t, str) and t.replace("_", "").lower() in ("availablenow", "available", "once")

    def _poll_progress(self, sub: int, query) -> None:
        try:
            recent = list(query.recent_progress or [])
        except Exception:  # noqa: BLE001
            return
        for p in recent:
            d = _progress_dict(p)
            bid = d.get("batch_id")
            if bid is None or bid < 0:
                continue
            key = (sub, bid, d.get("timestamp"))
            if key not in self._progress:
                self._progress[key] = dict(d, subtopology=sub, seen_at=time.time())
                self._records_processed += self._input_records(d)

    def _input_records(self, progress: dict) -> int:
        """Records of the application's input topics in a micro-batch (a repartition topic's are
        the same records again, counted once where they came in)."""
        by_topic = progress.get("records_by_topic")
        if not by_topic:
            return int(progress.get("num_input_rows") or 0)
        repart = set(getattr(self.plan, "repartition_topics", ()) or ())
        return sum(n for t, n in by_topic.items() if t not in repart)

    def _one_line(self, exc) -> StatekitError:
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
        if isinstance(err, (ProcessorError, UnknownTopic, BrokerUnreachable, TopologyError)):
            return err
        for e in reversed(self._task_errors):
            if e.error:
                return ProcessorError(e.error)
        if "failed on key=" in str(err):
            return ProcessorError(str(err))
        return err

    # ------------------------------------------------------------------ progress
    def _require_started(self, what: str) -> Coordinator:
        co = self._coordinator
        if co is None or self.state == AppState.CREATED:
            raise AppStateError(f"app '{self.name}' is not started: start() it (or %statekit start "
                                f"{self.name}) before {what}")
        return co

    def _settled_false(self) -> bool:
        """False, once the app's state tells why: the coordinator marks the last member dead a
        moment before it tells the app, and whoever hears False should find ERROR already."""
        co = self._coordinator
        if co is not None and not co.stopped and not co.live():
            self._life.wait_for([AppState.ERROR, AppState.NOT_RUNNING], 10)
        return False

    def _wait_drained(self, timeout: Optional[float]) -> bool:
        """Until every task is open with nothing spooled; False when no instance can do it."""
        co = self._coordinator
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            if co is None or co.stopped:
                return True
            if not co.live():
                return self._settled_false()
            if self.state == AppState.ERROR:
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
        if not self._queries:
            if self.state == AppState.ERROR and self._error is not None:
                raise self._error
            raise AppStateError(f"app '{self.name}' is {self.state}: nothing is running")
        t0 = time.monotonic()

        def left():
            return None if timeout is None else max(1.0, timeout - (time.monotonic() - t0))

        repart = list(getattr(self.plan, "repartition_topics", ()) or ())
        while True:
            before = self._topic_ends(repart)
            for sub in sorted(self._queries):
                q = self._queries.get(sub)
                if q is None:
                    continue
                try:
                    if timeout is None:
                        q.process_all_available()
                    else:
                        q.process_all_available(timeout=left())
                except Exception as exc:  # noqa: BLE001
                    if not _active(q):
                        self._life.wait_for([AppState.ERROR, AppState.NOT_RUNNING], 30)
                        if self.state == AppState.NOT_RUNNING:
                            return True
                        raise self._error or self._one_line(exc) from None
                    return self._settled_false()
            if not self._wait_drained(left()):
                if self.state == AppState.ERROR and isinstance(self._error, ProcessorError):
                    raise self._error
                return False
            if self._topic_ends(repart) == before:
                break
            if timeout is not None and time.monotonic() - t0 > timeout:
                return False
        if self.state in (AppState.RESTORING, AppState.REBALANCING):
            self._transition(AppState.RUNNING, "caught up")
        return True

    def _topic_ends(self, topics: list) -> dict:
        return {t: self.kafka.end_offsets(t) for t in topics}

    def wait_until_idle(self, timeout: float = 60) -> bool:
        """``process_all_available`` with a timeout; True when idle, False otherwise."""
        try:
            return self.process_all_available(timeout=timeout)
        except AppStateError:
            return False

    def progress(self, since: Optional[float] = None) -> list:
        """The engines' micro-batch progress (dicts: batch_id, num_input_rows, input and processed
        rates, batch_duration_ms, subtopology, seen_at), oldest first; from time ``since`` on."""
        for sub, q in list(self._queries.items()):
            self._poll_progress(sub, q)
        out = list(self._progress.values())
        return out if since is None else [p for p in out if p["seen_at"] >= since]

    def metrics(self) -> dict:
        """Records processed, input rate, last batch latency (from the engines' progress)."""
        for sub, q in list(self._queries.items()):
            self._poll_progress(sub, q)
        prog = list(self._progress.values())
        last = prog[-1] if prog else {}
        return {
            "state": str(self.state),
            "generation": self.generation,
            "instances": self.instances,
            "records_processed": self._records_processed,
            "batches": len(prog),
            "last_batch_id": last.get("batch_id"),
            "last_batch_records": last.get("num_input_rows"),
            "input_rate": last.get("input_rows_per_second"),
            "processed_rate": last.get("processed_rows_per_second"),
            "last_batch_latency_ms": last.get("batch_duration_ms"),
        }

    def output(self):
        """The memory sink's rows (pandas: batch, task, topic, key, value decoded with the sink
        serdes), when started with ``sink="memory"``. Each task writes its outputs of each batch
        once, whichever instance processed it, so a batch replayed after a crash is not there twice."""
        import pandas as pd

        from statekit.worker.output import read_outputs

        if (self._run_opts or {}).get("sink", "memory") != "memory":
            raise StatekitError("no memory sink output: start(sink='memory') first")
        serdes = {}
        for p in self.subplans.values():
            for s in getattr(p, "sinks", ()) or ():
                serdes.setdefault(s.topic, p.sink_serdes(s.topic))
        rows = []
        for batch, task, topic, kb, vb in read_outputs(self.layout.control.output_dir()):
            ks, vs = serdes[topic]
            rows.append((batch, task, topic, None if kb is None else ks.from_bytes(kb),
                         None if vb is None else vs.from_bytes(vb)))
        return pd.DataFrame(rows, columns=["batch", "task", "topic", "key", "value"])

    # ------------------------------------------------------------------ membership
    def kill(self, instance: int) -> dict:
        """SIGKILL one instance now (a crash with nothing armed). Its tasks move to the live
        instances (standby holders first); the others keep processing. Refused for the last live
        instance: use ``crash()`` to crash a whole one-instance app."""
        co = self._require_started("kill")
        return co.kill(instance, mode="process", cause="kill")

    def revive(self, instance: int, disk: bool = True):
        """Start a dead instance again, with its disk (``disk=True``: its old state directories
        count as copies, possibly behind: warmups bring them up before tasks move back) or
        without. Returns the new assignment."""
        co = self._require_started("revive")
        a = co.revive(instance, disk=disk)
        if self.state == AppState.ERROR and isinstance(self._error, NoLiveInstance) and self._queries:
            self._error = None
            self._transition(AppState.REBALANCING, f"instance {instance} revived")
        return a

    def add_instance(self) -> int:
        """A new instance joins (empty disk); returns its number. Tasks it should run get warmup
        replicas there first and move once they have caught up."""
        return self._require_started("add_instance").add_instance()

    def remove_instance(self, instance: int, timeout: float = 120.0) -> None:
        """Gracefully remove an instance: its tasks move first (through warmups), then it stops."""
        self._require_started("remove_instance").remove_instance(instance, timeout=timeout)

    def scale(self, n: int) -> list[int]:
        """Add or remove instances until ``n`` are live (the highest numbers leave first)."""
        return self._require_started("scale").scale(n)

    def pause_standbys(self, instance: Optional[int] = None) -> list:
        """Stop the standby (and warmup) replicas from tailing — on one instance or all — so that
        their lag grows and a promotion visibly replays it. ``resume_standbys()`` undoes it."""
        return self._require_started("pause_standbys").pause_replicas(True, instance)

    def resume_standbys(self, instance: Optional[int] = None) -> list:
        return self._require_started("resume_standbys").pause_replicas(False, instance)

    @property
    def assignment(self):
        """The current ``runtime.assignor.Assignment`` (None before start)."""
        co = self._coordinator
        return co.assignment if co is not None else None

    def assignment_frame(self):
        """The current assignment as a DataFrame: task, instance, role, state_dir."""
        import pandas as pd

        rows = []
        a = self.assignment
        if a is not None:
            for t in a.tasks:
                for inst, role in a.roles(t):
                    rows.append({"task": str(t), "instance": inst, "role": role,
                                 "state_dir": self.layout.task_dir(inst, t)})
        return pd.DataFrame(rows, columns=["task", "instance", "role", "state_dir"])

    def instances_frame(self):
        """One row per instance: status (alive, leaving, dead, stopped), incarnation, pid and its
        active, standby and warmup tasks."""
        import pandas as pd

        co = self._coordinator
        rows = co.members_frame_rows() if co is not None else []
        return pd.DataFrame(rows, columns=["instance", "status", "incarnation", "pid", "active",
                                           "standby", "warmup", "reported"])

    @property
    def rebalances(self) -> list:
        """Every rebalance so far: generation, reason, moves, assignment."""
        co = self._coordinator
        return list(co.rebalances) if co is not None else []

    # ------------------------------------------------------------------ crash
    def crash(self, mode: str = "process", instance: Optional[int] = None,
              after_records: Optional[int] = None, point: str = "records", wait: bool = True,
              timeout: float = 60, subtopology: Optional[int] = None) -> dict:
        """Crash an instance for real.

        With ``after_records=n`` (or another ``point``: "before_send", "before_commit" (the batch's
        records are written, its transaction not committed), "after_ack", "after_rocksdb",
        "mid_restore"), write a crash directive: the first task of that instance that has processed
        ``n`` records of one batch (or reaches the commit or restore point) SIGKILLs its own
        instance. With ``after_records=None`` and ``point="records"`` the instance is killed now.
        ``subtopology`` limits a directive to that sub-topology's tasks.
        ``mode="disk-loss"`` also deletes the instance's state directories once it is dead. The
        other instances take over its tasks; a one-instance app goes to ERROR until ``restart()``.
        With ``wait`` a crash now returns when it is done. Returns the crash record.

        With ``placement="executors"``, ``instance`` is an executor number (None: any), the modes
        are "process" (the Python worker), "executor" (its executor JVM too) and "disk-loss" (and
        the executor's state directory), and a crash "now" fires before the first record of the
        next batch (docs/ARCHITECTURE.md, "Running on a cluster")."""
        if self.placement == "executors" and self._coordinator is not None:
            return self._crash_on_executors(mode, instance, after_records, point)
        if mode not in ("process", "disk-loss"):
            raise StatekitError(f"unknown crash mode {mode!r}; use 'process' or 'disk-loss'")
        if point not in crash_mod.POINTS:
            raise StatekitError(f"unknown crash point {point!r}; use one of {', '.join(crash_mod.POINTS)}")
        co = self._require_started("crash")
        with self._lock:
            if co.stopped or not co.live():
                raise AppStateError(f"app '{self.name}' has no live instance to crash: restart() it")
            if instance is None:
                instance = self._default_crash_instance()
            try:
                instance = int(instance)
            except (TypeError, ValueError):
                raise StatekitError(f"instance must be a number, got {instance!r}") from None
            m = co.members.get(instance)
            if m is None or not m.live:
                live = ", ".join(str(i) for i in co.live())
                raise StatekitError(f"instance {instance} is not a live instance (live: {live})")
            rec = {"mode": mode, "instance": instance, "point": point, "after_records": after_records,
                   "requested_at": time.time(), "generation": self.generation, "status": "pending",
                   "tasks": [str(t) for t in co.assignment.active_tasks(instance)]}
            self.crashes.append(rec)
            if after_records is None and point == "records":
                co.kill(instance, mode=mode, cause="crash", allow_last=True)
                rec.update(status="applied", applied=True, died_at=time.time())
                return rec
            d = crash_mod.write_directive(self.layout.control_dir, instance, point,
                                          0 if after_records is None else after_records, mode,
                                          subtopology)
            rec["id"] = d["id"]
            self._crash = rec
        return rec

    def _default_crash_instance(self) -> int:
        co = self._coordinator
        live = co.live()
        a = co.assignment
        return max(live, key=lambda i: (len(a.active_tasks(i)) if a else 0, -i))

    @property
    def pending_crash(self) -> Optional[dict]:
        """The crash directive written but not fired yet (None otherwise)."""
        rec = self._crash
        if rec is None or rec.get("status") != "pending":
            return None
        if crash_mod.claimed(self.layout.control_dir, rec["id"]) is not None:
            rec.update(status="applied", applied=True)
            return None
        return rec

    def cancel_crash(self) -> Optional[dict]:
        """Withdraw a crash directive that has not fired yet; returns it (None if there was none)."""
        with self._lock:
            rec = self._crash
            if rec is None or rec.get("status") != "pending":
                return None
            crash_mod.clear(self.layout.control_dir)
            if rec.get("id") and crash_mod.claimed(self.layout.control_dir, rec["id"]) is not None:
                rec.update(status="applied", applied=True)
                return None  # it fired meanwhile
            rec["status"] = "withdrawn"
            self._crash = None
            return rec

    # ------------------------------------------------------------------ restart
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
        if restore_rate is not None and float(restore_rate) <= 0:
            raise StatekitError(f"restore_rate must be > 0 records/s, got {restore_rate}")
        if crash_during is not None:
            cd = dict(crash_during)
            if cd.get("mode", "process") not in ("process", "disk-loss"):
                raise StatekitError(f"unknown crash mode {cd.get('mode')!r}; use 'process' or 'disk-loss'")
            if cd.get("point", "mid_restore") not in crash_mod.POINTS:
                raise StatekitError(f"unknown crash point {cd.get('point')!r}; use one of "
                                    f"{', '.join(crash_mod.POINTS)}")
        with self._lock:
            if self.state == AppState.CREATED or self._coordinator is None:
                raise AppStateError(f"app '{self.name}' was never started; use start()")
            if self.state in (AppState.NOT_RUNNING, AppState.PENDING_SHUTDOWN):
                raise AppStateError(f"app '{self.name}' is stopped; use start()")
            co = self._coordinator
            crash = self.cancel_crash()
            if crash is not None:
                crash["status"] = "withdrawn"
            co.options["restore_rate"] = float(restore_rate) if restore_rate else self.restore_rate
            if crash_during:
                cd = dict(crash_during)
                d = crash_mod.write_directive(self.layout.control_dir, cd.get("instance"),
                                              cd.get("point", "mid_restore"),
                                              cd.get("after_records") or 0, cd.get("mode", "process"))
                self._crash = {**cd, "id": d["id"], "status": "pending", "requested_at": time.time()}
                self.crashes.append(self._crash)
            gen0 = self.generation
            revived = co.restart_instances()
            self._error = None
            self._task_errors = []
            self._transition(AppState.RESTORING, "restart")
            self._launch_queries()
            if self._monitor is None:
                self._start_monitor()
            rec = {"at": time.time(), "generation": self.generation, "from_generation": gen0,
                   "revived": revived, "restore_rate": restore_rate,
                   "moves": [m for r in co.rebalances if r["generation"] > gen0 for m in r["moves"]]}
            self.restarts.append(rec)
        if wait:
            self._life.wait_for([AppState.RUNNING, AppState.ERROR], timeout)
        return rec

    # ------------------------------------------------------------------ lag & status
    def lag(self):
        """pandas DataFrame: task, instance, role, state, store, checkpoint_offset, changelog_end,
        lag — one row per copy (active, standby, warmup) of each store."""
        from statekit.runtime.lag import lag_frame, lag_rows

        co = self._coordinator
        if co is None:
            return lag_frame([])
        if self.placement == "executors":
            return lag_frame(co.lag_rows())
        return lag_frame(lag_rows(self.name, co.assignment, co.statuses(fresh=True), self.subplans,
                                  self.kafka, self.layout))

    def restore_forecast(self, apply_rate: Optional[float] = None, settle: float = 5.0):
        """Before anything crashes: how long each task's restore would take now — from its
        checkpoint, from a standby or warmup (a promotion), from scratch — and, per instance, what
        its death would cost ("if instance 0 died now: ≈ 4.1 s from scratch, 0.2 s from its
        standby"). ``apply_rate`` (records/s) defaults to the last full-speed restore's, else to
        a calibration the task's instance makes (a real restore of the changelog), which waits up
        to ``settle`` seconds for a quiet machine when it has no rate measured on one yet."""
        from statekit.runtime.forecasts import forecast, last_apply_rate

        co = self._require_started("restore_forecast")
        rate, source = apply_rate, "given"
        if rate is None:
            rate, source = last_apply_rate(self.events(types="restore_end")), "last restore"
        return forecast(self.name, co.assignment, co.statuses(fresh=True), self.subplans, self.kafka,
                        self.layout, apply_rate=rate, rate_source=source if rate else None,
                        calibrator=self._calibrator(co, settle))

    @staticmethod
    def _calibrator(co, settle: float):
        cal = getattr(co, "calibrate", None)
        return None if cal is None else (lambda topic, partition: cal(topic, partition, settle))

    def task_status(self) -> dict:
        """``{task: {instance, role, state, source, last_batch, backlog, ...}}`` as the instances
        report it (active tasks), for dashboards."""
        co = self._coordinator
        out = {}
        if co is None:
            return out
        for i, st in co.statuses().items():
            for t, row in (st.get("tasks") or {}).items():
                out[t] = dict(row, instance=i)
        return out

    # ------------------------------------------------------------------ queries
    def _get_router(self):
        from statekit.runtime.queries import QueryRouter

        if self._router is None:
            co = self._coordinator
            self._router = co.query_router(self) if self.placement == "executors" and co is not None \
                else QueryRouter(self)
        return self._router

    def _close_router(self) -> None:
        r, self._router = self._router, None
        if r is not None:
            r.close()

    def key_owner(self, store: str, key):
        """``KeyOwner`` of the active copy of ``key`` in ``store``: task, instance, role (unpacks
        as those three), its state (running, restoring, moving, dead, ...) and how far behind the
        changelog it is (``lag`` records, ``lag_s`` seconds of commits)."""
        return self._get_router().key_owner(store, key)

    def key_owners(self, store: str, key) -> list:
        """Every copy of ``key`` (the active, the standbys, the warmups), each a ``KeyOwner`` with
        its role, state and lag (Kafka Streams' ``queryMetadataForKey`` with each copy's
        ``LagInfo``)."""
        return self._get_router().key_owners(store, key)

    def query(self, store: str, key, stale: bool = False, wait: Optional[float] = None,
              with_lag: bool = False):
        """The value of ``key`` in ``store`` (None when absent), read from a copy of its task's
        RocksDB while the application runs.

        ``stale=False``: the answer holds every commit made before the call — from the active copy,
        or any copy at the changelog's end; while none is (a restore, a move, a dead owner) it waits
        up to ``wait`` seconds (default 5), then raises ``StaleRead``, one line naming the task, its
        state and its lag. ``stale=True``: at once, from the freshest copy there is (a standby, a
        warmup, the restoring store). ``with_lag=True`` returns an ``Answer``: ``.value`` and
        ``.copy`` (role, state, ``lag`` records, ``lag_s`` seconds behind)."""
        return self._get_router().get(store, key, stale=stale, wait=wait, with_lag=with_lag)

    def query_range(self, store: str, lo, hi, stale: bool = False, wait: Optional[float] = None,
                    with_lag: bool = False):
        """``[(key, value)]`` with ``lo <= key <= hi`` in serialized-key order, over all tasks
        (``stale``, ``wait``, ``with_lag``: as ``query``; an ``Answer`` has one copy per task)."""
        return self._get_router().range(store, lo, hi, stale=stale, wait=wait, with_lag=with_lag)

    def query_all(self, store: str, stale: bool = False, limit_per_task: Optional[int] = None,
                  wait: Optional[float] = None, with_lag: bool = False):
        """The whole store as a DataFrame (key, value, task, instance; window stores add
        window_start, session stores start and end, suppression buffers time, old, prior and
        timestamp); with ``limit_per_task``, at most that many rows of each task (in key order): a
        look at a million-key store without reading all of it. ``stale`` and ``wait`` as in
        ``query``; with ``stale=True`` (or ``with_lag=True``) each row also says the copy it came
        from: ``role``, ``state`` (running, restoring, ...), ``lag`` and ``lag_s``.
        ``.attrs["copies"]`` maps every task to that copy, a task without rows too."""
        return self._get_router().all(store, stale=stale, limit_per_task=limit_per_task, wait=wait,
                                      with_lag=with_lag)

    def query_window(self, store: str, key, t_from: int, t_to: int, stale: bool = False,
                     wait: Optional[float] = None, with_lag: bool = False):
        """``[(window_start, value)]`` of a windowed store for ``t_from <= start <= t_to``
        (``stale``, ``wait``, ``with_lag``: as ``query``)."""
        return self._get_router().window(store, key, t_from, t_to, stale=stale, wait=wait,
                                         with_lag=with_lag)

    # ------------------------------------------------------------------ events
    def _start_events(self) -> None:
        if self._event_reader is not None:
            return
        from statekit.event_bus import EventReader

        self._event_reader = EventReader(self.bootstrap, self.name, start="end")
        self._event_reader.subscribe(self._handle_event)

    def _stop_events(self) -> None:
        r, self._event_reader = self._event_reader, None
        if r is not None:
            try:
                r.close()
            except Exception:  # noqa: BLE001
                pass
        self._publisher = None

    def _handle_event(self, e: ev.Event) -> None:
        """Called by the EventReader's thread for every event of the app's events topic."""
        if isinstance(e, ev.TaskFailed):
            self._task_errors.append(e)
        elif isinstance(e, ev.Crashed) and self._crash is not None and \
                e.directive == self._crash.get("id"):
            self._crash.update(status="applied", applied=True, claim={"task": e.task, "batch": e.batch})
        for cb in list(self._callbacks):
            try:
                cb(e)
            except Exception as exc:  # noqa: BLE001 - a callback never stops the reader
                log.info("event callback failed: %s", exc)

    def _publish(self, e: ev.Event) -> None:
        """The control side's events (state changes, membership, rebalances) go to the same topic."""
        try:
            if self._publisher is None:
                if self._bootstrap is None:
                    return  # no broker yet: nothing to publish to (CREATED -> NOT_RUNNING)
                from statekit.event_bus import EventPublisher

                self._publisher = EventPublisher(self._bootstrap, self.name)
            self._publisher.publish(e)
        except Exception as exc:  # noqa: BLE001
            log.info("could not publish an event: %s", exc)

    def events(self, since: Optional[float] = None, types=None) -> list:
        """The events (``statekit.events`` records) read since start(), oldest first; optionally
        from time ``since`` (epoch seconds) on and of some ``types``."""
        r = self._event_reader
        if r is None:
            return []
        return r.events(since_ts=since, types=types)

    def events_frame(self, **kw):
        import pandas as pd

        return pd.DataFrame([e.to_dict() for e in self.events(**kw)])

    def wait_for_event(self, predicate: Callable[[ev.Event], bool], timeout: float = 30) -> Optional[ev.Event]:
        """The first event (already read or new) matching ``predicate``, or None after ``timeout``."""
        r = self._event_reader
        if r is None:
            return None
        return r.wait_for(predicate, timeout)

    def on_event(self, callback: Callable[[ev.Event], None]) -> Callable[[ev.Event], None]:
        """Call ``callback(event)`` for every event from now on (from the reader thread)."""
        self._callbacks.append(callback)
        return callback

    def restore_summary(self, since_generation: Optional[int] = None):
        """The restores seen in the events, one row per (task, store) that replayed changelog
        records: generation, task, instance, store, source (checkpoint / standby / warmup /
        scratch), records, applied, seconds, rate, offsets. Default: since the last restart (or
        start)."""
        import pandas as pd

        if since_generation is None:
            since_generation = self.restarts[-1]["from_generation"] + 1 if self.restarts else 0
        rows = [{"generation": e.generation, "task": e.task, "instance": e.instance, "store": e.store,
                 "source": e.source, "records": e.restored, "applied": e.applied, "seconds": e.seconds,
                 "rate": e.rate_rps, "start_offset": e.start_offset, "end_offset": e.end_offset}
                for e in self.events(types="restore_end")
                if (e.generation or 0) >= since_generation]
        cols = ["generation", "task", "instance", "store", "source", "records", "applied", "seconds",
                "rate", "start_offset", "end_offset"]
        return pd.DataFrame(rows, columns=cols)

    def task_opens(self, since_generation: Optional[int] = None):
        """``TaskOpened`` events: how each task found its state (source, records replayed, ms)."""
        import pandas as pd

        if since_generation is None:
            since_generation = self.restarts[-1]["from_generation"] + 1 if self.restarts else 0
        rows = [{"generation": e.generation, "task": e.task, "instance": e.instance,
                 "source": e.source, "restored": e.restored, "last_batch": e.last_batch,
                 "open_ms": e.open_ms}
                for e in self.events(types="task_opened") if (e.generation or 0) >= since_generation]
        return pd.DataFrame(rows, columns=["generation", "task", "instance", "source", "restored",
                                           "last_batch", "open_ms"])

    # ------------------------------------------------------------------ Spark sessions and placement
    def _init_placement(self, spark, placement: str, checkpoint_location, executor_state_dir) -> None:
        from statekit.runtime.placement import check_placement

        self._spark = spark
        self._placement_arg = check_placement(placement)
        self.placement = placement if placement != "auto" else None   # resolved by start()
        self.checkpoint_location = checkpoint_location
        self.executor_state_dir = executor_state_dir
        self._placement_extra: dict = {}
        if spark is not None and engine_is_local(self._engine_arg):
            raise StatekitError("App(spark=...) runs on that session: use engine='changelog' "
                                "(engine='local' runs without Spark)")

    def _boot_spark(self) -> None:
        """The Spark session boots (about 5 s of JVM) while start() checks topics and starts the
        instances; the query waits for it when it starts."""
        if self._engine_arg == "changelog" and self._spark is None and self._engine is None:
            from pyspark.sql import SparkSession

            if SparkSession.getActiveSession() is None:
                from statekit.engine.spark.session import get_session_soon

                get_session_soon()

    def _spark_engine(self):
        if self._spark is not None:
            from statekit.engine.spark.cluster import SessionEngine

            return SessionEngine(self._spark)
        from statekit.engine.spark import SparkEngine

        return SparkEngine()

    def _spark_master(self) -> Optional[str]:
        """The master the queries will run on, without starting a session just to ask."""
        if self._engine_arg != "changelog":
            return None
        from statekit.engine.spark.session import resolve_master, session_master

        if self._spark is not None:
            return session_master(self._spark)
        from pyspark.sql import SparkSession

        active = SparkSession.getActiveSession()
        return session_master(active) if active is not None else resolve_master()

    def _new_coordinator(self, spec, sink: str):
        """The control side for the resolved placement (instances: ``runtime.coordinator``;
        executors: ``runtime.placement.ExecutorsCoordinator``)."""
        from statekit.engine.spark.session import is_local_master
        from statekit.runtime import placement as pl

        master = self._spark_master()
        self.placement = pl.resolve_placement(self._placement_arg, engine=self.engine_name,
                                              master=master)
        spark = None
        if self._engine_arg == "changelog" and (self.placement == "executors" or
                                                not is_local_master(master)):
            spark = self._get_engine().session()
        self._placement_extra = pl.prepare(
            placement=self.placement, spark=spark, master=master, layout=self.layout,
            bootstrap=self.bootstrap, sink=sink, checkpoint_location=self.checkpoint_location,
            executor_state_dir=self.executor_state_dir)
        if self.placement == "executors":
            return pl.ExecutorsCoordinator(
                application=self.name, layout=self.layout, spec=spec, tasks=self.tasks(),
                extra=self._placement_extra, publish=self._publish, subscribe=self.on_event,
                unsubscribe=lambda cb: cb in self._callbacks and self._callbacks.remove(cb),
                generation=self.generation, standby_replicas=self.settings.standby_replicas)
        return Coordinator(application=self.name, layout=self.layout, spec=spec,
                           tasks=self.tasks(), settings=self.settings,
                           publish=self._publish, on_change=self._on_membership)

    def _run_extra(self) -> dict:
        co = self._coordinator
        return co.run_extra() if self.placement == "executors" and co is not None else {}

    def _checkpoint_dir(self, sub: int) -> str:
        if self.checkpoint_location:
            from statekit.engine.spark.cluster import join

            return join(self.checkpoint_location, str(int(sub)))
        return self.layout.checkpoint_dir(sub)

    def _reset_checkpoint_location(self) -> None:
        if not self.checkpoint_location:
            return
        from statekit.engine.spark.cluster import delete_checkpoint, is_remote_uri

        spark = self._get_engine().session() if is_remote_uri(self.checkpoint_location) else None
        for sub in self.subplans:
            delete_checkpoint(spark, self._checkpoint_dir(sub))

    def _crash_on_executors(self, mode, instance, after_records, point) -> dict:
        co = self._require_started("crash")
        if co.stopped:
            raise AppStateError(f"app '{self.name}' is {self.state}: start() or restart() it before crash")
        with self._lock:
            self.cancel_crash()
            rec = co.crash_directive(mode, instance, after_records, point)
            self.crashes.append(rec)
            self._crash = rec
        return rec

    def __repr__(self) -> str:
        return (f"App({self.name!r}, state={self.state}, partitions={self.partitions}, "
                f"instances={self.instances}, standby_replicas={self.standby_replicas})")
