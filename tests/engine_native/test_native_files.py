"""Checkpoint-file inspection without Spark: changelog files, snapshots and the changelog lag."""
from __future__ import annotations

import os

from kernel_ext.dashboard.model import normalize_task
from statekit.engine.spark_native.inspect import changelog_lag, checkpoint_bytes, checkpoint_files, \
    lag_table, restore_metrics, state_operator_metrics


def _touch(path, n=10):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(b"x" * n)


def test_changelog_lag_counts_versions_since_last_snapshot(tmp_path):
    ck = str(tmp_path)
    for v in range(1, 8):
        _touch(f"{ck}/state/0/0/{v}.changelog")
    _touch(f"{ck}/state/0/0/3.zip")
    _touch(f"{ck}/state/0/0/SSTs/000008-abc.sst", 100)
    _touch(f"{ck}/state/0/0/.7.changelog.crc")
    for v in range(1, 4):
        _touch(f"{ck}/state/0/1/{v}_0f3a.changelog")
    _touch(f"{ck}/state/0/_metadata/v2/0")
    f = checkpoint_files(ck)
    assert set(f.kind) == {"changelog", "snapshot", "sst"}
    lag = changelog_lag(ck, f).set_index("partition")
    assert lag.loc[0, "latest_version"] == 7 and lag.loc[0, "last_snapshot"] == 3
    assert lag.loc[0, "changelog_lag"] == 4 and lag.loc[0, "snapshots"] == 1
    assert lag.loc[1, "changelog_lag"] == 3 and lag.loc[1, "latest_version"] == 3
    assert checkpoint_bytes(ck) >= 7 * 10 + 10 + 100
    # the same rows in App.lag()'s shape, which the dashboard's task table and lag chart read
    table = lag_table(changelog_lag(ck, f), ["counts"])
    rows = sorted((normalize_task(r) for r in table.to_dict("records")), key=lambda r: r["task"])
    assert [(r["task"], r["store"], r["checkpoint"], r["changelog_end"], r["lag"]) for r in rows] == \
        [("0_0", "counts", 3, 7, 4), ("0_1", "counts", 0, 3, 3)]


def test_progress_frames():
    prog = [{"batchId": 0, "numInputRows": 3, "durationMs": {"triggerExecution": 9}},
            {"batchId": 1, "numInputRows": 4, "durationMs": {"triggerExecution": 7},
             "stateOperators": [{"operatorName": "transformWithStateInPandasExec", "numRowsTotal": 5,
                                 "memoryUsedBytes": 100, "commitTimeMs": 2,
                                 "customMetrics": {"rocksdbNumReplayChangelogFiles": 3,
                                                   "rocksdbLoadLatencyMs": 12}}]}]
    df = state_operator_metrics(prog)
    assert list(df.batch_id) == [1] and int(df.rocksdbNumReplayChangelogFiles.iloc[0]) == 3
    r = restore_metrics(prog)
    assert r["batch_id"] == 1 and r["rocksdbLoadLatencyMs"] == 12 and r["numRowsTotal"] == 5
