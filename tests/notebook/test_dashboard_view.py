"""The dashboard view and its refresh thread, driven by a fake App (no Spark, no kernel)."""
from __future__ import annotations

import time

import pandas as pd

from kernel_ext.dashboard.view import LiveDashboard


class FakeApp:
    name = "fake"

    def __init__(self):
        self.state = "RUNNING"
        self.n = 0
        self.rows = {"kafka": 3, "spark": 5}
        self._events = [{"type": "restore_start", "task": 0, "store": "counts", "start_offset": 0,
                         "end_offset": 10, "ts": time.time()},
                        {"type": "restore_end", "task": 0, "store": "counts", "restored": 10, "ts": time.time()}]

    def metrics(self):
        self.n += 1
        return {"records_processed": 100 * self.n, "input_rate": 50.0, "last_batch_latency_ms": 120,
                "last_batch_id": self.n}

    def lag(self):
        return pd.DataFrame([{"task": 0, "instance": 0, "role": "active", "store": "counts",
                              "checkpoint_offset": 10, "changelog_end": 12, "lag": 2, "rows": len(self.rows)}])

    def describe(self):
        return {"nodes": [{"id": "src", "type": "source", "topic": "words"},
                          {"id": "agg", "type": "processor", "stores": ["counts"]},
                          {"id": "counts", "type": "store"}],
                "edges": [{"from": "src", "to": "agg"}, {"from": "agg", "to": "counts"}]}

    def query_all(self, store):
        return pd.DataFrame({"key": list(self.rows), "value": list(self.rows.values())})

    def events(self):
        return list(self._events)


def test_refresh_renders_every_panel():
    app = FakeApp()
    d = LiveDashboard(app, interval=0.1)
    d.refresh()
    app.rows["kafka"] = 4
    app.rows["rocksdb"] = 1
    d.refresh()
    v = d.view
    assert "RUNNING" in v.header.value and "store rows" in v.header.value
    assert "counts" in v.tasks.value
    assert "rocksdb" in v.store.value and "class='new'" in v.store.value
    assert "class='changed'" in v.store.value
    assert "restored 1 task" in v.restore.value
    assert len(v.lag.value) > 1000 and len(v.topology.value) > 1000  # PNGs


def test_thread_stops_when_the_app_stops_and_on_close():
    app = FakeApp()
    d = LiveDashboard(app, interval=0.1).start()
    time.sleep(0.5)
    assert d.running and d.refreshes >= 2
    app.state = "NOT_RUNNING"
    deadline = time.time() + 5
    while d.running and time.time() < deadline:
        time.sleep(0.05)
    assert not d.running
    d2 = LiveDashboard(FakeApp(), interval=0.1).start()
    d2.view.stop_button.click()
    deadline = time.time() + 5
    while d2.running and time.time() < deadline:
        time.sleep(0.05)
    assert not d2.running


def test_a_failing_panel_does_not_kill_the_dashboard():
    app = FakeApp()
    app.lag = lambda: (_ for _ in ()).throw(RuntimeError("boom"))
    d = LiveDashboard(app, interval=0.1)
    snap = d.refresh()
    assert "lag: boom" in snap.error
    assert "boom" in d.view.header.value


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
