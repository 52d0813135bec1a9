"""The dashboard's data model, fed with hand-made snapshots and typed events (statekit.events): no
Spark, no widgets, no broker."""
from __future__ import annotations

import math
import re

import pytest

from kernel_ext.dashboard.collect import StoreCache
from kernel_ext.dashboard.model import (CounterRate, DashboardModel, Snapshot, clip, diff_rows, fmt_eta,
                                        forecast_by_instance, layout_topology, normalize_task, task_id)
from statekit import events as ev


def task(t, lag, rows=None, role="active", ckpt=None, end=None, state="running", store="counts", instance=0):
    end = end if end is not None else 100
    return {"task": t, "instance": instance, "role": role, "store": store, "rows": rows,
            "checkpoint_offset": ckpt if ckpt is not None else end - lag, "changelog_end": end,
            "lag": lag, "state": state}


class Events:
    """Typed events with increasing offsets and chosen times."""

    def __init__(self):
        self.offset = 0

    def __call__(self, cls, ts, **kw):
        e = cls(ts=ts, **kw)
        e.offset = self.offset
        self.offset += 1
        return e


def test_diff_rows():
    d = diff_rows({"a": 1, "b": 2, "c": 3}, {"a": 1, "b": 5, "d": 1})
    assert d.added == {"d"} and d.changed == {"b"} and d.removed == {"c"}
    assert d.touched == {"b", "d"} and len(d) == 3
    assert len(diff_rows(None, {"a": 1})) == 1


def test_changed_rows_since_last_refresh_are_highlighted():
    m = DashboardModel(top_k=10)
    m.update(Snapshot(t=0, stores={"counts": {"a": 1, "b": 2}}))
    assert m.changed_count("counts") == 0  # the first refresh marks nothing
    assert all(r.status is None for r in m.store_rows())
    m.update(Snapshot(t=1, stores={"counts": {"a": 1, "b": 3, "c": 1}}))
    status = {r.key: r.status for r in m.store_rows()}
    assert status == {"a": None, "b": "changed", "c": "new"}
    assert m.changed_count("counts") == 2
    m.update(Snapshot(t=2, stores={"counts": {"a": 1, "b": 3, "c": 1}}))
    assert all(r.status is None for r in m.store_rows())  # only since the *last* refresh


def test_store_rows_top_k_sort_and_filter():
    m = DashboardModel(top_k=2)
    rows = {"kafka": 5, "spark": 9, "rocks": 1, "kstreams": 7}
    m.update(Snapshot(t=0, stores={"counts": rows}))
    assert [r.key for r in m.store_rows()] == ["spark", "kstreams"]
    m.key_filter = "KA"  # case-insensitive substring
    assert [r.key for r in m.store_rows()] == ["kafka"]
    m.key_filter = ""
    m.sort_by = "key"
    assert [r.key for r in m.store_rows()] == ["kafka", "kstreams"]
    m.update(Snapshot(t=1, stores={"counts": dict(rows, rocks=2)}))
    m.sort_by = "recency"
    assert m.store_rows()[0].key == "rocks"
    m2 = DashboardModel(top_k=1)  # dict values rank by their count field
    m2.update(Snapshot(t=0, stores={"s": {"x": {"count": 1}, "y": {"count": 4}}}))
    assert m2.store_rows()[0].key == "y"


def test_task_ids_and_lag_table_rows():
    assert [task_id(x) for x in ("0_3", 3, (1, 2), 2.0, None)] == ["0_3", "0_3", "1_2", "0_2", None]
    r = normalize_task({"task": "1_4", "instance": 2, "role": "warmup", "store": "s",
                        "checkpoint_offset": 5.0, "changelog_end": 9, "state": "warmup"})
    assert (r["task"], r["role"], r["checkpoint"], r["lag"], r["instance"]) == ("1_4", "warmup", 5, 4, 2)
    assert normalize_task({"task": 0, "role": "ACTIVE", "lag": float("nan")})["lag"] is None


def test_lag_history_per_task_sums_stores():
    m = DashboardModel(history_points=3)
    for t, lags in enumerate([(5, 0), (3, 2), (0, 4), (0, 0)]):
        m.update(Snapshot(t=10 + t, tasks=[task("0_0", lags[0]), task("0_1", lags[1]),
                                           task("0_0", 1, role="standby", instance=1)]))
    series = m.lag_series()
    assert list(series) == ["0_0", "0_1"]
    assert series["0_0"] == ([1, 2, 3], [3, 0, 0])  # bounded history, seconds since the first refresh
    assert series["0_1"][1] == [2, 4, 0]
    assert m.lag_series(standby=True)["0_0"][1] == [1, 1, 1]
    m2 = DashboardModel()
    m2.update(Snapshot(t=0, tasks=[task("0_0", 3, store="a"), task("0_0", 4, store="b")]))
    assert m2.lag_series()["0_0"][1] == [7] and m2.header()["lag"] == 7


def test_input_rate_follows_the_processed_counter_and_drops_to_zero():
    r = CounterRate(window=5)
    assert r.rate is None
    for t, n in [(0, 0), (1, 1000), (2, 2000), (3, 3000)]:
        r.add(t, n)
    assert r.rate == pytest.approx(1000.0)
    for t in (4, 5, 6, 7, 8, 9):  # the producer stopped: the counter stays at 3000
        r.add(t, 3000)
    assert r.rate == 0.0
    r.add(10, 10)  # a counter that goes down: a new app, start over
    assert r.rate is None
    # an app without events (Spark's own state store): the engine's counter
    m = DashboardModel(rate_window=5)
    for t, n in [(0, 0), (1, 800), (2, 1600)]:
        m.update(Snapshot(t=t, metrics={"records_processed": n, "input_rate": 5555.0}, has_events=False))
    assert m.header()["input_rate"] == pytest.approx(800.0)  # the counter's rate, not Spark's last figure
    for t in range(3, 9):
        m.update(Snapshot(t=t, metrics={"records_processed": 1600, "input_rate": 5555.0}, has_events=False))
    assert m.header()["input_rate"] == 0.0
    m = DashboardModel(rate_window=5)                         # a stopped app reads 0 at once
    for t, n in [(0, 0), (1, 800), (2, 1600)]:
        m.update(Snapshot(t=t, state="RUNNING", metrics={"records_processed": n, "input_rate": 55.0},
                          has_events=False))
    m.update(Snapshot(t=2.5, state="NOT_RUNNING", metrics={"records_processed": 1600,
                                                          "input_rate": 55.0}, has_events=False))
    assert m.header()["input_rate"] == 0.0


def test_the_header_is_the_total_of_the_panels_beside_it():
    """With events, the header's rate, records, batch and lag are the sums of what the Instances
    panel, the chips and the Tasks tab show, whatever the engine's progress says (a browser
    picture showed 0 rec/s, batch 0 and 2,000 processed beside tripled offsets and 171/s)."""
    from kernel_ext.dashboard.model import disagreements

    E = Events()
    m = DashboardModel(rate_window=5)
    evs = [E(ev.Rebalance, 1.0, live=[0, 1], active={"0_0": 0, "0_1": 1}, generation=1)]
    for i, t in enumerate((2.0, 3.0, 4.0)):
        evs += [E(ev.Committed, t, task="0_0", instance=0, batch=i, records=300, rows={"c": 10 * (i + 1)},
                  offsets={"c": 11 * (i + 1)}),
                E(ev.Committed, t + 0.1, task="0_1", instance=1, batch=i, records=200, rows={"c": 5 * (i + 1)},
                  offsets={"c": 6 * (i + 1)})]
    m.update(Snapshot(t=5.0, state="RUNNING", events=evs,
                      metrics={"records_processed": 2000, "last_batch_id": 0, "input_rate": 0.0},
                      instances=[{"instance": 0, "status": "alive"}, {"instance": 1, "status": "alive"}]))
    p = m.picture()
    h = p.header
    assert (h["records"], h["batch_id"], h["rows"], h["lag"]) == (1500, 2, 45, 0)
    assert h["input_rate"] == pytest.approx((900 + 600) / 5) == sum(r["rate"] for r in p.instances)
    assert disagreements(p) == []


def test_restore_round_queued_restoring_done_with_eta_and_summary():
    E = Events()
    m = DashboardModel()
    m.update(Snapshot(t=99.0, state="RESTORING", events=[
        E(ev.RestoreQueued, 100.0, task="0_0", instance=0, source="checkpoint", to_replay=1000, generation=3),
        E(ev.RestoreQueued, 100.0, task="0_1", instance=0, source="checkpoint", to_replay=0, generation=3),
        E(ev.RestoreQueued, 100.1, task="0_2", instance=1, source="standby", to_replay=40, generation=3),
    ]))
    rnd = m.restores.current
    assert [(r.task, r.status, r.total, r.fraction) for r in rnd.ordered()] == [
        ("0_0", "queued", 1000, 0.0), ("0_1", "queued", 0, 0.0), ("0_2", "queued", 40, 0.0)]
    assert m.badge_reason() == "3 queued"
    m.update(Snapshot(t=102.0, state="RESTORING", events=[
        E(ev.RestoreStarted, 100.5, task="0_0", instance=0, store="counts", source="checkpoint",
          start_offset=0, end_offset=1000, to_replay=1000),
        E(ev.RestoreProgress, 101.0, task="0_0", instance=0, store="counts", restored=200, remaining=800,
          rate_rps=400.0),
        E(ev.RestoreProgress, 102.0, task="0_0", instance=0, store="counts", restored=400, remaining=600,
          rate_rps=300.0),
        E(ev.StandbyPromoted, 100.2, task="0_2", instance=1, role="standby", lag=0),
        E(ev.TaskOpened, 100.3, task="0_2", instance=1, source="standby", restored=0),
    ]))
    r0 = rnd.rows["0_0"]
    assert (r0.status, r0.restored, r0.total, r0.fraction) == ("restoring", 400, 1000, 0.4)
    assert r0.rate == pytest.approx(200.0)  # the column: over the last two progress reports
    # the ETA: instance 0's smoothed rate, 400/s over the first half second, then 200/s for a second
    # (an exponential average with a 4 s time constant), not the last report's alone
    rate = 400 + (1 - math.exp(-1 / 4)) * (200 - 400)
    assert rnd.rate(0) == pytest.approx(rate)
    assert rnd.eta(r0) == pytest.approx(600 / rate)
    # 0_1 waits behind 0_0 on instance 0: 600 records left there + its own 0, at the same rate
    assert rnd.eta(rnd.rows["0_1"]) == pytest.approx(600 / rate)
    assert (rnd.rows["0_2"].status, rnd.rows["0_2"].label) == ("promoted", "promoted standby")
    assert m.badge_reason() == "restoring 1 task(s), 1 queued"
    assert not rnd.final and rnd.summary() is None
    m.update(Snapshot(t=106.0, state="RUNNING", events=[
        E(ev.RestoreEnded, 104.5, task="0_0", instance=0, store="counts", source="scratch", start_offset=0,
          end_offset=1000, restored=1000, seconds=4.0, rate_rps=250.0),
        E(ev.TaskOpened, 104.6, task="0_0", instance=0, source="scratch", restored=1000),
        E(ev.TaskOpened, 104.7, task="0_1", instance=0, source="checkpoint", restored=0),
    ]))
    assert rnd.final and not m.restoring
    assert [(r.task, r.status, r.source) for r in rnd.ordered()] == [
        ("0_0", "done", "scratch"), ("0_1", "nothing", "checkpoint"), ("0_2", "promoted", "standby")]
    assert r0.seconds == 4.0 and r0.rate == pytest.approx(250.0) and rnd.eta(r0) == 0.0
    s = rnd.summary()
    assert (s.tasks, s.restored_tasks, s.records, s.promoted, s.nothing) == (3, 1, 1000, 1, 1)
    assert s.seconds == pytest.approx(4.1)  # its restore began at 100.5, the task opened at 104.6
    assert s.task_seconds == {"0_0": (4.0, 1000, 250.0)}
    assert s.line() == ("restored 1 task(s) in 4.1 s (4.0 s replaying): 1,000 records at 250 records/s "
                        "(1 from scratch); "
                        "1 promoted replica(s); 1 task(s) with nothing to replay")
    assert [(k, lab) for _t, k, lab in m.chart_markers()] == [("restored", "restored in 4.1 s")]


def test_restore_rounds_group_one_episode_and_replay():
    E = Events()
    m = DashboardModel()
    evs = [E(ev.RestoreQueued, 10.0, task="0_0", instance=0, to_replay=0, generation=1),
           E(ev.TaskOpened, 10.1, task="0_0", instance=0, restored=0),
           # the next instance's tasks, queued by another generation a moment later: the same start
           E(ev.RestoreQueued, 10.5, task="0_1", instance=1, to_replay=0, generation=2),
           E(ev.TaskOpened, 10.6, task="0_1", instance=1, restored=0),
           # a crash 20 s later: a new round
           E(ev.InstanceDied, 30.0, instance=0, tasks=["0_0"]),
           E(ev.RestoreQueued, 30.1, task="0_0", instance=1, to_replay=50, generation=3),
           E(ev.RestoreStarted, 30.2, task="0_0", instance=1, store="counts", to_replay=50, start_offset=0,
             end_offset=50),
           E(ev.RestoreProgress, 30.4, task="0_0", instance=1, store="counts", restored=20, remaining=30),
           E(ev.RestoreEnded, 30.7, task="0_0", instance=1, store="counts", restored=50, seconds=0.5),
           E(ev.TaskOpened, 30.8, task="0_0", instance=1, restored=50)]
    m.update(Snapshot(t=31.0, events=evs))
    first, second = m.restores.rounds
    assert sorted(first.rows) == ["0_0", "0_1"] and first.summary().nothing == 2
    assert list(second.rows) == ["0_0"] and second.summary().records == 50
    assert [(r.status, r.restored) for r in (second.at(30.15).rows["0_0"], second.at(30.5).rows["0_0"],
                                             second.at(31.0).rows["0_0"])] == [
        ("queued", 0), ("restoring", 20), ("done", 50)]
    assert second.at(29.0).rows == {}


def test_a_task_whose_instance_died_while_restoring_is_queued_again_at_once():
    E = Events()
    m = DashboardModel()
    m.update(Snapshot(t=5.0, events=[
        E(ev.RestoreQueued, 1.0, task="0_0", instance=0, to_replay=100, generation=2),
        E(ev.RestoreStarted, 1.1, task="0_0", instance=0, store="counts", to_replay=100, start_offset=0,
          end_offset=100),
        E(ev.RestoreProgress, 1.3, task="0_0", instance=0, store="counts", restored=60, remaining=40),
        E(ev.InstanceDied, 1.5, instance=0, tasks=["0_0"])]))
    row = m.restores.current.rows["0_0"]
    # waiting for a new owner, its progress gone with the instance; everywhere in the picture
    assert (row.status, row.instance, row.restored, row.label) == ("queued", None, 0, "queued: instance 0 died")
    assert [(c["task"], c["state"], c["instance"]) for c in m.task_chips()] == [("0_0", "queued", None)]
    m.update(Snapshot(t=6.0, events=[E(ev.RestoreQueued, 1.6, task="0_0", instance=1, to_replay=100,
                                       generation=3)]))
    assert len(m.restores.rounds) == 1  # the same episode
    row = m.restores.current.rows["0_0"]
    assert (row.instance, row.status, row.queued_at) == (1, "queued", 1.0)


def test_a_crash_opens_a_round_with_the_dead_instances_tasks_queued():
    E = Events()
    m = DashboardModel()
    m.update(Snapshot(t=3.0, state="RUNNING", instances=[
        {"instance": 0, "status": "alive"}, {"instance": 1, "status": "alive"}], events=[
        E(ev.RestoreQueued, 1.0, task="0_0", instance=0, generation=1),
        E(ev.RestoreQueued, 1.0, task="0_1", instance=1, generation=1),
        E(ev.TaskOpened, 1.1, task="0_0", instance=0),
        E(ev.TaskOpened, 1.1, task="0_1", instance=1)]))
    assert m.restores.current.final
    # a crash a moment after the start opens a new round, though it carries the generation it
    # ended (the start's)
    m.update(Snapshot(t=3.0, events=[E(ev.InstanceDied, 1.5, instance=0, tasks=["0_0"], mode="disk-loss",
                                       generation=1)]))
    rnd = m.restores.current
    assert len(m.restores.rounds) == 2 and list(rnd.rows) == ["0_0"] and rnd.started == 1.5
    p = m.picture()
    assert [(c["task"], c["state"], c["instance"]) for c in p.chips] == [("0_0", "queued", None),
                                                                         ("0_1", "running", 1)]
    assert [(r["instance"], r["status"], r["active"]) for r in p.instances] == [(0, "dead", []),
                                                                                 (1, "alive", ["0_1"])]
    assert p.reason == "1 queued" and p.header["instances"] == (1, 2)
    from kernel_ext.dashboard.model import disagreements
    assert disagreements(p) == []


def test_one_generation_in_one_picture_after_a_crash():
    """The header, the Restoration panel and the moves line name the rebalance that moved the
    dead instance's tasks, though the metrics' poll has not seen it yet and the crash carries the
    generation it ended (a browser picture of notebook 05 showed 1, 1 and 2)."""
    from kernel_ext.dashboard import panels

    E = Events()
    m = DashboardModel()
    m.update(Snapshot(t=0.0, state="RUNNING", metrics={"generation": 1, "batches": 3}, events=[
        E(ev.RestoreQueued, 1.0, task="0_0", instance=0, generation=1),
        E(ev.RestoreQueued, 1.0, task="0_1", instance=1, generation=1),
        E(ev.Rebalance, 1.3, active={"0_0": 0, "0_1": 1}, generation=1)]))
    assert m.header()["generation"] == 1
    m.update(Snapshot(t=6.0, state="RUNNING", metrics={"generation": 1, "batches": 4}, events=[
        E(ev.InstanceDied, 5.0, instance=0, tasks=["0_0"], generation=1),
        E(ev.RestoreQueued, 5.1, task="0_0", instance=1, source="standby", generation=2),
        E(ev.Rebalance, 5.2, active={"0_0": 1, "0_1": 1}, moves=[{"task": "0_0", "from": 0, "to": 1}],
          generation=2)]))
    assert m.header()["generation"] == 2
    assert "round began" in panels.render_restore(m) and "· generation 2" in panels.render_restore(m)
    assert "(generation 2," in panels.render_moves(m)


def test_ownership_timeline_counts_only_real_moves():
    E = Events()
    m = DashboardModel()
    m.update(Snapshot(t=0.0, events=[
        E(ev.RestoreQueued, 1.0, task="0_0", instance=0, generation=1),
        E(ev.RestoreQueued, 1.0, task="0_1", instance=1, generation=1),
        E(ev.TaskOpened, 1.2, task="0_0", instance=0),
        E(ev.Rebalance, 1.3, active={"0_0": 0, "0_1": 1}, generation=1),
        # instance 0 dies; its task moves to 1
        E(ev.InstanceDied, 5.0, instance=0, tasks=["0_0"]),
        E(ev.RestoreQueued, 5.1, task="0_0", instance=1, generation=2),
        E(ev.Rebalance, 5.2, active={"0_0": 1, "0_1": 1}, moves=[{"task": "0_0", "from": 0, "to": 1}],
          generation=2),
        # a rebalance that changes nothing for either task
        E(ev.Rebalance, 6.0, active={"0_0": 1, "0_1": 1}, warmups={"0_1": [0]}, generation=3),
        E(ev.WarmupCaughtUp, 9.0, task="0_1", instance=0),
        E(ev.RestoreQueued, 9.1, task="0_1", instance=0, source="warmup", generation=4),
        E(ev.StandbyPromoted, 9.2, task="0_1", instance=0, role="warmup"),
        E(ev.TaskOpened, 9.3, task="0_1", instance=0, source="warmup"),
        E(ev.Rebalance, 9.4, active={"0_0": 1, "0_1": 0}, generation=4)]))
    own = m.ownership
    assert own.moves == 2
    assert own.owner_history("0_0") == [0, 1] and own.owner_history("0_1") == [1, 0]
    seg = own.segments["0_0"]
    assert [(s.instance, s.start, s.end, s.opened) for s in seg] == [(0, 1.0, 5.0, 1.2), (1, 5.1, None, None)]
    assert [(s.instance, s.start, s.end) for s in own.warmups["0_1"]] == [(0, 6.0, 9.2)]
    kinds = [(mk.kind, mk.task) for mk in own.markers if mk.task is not None]
    assert kinds == [("crash", "0_0"), ("caught-up", "0_1"), ("promoted", "0_1")]
    # a dead instance's task that comes back to the same instance did not move
    E2 = Events()
    m2 = DashboardModel()
    m2.update(Snapshot(t=0.0, events=[
        E2(ev.RestoreQueued, 1.0, task="0_0", instance=0, generation=1),
        E2(ev.InstanceDied, 2.0, instance=0, tasks=["0_0"]),
        E2(ev.RestoreQueued, 3.0, task="0_0", instance=0, generation=2)]))
    assert m2.ownership.moves == 0 and len(m2.ownership.segments["0_0"]) == 2


def test_badge_reasons():
    m = DashboardModel()
    m.update(Snapshot(t=0, state="RUNNING", metrics={"batches": 0}))
    assert m.badge_reason() == "waiting for the first micro-batch (no commit yet)"
    E0 = Events()
    m0 = DashboardModel()
    m0.update(Snapshot(t=100.0, state="RUNNING", metrics={"batches": 0}, events=[
        E0(ev.StateChanged, 88.0, state="RESTORING", old="CREATED"),
        E0(ev.StateChanged, 89.0, state="RUNNING", old="RESTORING"),
        E0(ev.Committed, 99.0, task="0_0", instance=0, batch=0, records=40_000)]))
    # what it waits for, from the first second: how long, and what the tasks committed so far
    # the tasks committed batch 0 (the header says "batch 0"): the badge does not say it waits
    assert m0.header()["batch_id"] == 0
    assert m0.badge_reason() == "the first micro-batch is not over (running 12 s; 40,000 records committed so far)"
    assert m0.header()["records"] == 40_000
    m.update(Snapshot(t=1, state="RUNNING", metrics={"batches": 3}))
    assert m.badge_reason() == ""
    m.update(Snapshot(t=2, state="ERROR", app_error="ProcessorError: task 0_1 failed on key='a': "
                                                    "ZeroDivisionError: division by zero"))
    assert m.badge_reason().startswith("ProcessorError: task 0_1 failed") and m.header()["state"] == "ERROR"
    E = Events()
    m.update(Snapshot(t=3, state="REBALANCING", metrics={"batches": 3}, events=[
        E(ev.Rebalance, 3.0, reason="instance 1 died", generation=7, moves=[{"task": "0_1", "from": 1, "to": 0}])]))
    assert m.badge_reason() == "generation 7 (instance 1 died): moving 0_1"
    assert m.last_error.startswith("ProcessorError")  # kept after the app left ERROR


def test_instances_rates_and_task_chips():
    E = Events()
    m = DashboardModel(rate_window=5)
    commits = [E(ev.Committed, t, task=tk, instance=i, records=n, batch=b,
                 rows={"counts": 10}, cache={"counts": {"dirty": 3}})
               for t, tk, i, n, b in [(11.0, "0_0", 0, 100, 1), (12.0, "0_0", 0, 150, 2),
                                      (12.5, "0_1", 1, 40, 2), (3.0, "0_1", 1, 999, 0)]]
    m.update(Snapshot(
        t=13.0, tasks=[task("0_0", 0, instance=0), task("0_1", 0, instance=1)],
        status={"0_0": {"instance": 0, "state": "running", "backlog": 0},
                "0_1": {"instance": 1, "state": "restoring", "backlog": 2}},
        instances=[{"instance": 0, "status": "alive", "active": ["0_0"], "standby": ["0_1"], "warmup": []},
                   {"instance": 1, "status": "alive", "active": ["0_1"], "standby": [], "warmup": []},
                   {"instance": 2, "status": "dead", "active": [], "standby": [], "warmup": []}],
        events=commits))
    rows = m.instance_rows()
    assert [(r["instance"], r["status"], r["active"], r["standby"]) for r in rows] == [
        (0, "alive", ["0_0"], ["0_1"]), (1, "alive", ["0_1"], []), (2, "dead", [], [])]
    assert [r["rate"] for r in rows] == [50.0, 8.0, 0.0]  # (100+150)/5 s, 40/5 s; the old commit left the window
    assert m.header()["instances"] == (2, 3)
    chips = m.task_chips()
    # 0_1's commit at 12.5 says it runs (the status, up to a second older, says restoring); its
    # backlog comes from the status
    assert [(c["task"], c["instance"], c["state"], c["backlog"]) for c in chips] == [
        ("0_0", 0, "running", 0), ("0_1", 1, "running", 2)]
    # a task no event told about (a dashboard opened late): the instances' own word
    m.update(Snapshot(t=13.5, status={"0_2": {"instance": 1, "state": "restoring", "backlog": 1}}))
    assert [(c["task"], c["state"]) for c in m.task_chips()][-1] == ("0_2", "restoring")
    assert [(r["task"], r["role"], r["instance"], r["rows"], r["dirty"]) for r in m.tasks()] == [
        ("0_0", "active", 0, 10, 3), ("0_1", "active", 1, 10, 3), ("0_1", "standby", 0, None, None),
        ("0_2", "active", 1, None, None)]
    m.update(Snapshot(t=14.0, status={"0_0": {"instance": 0, "state": "running"}},
                      events=[E(ev.TaskFailed, 13.5, task="0_0", instance=0, error="ZeroDivisionError: x")]))
    assert [(c["task"], c["state"]) for c in m.task_chips()][0] == ("0_0", "failed")
    m.update(Snapshot(t=15.0, status={"0_0": {"instance": 0, "state": "running"}},
                      events=[E(ev.TaskOpened, 14.5, task="0_0", instance=0)]))
    assert [(c["task"], c["state"]) for c in m.task_chips()][0] == ("0_0", "running")


def test_forecast_by_instance_and_before_a_round():
    from kernel_ext.dashboard.model import forecast_data, forecast_seconds

    class Forecast:  # App.restore_forecast()'s shape: a frame and a line per instance
        frame = [{"task": "0_0", "instance": 0, "source": "scratch", "records": 100, "seconds": 2.0},
                 {"task": "0_0", "instance": 0, "source": "standby", "records": 3, "seconds": 0.1},
                 {"task": "0_0", "instance": 0, "source": "warmup", "records": 9, "seconds": 0.3},
                 {"task": "0_1", "instance": 0, "source": "scratch", "records": 80, "seconds": 1.5},
                 {"task": "0_2", "instance": 1, "source": "scratch", "records": 150, "seconds": 3.0},
                 {"task": "0_2", "instance": 1, "source": "checkpoint", "records": 0, "seconds": 0.0}]
        lines = {0: "if instance 0 died now: ≈ 3.5 s from scratch", 1: "if instance 1 died now: ≈ 3.0 s"}

    fc = forecast_data(Forecast())
    assert forecast_by_instance(fc) == [
        {"instance": 0, "tasks": ["0_0", "0_1"], "scratch_s": 3.5, "standby_s": 0.1,
         "line": "if instance 0 died now: ≈ 3.5 s from scratch"},
        {"instance": 1, "tasks": ["0_2"], "scratch_s": 3.0, "standby_s": None,
         "line": "if instance 1 died now: ≈ 3.0 s"}]
    assert [forecast_seconds(fc, "0_0", s) for s in ("scratch", "standby", "checkpoint")] == [2.0, 0.1, None]
    # a forecast that counted no record of what a restore then read is no forecast of it
    assert forecast_seconds(fc, "0_2", "checkpoint") == 0.0 and forecast_seconds(fc, "0_2", "checkpoint", 50) is None
    E = Events()
    m = DashboardModel()
    m.update(Snapshot(t=1.0, forecast=fc))
    later = forecast_data(Forecast())
    m.update(Snapshot(t=2.0, forecast=later,
                      events=[E(ev.RestoreQueued, 2.0, task="0_0", instance=1, to_replay=5, generation=2)]))
    # the forecast made before the round is kept with it; a newer one is not taken while restoring
    assert m.round_forecast() == (1.0, fc) and m.round_forecast()[1] is fc
    m.update(Snapshot(t=3.0, forecast=forecast_data(Forecast())))
    assert m.forecast is fc


def test_changelog_rows_match_store_and_task_partition():
    m = DashboardModel()
    m.update(Snapshot(t=0, tasks=[task("0_0", 0, rows=7), task("0_1", 0, rows=3)],
                      stores={"counts": {}, "cnt": {}}, changelog=[
        {"topic": "wc-counts-changelog", "partition": 1, "log_start_offset": 0, "high_watermark": 50,
         "records": 20, "dirty_ratio": 0.25, "cleaner_runs": 2, "records_removed": 30}]))
    (row,) = m.changelog_rows()
    assert (row["store"], row["live_keys"], row["records"], row["cleaner_runs"]) == ("counts", 3, 20, 2)


def test_clip_and_eta_formats():
    assert clip("a  b\nc", 10) == "a b c"
    assert clip("x" * 20, 8) == "xxxxxxx…" and len(clip("é" * 20, 8)) == 8
    assert fmt_eta(None) == "–" and fmt_eta(0.2) == "<1 s" and fmt_eta(42) == "42 s" and fmt_eta(600) == "10 min"


def test_layout_topology_columns():
    nodes = [{"id": "src", "kind": "source"}, {"id": "map", "kind": "processor"},
             {"id": "agg", "kind": "processor"}, {"id": "counts", "kind": "store"},
             {"id": "cl", "kind": "changelog"}, {"id": "out", "kind": "sink"},
             {"id": "src2", "kind": "source"}]
    edges = [("src", "map"), ("map", "agg"), ("src2", "agg"), ("agg", "counts"), ("counts", "cl"), ("agg", "out")]
    pos = layout_topology(nodes, edges)
    assert pos["src"][0] == pos["src2"][0] == 0
    assert pos["map"][0] == 1 and pos["agg"][0] == 2
    assert pos["counts"][0] == 3 and pos["cl"][0] == 4 and pos["out"][0] == 5
    assert pos["src"][1] != pos["src2"][1]
    assert all(0 <= y <= 1 for _, y in pos.values())


class _CommitApp:
    """Two tasks of one store; a store read is counted; commits move the changelog offsets."""

    state = "RUNNING"

    def __init__(self):
        self.batch = 3
        self.checkpoints = {"0_0": 10, "0_1": 20}
        self.rows = {"a": 1, "b": 2}
        self.store_reads = 0

    def metrics(self):
        return {"last_batch_id": self.batch}

    def lag(self):
        return [{"task": t, "instance": 0, "role": "active", "store": "counts", "checkpoint_offset": cp,
                 "changelog_end": cp, "lag": 0} for t, cp in self.checkpoints.items()]

    def query_all(self, store):
        self.store_reads += 1
        return dict(self.rows)


def test_a_store_is_read_again_only_after_a_commit():
    from kernel_ext.dashboard.collect import collect

    app, cache, m = _CommitApp(), StoreCache(max_age=30.0), DashboardModel()
    s1 = collect(app, stores=["counts"], cache=cache)
    m.update(s1)
    assert (app.store_reads, cache.reads, cache.skips) == (1, 1, 0)
    s2 = collect(app, stores=["counts"], cache=cache)  # nothing committed: no read, the same rows
    m.update(s2)
    assert (app.store_reads, cache.reads, cache.skips) == (1, 1, 1)
    assert s2.stores["counts"] is s1.stores["counts"] and m.changed_count("counts") == 0
    app.rows["b"] = 5  # task 0_1 commits (its offset moves): read again, the row is highlighted
    app.checkpoints["0_1"] = 21
    m.update(collect(app, stores=["counts"], cache=cache))
    assert (app.store_reads, cache.reads, cache.skips) == (2, 2, 1)
    assert m.diffs["counts"].changed == {"b"} and m.diffs["counts"].added == set()
    assert [(r.key, r.value, r.status) for r in m.store_rows()] == [("b", 5, "changed"), ("a", 1, None)]
    app.batch = 4  # a new micro-batch (even with the same offsets) reads again
    collect(app, stores=["counts"], cache=cache)
    assert app.store_reads == 3
    app.state = "RESTORING"  # a state change reads again
    collect(app, stores=["counts"], cache=cache)
    assert app.store_reads == 4
    app.state = "ERROR"  # not running: the stores are not read, the last rows stay
    snap = collect(app, stores=["counts"], cache=cache)
    assert app.store_reads == 4 and snap.stores["counts"] == {"a": 1, "b": 5}


def test_store_cache_signature_and_max_age():
    app = _CommitApp()
    assert StoreCache.signature("counts", "RUNNING", {}, [dict(r, checkpoint_offset=None) for r in app.lag()]) is None
    assert StoreCache.signature("counts", "RUNNING", {"last_batch_id": 7, "generation": 2}, app.lag()) == \
        ("RUNNING", 2, 7, (("0_0", 0, 10), ("0_1", 0, 20)))
    c = StoreCache(max_age=30.0)
    c.put("counts", ("RUNNING", 1, ()), 100.0, ({"a": 1}, {}))
    assert c.get("counts", ("RUNNING", 1, ()), 130.0) == ({"a": 1}, {})
    assert c.get("counts", ("RUNNING", 1, ()), 130.5) is None
    assert c.get("counts", ("RUNNING", 2, ()), 101.0) is None
    assert c.last("counts") == ({"a": 1}, {}) and c.last("other") is None
    assert (c.reads, c.skips) == (1, 1)


def test_throttled_heavy_panel_and_nice_axis_limits():
    from kernel_ext.dashboard.charts import axis_limit
    from kernel_ext.dashboard.collect import Throttled

    now = [0.0]
    calls = []
    th = Throttled(lambda: calls.append(now[0]) or len(calls), every=5.0, clock=lambda: now[0])
    got = []
    for t in (0.0, 1.0, 4.9, 5.0, 6.0, 11.0):
        now[0] = t
        got.append(th())
    assert got == [1, 1, 1, 2, 2, 3] and calls == [0.0, 5.0, 11.0] and th.calls == 3
    assert [axis_limit(v, floor=30.0) for v in (1, 29, 31, 37, 41, 123, 599)] == [30, 30, 40, 40, 50, 150, 600]
    assert [axis_limit(v, floor=4) for v in (0, 4.6, 115, 575.0)] == [4, 5, 150, 600]


def test_a_restore_without_progress_yet_gets_an_eta_from_the_tasks_done_before_it():
    E = Events()
    m = DashboardModel()
    m.update(Snapshot(t=20.0, events=[
        E(ev.RestoreQueued, 10.0, task="0_0", instance=0, to_replay=300, generation=2),
        E(ev.RestoreQueued, 10.0, task="0_1", instance=0, to_replay=500, generation=2),
        E(ev.RestoreStarted, 10.1, task="0_0", instance=0, store="s", to_replay=300, start_offset=0,
          end_offset=300),
        E(ev.RestoreEnded, 13.1, task="0_0", instance=0, store="s", restored=300, seconds=3.0),
        E(ev.TaskOpened, 13.1, task="0_0", instance=0, restored=300),
        E(ev.RestoreStarted, 13.2, task="0_1", instance=0, store="s", to_replay=500, start_offset=0,
          end_offset=500)]))
    rnd = m.restores.current
    row = rnd.rows["0_1"]
    assert row.status == "restoring" and row.rate is None     # no progress report of its own yet
    assert rnd.eta(row) == pytest.approx(5.0)                   # 500 records at 0_0's 100 records/s


def test_the_badge_shows_the_exception_of_a_long_error_line():
    from kernel_ext.dashboard.model import short_error

    line = ("KSTREAM-MAPVALUES-0000000001 (map values) failed on key='when' value={'seq': 3, 'word': "
            "'when'} from nums partition 0 offset 0: ZeroDivisionError: division by zero")
    assert short_error(line) == "map values failed: ZeroDivisionError: division by zero"
    assert short_error("every instance of 'wc' is dead: restart() or revive() one") == \
        "every instance of 'wc' is dead: restart() or revive() one"
    m = DashboardModel()
    m.update(Snapshot(t=0, state="ERROR", app_error=line))
    assert m.badge_reason() == "map values failed: ZeroDivisionError: division by zero"


def test_a_restoring_task_that_read_every_record_is_not_shown_done():
    from kernel_ext.dashboard.restore import RestoreRow, StoreProgress

    r = RestoreRow(task="0_0", instance=0, source="scratch", status="restoring",
                   stores={"counts": StoreProgress(total=1000, restored=1000)})
    assert r.fraction == 0.99        # the last write and the checkpoint are still to come
    r.status = "done"
    assert r.fraction == 1.0


def test_an_eta_does_not_jump_when_one_report_dips():
    # a restore at 100k records/s whose tail stalls for a report (RocksDB flushing): the ETA of the
    # task queued behind it moves by a fraction, where the last two reports alone said 100x
    E = Events()
    m = DashboardModel()
    evs = [E(ev.RestoreQueued, 0.0, task="0_0", instance=0, to_replay=1_000_000, generation=2),
           E(ev.RestoreQueued, 0.0, task="0_1", instance=0, to_replay=1_000_000, generation=2),
           E(ev.RestoreStarted, 0.1, task="0_0", instance=0, store="s", to_replay=1_000_000, start_offset=0,
             end_offset=1_000_000)]
    m.update(Snapshot(t=0.2, events=evs))
    rnd = m.restores.current
    etas, naive = [], []
    restored = 0
    for i, step in enumerate([100_000] * 4 + [1_000] + [100_000] * 3):
        restored += step
        t = 0.1 + (i + 1) * 1.0
        m.update(Snapshot(t=t, events=[E(ev.RestoreProgress, t, task="0_0", instance=0, store="s",
                                         restored=restored, remaining=1_000_000 - restored)]))
        etas.append(rnd.eta(rnd.rows["0_1"]))
        naive.append((2_000_000 - restored) / rnd.rows["0_0"].rate)   # the last two reports' rate
    assert naive[4] / naive[3] > 90                              # what a dip did to the old ETA
    jumps = [b / a for a, b in zip(etas, etas[1:])]
    assert all(0.5 < j < 1.5 for j in jumps), (etas, jumps)
    assert max(jumps) < 1.3                                      # the dip: +27%, not 100x


def test_the_first_eta_is_the_forecast_and_the_rate_starts_from_it():
    E = Events()
    m = DashboardModel()
    fc = {"rows": [{"task": "0_0", "instance": 1, "source": "scratch", "records": 1000, "seconds": 10.0},
                   {"task": "0_1", "instance": 1, "source": "scratch", "records": 1000, "seconds": 10.0}],
          "lines": {1: "if instance 1 died now: ≈ 20.0 s from scratch for 0_0, 0_1 (2,000 records)"}}
    m.update(Snapshot(t=1.0, state="RUNNING", forecast=fc))
    m.update(Snapshot(t=2.0, events=[
        E(ev.RestoreQueued, 2.0, task="0_0", instance=0, source="scratch", to_replay=1000, generation=2),
        E(ev.RestoreQueued, 2.0, task="0_1", instance=0, source="scratch", to_replay=1000, generation=2),
        E(ev.RestoreStarted, 2.1, task="0_0", instance=0, store="s", source="scratch", to_replay=1000,
          end_offset=1000)]))
    rnd = m.restores.current
    assert rnd.forecast is fc and m.round_forecast() == (1.0, fc)
    # no rate measured yet: the forecast's seconds, the queued task behind the restoring one
    assert rnd.estimate(rnd.rows["0_0"]) == (10.0, True) and rnd.estimate(rnd.rows["0_1"]) == (20.0, True)
    m.update(Snapshot(t=3.2, events=[E(ev.RestoreProgress, 3.1, task="0_0", instance=0, store="s",
                                       restored=200, remaining=800)]))
    # one report at 200 records/s moves the forecast's 100 records/s a quarter of the way (1 s of 4)
    rate = 100 + (1 - math.exp(-1 / 4)) * (200 - 100)
    assert rnd.rate(0) == pytest.approx(rate)
    assert rnd.estimate(rnd.rows["0_1"]) == (pytest.approx(1800 / rate), False)


def test_store_rows_are_the_latest_key_counts_of_the_commits():
    # STORE ROWS is the sum of each task's latest commit's key count, never a sum of updates
    E = Events()
    m = DashboardModel()
    m.update(Snapshot(t=5.0, events=[
        E(ev.Committed, 1.0, task="0_0", instance=0, batch=0, records=100, rows={"counts": 60}),
        E(ev.Committed, 1.0, task="0_1", instance=0, batch=0, records=100, rows={"counts": 40}),
        E(ev.Committed, 2.0, task="0_0", instance=0, batch=1, records=100, rows={"counts": 70}),
        E(ev.Committed, 2.0, task="0_1", instance=0, batch=1, records=100, rows={"counts": 40})]))
    assert m.header()["rows"] == 110 and m.header()["records"] == 400
    assert [(r["task"], r["rows"]) for r in m.tasks()] == [("0_0", 70), ("0_1", 40)]


def test_the_model_reads_typed_events_only():
    m = DashboardModel()
    assert m.apply({"type": "instance_died", "instance": 0, "ts": 1.0}) is False
    assert m.ignored == 1 and m.board.instances == {} and m.version == 0
    assert m.apply(ev.InstanceDied(instance=0, ts=1.0, tasks=[])) is True   # urgent: drawn at once
    assert m.board.instances[0].status == "dead"


def test_a_stopped_app_shows_no_live_instance_or_task():
    E = Events()
    m = DashboardModel()
    m.update(Snapshot(t=2.0, state="RUNNING", events=[
        E(ev.InstanceStarted, 0.5, instance=0), E(ev.InstanceStarted, 0.5, instance=1),
        E(ev.RestoreQueued, 1.0, task="0_0", instance=0, generation=1),
        E(ev.TaskOpened, 1.1, task="0_0", instance=0)],
        instances=[{"instance": 0, "status": "alive"}, {"instance": 1, "status": "alive"}]))
    assert m.header()["instances"] == (2, 2)
    m.final("NOT_RUNNING")       # after stop or down: nothing is asked any more
    p = m.picture()
    assert p.state == "NOT_RUNNING" and p.header["instances"] == (0, 2) and p.reason == "stopped"
    assert [c["state"] for c in p.chips] == ["closed"] and [r["status"] for r in p.instances] == ["stopped"] * 2
    from kernel_ext.dashboard.model import disagreements
    assert disagreements(p) == []
    # a poll of a stopped app says the same (the StateChanged event may never be read)
    m2 = DashboardModel()
    m2.update(Snapshot(t=1.0, state="RUNNING", instances=[{"instance": 0, "status": "alive"}]))
    m2.update(Snapshot(t=2.0, state="NOT_RUNNING"))
    assert m2.header()["instances"] == (0, 1)


def test_disagreements_are_found():
    from kernel_ext.dashboard.model import disagreements

    E = Events()
    m = DashboardModel()
    m.update(Snapshot(t=2.0, state="RUNNING", instances=[{"instance": 0, "status": "alive"}], events=[
        E(ev.RestoreQueued, 1.0, task="0_0", instance=0, generation=1),
        E(ev.RestoreStarted, 1.1, task="0_0", instance=0, store="s", to_replay=10, end_offset=10)]))
    p = m.picture()
    assert disagreements(p) == []
    p.chips[0]["state"] = "running"                  # a chip that says otherwise than the panel
    p.header["instances"] = (2, 2)
    assert disagreements(p) == ["task 0_0: chip running@0 vs Tasks tab restoring@0",
                                "task 0_0: Restoration restoring@0 vs chip running@0",
                                "header 2 alive vs Instances panel 1"]


def test_a_poll_that_sees_a_death_before_its_event_changes_nothing():
    # the coordinator marks the instance dead a moment before it publishes the death: a poll in
    # between must not leave the instance dead with its tasks still running on it
    from kernel_ext.dashboard.model import disagreements

    E = Events()
    m = DashboardModel()
    m.update(Snapshot(t=2.0, state="RUNNING", events=[
        E(ev.InstanceStarted, 0.5, instance=0), E(ev.InstanceStarted, 0.5, instance=1),
        E(ev.RestoreQueued, 1.0, task="0_0", instance=0, generation=1),
        E(ev.TaskOpened, 1.1, task="0_0", instance=0)]))
    m.update(Snapshot(t=3.0, state="RUNNING", instances=[{"instance": 0, "status": "dead"},
                                                         {"instance": 1, "status": "alive"}]))
    p = m.picture()
    assert [r["status"] for r in p.instances] == ["alive", "alive"] and disagreements(p) == []
    m.update(Snapshot(t=3.1, events=[E(ev.InstanceDied, 3.05, instance=0, tasks=["0_0"])]))
    p = m.picture()
    assert [r["status"] for r in p.instances] == ["dead", "alive"] and disagreements(p) == []
    assert [(c["task"], c["state"], c["instance"]) for c in p.chips] == [("0_0", "queued", None)]


def test_a_done_row_replayed_what_it_says_it_had_to_and_says_what_compaction_saved():
    """A restore crosses more offsets than it reads records (compaction, transaction markers):
    while it runs "to replay" is the offsets, drawn as an upper bound; done, it is the records
    read, both sides equal, the offsets without a record said apart (a browser picture showed
    "629,701 / 634,666" and "191 / 172" on done rows)."""
    from kernel_ext.dashboard import panels
    from kernel_ext.dashboard.model import disagreements

    E = Events()
    m = DashboardModel()
    m.update(Snapshot(t=10.0, state="RESTORING", events=[
        E(ev.RestoreQueued, 1.0, task="0_0", instance=0, source="scratch", to_replay=634_666,
          stores={"counts": [0, 634_666]}, generation=2),
        E(ev.RestoreStarted, 1.1, task="0_0", instance=0, store="counts", source="scratch",
          start_offset=0, end_offset=634_666, to_replay=634_666),
        E(ev.RestoreProgress, 2.0, task="0_0", instance=0, store="counts", offset=300_000,
          restored=298_000, remaining=334_666)]))
    row = m.restores.current.rows["0_0"]
    assert (row.restored, row.total, row.exact) == (298_000, 634_666, False)
    assert row.fraction == pytest.approx(300_000 / 634_666)       # the offsets crossed
    assert "298,000 / ≤ 634,666" in panels.render_restore(m)
    assert m.header()["lag"] == 334_666 and disagreements(m.picture()) == []
    m.update(Snapshot(t=11.0, state="RUNNING", events=[
        E(ev.RestoreEnded, 4.0, task="0_0", instance=0, store="counts", source="scratch", start_offset=0,
          end_offset=634_666, restored=629_701, seconds=2.9),
        E(ev.TaskOpened, 4.1, task="0_0", instance=0, source="scratch", restored=629_720)]))   # + _task
    row = m.restores.current.rows["0_0"]
    assert (row.status, row.restored, row.total, row.skipped) == ("done", 629_701, 629_701, 4_965)
    html = panels.render_restore(m)
    assert "629,701 / 629,701" in html and "4,965 of the offsets it crossed held no record" in html
    assert "4,965 offsets held no record (compacted away, or transaction markers)" in html   # the summary
    assert disagreements(m.picture()) == []


def test_an_executors_death_noticed_after_its_tasks_reopened_elsewhere_queues_nothing():
    """On a cluster Spark runs a dead executor's tasks on another before the driver notices the
    death: the death must not queue them again (notebook 13 showed "2 queued" for 10 s); the
    rebalance that announced the moves names the generation the header shows."""
    from kernel_ext.dashboard import panels
    from kernel_ext.dashboard.model import disagreements

    E = Events()
    m = DashboardModel()
    m.update(Snapshot(t=2.0, state="RUNNING", events=[
        E(ev.InstanceStarted, 1.0, instance=1), E(ev.InstanceStarted, 1.0, instance=2),
        E(ev.Committed, 1.2, task="0_0", instance=1, batch=0, records=5, offsets={"c": 6}),
        E(ev.Committed, 1.2, task="0_1", instance=2, batch=0, records=5, offsets={"c": 6}),
        E(ev.Rebalance, 1.3, live=[1, 2], active={"0_0": 1, "0_1": 2}, generation=1)]))
    m.update(Snapshot(t=9.0, state="RUNNING", events=[
        E(ev.StandbyPromoted, 5.0, task="0_0", instance=2, role="standby", lag=0),
        E(ev.TaskOpened, 5.1, task="0_0", instance=2, source="standby", restored=0),
        E(ev.InstanceDied, 6.0, instance=1, tasks=["0_0"], generation=1),
        E(ev.Rebalance, 6.1, live=[2], active={"0_0": 2, "0_1": 2}, generation=2,
          moves=[{"task": "0_0", "from": 1, "to": 2, "reason": "owner-died"}])]))
    p = m.picture()
    assert [(c["task"], c["state"], c["instance"]) for c in p.chips] == [("0_0", "running", 2),
                                                                         ("0_1", "running", 2)]
    assert "queued" not in p.reason and p.header["generation"] == 2
    assert disagreements(p) == []
    assert "promoted standby" in panels.render_restore(m) and "<tr class='dead'>" not in panels.render_restore(m)


def test_an_outage_is_a_band_on_the_lag_chart_and_the_badge_says_what_the_app_waits_for():
    from kernel_ext.dashboard import svg
    from kernel_ext.dashboard.model import disagreements

    E = Events()
    m = DashboardModel()
    m.update(Snapshot(t=100.0, state="RUNNING", tasks=[task("0_0", 0)]))
    line = "waiting for Kafka at h:1 since 3 s; 1 transaction aborted; tasks waiting: 0_0"
    m.update(Snapshot(t=104.0, state="WAITING", tasks=[],
                      waiting={"line": line, "since": 101.0, "aborted": 1, "tasks": ["0_0"]}))
    p = m.picture()
    assert p.state == "WAITING" and p.reason == line and not disagreements(p)
    assert p.outages == [(1.0, 4.0, "Kafka away 3 s · 1 transaction aborted")]   # still open: to now
    # Kafka is back: the poll closes the band, the event (published after the outage) fixes its end
    m.update(Snapshot(t=108.0, state="RESTORING", tasks=[task("0_0", 40)]))
    m.update(Snapshot(t=109.0, state="RUNNING", tasks=[task("0_0", 0)],
                      events=[E(ev.KafkaAvailable, 108.5, bootstrap="h:1", since=101.0, seconds=6.5,
                                aborted=2, tasks_waited=["0_0"])]))
    p = m.picture()
    assert p.outages == [(1.0, 7.5, "Kafka away 6 s · 2 transactions aborted")]
    chart = svg.lag_chart(p.lag, p.standby_lag, p.markers, p.outages)
    assert chart.count("class='kafka-away'") == 1 and "Kafka away 6 s · 2 transactions aborted" in chart
    # what it aborted is written on the chart, under its length, not only in the tooltip
    assert re.findall(r"class='kafka-away-label'>([^<]*)<", chart) == ["Kafka away 6 s", "2 transactions aborted"]
    assert "Kafka away" not in svg.lag_chart(p.lag, p.standby_lag, p.markers)


def test_a_stopped_poller_leaves_no_forecast_running_and_starts_none():
    """A forecast the poller makes (a calibration: seconds in the app) is waited for by `stop()`,
    and none is started once it stopped: nothing the dashboard started runs on after it."""
    import threading
    import time
    from types import SimpleNamespace

    from kernel_ext.dashboard.collect import Poller

    calls, ended = [], threading.Event()

    def slow_forecast():
        calls.append(time.monotonic())
        time.sleep(0.3)
        ended.set()

    m = DashboardModel(name="fc-stop")
    p = Poller(SimpleNamespace(name="fc-stop"), m, forecast_fn=slow_forecast)
    snap = Snapshot(t=1.0, state="RUNNING", tasks=[], instances=[], metrics={})
    p._forecast(snap, force=False)
    from waiting import wait_until

    wait_until(lambda: calls, 5, "the forecast being made")
    p.stop(timeout=5)
    assert ended.is_set() and not p._fc_thread.is_alive()
    m.commits += 1                      # something changed: a running poller would forecast again
    p._fc_at = None
    p._forecast(snap, force=False)
    time.sleep(0.05)
    assert len(calls) == 1


def test_the_forecast_left_on_a_stopped_app_counts_its_last_commits_or_says_it_does_not():
    """A forecast made before the app's last commits says fewer records than the changelogs hold.
    `%statekit stop`'s last poll counts them again, at that forecast's own rate (no calibration
    while the app stops); a stopped app whose forecast could not be counted again says so."""
    from types import SimpleNamespace

    from kernel_ext.dashboard.collect import Poller
    from kernel_ext.dashboard.model import forecast_data
    from kernel_ext.dashboard.panels import render_forecast

    def made(records, rate, at):
        rows = [{"task": f"0_{i}", "instance": 0, "source": "scratch", "records": n, "seconds": n / rate,
                 "apply_rate": rate, "rate_source": "calibrated", "load": 1.0, "exact": True}
                for i, n in enumerate(records)]
        return SimpleNamespace(frame=rows, made_at=at, lines={
            0: f"if instance 0 died now: ≈ from scratch ({sum(records):,} records)"})

    E = Events()
    m = DashboardModel(name="fc-final")
    m.update(Snapshot(t=10.0, state="RUNNING", forecast=forecast_data(made([0, 0], 50_000.0, 10.0)),
                      events=[E(ev.StateChanged, 9.0, state="RUNNING", old="CREATED")]))
    m.update(Snapshot(t=12.0, state="RUNNING", events=[
        E(ev.Committed, 11.5, task="0_0", instance=0, batch=0, records=30, offsets={"c": 30}),
        E(ev.Committed, 11.6, task="0_1", instance=0, batch=0, records=20, offsets={"c": 20})]))
    assert not m.picture().forecast_behind   # running: a newer forecast is on its way
    asked = []

    def forecast_fn(**given):
        asked.append(given)
        return made([30, 20], given["apply_rate"], 13.0)

    p = Poller(SimpleNamespace(name="fc-final"), m, forecast_fn=forecast_fn)
    p._fc_sig = (m.board.generation, m.commits)   # nothing due: a poll now would make none
    p._fc_at = 1e18
    running = Snapshot(t=13.0, state="RUNNING", tasks=[], instances=[], metrics={})
    p._recount(running)
    assert asked == [{"apply_rate": 50_000.0, "rate_source": "calibrated"}]
    m.update(Snapshot(t=13.0, state="NOT_RUNNING", forecast=p._forecast(running, force=True)))
    pic = m.picture()
    assert [r["records"] for r in pic.forecast["rows"]] == [30, 20] and not pic.forecast_behind
    assert "50 records" in render_forecast(pic) and "last commits" not in render_forecast(pic)
    p._recount(running)                      # counted after the last commit: nothing to count again
    assert len(asked) == 1

    # an app that stopped on its own (no last poll): its old forecast says it is behind
    m2 = DashboardModel(name="fc-gone")
    m2.update(Snapshot(t=10.0, state="RUNNING", forecast=forecast_data(made([0, 0], 50_000.0, 10.0))))
    m2.update(Snapshot(t=12.0, state="NOT_RUNNING", events=[
        E(ev.Committed, 11.5, task="0_0", instance=0, batch=0, records=30, offsets={"c": 30})]))
    pic = m2.picture()
    assert pic.forecast_behind
    assert "made before the app's last commits: its changelogs hold more now" in render_forecast(pic)
