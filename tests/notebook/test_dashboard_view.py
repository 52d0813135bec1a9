"""The dashboard view and its refresh thread, driven by a fake App (no Spark, no kernel)."""
from __future__ import annotations

import html
import json
import re
import time

import pandas as pd

from kernel_ext.dashboard.view import LiveDashboard, render_events, render_header
from statekit import events as ev
from waiting import wait_until


def _events():
    t = time.time()
    out = [ev.RestoreQueued(task="0_0", instance=0, source="checkpoint", to_replay=10, generation=1, ts=t),
           ev.RestoreStarted(task="0_0", instance=0, store="counts", start_offset=0, end_offset=10,
                             to_replay=10, ts=t + 0.1),
           ev.RestoreEnded(task="0_0", instance=0, store="counts", restored=10, seconds=0.2, source="scratch",
                           ts=t + 0.3),
           ev.TaskOpened(task="0_0", instance=0, source="scratch", restored=10, ts=t + 0.31),
           ev.Rebalance(active={"0_0": 0}, generation=1, ts=t + 0.32)]
    for i, e in enumerate(out):
        e.offset = i
    return out


class FakeApp:
    name = "fake"

    def __init__(self):
        self.state = "RUNNING"
        self.error = None
        self.n = 0
        self.rows = {"kafka": 3, "spark": 5}
        self._events = _events()
        self.callbacks = []

    def metrics(self):
        self.n += 1
        return {"records_processed": 100 * self.n, "input_rate": 50.0, "last_batch_latency_ms": 120,
                "last_batch_id": self.n, "batches": self.n}

    def lag(self):
        return pd.DataFrame([{"task": "0_0", "instance": 0, "role": "active", "store": "counts",
                              "checkpoint_offset": 10, "changelog_end": 12, "lag": 2}])

    def instances_frame(self):
        return pd.DataFrame([{"instance": 0, "status": "alive", "incarnation": 1, "pid": 1,
                              "active": ["0_0"], "standby": [], "warmup": []}])

    def task_status(self):
        return {"0_0": {"instance": 0, "state": "running", "backlog": 0}}

    def describe(self):
        return {"nodes": [{"id": "src", "type": "source", "topic": "words"},
                          {"id": "agg", "type": "processor", "stores": ["counts"]},
                          {"id": "counts", "type": "store"}],
                "edges": [{"from": "src", "to": "agg"}, {"from": "agg", "to": "counts"}]}

    def query_all(self, store):
        return pd.DataFrame({"key": list(self.rows), "value": list(self.rows.values()),
                             "task": ["0_0"] * len(self.rows)})

    def events(self):
        return list(self._events)

    def on_event(self, cb):
        self.callbacks.append(cb)
        return cb

    def push(self, e):
        e.offset = len(self._events)
        self._events.append(e)
        for cb in self.callbacks:
            cb(e)


def test_refresh_renders_every_panel():
    app = FakeApp()
    d = LiveDashboard(app, interval=0.1)
    d.refresh()
    app.rows["kafka"] = 4
    app.rows["rocksdb"] = 1
    d.refresh()
    v = d.view
    assert "RUNNING" in v.header.value and "store rows" in v.header.value
    assert "class='sk-chip'" in v.header.value and ">0_0<" in v.header.value
    assert "counts" in v.tasks.value
    assert "rocksdb" in v.store.value and "class='new'" in v.store.value
    assert "class='changed'" in v.store.value
    assert "restored 1 task(s)" in v.restore.value and "took 0.2 s" in v.restore.value
    assert "Instances" in v.instances.value and "0_0" in v.instances.value
    assert v.topology.value == b""        # drawn when its tab first shows
    v.tabs.selected_index = 4
    assert len(v.topology.value) > 1000   # a PNG
    # the live charts are inline SVG: a line per task, the ownership bars coloured by instance
    assert v.lag.value.startswith("<svg") and "<polyline" in v.lag.value and "task 0_0" in v.lag.value
    assert v.ownership.value.startswith("<svg") and "<rect" in v.ownership.value and "instance 0" in v.ownership.value


def test_a_refresh_sends_its_panels_together_once_every_one_is_drawn(monkeypatch):
    """One burst of widget messages per refresh (the page lays it out once), not a message per
    panel spread over the drawing."""
    from kernel_ext.dashboard import view as view_mod

    app = FakeApp()
    d = LiveDashboard(app, interval=0.1)
    d.refresh()
    sent = []
    for name in ("header", "store", "restore", "instances", "tasks"):
        getattr(d.view, name).observe(lambda ch, name=name: sent.append(name), names="value")
    seen_while_drawing = {}
    real = view_mod.render_restore

    def restore_panel(p):            # drawn after the header and the store panel
        seen_while_drawing["sent"] = list(sent)
        return real(p)

    monkeypatch.setattr(view_mod, "render_restore", restore_panel)
    app.rows["kafka"] = 9
    app.push(ev.InstanceDied(instance=0, tasks=["0_0"], ts=time.time()))
    d.refresh()
    assert seen_while_drawing == {"sent": []}
    assert {"header", "store"} <= set(sent)                 # then sent, once each
    assert len(sent) == len(set(sent))
    assert "kafka" in d.view.store.value and ">9<" in d.view.store.value


def test_events_pushed_after_the_history_are_seen_once():
    app = FakeApp()
    d = LiveDashboard(app, interval=0.1, view=False)
    d.refresh()
    assert [e.offset for e in d.model.events] == [0, 1, 2, 3, 4]
    app.push(ev.InstanceDied(instance=0, tasks=["0_0"], ts=time.time()))
    d.refresh()
    d.refresh()
    assert [e.type for e in d.model.events][-1] == "instance_died"
    assert sum(e.type == "instance_died" for e in d.model.events) == 1


def test_an_error_shows_on_the_badge_and_the_dashboard_keeps_the_last_state():
    app = FakeApp()
    d = LiveDashboard(app, interval=0.1)
    d.refresh()
    rows_before = dict(d.model.snapshot.stores["counts"])
    app.state = "ERROR"
    app.error = "ProcessorError: task 0_0 failed on key='kafka' value=3: ZeroDivisionError: division by zero"
    app.query_all = lambda store: (_ for _ in ()).throw(AssertionError("a stopped app's store was read"))
    d.refresh()
    h = d.view.header.value
    assert "sk-reason bad" in h and "ZeroDivisionError: division by zero" in html.unescape(h)
    assert "class='sk-err'" in h
    assert d.model.snapshot.stores["counts"] == rows_before  # the last rows read stay
    assert "kafka" in d.view.store.value


def test_thread_keeps_refreshing_in_error_and_stops_when_the_app_stops_and_on_close():
    app = FakeApp()
    d = LiveDashboard(app, interval=0.1).start()
    wait_until(lambda: d.refreshes >= 2, 5, "two refreshes")
    assert d.running
    app.state = "ERROR"
    n = d.refreshes
    wait_until(lambda: d.refreshes >= n + 3, 5, "three refreshes after the error")
    assert d.running  # past 1.5 intervals in ERROR: it goes on (a restart from Python must show up)
    app.state = "NOT_RUNNING"
    wait_until(lambda: not d.running, 5, "the thread stopping with the app")
    d.follow()  # the app runs again: the same dashboard follows it
    app.state = "RUNNING"
    n = d.refreshes
    wait_until(lambda: d.refreshes >= n + 3, 5, "three refreshes after follow()")
    assert d.running
    d.stop()
    d2 = LiveDashboard(FakeApp(), interval=0.1).start()
    d2.view.stop_button.click()
    wait_until(lambda: not d2.running, 5, "the stop button stopping the thread")


def test_a_failing_panel_does_not_kill_the_dashboard():
    app = FakeApp()
    app.lag = lambda: (_ for _ in ()).throw(RuntimeError("boom"))
    d = LiveDashboard(app, interval=0.1)
    snap = d.refresh()
    assert "lag: boom" in snap.error
    assert "boom" in d.view.header.value


def test_event_details_are_escaped_and_never_cut_inside_an_entity():
    from kernel_ext.dashboard.model import DashboardModel, Snapshot

    raw = "<b>bold</b> & \"quoted\" 'single' " + "é" * 200
    e = ev.TaskFailed(task="0_1", instance=0, error=raw, ts=time.time())
    e.offset = 0
    m = DashboardModel()
    m.update(Snapshot(t=time.time(), events=[e]))
    out = render_events(m)
    assert "<b>bold" not in out                      # escaped, not markup
    cells = re.findall(r"<td class='l'>(.*?)</td>", out)
    details = cells[-1]
    shown = re.sub(r"<span title='[^']*'>(.*)</span>", r"\1", details)
    assert not re.search(r"&[a-z#0-9]*…", shown)      # no entity cut in half
    text = html.unescape(shown)
    assert text.endswith("…") and len(text) == 110
    assert text.startswith('{"batch": -1, "error": "<b>bold</b> & \\"quoted\\" \'single\' ééé')
    title = html.unescape(re.search(r"title='([^']*)'", details).group(1))
    assert json.loads(title)["error"] == raw         # the whole text on hover


def test_header_reason_is_clipped_as_text_not_as_markup():
    from kernel_ext.dashboard.model import DashboardModel, Snapshot

    m = DashboardModel()
    m.update(Snapshot(t=0, state="ERROR", app_error="x & y " * 60))
    h = render_header("a", m)
    reason = re.search(r"<span class='sk-reason bad' title='[^']*'>(.*?)</span>", h).group(1)
    assert not re.search(r"&[a-z#0-9]*…", reason) and html.unescape(reason).endswith("…")


def test_history_panel_slider_over_offsets():
    from kernel_ext.dashboard.view import HistoryPanel, as_of

    pts = [(3, 1, 0, True), (10, 2, 1, True), (17, None, 2, True), (21, 9, 3, False)]
    assert [as_of(pts, o) for o in (0, 3, 9, 10, 18, 25)] == [None, 0, 0, 1, 2, 2]
    panel = HistoryPanel(lambda store, key: pts if key == "k" else [], stores=["counts"])
    panel.load("counts", "k")
    assert (panel.slider.min, panel.slider.max, panel.slider.value) == (3, 21, 21)
    assert "deleted" in panel.out.value and "uncommitted" in panel.out.value
    panel.slider.value = 12
    assert "k = 2" in panel.out.value and "offset 12" in panel.out.value
    panel.load("counts", "nothing")
    assert "no changelog record" in panel.out.value


def test_restore_replay_follows_the_latest_round_and_replays_it():
    app = FakeApp()
    d = LiveDashboard(app, interval=0.1)
    d.refresh()
    r = d.view.replay
    d.view.tabs.selected_index = 3
    assert len(r.rounds.options) == 1 and r.slider.max >= 3
    assert ">done<" in r.table.value and len(r.image.value) > 1000
    r.slider.value = 1  # 0.1 s into the round: the task was restoring
    assert ">restoring<" in r.table.value and ">done<" not in r.table.value
    assert "t = 0.1 s" in r.clock.value


def test_an_app_without_events_or_instances_still_gets_a_dashboard():
    """Spark's own state store (NativeApp) has no event stream and one instance: the panels that
    need them stay out of the way."""

    class Native:
        name = "nat"
        state = "RUNNING"

        def metrics(self):
            return {"records_processed": 10, "last_batch_id": 1, "batches": 2, "state_rows": 3}

        def lag(self):
            return pd.DataFrame([{"task": 0, "store": "counts", "checkpoint_offset": 1, "changelog_end": 3,
                                  "lag": 2}])

        def query_all(self, store):
            return pd.DataFrame({"key": ["a"], "value": [1]})

        def describe(self):
            return {"nodes": [], "edges": []}

    d = LiveDashboard(Native(), interval=0.1, stores=["counts"])
    snap = d.refresh()
    assert snap.error is None and snap.events == [] and snap.instances == []
    v = d.view
    assert "state rows (Spark)" in v.header.value and ">0_0<" in v.tasks.value
    assert v.instances.layout.display == "none" and v.ownership_box.layout.display == "none"
    assert "restores inside Spark" in v.restore.value and "restore_report()" in v.restore.value


def _scratch_forecast(seconds: float, records: int, line: str, made_at: float | None = None):
    """A forecast of task 0_0 (instance 0) from scratch, as `App.restore_forecast()` makes it."""
    from statekit.runtime import forecasts

    frame = pd.DataFrame([{"task": "0_0", "instance": 0, "source": "scratch", "records": records,
                           "seconds": seconds}])
    return forecasts.RestoreForecast(frame, {0: line}, **({} if made_at is None else {"made_at": made_at}))


def test_the_forecast_before_a_restore_is_shown_and_then_beside_it():
    class Forecast:
        frame = pd.DataFrame([{"task": "0_0", "instance": 0, "source": "scratch", "records": 10, "seconds": 0.25}])
        lines = {0: "if instance 0 died now: ≈ 250 ms from scratch for 0_0 (10 records)"}

    app = FakeApp()
    app._events = []
    app.restore_forecast = lambda: Forecast()
    d = LiveDashboard(app, interval=0.1)
    d.refresh()
    assert "Restore forecast" in d.view.restore.value
    assert "if instance 0 died now: ≈ 250 ms from scratch for 0_0 (10 records)" in html.unescape(d.view.restore.value)
    for e in _events():
        app.push(e)
    d.refresh()
    v = html.unescape(d.view.restore.value)
    assert "<th class='' title='the restore forecast made before this round began'>forecast</th>" in \
        d.view.restore.value
    assert "≈ 0.2 s" in v and "forecast before: ≈ 0.2 s of replay" in v


def test_before_a_round_has_a_rate_the_eta_comes_from_the_forecast():
    # a fast restore ends before its first progress report: the ETA column said "–" all along
    from kernel_ext.dashboard.restore import RestoreRound
    from kernel_ext.dashboard.view import render_restore_table

    t = time.time()
    rnd = RestoreRound(t, 3)
    for e in (ev.RestoreQueued(task="0_0", instance=0, source="scratch", to_replay=1000, generation=3, ts=t),
              ev.RestoreQueued(task="0_1", instance=0, source="scratch", to_replay=500, generation=3, ts=t),
              ev.RestoreQueued(task="1_0", instance=1, source="scratch", to_replay=9, generation=3, ts=t),
              ev.RestoreStarted(task="0_0", instance=0, store="counts", start_offset=0, end_offset=1000,
                                to_replay=1000, source="scratch", ts=t + 0.1)):
        rnd.feed(e)
    fc = {"rows": [{"task": "0_0", "source": "scratch", "records": 1000, "seconds": 4.0},
                   {"task": "0_1", "source": "scratch", "records": 500, "seconds": 3.0}]}
    cells = {}
    for tr in re.findall(r"<tr[^>]*>(.*?)</tr>", render_restore_table(rnd, fc), re.S)[1:]:
        tds = [html.unescape(re.sub(r"<[^>]+>", "", c)) for c in re.findall(r"<td[^>]*>(.*?)</td>", tr, re.S)]
        cells[tds[0]] = tds
    eta = 6          # the ETA column (the forecast column is 7)
    assert cells["0_0"][eta] == "≈ 4 s"       # restoring, nothing replayed yet: all of its forecast
    assert cells["0_1"][eta] == "≈ 7 s"       # queued behind 0_0 on instance 0: 4 s + its own 3 s
    assert cells["1_0"][eta] == "–"           # no forecast for it: unknown, not made up
    assert render_restore_table(rnd).count("≈") == 0    # without a forecast nothing is guessed


def test_the_dashboard_shows_the_forecast_a_notebook_cell_made():
    # one forecast: the figure a cell printed is the one the Restoration panel shows
    from statekit.runtime import forecasts

    app = FakeApp()
    app.name = f"fc-{time.monotonic_ns()}"
    app._events = []
    made = []

    def restore_forecast(settle: float = 5.0):   # as App.restore_forecast: every forecast is remembered
        n = len(made) + 1
        made.append(settle)
        return forecasts._remember(app.name, _scratch_forecast(
            float(n), 10 * n, f"if instance 0 died now: ≈ {n}.0 s from scratch for 0_0 ({10 * n} records)"))

    app.restore_forecast = restore_forecast
    d = LiveDashboard(app, interval=0.1)
    d.refresh()
    assert made == [0.0]          # the dashboard's own, made without waiting for a quiet machine
    assert "≈ 1.0 s from scratch" in html.unescape(d.view.restore.value)
    cell = app.restore_forecast()  # a notebook cell, later
    d.refresh()
    shown = html.unescape(d.view.restore.value)
    assert cell.lines[0] in shown and "≈ 1.0 s" not in shown
    assert made == [0.0, 5.0]      # nothing changed since: the dashboard made no other


def test_after_stop_and_down_the_dashboard_shows_the_app_stopped():
    app = FakeApp()
    d = LiveDashboard(app, interval=0.1).start()
    wait_until(lambda: "1 alive" in d.view.header.value, 10, "the header saying 1 alive")
    d.stop()                  # `%statekit down` stops the dashboards, then the apps
    app.state = "NOT_RUNNING"
    wait_until(lambda: ">NOT_RUNNING<" in d.view.header.value and ">stopped<" in d.view.instances.value,
               10, "the header saying NOT_RUNNING and the Instances panel the instance stopped")
    h = d.view.header.value
    assert "0 alive / 1" in h and "1 alive" not in h
    assert "0 alive" in d.view.instances.value and ">stopped<" in d.view.instances.value


def test_an_urgent_event_is_drawn_before_the_next_tick():
    app = FakeApp()
    d = LiveDashboard(app, interval=30.0)   # a tick every 30 s: only the event can draw it
    d.refresh()
    d.start()
    n = d.refreshes
    t = time.monotonic()
    app.push(ev.InstanceDied(instance=0, tasks=["0_0"], ts=time.time()))
    wait_until(lambda: ">dead<" in d.view.instances.value, 5, "the instance drawn dead")
    assert time.monotonic() - t < 2 and d.refreshes > n
    assert "1 queued" in d.view.header.value      # its task waits for a new owner
    d.stop()


def test_the_forecast_follows_the_changelogs_as_commits_grow_them():
    """A forecast made at the first commits must not stay on the dashboard once the changelogs
    have grown (a browser picture showed "(60 records)" beside changelogs holding 477)."""
    app = FakeApp()
    app.name = f"grow-{time.monotonic_ns()}"
    app._events = []
    size = {"records": 0}

    def restore_forecast(settle: float = 5.0):
        from statekit.runtime import forecasts

        n = size["records"]
        return forecasts._remember(app.name, _scratch_forecast(
            n / 1000, n, f"if instance 0 died now: ≈ {n / 1000:.1f} s from scratch for 0_0 ({n} records)"))

    app.restore_forecast = restore_forecast
    d = LiveDashboard(app, interval=0.1, heavy_interval=0.3)
    try:
        d.start()
        for b in range(8):
            size["records"] += 60
            app.push(ev.Committed(task="0_0", instance=0, batch=b, records=100, offsets={"counts": size["records"]},
                                  ts=time.time()))
            time.sleep(0.15)
        wait_until(lambda: f"({size['records']} records)" in html.unescape(d.view.restore.value), 10,
                   f"the forecast of the {size['records']} records the changelog holds")
    finally:
        d.stop()


def test_a_forecast_that_failed_is_made_again_though_nothing_committed_since():
    app = FakeApp()
    app.name = f"retry-{time.monotonic_ns()}"
    app._events = []
    calls = []

    def restore_forecast(settle: float = 5.0):
        calls.append(time.monotonic())
        if len(calls) == 1:
            raise RuntimeError("no instance answered")
        from statekit.runtime import forecasts

        return forecasts._remember(app.name, _scratch_forecast(
            0.5, 477, "if instance 0 died now: ≈ 0.5 s from scratch for 0_0 (477 records)"))

    app.restore_forecast = restore_forecast
    d = LiveDashboard(app, interval=0.1, heavy_interval=0.3)
    try:
        d.start()
        wait_until(lambda: "(477 records)" in html.unescape(d.view.restore.value), 10,
                   "the forecast made again after the first one failed")
    finally:
        d.stop()
    assert len(calls) >= 2


def test_matplotlib_is_imported_only_when_the_topology_is_first_drawn():
    """A kernel pays for matplotlib (~0.4 s of CPU) only when its learner opens the Topology tab:
    the extension, the live dashboard and its SVG charts do without it."""
    import os
    import subprocess
    import sys
    import textwrap

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    code = textwrap.dedent("""
        import json, sys
        sys.path.insert(0, "tests/notebook")
        import kernel_ext, kernel_ext.magics
        from test_dashboard_view import FakeApp
        from kernel_ext.dashboard.view import LiveDashboard
        d = LiveDashboard(FakeApp(), interval=0.1)
        d.refresh(); d.refresh()
        before = "matplotlib" in sys.modules
        lag = d.view.lag.value.startswith("<svg")
        d.view.tabs.selected_index = 4
        print(json.dumps({"before": before, "lag": lag, "after": "matplotlib" in sys.modules,
                          "png": d.view.topology.value[:4] == b"\\x89PNG"}))
        """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=root,
                         timeout=120, env=dict(os.environ, PYTHONPATH=os.path.join(root, "tests")))
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.strip().splitlines()[-1]) == {"before": False, "lag": True,
                                                                "after": True, "png": True}


def test_a_round_keeps_the_forecast_made_last_not_the_one_a_poll_brought_last():
    """The dashboard's own forecast, made before a cell's but brought by a poll after it, must
    not win: at the crash the round takes the cell's (seen in a busy browser run, where the
    dashboard showed 1.4 s beside the cell's 2.6 s)."""
    from kernel_ext.dashboard.model import DashboardModel, Snapshot
    from statekit.runtime import forecasts

    name = f"fc-order-{time.monotonic_ns()}"
    t = time.time()
    own = _scratch_forecast(1.4, 10, "≈ 1.4 s", made_at=t - 5)                   # the dashboard's, made first
    cell = forecasts._remember(name, _scratch_forecast(2.6, 10, "≈ 2.6 s", made_at=t - 2))   # the cell's, after it
    from kernel_ext.dashboard.forecast import forecast_data

    m = DashboardModel(name=name)
    m.update(Snapshot(t=t, state="RUNNING", forecast=forecast_data(own)))   # a poll brings its own, late
    assert m.forecast_at == own.made_at
    m.update(Snapshot(t=t + 0.5, state="RUNNING", events=[ev.InstanceDied(instance=0, ts=t + 0.5)]))
    assert m.forecast["rows"][0]["seconds"] == 2.6 and m.forecast_at == cell.made_at


def test_the_dashboard_makes_no_forecast_of_its_own_while_one_is_being_made():
    from statekit.runtime import forecasts

    app = FakeApp()
    app.name = f"fc-busy-{time.monotonic_ns()}"
    app._events = []
    made = []

    def restore_forecast(settle: float = 5.0):
        made.append(settle)
        return forecasts._remember(app.name, _scratch_forecast(1.0, 10, "≈ 1.0 s"))

    app.restore_forecast = restore_forecast
    d = LiveDashboard(app, interval=0.1)
    with forecasts.making(app.name):          # a cell's forecast, calibrating
        d.refresh()
        assert made == []
    assert not forecasts.in_flight(app.name)
    d.refresh()
    assert made == [0.0]                      # none being made: the dashboard makes its own
