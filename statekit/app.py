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

The App holds the application's settings, its topology and its lifecycle, and hands every other
job to one part of ``statekit.runtime``: ``runner.Runner`` (start, the monitor, catching up, stop,
restart), ``inspection.Inspection`` (read-only views), ``app_events.AppEvents`` (the events read,
published and called back), ``crash_control.Crashes`` (crash requests), ``deployment.Deployment``
(the engine and the placement object), ``app_topics`` (the topics on the broker) and
``queries.QueryRouter`` (interactive queries).
"""
from __future__ import annotations

import functools
import logging
import shutil
import threading
from typing import Any, Optional

from statekit import events as ev
from statekit.contracts import Layout, TaskId, changelog_topic, default_state_dir, events_topic
from statekit.errors import BrokerUnreachable, StatekitError, TopologyError
from statekit.runtime import app_topics
from statekit.runtime.app_events import AppEvents
from statekit.runtime.app_topics import CopartitionError
from statekit.runtime.coordinator import Coordinator, MembershipError, Settings
from statekit.runtime.crash_control import Crashes
from statekit.runtime.deployment import Deployment, engine_is_local
from statekit.runtime.inspection import Inspection
from statekit.runtime.lifecycle import AppState, AppStateError, Lifecycle, NoLiveInstance
from statekit.runtime.runner import DEFAULT_MAX_RECORDS_PER_TRIGGER, Runner

__all__ = ["App", "AppState", "AppStateError", "MembershipError", "CopartitionError",
           "NoLiveInstance", "DEFAULT_MAX_RECORDS_PER_TRIGGER", "engine_is_local"]

log = logging.getLogger("statekit.app")

ENGINES = ("changelog", "local")
DEFAULT_PARTITIONS = 4


def _check_arguments(name, partitions, instances, standby_replicas, acceptable_recovery_lag,
                     max_warmup_replicas, probing_rebalance_interval, restore_rate, engine,
                     processing_guarantee, task_timeout=300.0) -> None:
    """``App(...)``'s arguments, each refused in one line."""
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
    if float(probing_rebalance_interval) <= 0:
        raise StatekitError(f"probing_rebalance_interval must be > 0 seconds, got "
                            f"{probing_rebalance_interval}")
    if engine == "spark":
        raise StatekitError("engine='spark' is Spark's own state store: use "
                            "statekit.NativeApp(name, ...) (one instance, no standby replicas)")
    if isinstance(engine, str) and engine not in ENGINES:
        raise StatekitError(f"unknown engine {engine!r}; use one of {', '.join(ENGINES)} "
                            f"(or statekit.NativeApp for Spark's own state store)")
    if not float(task_timeout) > 0:
        raise StatekitError(f"task_timeout must be > 0 seconds, got {task_timeout}")
    if processing_guarantee not in ("exactly_once", "at_least_once"):
        raise StatekitError(f"processing_guarantee must be 'exactly_once' or 'at_least_once', "
                            f"not {processing_guarantee!r}")


def _compile(builder, name: str):
    """The builder's ``Plan``; a DSL mistake as one ``TopologyError`` line."""
    try:
        try:
            return builder.compile(application=name)
        except TypeError:
            return builder.compile()
    except StatekitError:
        raise
    except Exception as exc:  # a DSL mistake: one line
        raise TopologyError(f"the topology does not compile: {type(exc).__name__}: {exc}") from None


def _delegate(part_class, part: str, name: str, as_name: Optional[str] = None):
    """An App method that is the method ``name`` of the App's part ``part`` (a ``part_class``),
    with that method's signature and docstring."""
    fn = getattr(part_class, name)

    @functools.wraps(fn)
    def method(self, *args, **kwargs):
        return getattr(getattr(self, part), name)(*args, **kwargs)

    method.__name__ = as_name or name
    method.__qualname__ = f"App.{method.__name__}"
    method.__module__ = __name__
    return method


def _forward(path: str, doc: str = "", settable: bool = False) -> property:
    """A property of the App that is the attribute at ``path`` (dotted) of one of its parts."""
    *parts, last = path.split(".")

    def owner(app):
        for p in parts:
            app = getattr(app, p)
        return app

    return property(lambda self: getattr(owner(self), last),
                    (lambda self, v: setattr(owner(self), last, v)) if settable else None, doc=doc)


def _pause_kafka(self, seconds: float = 10.0, mid_transaction: bool = False) -> dict:
    """The broker this app uses (one this machine runs: the embedded one) stops answering for
    ``seconds`` (``statekit.broker.pause``): the app goes WAITING, then catches up by itself."""
    from statekit import broker

    return broker.pause(self.bootstrap, seconds, mid_transaction=mid_transaction)


def _restart_kafka(self, down: float = 0.0):
    """``kill -9`` the broker this app uses and start it again ``down`` seconds later on the same
    directory and port (``statekit.broker.restart``); returns the new broker's handle."""
    from statekit import broker

    return broker.restart(self.bootstrap, down=down)


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
    ``$STATEKIT_EXECUTOR_STATE_DIR``, else under Spark's local dirs).

    ``task_timeout`` (seconds, default 300): how long the app rides out a Kafka that is away
    (Kafka Streams' ``task.timeout.ms``): tasks, the engine and the control side retry with
    backoff meanwhile, the app is WAITING (``waiting`` says for what), transactions in flight abort
    and their batches replay; past it, ERROR. Requests time out after a tenth of it (2-30 s)."""

    def __init__(self, name: str, bootstrap: Optional[str] = None, partitions: Optional[int] = None,
                 instances: int = 1, standby_replicas: int = 0, state_dir: Optional[str] = None,
                 commit_interval: Optional[float] = None, cache_bytes: int = 10 << 20,
                 engine: Any = "changelog", acceptable_recovery_lag: int = 10_000,
                 max_warmup_replicas: int = 2, probing_rebalance_interval: float = 10.0,
                 restore_rate: Optional[float] = None,
                 processing_guarantee: str = "exactly_once", spark: Any = None,
                 placement: str = "auto", checkpoint_location: Optional[str] = None,
                 executor_state_dir: Optional[str] = None, task_timeout: float = 300.0):
        _check_arguments(name, partitions, instances, standby_replicas, acceptable_recovery_lag,
                         max_warmup_replicas, probing_rebalance_interval, restore_rate, engine,
                         processing_guarantee, task_timeout)
        self.task_timeout = float(task_timeout)
        self.restore_rate = float(restore_rate) if restore_rate else None
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
        self.layout = Layout(state_dir or default_state_dir(name), name)
        self.state_dir = self.layout.root
        self._bootstrap_arg = bootstrap
        self._bootstrap: Optional[str] = None
        self._kafka = None
        self._txn_support: Optional[bool] = None
        self._deploy = Deployment(engine, spark, placement, checkpoint_location, executor_state_dir)

        from statekit.topology import TopologyBuilder

        self.builder = TopologyBuilder()
        self.plan = None
        self._subplans: dict = {}

        from statekit.runtime import supervisor

        supervisor.warm()   # a spare process: start() does not wait for its imports
        self._lock = threading.RLock()
        self._coordinator: Optional[Coordinator] = None
        self._error: Optional[StatekitError] = None
        self._outage = None                # runtime.outage.KafkaWatch, from start()
        self.runs: dict = {}               # sub-topology -> its engine.spec.RunSpec
        self.restarts: list[dict] = []
        self._router = None
        self._crashes = Crashes(self)
        self._bus = AppEvents(name, lambda: self._bootstrap, hooks=[self._crashes.on_event])
        self._runner = Runner(self)
        self._inspect = Inspection(self)
        self._life = Lifecycle()
        self._life.add_listener(self._on_state_change)

    engine_name = _forward("_deploy.engine_name", "``changelog``, ``local`` or the engine's class.")
    placement = _forward("_deploy.placement_name", "``instances`` or ``executors`` (None: ``auto``, "
                         "before start() resolves it).")
    checkpoint_location = _forward("_deploy.checkpoint_location", "Where the Spark checkpoint goes.",
                                   settable=True)
    executor_state_dir = _forward("_deploy.executor_state_dir", "The tasks' state root on every "
                                  "executor host.", settable=True)
    crashes = _forward("_crashes.records", "Every crash asked for, oldest first.")
    _queries = _forward("_runner.queries")
    _placement_extra = _forward("_deploy.placement.extra")

    # ------------------------------------------------------------------ topology front
    def stream(self, topic: str, *args, **kwargs):
        """A ``KStream`` over ``topic`` (delegates to the ``TopologyBuilder``)."""
        return self.builder.stream(topic, *args, **kwargs)

    def table(self, topic: str, *args, **kwargs):
        """A ``KTable`` over ``topic`` materialized in ``store=`` (delegates to the builder)."""
        return self.builder.table(topic, *args, **kwargs)

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
        return _compile(self.builder, self.name)

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
            counts = app_topics.source_partitions(self)
            if counts:
                self._partitions = max(counts.values())
                self.check_copartitioned(counts)
            else:
                self._partitions = DEFAULT_PARTITIONS
        return self._partitions

    @partitions.setter
    def partitions(self, n: int) -> None:
        self._partitions = int(n)

    def check_copartitioned(self, counts: Optional[dict] = None) -> None:
        """Every source topic must have one partition per task: a task reads its own partition of
        each (Kafka Streams' co-partitioning). Refused in one line that says what to do."""
        app_topics.check_copartitioned(self, counts)

    def check_topics(self) -> None:
        """Raise ``UnknownTopic`` (one line, with the closest existing name) for a source topic that
        does not exist. ``%%statekit app`` calls it when the cell runs, not only at start."""
        app_topics.check_topics(self)

    def tasks(self) -> list[TaskId]:
        """Every task: one per partition of every sub-topology."""
        return [TaskId(s, p) for s in sorted(self.subplans) for p in range(self.partitions)]

    def store_spec(self, store: str):
        """The ``StoreSpec`` of ``store`` (``.kind`` says which query reads it: ``query`` for
        "kv", ``query_window`` for "window")."""
        from statekit.runtime.queries import UnknownStore

        specs = {s.name: s for p in self.subplans.values() for s in p.stores}
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

    def changelog_topic(self, store: str) -> str:
        return changelog_topic(self.name, store)

    @property
    def events_topic(self) -> str:
        return events_topic(self.name)

    # ------------------------------------------------------------------ state
    @property
    def state(self) -> AppState:
        return self._life.state

    @property
    def waiting(self):
        """While Kafka is away: what the app waits for (``runtime.outage.Wait``: ``str()`` is
        "waiting for Kafka at HOST:PORT since 4 s; 2 transactions aborted", and ``since``,
        ``aborted``, ``tasks``); else None."""
        return self._outage.current if self._outage is not None else None

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
        runner = getattr(self, "_runner", None)
        if runner is not None:
            runner.nudge()   # its monitor looks at the new state now (an idle one sleeps 0.5 s)
        self._bus.publish(ev.StateChanged(state=str(new), old=str(old), reason=self._life.reason or "",
                                          generation=self.generation))

    def _fail(self, err: StatekitError) -> None:
        self._error = err
        self._transition(AppState.ERROR, str(err))

    def _require_started(self, what: str) -> Coordinator:
        co = self._coordinator
        if co is None or self.state == AppState.CREATED:
            raise AppStateError(f"app '{self.name}' is not started: start() it (or %statekit start "
                                f"{self.name}) before {what}")
        return co

    @property
    def bootstrap(self) -> str:
        if self._bootstrap is None:
            from statekit.bootstrap import resolve_bootstrap

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
            from statekit.kafka.retry import request_timeout_for

            self._kafka = Kafka(self.bootstrap, timeout=request_timeout_for(self.task_timeout))
        return self._kafka

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

    def _get_engine(self):
        return self._deploy.engine()

    # ------------------------------------------------------------------ start / stop
    def start(self, trigger=None, max_records_per_trigger: Optional[int] = None, sink: str = "memory",
              starting_offsets: str = "earliest") -> "App":
        """Compile, start the instances (they restore their tasks) and the engine. Returns self.

        ``sink``: ``"memory"`` (``output()``), ``"kafka"`` (the plan's ``.to()`` topics) or ``"none"``.
        ``max_records_per_trigger``: records per micro-batch at most (default
        ``DEFAULT_MAX_RECORDS_PER_TRIGGER``; 0: no bound)."""
        self._runner.start(trigger, max_records_per_trigger, sink, starting_offsets)
        return self

    def stop(self, timeout: float = 60) -> None:
        """Stop the queries gracefully (the batch in flight finishes and commits), then the instances
        (every task closes cleanly). The state stays; ``start()`` continues from it."""
        self._runner.stop()

    def close(self) -> None:
        """stop() and release every client (event reader, Kafka connection)."""
        self.stop()

    def reset(self, topics: bool = True) -> dict:
        """Forget everything this application did (like ``kafka-streams-application-reset``): delete
        its state directories, engine checkpoints and control files and, with ``topics``, its
        changelog, repartition and events topics. The app must not run. Input and output topics are
        left alone."""
        with self._lock:
            if self.state.is_running() or self.state == AppState.PENDING_SHUTDOWN:
                raise AppStateError(f"app '{self.name}' is {self.state}: stop() it before reset()")
            deleted_topics = []
            if topics:
                deleted_topics = app_topics.delete_internal_topics(self)
                self._close_helpers()
            self._deploy.reset_checkpoint_location(self.layout, self.subplans)
            shutil.rmtree(self.layout.root, ignore_errors=True)
            self._coordinator = None
            return {"state_dir": self.layout.root, "topics": deleted_topics}

    def _close_helpers(self) -> None:
        self._bus.stop()
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

    restart = _delegate(Runner, "_runner", "restart")
    process_all_available = _delegate(Runner, "_runner", "process_all_available")

    def wait_until_idle(self, timeout: float = 60) -> bool:
        """``process_all_available`` with a timeout; True when idle, False otherwise."""
        try:
            return self.process_all_available(timeout=timeout)
        except AppStateError:
            return False

    # ------------------------------------------------------------------ membership
    def kill(self, instance: int) -> dict:
        """SIGKILL one instance now (a crash with nothing armed). Its tasks move to the live
        instances (standby holders first); the others keep processing. Refused for the last live
        instance: use ``crash()`` to crash a whole one-instance app."""
        return self._require_started("kill").kill(instance, mode="process", cause="kill")

    def revive(self, instance: int, disk: bool = True):
        """Start a dead instance again, with its disk (``disk=True``: its old state directories
        count as copies, possibly behind: warmups bring them up before tasks move back) or
        without. Returns the new assignment."""
        a = self._require_started("revive").revive(instance, disk=disk)
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

    pause_kafka, restart_kafka = _pause_kafka, _restart_kafka   # Kafka going away, on purpose

    @property
    def assignment(self):
        """The current ``runtime.assignor.Assignment`` (None before start)."""
        co = self._coordinator
        return co.assignment if co is not None else None

    @property
    def rebalances(self) -> list:
        """Every rebalance so far: generation, reason, moves, assignment."""
        co = self._coordinator
        return list(co.rebalances) if co is not None else []

    # ------------------------------------------------------------------ crash
    crash = _delegate(Crashes, "_crashes", "crash")
    pending_crash = _forward("_crashes.pending", Crashes.pending.__doc__)
    cancel_crash = _delegate(Crashes, "_crashes", "cancel", "cancel_crash")
    hold_restores = _delegate(Crashes, "_crashes", "hold_restores")
    release_restores = _delegate(Crashes, "_crashes", "release_restores")

    # ------------------------------------------------------------------ inspection (read-only)
    lag = _delegate(Inspection, "_inspect", "lag")
    restore_forecast = _delegate(Inspection, "_inspect", "restore_forecast")
    task_status = _delegate(Inspection, "_inspect", "task_status")
    assignment_frame = _delegate(Inspection, "_inspect", "assignment_frame")
    instances_frame = _delegate(Inspection, "_inspect", "instances_frame")
    restore_summary = _delegate(Inspection, "_inspect", "restore_summary")
    task_opens = _delegate(Inspection, "_inspect", "task_opens")
    progress = _delegate(Inspection, "_inspect", "progress")
    metrics = _delegate(Inspection, "_inspect", "metrics")
    output = _delegate(Inspection, "_inspect", "output")

    # ------------------------------------------------------------------ queries
    def _get_router(self):
        if self._router is None:
            self._router = self._deploy.placement.query_router(self, self._coordinator)
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
        warmup, the restoring store); with no copy at all (a lost disk) it waits up to ``wait``
        seconds (default 0) for one, then raises ``StaleRead``. ``with_lag=True`` returns an ``Answer``: ``.value`` and
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
    events = _delegate(AppEvents, "_bus", "events")
    last_event = _delegate(AppEvents, "_bus", "last", "last_event")
    events_frame = _delegate(AppEvents, "_bus", "frame", "events_frame")
    wait_for_event = _delegate(AppEvents, "_bus", "wait_for", "wait_for_event")
    on_event = _delegate(AppEvents, "_bus", "on_event")

    def __repr__(self) -> str:
        w = self.waiting if self.state == AppState.WAITING else None
        return (f"App({self.name!r}, state={self.state}{f' ({w})' if w else ''}, partitions="
                f"{self.partitions}, instances={self.instances}, standby_replicas={self.standby_replicas})")
