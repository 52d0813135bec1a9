"""Read-only views of a running application, for notebooks and dashboards: frames of the
assignment and the instances, lag, restore forecasts, task status, the restores and task opens seen
in the events, the engines' progress and metrics, and the memory sink's output.

Nothing here changes the application: each view reads the coordinator, the events or the engines'
progress and shapes the answer (mostly a pandas DataFrame).
"""
from __future__ import annotations

from typing import Optional

from statekit.errors import StatekitError


class Inspection:
    """The views of one ``App`` (``app``: its façade)."""

    def __init__(self, app):
        self.app = app

    def assignment_frame(self):
        """The current assignment as a DataFrame: task, instance, role, state_dir."""
        import pandas as pd

        app, rows = self.app, []
        a = app.assignment
        if a is not None:
            for t in a.tasks:
                for inst, role in a.roles(t):
                    rows.append({"task": str(t), "instance": inst, "role": role,
                                 "state_dir": app.layout.task_dir(inst, t)})
        return pd.DataFrame(rows, columns=["task", "instance", "role", "state_dir"])

    def instances_frame(self):
        """One row per instance: status (alive, leaving, dead, stopped), incarnation, pid and its
        active, standby and warmup tasks."""
        import pandas as pd

        co = self.app._coordinator
        rows = co.members_frame_rows() if co is not None else []
        return pd.DataFrame(rows, columns=["instance", "status", "incarnation", "pid", "active",
                                           "standby", "warmup", "reported"])

    def lag(self):
        """pandas DataFrame: task, instance, role, state, store, checkpoint_offset, changelog_end,
        lag — one row per copy (active, standby, warmup) of each store."""
        from statekit.runtime.lag import lag_frame

        app = self.app
        co = app._coordinator
        if co is None:
            return lag_frame([])
        return lag_frame(app._deploy.placement.lag_rows(app, co))

    def restore_forecast(self, apply_rate: Optional[float] = None, settle: float = 5.0,
                         rate_source: str = "given"):
        """Before anything crashes: how long each task's restore would take now — from its
        checkpoint, from a standby or warmup (a promotion), from scratch — and, per instance, what
        its death would cost ("if instance 0 died now: ≈ 4.1 s from scratch, 0.2 s from its
        standby"). ``apply_rate`` (records/s) defaults to the rate a restore runs at now on this
        machine, measured by the task's instance: its calibration (a real restore of the
        changelog, measured once; it waits up to ``settle`` seconds for the instance's own
        micro-batches to pause) at the load of the moment (a short restore set against it), so
        a busy machine's forecast is a busy machine's; without instances to ask, the last
        full-speed restore's rate. ``rate_source`` labels a given rate (a dashboard counting the
        records again at an earlier forecast's rate says where that rate came from)."""
        from statekit.runtime.forecasts import forecast, last_apply_rate, making

        app = self.app
        co = app._require_started("restore_forecast")
        with making(app.name):
            rate, source = apply_rate, rate_source
            calibrator = self._calibrator(co, settle)
            if rate is None and calibrator is None:
                rate, source = last_apply_rate(app.events(types="restore_end")), "last restore"
            return forecast(app.name, co.assignment, co.statuses(fresh=True), app.subplans,
                            app.kafka, app.layout, apply_rate=rate,
                            rate_source=source if rate else None, calibrator=calibrator)

    @staticmethod
    def _calibrator(co, settle: float):
        """The instances' calibration. Without an answer (the instance died during the call), a
        caller who waits (a cell) calibrates in this process; one who does not (the dashboard,
        ``settle=0``) gets an error and keeps its last forecast: its calibration, left to the
        kernel by an instance a crash killed mid-call, ran beside the learner's next cells."""
        cal = getattr(co, "calibrate", None)
        if cal is None:
            return None

        def ask(topic, partition):
            got = cal(topic, partition, settle)
            if got is None and settle <= 0:
                raise StatekitError("no live instance answered to measure the restore rate on; "
                                    "the forecast is made again once one runs (or pass settle > 0 "
                                    "to measure it here)")
            return got
        return ask

    def task_status(self) -> dict:
        """``{task: {instance, role, state, source, last_batch, backlog, ...}}`` as the instances
        report it (active tasks), for dashboards."""
        co = self.app._coordinator
        out = {}
        if co is None:
            return out
        # (the last reports while the coordinator's loop holds its lock over Kafka requests: a
        # dashboard must not freeze through an outage, as the App's monitor must not)
        reports = co.statuses(wait=False)
        for i, st in (co.last_statuses() if reports is None else reports).items():
            for t, row in (st.get("tasks") or {}).items():
                out[t] = dict(row, instance=i)
        return out

    def _since(self, since_generation: Optional[int]) -> int:
        """Default: since the last restart (or start)."""
        if since_generation is not None:
            return since_generation
        restarts = self.app.restarts
        return restarts[-1]["from_generation"] + 1 if restarts else 0

    def restore_summary(self, since_generation: Optional[int] = None):
        """The restores seen in the events, one row per (task, store) that replayed changelog
        records: generation, task, instance, store, source (checkpoint / standby / warmup /
        scratch), records, applied, seconds, rate, offsets. Default: since the last restart (or
        start)."""
        import pandas as pd

        since = self._since(since_generation)
        rows = [{"generation": e.generation, "task": e.task, "instance": e.instance, "store": e.store,
                 "source": e.source, "records": e.restored, "applied": e.applied, "seconds": e.seconds,
                 "rate": e.rate_rps, "start_offset": e.start_offset, "end_offset": e.end_offset}
                for e in self.app.events(types="restore_end") if (e.generation or 0) >= since]
        cols = ["generation", "task", "instance", "store", "source", "records", "applied", "seconds",
                "rate", "start_offset", "end_offset"]
        return pd.DataFrame(rows, columns=cols)

    def task_opens(self, since_generation: Optional[int] = None):
        """``TaskOpened`` events: how each task found its state (source, records replayed, ms)."""
        import pandas as pd

        since = self._since(since_generation)
        rows = [{"generation": e.generation, "task": e.task, "instance": e.instance,
                 "source": e.source, "restored": e.restored, "last_batch": e.last_batch,
                 "open_ms": e.open_ms}
                for e in self.app.events(types="task_opened") if (e.generation or 0) >= since]
        return pd.DataFrame(rows, columns=["generation", "task", "instance", "source", "restored",
                                           "last_batch", "open_ms"])

    def progress(self, since: Optional[float] = None) -> list:
        """The engines' micro-batch progress (dicts: batch_id, num_input_rows, input and processed
        rates, batch_duration_ms, subtopology, seen_at), oldest first; from time ``since`` on."""
        out = self.app._runner.poll_all()
        return out if since is None else [p for p in out if p["seen_at"] >= since]

    def metrics(self) -> dict:
        """Records processed, input rate, last batch latency (from the engines' progress)."""
        app = self.app
        prog = app._runner.poll_all()
        last = prog[-1] if prog else {}
        return {
            "state": str(app.state),
            "generation": app.generation,
            "instances": app.instances,
            "records_processed": app._runner.records_processed,
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

        app = self.app
        if (app._runner.run_opts or {}).get("sink", "memory") != "memory":
            raise StatekitError("no memory sink output: start(sink='memory') first")
        serdes = {}
        for p in app.subplans.values():
            for s in getattr(p, "sinks", ()) or ():
                serdes.setdefault(s.topic, p.sink_serdes(s.topic))
        rows = []
        for batch, task, topic, kb, vb in read_outputs(app.layout.control.output_dir()):
            ks, vs = serdes[topic]
            rows.append((batch, task, topic, None if kb is None else ks.from_bytes(kb),
                         None if vb is None else vs.from_bytes(vb)))
        return pd.DataFrame(rows, columns=["batch", "task", "topic", "key", "value"])
