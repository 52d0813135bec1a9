"""What runs an application and where: the engine (a Spark session, given or statekit's own, or
the local loop), the Spark checkpoint location, and the placement of its tasks, chosen once per
``start()`` as an object.

The two placements (``runtime.placement`` explains them) differ in their control side, their
queries' extra settings, how ``lag()`` finds the copies, how queries are routed and how a crash is
made; each is one class here, so the App asks its placement instead of testing its name.
"""
from __future__ import annotations

import time
from typing import Any, Optional

from statekit.errors import StatekitError
from statekit.runtime.coordinator import Coordinator
from statekit.runtime.crash_control import check_mode_and_point
from statekit.runtime.lifecycle import AppStateError


def engine_is_local(engine) -> bool:
    return isinstance(engine, str) and engine == "local"


class InstancesPlacement:
    """Tasks in statekit's instance processes beside the driver (``runtime.coordinator``)."""

    name = "instances"

    def __init__(self, extra: Optional[dict] = None):
        self.extra = dict(extra or {})

    def coordinator(self, app, spec):
        return Coordinator(application=app.name, layout=app.layout, spec=spec, tasks=app.tasks(),
                           settings=app.settings, publish=app._bus.publish,
                           on_change=app._runner.on_membership)

    def run_extra(self, co) -> dict:
        return {}

    def start(self, co, instances: int, options: dict, launch) -> None:
        """The instances start while Spark starts the queries (a second or more each): a batch
        that comes first waits in the exchange for its owner."""
        co.begin(instances, options)
        launch()
        co.finish()

    def lag_rows(self, app, co) -> list:
        from statekit.runtime.lag import lag_rows

        return lag_rows(app.name, co.assignment, co.statuses(fresh=True), app.subplans, app.kafka,
                        app.layout)

    def query_router(self, app, co):
        from statekit.runtime.queries import QueryRouter

        return QueryRouter(app)

    def crash(self, app, mode: str, instance, after_records, point: str, subtopology) -> dict:
        """A crash now (SIGKILL) or a directive the instance's task fires at its point."""
        check_mode_and_point(mode, point)
        co = app._require_started("crash")
        crashes = app._crashes
        with app._lock:
            if co.stopped or not co.live():
                raise AppStateError(f"app '{app.name}' has no live instance to crash: restart() it")
            if instance is None:
                a = co.assignment
                instance = max(co.live(), key=lambda i: (len(a.active_tasks(i)) if a else 0, -i))
            try:
                instance = int(instance)
            except (TypeError, ValueError):
                raise StatekitError(f"instance must be a number, got {instance!r}") from None
            m = co.members.get(instance)
            if m is None or not m.live:
                live = ", ".join(str(i) for i in co.live())
                raise StatekitError(f"instance {instance} is not a live instance (live: {live})")
            rec = {"mode": mode, "instance": instance, "point": point, "after_records": after_records,
                   "requested_at": time.time(), "generation": app.generation, "status": "pending",
                   "tasks": [str(t) for t in co.assignment.active_tasks(instance)]}
            if after_records is None and point == "records":
                crashes.record(rec, directive=False)
                co.kill(instance, mode=mode, cause="crash", allow_last=True)
                rec.update(status="applied", applied=True, died_at=time.time())
                return rec
            crashes.records.append(rec)
            d = crashes.write_directive(instance, point, 0 if after_records is None else after_records,
                                        mode, subtopology)
            rec["id"] = d["id"]
            crashes.current = rec
        return rec


class ExecutorsPlacement(InstancesPlacement):
    """Tasks in Spark's Python workers on the executors (``runtime.placement``)."""

    name = "executors"

    def coordinator(self, app, spec):
        from statekit.runtime.placement import ExecutorsCoordinator

        return ExecutorsCoordinator(
            application=app.name, layout=app.layout, spec=spec, tasks=app.tasks(), extra=self.extra,
            publish=app._bus.publish, subscribe=app._bus.on_event, unsubscribe=app._bus.unsubscribe,
            generation=app.generation, standby_replicas=app.settings.standby_replicas)

    def run_extra(self, co) -> dict:
        return co.run_extra() if co is not None else {}

    def start(self, co, instances: int, options: dict, launch) -> None:
        co.start(instances, options)   # the queries take its generation and run id
        launch()

    def lag_rows(self, app, co) -> list:
        return co.lag_rows()

    def query_router(self, app, co):
        return co.query_router(app) if co is not None else super().query_router(app, co)

    def crash(self, app, mode: str, instance, after_records, point: str, subtopology) -> dict:
        """A directive the Python worker running the task claims (``engine.spark.executors``)."""
        co = app._coordinator
        if co is None:   # never started: refused as for instances
            return super().crash(app, mode, instance, after_records, point, subtopology)
        if co.stopped:
            raise AppStateError(f"app '{app.name}' is {app.state}: start() or restart() it before "
                                f"crash")
        with app._lock:
            app._crashes.cancel()
            return app._crashes.record(co.crash_directive(mode, instance, after_records, point),
                                       directive=True)


PLACEMENT_CLASSES = {"instances": InstancesPlacement, "executors": ExecutorsPlacement}


class Deployment:
    """The engine and the placement of one App. ``engine``: ``"changelog"`` (Spark), ``"local"``
    or an engine object; ``spark``: a session to run on (None: statekit's own)."""

    def __init__(self, engine: Any, spark: Any, placement: str, checkpoint_location: Optional[str],
                 executor_state_dir: Optional[str]):
        from statekit.runtime.placement import check_placement

        if spark is not None and engine_is_local(engine):
            raise StatekitError("App(spark=...) runs on that session: use engine='changelog' "
                                "(engine='local' runs without Spark)")
        self.engine_arg = engine
        self.engine_name = engine if isinstance(engine, str) else type(engine).__name__
        self.spark = spark
        self.placement_arg = check_placement(placement)
        self.checkpoint_location = checkpoint_location
        self.executor_state_dir = executor_state_dir
        self._engine = None
        # the placement's name (None while "auto" waits for start() to resolve it), and the
        # placement itself: before a start, the one asked for
        self.placement_name: Optional[str] = placement if placement != "auto" else None
        self.placement = PLACEMENT_CLASSES.get(placement, InstancesPlacement)()

    # -- the engine
    def engine(self):
        if self._engine is not None:
            return self._engine
        e = self.engine_arg
        if not isinstance(e, str):
            self._engine = e
        elif e == "changelog":
            if self.spark is not None:
                from statekit.engine.spark.cluster import SessionEngine

                self._engine = SessionEngine(self.spark)
            else:
                from statekit.engine.spark import SparkEngine

                self._engine = SparkEngine()
        else:
            from statekit.engine.local_stream import LocalStreamingEngine

            self._engine = LocalStreamingEngine()
        return self._engine

    def boot_spark(self) -> None:
        """The Spark session boots (about 5 s of JVM) while start() checks topics and starts the
        instances; the query waits for it when it starts."""
        if self.engine_arg == "changelog" and self.spark is None and self._engine is None:
            from statekit.engine.spark.jvm import ask_java_early

            ask_java_early()        # answers while pyspark imports
            from pyspark.sql import SparkSession

            if SparkSession.getActiveSession() is None:
                from statekit.engine.spark.session import get_session_soon

                get_session_soon()

    def spark_master(self) -> Optional[str]:
        """The master the queries will run on, without starting a session just to ask."""
        if self.engine_arg != "changelog":
            return None
        from statekit.engine.spark.session import is_connect_url, resolve_master

        if self.spark is not None:
            return self.master_of(self.spark)
        from pyspark.sql import SparkSession

        active = SparkSession.getActiveSession()
        if active is not None:
            return self.master_of(active)
        master = resolve_master()
        if is_connect_url(master):   # the server's master, asked through the session we will use
            return self.master_of(self.engine().session())
        return master

    @staticmethod
    def master_of(spark) -> Optional[str]:
        """A session's master; for a Spark Connect server on another machine, its URL: what runs
        there is not on this machine, whatever master the server has."""
        from statekit.engine.spark.session import connect_url, connect_url_is_here, session_master

        url = connect_url(spark)
        if url and not connect_url_is_here(url):
            return url
        return session_master(spark)

    # -- the placement
    def choose_placement(self, *, layout, bootstrap: str, sink: str):
        """Resolve the placement for this start, check that it can work here
        (``runtime.placement.prepare``) and keep it as the object the App asks from now on."""
        from statekit.engine.spark.session import is_local_master
        from statekit.runtime import placement as pl

        master = self.spark_master()
        name = self.placement_name = pl.resolve_placement(self.placement_arg,
                                                          engine=self.engine_name, master=master)
        spark = None
        if self.engine_arg == "changelog" and (name == "executors" or not is_local_master(master)):
            spark = self.engine().session()
        extra = pl.prepare(placement=name, spark=spark, master=master, layout=layout,
                           bootstrap=bootstrap, sink=sink,
                           checkpoint_location=self.checkpoint_location,
                           executor_state_dir=self.executor_state_dir)
        self.placement = PLACEMENT_CLASSES[name](extra)
        return self.placement

    # -- the Spark checkpoint
    def checkpoint_dir(self, layout, sub: int) -> str:
        if self.checkpoint_location:
            from statekit.engine.spark.cluster import join

            return join(self.checkpoint_location, str(int(sub)))
        return layout.checkpoint_dir(sub)

    def reset_checkpoint_location(self, layout, subtopologies) -> None:
        if not self.checkpoint_location:
            return
        from statekit.engine.spark.cluster import delete_checkpoint, is_remote_uri

        spark = self.engine().session() if is_remote_uri(self.checkpoint_location) else None
        for sub in subtopologies:
            delete_checkpoint(spark, self.checkpoint_dir(layout, sub))
