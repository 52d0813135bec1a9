"""`NativeApp`: one application on Spark's own state store, with the App's verbs.

    app = NativeApp("wc", bootstrap=b, partitions=2, min_deltas_for_snapshot=10, maintenance_interval=1)
    app.stream("lines").flat_map_values(str.split).group_by(lambda k, w: w).count(store="counts")
    app.start(max_records_per_trigger=500)
    app.process_all_available()
    app.query_all("counts")            # Spark's state data source reader, decoded
    app.crash()                        # SIGKILL the JVM mid-batch + delete the RocksDB working dirs
    app.restart(); app.process_all_available()
    app.restore_report()               # the first batch's load metrics (snapshot load, changelog replay)
    app.checkpoint_files(); app.changelog_lag(); app.state_metrics(); app.metrics()

`statekit.NativeApp` is this class: it builds a `SparkNativeEngine` and calls its `start(RunSpec)`
(the App's verbs, no instances or standbys: Spark owns placement).
"""
from __future__ import annotations

import os
import tempfile
import time
from typing import Optional

from statekit.errors import StatekitError


class NativeApp:
    def __init__(self, name: str, bootstrap: Optional[str] = None, partitions: int = 2,
                 state_dir: Optional[str] = None, min_deltas_for_snapshot: int = 10,
                 maintenance_interval=None, mode: str = "tws"):
        if not name or any(c in name for c in "/\\ "):
            raise StatekitError(f"app name {name!r} must be a non-empty word")
        from statekit.engine.spark_native.engine import SparkNativeEngine
        from statekit.topology import TopologyBuilder

        self.name = name
        self.partitions = int(partitions)
        self._bootstrap = bootstrap
        self.state_dir = state_dir or os.path.join(tempfile.gettempdir(), f"statekit-native-{name}")
        self.checkpoint_dir = os.path.join(self.state_dir, "checkpoint")
        self.engine = SparkNativeEngine(min_deltas_for_snapshot=min_deltas_for_snapshot,
                                        maintenance_interval=maintenance_interval, mode=mode)
        self.builder = TopologyBuilder()
        self.plan = None
        self.run = None
        self.query = None
        self.generation = 0
        self.crashes: list = []
        self.restarts: list = []
        self._opts: dict = {}
        self._history: list = []    # (generation, raw progress) of finished queries

    # -- topology ----------------------------------------------------------------------------------
    def stream(self, topic: str, *a, **kw):
        return self.builder.stream(topic, *a, **kw)

    def table(self, topic: str, *a, **kw):
        return self.builder.table(topic, *a, **kw)

    @property
    def bootstrap(self) -> str:
        if self._bootstrap is None:
            from statekit.bootstrap import resolve_bootstrap

            self._bootstrap = resolve_bootstrap(None)
        return self._bootstrap

    # -- lifecycle ---------------------------------------------------------------------------------
    def start(self, trigger=None, max_records_per_trigger: Optional[int] = None, sink: str = "memory",
              starting_offsets: str = "earliest") -> "NativeApp":
        if self.query is not None and self.query.is_active:
            raise StatekitError(f"native app '{self.name}' is running; stop() or crash() first")
        from statekit.engine.spec import RunSpec

        if self.plan is None:
            self.validate()
        os.makedirs(self.state_dir, exist_ok=True)
        self._opts = dict(trigger=trigger, max_records_per_trigger=max_records_per_trigger, sink=sink,
                          starting_offsets=starting_offsets)
        self.run = RunSpec(app=self.name, bootstrap=self.bootstrap, plan=self.plan,
                           partitions=self.partitions, checkpoint_dir=self.checkpoint_dir,
                           trigger=trigger, max_records_per_trigger=max_records_per_trigger,
                           starting_offsets=starting_offsets, sink=sink,
                           query_name=f"{self.name}_native")
        self._launch()
        return self

    def _launch(self) -> None:
        self.generation += 1
        self.started_at = time.time()
        self.query = self.engine.start(self.run)

    def _retire(self) -> None:
        q = self.query
        if q is not None:
            self._history.append((self.generation, list(q.progress_log)))
        self.query = None

    def stop(self) -> None:
        """Stop after the running batch (state committed); the checkpoint stays."""
        q = self.query
        if q is not None:
            try:
                q.stop()
            except Exception:
                pass
            self._history.append((self.generation, q.raw_progress()))
        self.query = None

    def close(self) -> None:
        self.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def crash(self, mode: str = "jvm", during_batch: bool = True, wipe_local: bool = True,
              timeout: float = 30.0, instance: Optional[int] = None, **_ignored) -> dict:
        """Kill the query's state for real (see SparkNativeEngine.crash); restart() recovers.

        mode: "jvm" (SIGKILL the Spark JVM, delete Spark's local RocksDB working dirs), "query"
        (abort the query + unload the state stores + delete the working dirs, same JVM), or the
        App's names: "disk-loss" = "jvm"; "process" = "jvm" keeping the local dirs (a new JVM
        never reuses them: the restore work is the same). `instance` must be None or 0 (one
        instance); the App's other arguments (after_records, point, wait) are ignored."""
        if instance not in (None, 0):
            raise StatekitError(f"instance {instance} does not exist: the spark engine runs one instance")
        if mode == "disk-loss":
            mode = "jvm"
        elif mode == "process":
            mode, wipe_local = "jvm", False
        q = self.query
        if q is None:
            raise StatekitError(f"native app '{self.name}' is not running")
        progress = list(q.progress_log)
        rec = self.engine.crash(q, mode=mode, during_batch=during_batch, wipe_local=wipe_local,
                                timeout=timeout)
        rec["generation"] = self.generation
        self._history.append((self.generation, progress))
        self.query = None
        self.crashes.append(rec)
        return rec

    def restart(self, timeout: Optional[float] = None, wait: bool = False, **_ignored) -> dict:
        """Start a new query from the same checkpoint (a new JVM after a jvm crash)."""
        if self.run is None:
            raise StatekitError(f"native app '{self.name}' was never started; use start()")
        if self.query is not None:
            self.stop()
        t = time.time()
        self._launch()
        rec = {"generation": self.generation, "at": t, "start_s": time.time() - t}
        self.restarts.append(rec)
        return rec

    @property
    def state(self) -> str:
        """RUNNING (a query is active), ERROR (the last query died or was crashed), NOT_RUNNING,
        or CREATED."""
        if self.query is not None:
            if self.query.is_active:
                return "RUNNING"
            return "ERROR"
        if self.crashes and self.crashes[-1].get("generation") == self.generation:
            return "ERROR"
        return "CREATED" if self.run is None else "NOT_RUNNING"

    def validate(self) -> "NativeApp":
        """Compile the topology and refuse, in one line, what Spark's own state store cannot run:
        ``%%statekit app`` calls it when the cell runs."""
        from statekit.engine.spark_native.translate import check_supported

        plan = self.builder.compile(application=self.name, engine_shuffle=True)
        check_supported(plan)
        self.plan = plan
        return self

    def describe(self):
        return (self.plan or self.builder.compile(engine_shuffle=True)).describe(self.name)

    def wait_until_idle(self, timeout: float = 60) -> bool:
        try:
            return self.process_all_available(timeout=timeout)
        except StatekitError:
            return False

    def process_all_available(self, timeout: Optional[float] = None) -> bool:
        if self.query is None:
            raise StatekitError(f"native app '{self.name}' is not running")
        self.query.process_all_available(timeout=timeout)
        return True

    # -- state and dashboard data ------------------------------------------------------------------
    def query_all(self, store: str):
        """The store's committed rows (key, [window_start,] value, partition) from Spark's
        state data source reader."""
        return self.engine.query_all(self.run, store)

    def query(self, store: str, key, window_start=None):
        df = self.query_all(store)
        df = df[df.key == key]
        if window_start is not None:
            df = df[df.window_start == window_start]
        return None if df.empty else df.value.iloc[0]

    def store_dict(self, store: str) -> dict:
        df = self.query_all(store)
        if "window_start" in df.columns:
            return {(k, int(w)): v for k, w, v in zip(df.key, df.window_start, df.value)}
        return dict(zip(df.key, df.value))

    def state_metadata(self):
        from statekit.engine.spark_native.inspect import state_metadata

        return state_metadata(self.engine.session(self.run), self.checkpoint_dir)

    def checkpoint_files(self):
        return self.engine.checkpoint_files(self.run)

    def changelog_lag(self):
        return self.engine.changelog_lag(self.run)

    def lag(self):
        """``App.lag()``'s table from Spark's checkpoint: per state partition, the changelog versions
        since the last snapshot (what a restore replays)."""
        from statekit.engine.spark_native.inspect import lag_table

        plan = getattr(self, "plan", None)
        stores = [s.name for s in plan.stores] if plan is not None and getattr(plan, "stores", None) else []
        return lag_table(self.changelog_lag(), stores)

    def bytes_on_disk(self) -> int:
        from statekit.engine.spark_native.inspect import checkpoint_bytes

        return checkpoint_bytes(self.checkpoint_dir)

    def progress(self, generation: Optional[int] = None) -> list:
        """Spark's raw progress JSON of a generation (default: the current one)."""
        gen = self.generation if generation is None else generation
        if gen == self.generation and self.query is not None:
            return self.query.raw_progress()
        for g, p in reversed(self._history):
            if g == gen:
                return p
        return []

    def state_metrics(self, generation: Optional[int] = None):
        """stateOperators of every batch (one row per batch): numRowsTotal, memoryUsedBytes,
        commitTimeMs, rocksdb* custom metrics."""
        from statekit.engine.spark_native.inspect import state_operator_metrics

        gens = [generation] if generation is not None else sorted({g for g, _ in self._history} |
                                                                  {self.generation})
        frames = []
        for g in gens:
            df = state_operator_metrics(self.progress(g))
            df.insert(0, "generation", g)
            frames.append(df)
        import pandas as pd

        return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()

    def restore_report(self, generation: Optional[int] = None) -> dict:
        """The load of the state in a generation's first batch: rocksdbLoadLatencyMs,
        rocksdbNumReplayChangelogFiles, rocksdbReplayChangeLogLatencyMs,
        rocksdbLoadFromSnapshotLatencyMs, rocksdbNumLoadedFromDfs (summed over partitions by
        Spark), batch_ms, plus the changelog lag on disk before the restart."""
        from statekit.engine.spark_native.inspect import restore_metrics

        return restore_metrics(self.progress(generation))

    def metrics(self) -> dict:
        prog = self.progress()
        last = prog[-1] if prog else {}
        ops = (last.get("stateOperators") or [{}])[0] if last else {}
        return {
            "generation": self.generation,
            "records_processed": sum(int(p.get("numInputRows") or 0) for p in prog),
            "batches": len(prog),
            "last_batch_id": last.get("batchId"),
            "input_rate": last.get("inputRowsPerSecond"),
            "processed_rate": last.get("processedRowsPerSecond"),
            "last_batch_latency_ms": (last.get("durationMs") or {}).get("triggerExecution"),
            "state_rows": ops.get("numRowsTotal"),
            "state_memory_bytes": ops.get("memoryUsedBytes"),
            "commit_ms": ops.get("commitTimeMs"),
        }

    def output(self):
        """The memory sink's rows (batch, topic, key, value decoded with the sink serdes)."""
        import pandas as pd

        pdf = self.engine.output(self.run)
        rows = []
        from statekit.engine.spark_native.translate import gkey_serde
        from statekit.topology.graph import resolve_serde

        sinks = set(self.plan.sink_topics)
        for batch, topic, kb, vb in zip(pdf["batch"], pdf["topic"], pdf["key"], pdf["value"]):
            if topic in sinks:
                ks, vs = self.plan.sink_serdes(topic)
            else:  # mode="groupby": rows are (store, key, count)
                ks, vs = resolve_serde(gkey_serde(self.plan, topic)), resolve_serde("int64")
            rows.append((int(batch), topic, None if kb is None else ks.from_bytes(bytes(kb)),
                         None if vb is None else vs.from_bytes(bytes(vb))))
        return pd.DataFrame(rows, columns=["batch", "topic", "key", "value"])

    def __repr__(self) -> str:
        active = self.query is not None and self.query.is_active
        return f"NativeApp({self.name!r}, partitions={self.partitions}, active={active})"
