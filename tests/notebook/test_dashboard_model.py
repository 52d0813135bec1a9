"""The dashboard's data model, fed with hand-made snapshots: no Spark, no widgets."""
from __future__ import annotations

import pytest

from kernel_ext.dashboard.model import (DashboardModel, RateEstimator, Snapshot, diff_rows,
                                        fmt_eta, layout_topology, normalize_task)


def task(t, lag, rows=10, role="active", ckpt=None, end=None, state="RUNNING", store="counts"):
    end = end if end is not None else 100
    return {"task": t, "instance": 0, "role": role, "store": store, "rows": rows,
            "checkpoint": ckpt if ckpt is not None else end - lag, "changelog_end": end,
            "lag": lag, "state": state}


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
    # dict values rank by their count field
    m2 = DashboardModel(top_k=1)
    m2.update(Snapshot(t=0, stores={"s": {"x": {"count": 1}, "y": {"count": 4}}}))
    assert m2.store_rows()[0].key == "y"


def test_lag_history_per_task():
    m = DashboardModel(history_points=3)
    for t, lags in enumerate([(5, 0), (3, 2), (0, 4), (0, 0)]):
        m.update(Snapshot(t=10 + t, tasks=[task(0, lags[0]), task(1, lags[1]),
                                           task(0, 1, role="standby")]))
    series = m.lag_series()
    assert sorted(series) == [0, 1]
    xs, ys = series[0]
    assert xs == [1, 2, 3] and ys == [3, 0, 0]  # bounded history, seconds since the first refresh
    assert series[1][1] == [2, 4, 0]
    assert m.lag_series(standby=True)[0][1] == [1, 1, 1]
    assert m.header()["lag"] == 0


def test_lag_history_sums_stores_of_a_task():
    m = DashboardModel()
    m.update(Snapshot(t=0, tasks=[task(0, 3, store="a"), task(0, 4, store="b")]))
    assert m.lag_series()[0][1] == [7]


def test_rate_estimator_and_eta():
    est = RateEstimator(window=10)
    assert est.rate is None and est.eta(100) is None
    est.add(0.0, 0)
    est.add(2.0, 50)  # 25 records/s
    assert est.rate == pytest.approx(25.0)
    assert est.eta(100) == pytest.approx(2.0)
    est.add(4.0, 100)
    assert est.eta(100) == 0.0
    stalled = RateEstimator()
    stalled.add(0.0, 10)
    stalled.add(1.0, 10)
    assert stalled.eta(100) is None  # no progress: unknown, not infinite
    assert fmt_eta(None) == "–" and fmt_eta(0.2) == "<1 s" and fmt_eta(42) == "42 s" and fmt_eta(600) == "10 min"


def test_rate_estimator_window_slides():
    est = RateEstimator(window=2)
    for t, d in [(0, 0), (1, 100), (2, 110), (3, 120), (4, 130)]:
        est.add(t, d)
    assert est.rate == pytest.approx(10.0)


def test_restore_progress_from_events_and_summary():
    m = DashboardModel()
    m.update(Snapshot(t=100.0, state="RESTORING", events=[
        {"type": "restore_start", "task": 0, "store": "counts", "start_offset": 0, "end_offset": 1000, "t": 100.0},
        {"type": "restore_start", "task": 1, "store": "counts", "start_offset": 400, "end_offset": 600, "t": 100.0},
    ]))
    assert m.restoring
    r0, r1 = m.restore_rows()
    assert (r0.total, r0.source, r1.total, r1.source) == (1000, "scratch", 200, "checkpoint")
    m.update(Snapshot(t=102.0, state="RESTORING", events=[
        {"type": "restore_batch", "task": 0, "store": "counts", "restored": 400, "remaining": 600, "t": 102.0},
        {"type": "restore_batch", "task": 1, "store": "counts", "restored": 200, "t": 102.0},
    ]))
    r0 = m.restore[(0, "counts")]
    assert r0.fraction == pytest.approx(0.4)
    assert r0.rate == pytest.approx(200.0)
    assert r0.eta == pytest.approx(3.0)
    assert m.restore_summary is None
    m.update(Snapshot(t=105.0, state="RUNNING", events=[
        {"type": "restore_end", "task": 0, "store": "counts", "restored": 700, "t": 104.0, "from": "scratch"},
        {"type": "restore_end", "task": 1, "store": "counts", "restored": 200, "t": 102.5},
    ]))
    assert not m.restoring
    s = m.restore_summary
    assert s is not None
    assert s.seconds == pytest.approx(4.0)
    assert s.records_replayed == 900 and s.offsets_spanned == 1200
    assert s.saved_by_compaction == 300  # 1200 offsets, 900 records: the cleaner removed 300
    assert (s.from_scratch, s.from_checkpoint) == (1, 1)
    assert "900 records replayed" in s.line()


def test_restore_progress_from_task_table_without_events():
    m = DashboardModel()
    m.update(Snapshot(t=0, tasks=[task(0, 100, state="RESTORING", ckpt=0)]))
    m.update(Snapshot(t=1, tasks=[task(0, 60, state="RESTORING", ckpt=40)]))
    r = m.restore[(0, "counts")]
    assert r.restored == 40 and r.eta == pytest.approx(1.5)
    m.update(Snapshot(t=2, tasks=[task(0, 0, state="RUNNING")]))
    assert m.restore[(0, "counts")].done and m.restore_summary.records_replayed == 100


def test_normalize_task_aliases():
    r = normalize_task({"task_id": 3, "store_name": "s", "checkpoint_offset": 5.0,
                        "end_offset": 9, "dirty_entries": 2, "role": "STANDBY"})
    assert (r["task"], r["store"], r["checkpoint"], r["lag"], r["dirty"], r["role"]) == (3, "s", 5, 4, 2, "standby")


def test_changelog_rows():
    m = DashboardModel()
    m.update(Snapshot(t=0, tasks=[task(0, 0, rows=7)], stores={"counts": {}}, changelog=[
        {"topic": "wc-counts-changelog", "partition": 0, "log_start_offset": 0, "high_watermark": 50,
         "records": 20, "dirty_ratio": 0.25, "cleaner_runs": 2, "records_removed": 30}]))
    (row,) = m.changelog_rows()
    assert row["store"] == "counts" and row["live_keys"] == 7 and row["records"] == 20
    assert row["cleaner_runs"] == 2 and row["dirty_ratio"] == 0.25


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


def test_restore_events_as_the_task_runner_sends_them():
    """restore_end alone (a fast restore between two refreshes) still gives a summary, and a
    second restore later starts a new round; commit events fill rows and dirty entries."""
    m = DashboardModel()
    m.update(Snapshot(t=50.0, tasks=[task(0, 0, rows=None)], events=[
        {"type": "commit", "task": 0, "rows": {"counts": 24},
         "cache": {"counts": {"cache": {"dirty": 7, "entries": 24}}}, "ts": 49.0}]))
    (row,) = m.tasks()
    assert row["rows"] == 24 and row["dirty"] == 7
    m.update(Snapshot(t=60.0, events=[
        {"type": "restore_end", "task": 2, "store": "counts", "restored": 30, "duration_s": 0.5,
         "from": "checkpoint", "start_offset": 10, "end_offset": 50, "ts": 59.0}]))
    s = m.restore_summary
    assert s is not None and s.records_replayed == 30 and s.saved_by_compaction == 10
    assert s.seconds == pytest.approx(0.5) and s.from_checkpoint == 1
    m.update(Snapshot(t=70.0, events=[
        {"type": "restore_start", "task": 1, "store": "counts", "start_offset": 0, "end_offset": 5, "ts": 69.0}]))
    assert list(m.restore) == [(1, "counts")] and m.restore_summary is None and m.restoring
    m.update(Snapshot(t=71.0, events=[
        {"type": "restore_end", "task": 1, "store": "counts", "restored": 5, "duration_s": 0.1,
         "from": "standby", "start_offset": 0, "end_offset": 5, "ts": 70.5}]))
    assert m.restore_summary.from_standby == 1 and "from a standby" in m.restore_summary.line()


class _CommitApp:
    """Two tasks of one store; a store read is counted; commits move the checkpoint offsets."""

    state = "RUNNING"

    def __init__(self):
        self.batch = 3
        self.checkpoints = {0: 10, 1: 20}
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
    from kernel_ext.dashboard.model import StoreCache, collect

    app, cache, m = _CommitApp(), StoreCache(max_age=30.0), DashboardModel()
    s1 = collect(app, stores=["counts"], cache=cache)
    m.update(s1)
    assert (app.store_reads, cache.reads, cache.skips) == (1, 1, 0)
    # nothing committed: no read, the very same rows, nothing highlighted
    s2 = collect(app, stores=["counts"], cache=cache)
    m.update(s2)
    assert (app.store_reads, cache.reads, cache.skips) == (1, 1, 1)
    assert s2.stores["counts"] is s1.stores["counts"]
    assert m.changed_count("counts") == 0
    # task 1 commits (its checkpoint moves): read again, the changed row is highlighted
    app.rows["b"] = 5
    app.checkpoints[1] = 21
    m.update(collect(app, stores=["counts"], cache=cache))
    assert (app.store_reads, cache.reads, cache.skips) == (2, 2, 1)
    assert m.diffs["counts"].changed == {"b"} and m.diffs["counts"].added == set()
    assert [(r.key, r.value, r.status) for r in m.store_rows()] == [("b", 5, "changed"), ("a", 1, None)]
    # the next refresh without a commit: no read, and "changed since the last refresh" is empty again
    m.update(collect(app, stores=["counts"], cache=cache))
    assert (app.store_reads, cache.skips) == (2, 2)
    assert m.changed_count("counts") == 0
    # a new micro-batch (even with the same checkpoints) reads again
    app.batch = 4
    collect(app, stores=["counts"], cache=cache)
    assert app.store_reads == 3
    # a state change reads again
    app.state = "RESTORING"
    collect(app, stores=["counts"], cache=cache)
    assert app.store_reads == 4


def test_store_cache_reads_every_time_without_commit_figures_and_after_max_age():
    from kernel_ext.dashboard.model import StoreCache, collect

    app = _CommitApp()
    app.metrics = lambda: {}
    app.checkpoints = {0: None, 1: 20}  # task 0 never committed: no signature
    cache = StoreCache()
    for _ in range(3):
        collect(app, stores=["counts"], cache=cache)
    assert (app.store_reads, cache.reads, cache.skips) == (3, 3, 0)
    assert StoreCache.signature("counts", "RUNNING", {}, app.lag()) is None
    assert StoreCache.signature("counts", "RUNNING", {"last_batch_id": 7, "generation": 2}, app.lag()) == \
        ("RUNNING", 2, 7, ((0, 0, None), (1, 0, 20)))
    assert StoreCache.signature("counts", "RUNNING", {"last_batch_id": 7}, app.lag()) == \
        ("RUNNING", None, 7, ((0, 0, None), (1, 0, 20)))
    # a known signature is reused for at most max_age seconds
    c = StoreCache(max_age=30.0)
    c.put("counts", ("RUNNING", 1, ()), 100.0, ({"a": 1}, {}))
    assert c.get("counts", ("RUNNING", 1, ()), 130.0) == ({"a": 1}, {})
    assert c.get("counts", ("RUNNING", 1, ()), 130.5) is None
    assert c.get("counts", ("RUNNING", 2, ()), 101.0) is None
    assert c.get("other", ("RUNNING", 1, ()), 101.0) is None
    assert (c.reads, c.skips) == (1, 1)


def test_throttled_heavy_panel_and_nice_axis_limits():
    from kernel_ext.dashboard.charts import axis_limit
    from kernel_ext.dashboard.model import Throttled

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
