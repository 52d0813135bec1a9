"""The dashboard against a real app (the local engine: no Spark): a big store is not read whole."""
from __future__ import annotations

import pandas as pd

from kernel_ext.dashboard.view import LiveDashboard


def test_a_store_is_read_at_most_max_rows_per_refresh(broker, tmp_path):
    import statekit
    from statekit import datagen

    datagen.produce_fast("acc", "accounts", 1, 4000, broker.bootstrap, keys=4000, partitions=4)
    app = statekit.App("lim", bootstrap=broker.bootstrap, partitions=4, engine="local",
                       state_dir=str(tmp_path / "lim"))
    app.stream("acc", value_serde="json").group_by_key().count(store="counts")
    try:
        app.start(sink="none")
        assert app.process_all_available(timeout=60)
        whole = app.query_all("counts")
        assert len(whole) == 4000
        part = app.query_all("counts", limit_per_task=10)
        assert part.groupby("task").size().to_dict() == {"0_0": 10, "0_1": 10, "0_2": 10, "0_3": 10}
        for t, rows in part.groupby("task"):   # the first keys of each task, in key order
            first = whole[whole.task == t].head(10)
            assert rows.key.tolist() == first.key.tolist() and rows.value.tolist() == first.value.tolist()
        d = LiveDashboard(app, max_rows=40, stores=["counts"])
        snap = d.refresh()
        assert len(snap.stores["counts"]) == 40 and snap.task_rows == {}
        assert "40 rows read of 4,000" in d.view.store.value
        assert pd.Series(list(snap.stores["counts"].values())).eq(1).all()
    finally:
        app.stop()


def test_the_forecast_a_cell_prints_is_the_one_on_the_dashboard(broker, tmp_path):
    import html

    import statekit
    from statekit import datagen

    datagen.produce_fast("acc2", "accounts", 2, 20_000, broker.bootstrap, keys=20_000, partitions=2)
    app = statekit.App("fcl", bootstrap=broker.bootstrap, partitions=2, engine="local",
                       state_dir=str(tmp_path / "fcl"))
    app.stream("acc2", value_serde="json").group_by_key().count(store="counts")
    try:
        app.start(sink="none")
        assert app.process_all_available(timeout=60)
        d = LiveDashboard(app, stores=["counts"])
        d.refresh()
        fc = app.restore_forecast(apply_rate=50_000.0)   # the notebook cell
        d.refresh()
        shown = html.unescape(d.view.restore.value)
        assert list(fc.lines.values()) and all(line in shown for line in fc.lines.values()), shown
        app.crash(mode="disk-loss")
        app.wait_for_state(["ERROR"], timeout=60)
        app.restart()
        assert app.process_all_available(timeout=60)
        d.refresh()
        rnd = d.model.picture().round
        assert rnd.forecast["lines"] == fc.lines             # the round kept the cell's forecast
        cells = html.unescape(d.view.restore.value)
        per_task = fc.frame[fc.frame.source == "scratch"].set_index("task").seconds
        for task, sec in per_task.items():   # the forecast column: the same seconds per task
            assert f"≈ {sec:.1f} s" in cells or f"≈ {sec * 1000:.0f} ms" in cells, (task, sec)
    finally:
        app.stop()
