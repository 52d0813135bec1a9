"""Restore forecast: the records it predicts are the records a restore then reads (from scratch
over a compacted log, from a checkpoint, from a standby), and its seconds follow the rate it says
it used. The timing comparison with a real restore is marked slow."""
from __future__ import annotations

import shutil
import time

import pytest

from statekit import broker as broker_mod
from statekit.contracts import changelog_topic
from statekit.kafka import Kafka
from statekit.kafka.log_figures import embedded_log_figures
from statekit.state import StandbyReplica, TaskState
from statekit.state import checkpoint as ckpt
from statekit.state import forecast as F
from statekit.state import restore as R
from statekit.stores import StoreSpec
from waiting import wait_until

SPECS = [StoreSpec("counts"), StoreSpec("latest")]
CFG = {"segment.bytes": "4096", "min.cleanable.dirty.ratio": "0.01", "delete.retention.ms": "0",
       "min.compaction.lag.ms": "0"}


@pytest.fixture
def still_broker(tmp_path):
    """A broker whose log cleaner runs only when asked (`request_clean`): a pass of its own between a
    forecast and the restore it is compared with would make them count different logs."""
    handle = broker_mod.start(dir=str(tmp_path / "still-broker"), port=0,
                              configs={"log.cleaner.backoff.ms": str(3_600_000)})
    try:
        yield handle
    finally:
        handle.stop()


def commit_batches(t, batches, width: int = 12) -> None:
    for b in batches:
        for i in range(width):
            key = f"k{(b * 5 + i) % 40:02d}"
            t["counts"].put(key, b * 100 + i)
            if i % 3:
                t["latest"].put(key, b)
            else:
                t["latest"].delete(key)
        t.commit(b)


def stats_current(broker_dir: str, k: Kafka, app: str) -> None:
    """log_stats is refreshed every second: wait until it has caught up with the end offsets."""
    def current():
        rows = {(r["topic"], r["partition"]): r for r in broker_mod.log_stats(broker_dir)}
        return all(rows.get((changelog_topic(app, s.name), 0), {}).get("high_watermark")
                   == k.end_offsets(changelog_topic(app, s.name))[0] for s in SPECS)

    wait_until(current, 10, "log_stats catching up with the end offsets", interval=0.1)


def test_forecast_counts_exactly_what_the_restores_read(still_broker, tmp_path):
    broker = still_broker
    k = Kafka(broker.bootstrap)
    app = "fc"
    try:
        a = str(tmp_path / "a")
        with TaskState(app, 0, SPECS, state_dir=a, kafka=k, topic_configs=CFG) as t:
            commit_batches(t, range(0, 60))
        old_copy = str(tmp_path / "old")
        shutil.copytree(a, old_copy)               # a checkpoint that will fall behind
        standby = StandbyReplica(app, 0, SPECS, state_dir=str(tmp_path / "sb"),
                                 bootstrap=broker.bootstrap).start()
        try:
            with TaskState(app, 0, SPECS, state_dir=a, kafka=k) as t:
                commit_batches(t, range(60, 70))
            assert standby.wait_caught_up(30) == 0
            standby.stop()                          # it falls behind too, less
            with TaskState(app, 0, SPECS, state_dir=a, kafka=k) as t:
                commit_batches(t, range(70, 90))
            broker_mod.request_clean(broker.dir)
            with TaskState(app, 0, SPECS, state_dir=a, kafka=k) as t:
                commit_batches(t, range(90, 95))    # a tail the cleaner has not seen
            stats_current(broker.dir, k, app)
            assert any(r["records_removed"] for r in broker_mod.log_stats(broker.dir)
                       if r["topic"].startswith(app))  # compaction gaps in the log

            figures = embedded_log_figures(broker.dir)
            scratch = F.forecast_task(k, app, 0, SPECS, None, log_figures=figures,
                                      apply_rate=1000.0)
            cp = ckpt.read(f"{old_copy}/{app}/0")
            from_cp = F.forecast_task(k, app, 0, SPECS,
                                      {n: c.changelog_offset for n, c in cp.items()},
                                      log_figures=figures, apply_rate=1000.0)
            from_sb = F.forecast_task(k, app, 0, SPECS, standby.positions(), source="standby",
                                      log_figures=figures, apply_rate=1000.0)
            assert (scratch.source, from_cp.source, from_sb.source) == (
                "scratch", "checkpoint", "standby")
            assert scratch.exact and from_cp.exact and from_sb.exact
            assert {s: p.start_offset for s, p in from_sb.per_store.items()} == standby.positions()
            assert 0 < from_sb.records <= standby.lag()  # lag() counts offsets, gaps included
            sb_dir = standby.promote()
        finally:
            standby.close()
        measured = {}
        for name, state_dir in (("scratch", str(tmp_path / "fresh")), ("checkpoint", old_copy),
                                ("standby", str(tmp_path / "sb"))):
            with TaskState(app, 0, SPECS, state_dir=state_dir, kafka=k) as t:
                measured[name] = {s: m.records_restored for s, m in t.restore_metrics.items()}
        assert sb_dir.startswith(str(tmp_path / "sb"))
        for name, f in (("scratch", scratch), ("checkpoint", from_cp), ("standby", from_sb)):
            assert {s: p.records for s, p in f.per_store.items()} == measured[name], name
            assert f.seconds == f.records / 1000.0 and f.rate_source == "given"
        # from scratch over a compacted log: fewer records than offsets
        assert scratch.records < sum(p.end_offset for p in scratch.per_store.values())
        assert from_sb.records <= from_cp.records <= scratch.records
        assert scratch.describe().startswith(f"≈ {scratch.seconds:.1f} s from scratch (")
    finally:
        k.close()


def test_without_the_brokers_files_headers_are_counted_or_the_span_bounds_it(still_broker, tmp_path,
                                                                             monkeypatch):
    broker = still_broker
    k = Kafka(broker.bootstrap)
    try:
        with TaskState("ub", 0, SPECS, state_dir=str(tmp_path / "a"), kafka=k,
                       topic_configs=CFG) as t:
            commit_batches(t, range(0, 60))
        broker_mod.request_clean(broker.dir)
        counted = F.forecast_task(k, "ub", 0, SPECS, None, apply_rate=500.0)  # no log figures
        monkeypatch.setattr(F, "SCAN_MAX", 10)
        bound = F.forecast_task(k, "ub", 0, SPECS, None, apply_rate=500.0)
        with TaskState("ub", 0, SPECS, state_dir=str(tmp_path / "b"), kafka=k) as t:
            read = {s: m.records_restored for s, m in t.restore_metrics.items()}
        assert counted.exact and {s: p.records for s, p in counted.per_store.items()} == read
        ends = {s.name: k.end_offsets(f"ub-{s.name}-changelog")[0] for s in SPECS}
        assert not bound.exact and {s: p.records for s, p in bound.per_store.items()} == ends
        assert bound.describe().startswith("≤ ") and sum(read.values()) < bound.records
    finally:
        k.close()


def test_missing_changelogs_forecast_nothing(broker):
    k = Kafka(broker.bootstrap)
    try:
        f = F.forecast_task(k, "nothing", 3, SPECS, None, apply_rate=10.0,
                            log_figures=embedded_log_figures(broker.dir))
        assert (f.source, f.records, f.seconds) == ("none", 0, 0.0)
    finally:
        k.close()


def test_the_rate_comes_from_the_last_restore_else_a_calibration(broker, tmp_path, monkeypatch):
    k = Kafka(broker.bootstrap)
    try:
        monkeypatch.setattr(R, "_last_rate", None)
        F.clear_calibration()
        with TaskState("rt", 0, SPECS, state_dir=str(tmp_path / "a"), kafka=k) as t:
            commit_batches(t, range(0, 20))
        f = F.forecast_task(k, "rt", 0, SPECS, None, log_figures=embedded_log_figures(broker.dir))
        assert f.rate_source == "calibrated" and f.apply_rate > 0
        assert f.seconds == pytest.approx(f.records / f.apply_rate)
        assert F.calibrate(k, "rt-counts-changelog", 0) == f.apply_rate  # cached per process
        # a restore too short to say much about the rate is not remembered
        with TaskState("rt", 0, SPECS, state_dir=str(tmp_path / "b"), kafka=k) as t:
            assert sum(m.records_restored for m in t.restore_metrics.values()) < R.MEASURE_MIN
        assert R.last_restore_rate() is None
        monkeypatch.setattr(R, "_last_rate", (123_456.0, 50_000))
        f = F.forecast_task(k, "rt", 0, SPECS, None, log_figures=embedded_log_figures(broker.dir))
        assert (f.rate_source, f.apply_rate) == ("last restore", 123_456.0)
    finally:
        k.close()


@pytest.mark.slow
def test_the_forecast_is_within_a_factor_of_two_of_a_real_restore(broker, tmp_path, monkeypatch):
    import json

    from statekit.state.restore import BATCH_HEADER, MARKER_HEADER, MARKER_KEY

    k = Kafka(broker.bootstrap)
    try:
        topic = "big-counts-changelog"
        k.ensure_topic(topic, 1, {"cleanup.policy": "compact"})
        for b in range(20):
            bh = [(BATCH_HEADER, str(b).encode())]
            recs = [(b'"k%06d"' % ((b * 10_000 + i) % 150_000), b"%d" % i, bh)
                    for i in range(10_000)]
            recs.append((MARKER_KEY, json.dumps({"batch": b}).encode(),
                         [(MARKER_HEADER, b"1"), (BATCH_HEADER, str(b).encode())]))
            k.send(topic, 0, recs)
        seen = []
        for attempt in range(3):  # a shared machine's load can spoil one measurement, not three
            monkeypatch.setattr(R, "_last_rate", None)
            F.clear_calibration()
            f = F.forecast_task(k, "big", 0, [StoreSpec("counts")], None,
                                log_figures=embedded_log_figures(broker.dir))
            assert f.records == 200_020 and f.rate_source == "calibrated"
            with TaskState("big", 0, [StoreSpec("counts")], state_dir=str(tmp_path / str(attempt)),
                           kafka=k) as t:
                m = t.restore_metrics["counts"]
            assert m.records_restored == f.records
            seen.append(f.versus(t.restore_metrics))
            if 0.5 <= m.duration_s / f.seconds <= 2.0:
                break
        else:
            raise AssertionError("; ".join(seen))
    finally:
        k.close()


def test_a_calibration_is_measured_once_and_scaled_to_the_load_of_the_moment(broker, monkeypatch):
    """The whole partition is measured once (again when the changelog grew by a quarter, or
    when it was measured beside the caller's own work), whatever the machine's load; a forecast
    scales it by the load of the moment: a short restore of the same partition set against the
    calibration's first records (a forecast of 0.4 s and one of 2.8 s for the same records, from
    rates measured on a quiet and a busy machine, was the same cell's)."""
    k = Kafka(broker.bootstrap)
    topic = "cal-counts-changelog"
    measured, probes = [], []
    probe = {"took": 0.4, "read": 20_000}

    def fake_measure(kafka, t, partition, start, end, curve=None, listener=None):
        measured.append(end - start)
        if curve is not None:   # 100,000 records a second, whatever the size
            curve[:] = [(0.1 * i, 10_000 * i) for i in range(1, 11)]
        return 1000.0 * len(measured)

    def fake_probe(kafka, t, partition, start, end, seconds):
        probes.append((start, end, seconds))
        return probe["took"], probe["read"]

    def grow_to(n):
        have = k.end_offsets(topic)[0]
        for lo in range(have, n, 5_000):
            k.send(topic, 0, [(b"k%d" % i, b"v", []) for i in range(lo, min(n, lo + 5_000))])

    try:
        k.ensure_topic(topic, 1)
        monkeypatch.setattr(F, "_measure_restore", fake_measure)
        monkeypatch.setattr(F, "_probe", fake_probe)
        monkeypatch.setattr(F, "CALIBRATE_PASSES", 1)   # one pass each (the passes: below)
        F.clear_calibration()
        n = F.CALIBRATE_MIN
        monkeypatch.setattr(F, "_measure", lambda make_reader: 500.0)   # synthetic records
        grow_to(100)
        assert F.calibrate(k, topic, 0) == 500.0
        grow_to(n // 2)                     # grown fivefold, still short: the same synthetic sample
        assert F.calibrate(k, topic, 0) == 500.0 and measured == []
        grow_to(n)
        assert F.rate_now(k, topic, 0) == (1000.0, 1.0)           # measured just now: its load
        grow_to(2 * n)
        assert F.calibrate(k, topic, 0) == 2000.0                 # grown by more than a quarter
        assert F.calibrate(k, topic, 0) == 2000.0                 # cached
        t0 = time.monotonic()
        assert F.calibrate(k, topic, 0, busy=True, settle=0.3) == 2000.0   # cached: no wait
        assert time.monotonic() - t0 < 0.2
        grow_to(3 * n)
        t0 = time.monotonic()
        busy = {"on": True}
        assert F.calibrate(k, topic, 0, busy=lambda: busy["on"], settle=0.3) == 3000.0
        assert time.monotonic() - t0 >= 0.3                       # waited for its own work, in vain
        busy["on"] = False
        assert F.calibrate(k, topic, 0) == 4000.0                 # measured beside it: again, idle
        assert F.calibrate(k, topic, 0) == 4000.0
        # a moment later, on a machine twice as busy as during the calibration: 20,000 records
        # took 0.4 s where the calibration read them in 0.2 s. A dashboard's forecast keeps the
        # calibration's load for LOAD_TTL; a cell's (it waits for a quiet moment: settle) measures
        # the load of its own moment, once its own work pauses
        monkeypatch.setattr(F, "LOAD_FRESH", 0.0)
        assert F.rate_now(k, topic, 0) == (4000.0, 1.0) and probes == []
        busy["on"] = True
        t0 = time.monotonic()
        assert F.rate_now(k, topic, 0, busy=lambda: busy["on"], settle=0.3) == (4000.0, 1.0)
        assert time.monotonic() - t0 >= 0.3 and probes == []       # no pause came: it stands
        busy["on"] = False
        assert F.rate_now(k, topic, 0, settle=0.3) == (2000.0, 2.0)
        assert probes == [(0, 3 * n, F.PROBE_ASKED_S)]            # the partition from its start
        monkeypatch.setattr(F, "LOAD_TTL", 0.0)                   # later: a dashboard's too
        probe.update(took=0.1)                                    # quieter than then
        assert F.rate_now(k, topic, 0, busy=True) == (2000.0, 2.0)   # beside its own work: stands
        assert F.rate_now(k, topic, 0) == (8000.0, 0.5)
        assert measured == [n, 2 * n, 3 * n, 3 * n] and probes[1:] == [(0, 3 * n, F.PROBE_S)]
        # a cell's forecast right after a dashboard's calibration measures the load of its own
        # moment (the dashboard's may have been made beside the kernel's heaviest cell), and its
        # own measurement stands for LOAD_FRESH
        monkeypatch.setattr(F, "LOAD_FRESH", 60.0)
        monkeypatch.setattr(F, "LOAD_TTL", 60.0)
        grow_to(4 * n)
        assert F.rate_now(k, topic, 0) == (5000.0, 1.0) and len(probes) == 2   # calibrated: now
        probe.update(took=0.4)
        assert F.rate_now(k, topic, 0, settle=0.3) == (2500.0, 2.0)
        assert probes[2:] == [(0, 4 * n, F.PROBE_ASKED_S)]
        assert F.rate_now(k, topic, 0, settle=0.3) == (2500.0, 2.0) and len(probes) == 3
        # and a cell's own calibration is its moment's
        F.clear_calibration()
        assert F.rate_now(k, topic, 0, settle=0.3) == (6000.0, 1.0) and len(probes) == 3
    finally:
        F.clear_calibration()
        k.close()


def test_a_short_partition_is_calibrated_and_probed_by_its_median_pass(monkeypatch):
    """A partition restored in a fraction of a second is restored again, and the median pass is
    the figure: beside two CPU hogs and a browser, single passes of the same 105,000 records ran
    at 265,000 to 950,000 records/s (a forecast 2x the restore that followed). A pass that takes
    the whole budget is not repeated; a probe cut short by its seconds answers as it was."""
    rates = iter([300.0, 900.0, 500.0, 700.0, 600.0, 800.0])
    calls = []

    def fake_measure(kafka, t, partition, start, end, curve=None, listener=None):
        rate = next(rates)
        calls.append(rate)
        if curve is not None:
            curve[:] = [(1.0, int(rate))]
        return rate

    monkeypatch.setattr(F, "_measure_restore", fake_measure)
    curve = []
    assert F._median_pass(None, "t", 0, 0, 10, curve) == 600.0       # of 300, 900, 500, 700, 600
    assert calls == [300.0, 900.0, 500.0, 700.0, 600.0] and curve == [(1.0, 600)]
    monkeypatch.setattr(F, "CALIBRATE_REPEAT_S", 0.0)                 # a pass as long as the budget
    assert F._median_pass(None, "t", 0, 0, 10, curve) == 800.0 and len(calls) == 6

    took = iter([0.02, 0.3, 0.05, 0.04, 0.03, 9.0])

    def fake_restore(kafka, t, partition, start, end, curve=None, listener=None):
        listener.t0 = time.perf_counter()
        pause = next(took)
        deadline = listener.t0 + pause
        while True:      # batches of 100 records until the pass's time is up (or the probe's)
            time.sleep(min(0.01, max(0.0, deadline - time.perf_counter())))
            listener.on_batch_restored("s", partition, 0, 100)
            if time.perf_counter() >= deadline:
                return 1.0

    monkeypatch.setattr(F, "_measure_restore", fake_restore)
    t, read = F._probe(None, "t", 0, 0, 10, seconds=5.0)
    assert 0.04 <= t < 0.3, t           # the median of 0.02, 0.3, 0.05, 0.04 and 0.03 s
    t, read = F._probe(None, "t", 0, 0, 10, seconds=0.5)
    assert 0.5 <= t < 9.0, t            # a pass longer than the probe: cut at its seconds


def test_every_forecast_made_is_the_latest_of_its_application():
    # one forecast per application: what a notebook cell printed is what the dashboard reads
    import pandas as pd

    from statekit.runtime import forecasts

    assert forecasts.forecast("fc-latest-a", None, {}, {}, None, None).frame.empty  # nothing started
    first = forecasts.latest("fc-latest-a")
    assert first is not None and forecasts.latest("fc-latest-b") is None
    newer = forecasts._remember("fc-latest-a", forecasts.RestoreForecast(pd.DataFrame(), {0: "x"}))
    assert forecasts.latest("fc-latest-a") is newer and newer.made_at >= first.made_at
    older = forecasts.RestoreForecast(pd.DataFrame(), {}, made_at=first.made_at - 60)
    forecasts._remember("fc-latest-a", older)       # one made before (a slow call that ends late)
    assert forecasts.latest("fc-latest-a") is newer
