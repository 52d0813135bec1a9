"""The notebook's dashboard reads an app through the same calls whatever its engine: a Spark-native
app (Spark's own RocksDB state store) fills the task table and lag chart from Spark's checkpoint and the
store panel from Spark's state data source reader."""
from __future__ import annotations

import collections

import pytest

pytestmark = [pytest.mark.spark, pytest.mark.native]


def test_dashboard_model_reads_a_live_native_app(native_broker, native_spark, tmp_path):
    import statekit
    from kernel_ext.dashboard.collect import collect
    from kernel_ext.dashboard.model import DashboardModel, normalize_task
    from kernel_ext.dashboard.view import render_header
    from statekit.kafka import Kafka

    k = Kafka(native_broker.bootstrap)
    k.ensure_topic("dash-lines", 2)
    lines = [f"state {w} log {w}" for w in ("a", "b", "c", "a", "b", "a")] * 5
    for i, ln in enumerate(lines):
        k.send("dash-lines", i % 2, [(None, ln.encode())])
    want = dict(collections.Counter(w for ln in lines for w in ln.split()))

    app = statekit.NativeApp("dashnative", bootstrap=native_broker.bootstrap, partitions=2,
                             state_dir=str(tmp_path / "native"), min_deltas_for_snapshot=50)
    app.stream("dash-lines").flat_map_values(str.split).group_by(lambda key, w: w).count(store="counts")
    try:
        app.start(max_records_per_trigger=10)
        app.process_all_available(timeout=300)
        snap = collect(app, stores=["counts"])
        model = DashboardModel()
        model.update(snap)
        header = model.header()
        assert header["state_rows"] == len(want)  # Spark's numRowsTotal: one row per word
        assert "state rows (Spark)" in render_header("dashnative", model)
        assert snap.error is None, snap.error
        assert snap.state == "RUNNING"
        assert snap.stores["counts"] == want
        tasks = sorted((normalize_task(r) for r in snap.tasks), key=lambda r: r["task"])
        assert [t["task"] for t in tasks] == ["0_0", "0_1"]  # state partition p is task 0_p
        # 30 lines at 10 per trigger: 3 batches, each a changelog version of every state partition;
        # with minDeltasForSnapshot=50 no snapshot beyond Spark's first, so the lag is the versions since
        lag = app.changelog_lag().set_index("partition")
        for t in tasks:
            p = int(t["task"].split("_")[1])
            assert t["changelog_end"] == int(lag.loc[p, "latest_version"]) >= 3
            assert t["lag"] == int(lag.loc[p, "changelog_lag"])
            assert t["lag"] == t["changelog_end"] - t["checkpoint"]
    finally:
        app.stop()
