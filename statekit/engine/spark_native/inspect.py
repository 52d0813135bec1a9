"""Dashboard data for the native engine, all of it from Spark itself.

* `checkpoint_files(ckpt)`: the files of every state partition in the checkpoint dir
  (`state/<op>/<partition>/<version>.changelog`, `<version>.zip` snapshots, `SSTs/*.sst` they refer to);
  `changelog_lag(ckpt)`: per partition the latest version, the last snapshot version and the number of
  changelog versions since that snapshot (what a restore would replay).
* `read_store(spark, ckpt, plan, store)`: a store's rows through Spark's state data source reader
  (`spark.read.format("statestore")` with `stateVarName`), decoded with the store's serdes;
  `state_metadata(spark, ckpt)`: `spark.read.format("state-metadata")`.
* `state_operator_metrics(progress)`: the `stateOperators` of each micro-batch's progress (numRowsTotal,
  memoryUsedBytes, commitTimeMs, the rocksdb* custom metrics); `restore_metrics(progress)`: the load
  figures of the first batch after a (re)start — the state load happens there.
"""
from __future__ import annotations

import os
import re

_FILE = re.compile(r"^(\d+)(?:_([0-9a-fA-F-]+))?\.(changelog|zip)$")

# custom metrics Spark 4.3's RocksDBStateStoreProvider reports in stateOperators[].customMetrics
LOAD_METRICS = ("rocksdbLoadLatencyMs", "rocksdbLoadFromSnapshotLatencyMs", "rocksdbReplayChangeLogLatencyMs",
                "rocksdbNumReplayChangelogFiles", "rocksdbNumLoadedFromDfs", "rocksdbNumSnapshotsAutoRepaired")
COMMIT_METRICS = ("rocksdbCommitFlushLatency", "rocksdbCommitCompactLatency", "rocksdbCommitCheckpointLatency",
                  "rocksdbCommitFileSyncLatencyMs", "rocksdbChangeLogWriterCommitLatencyMs",
                  "rocksdbSaveZipFilesLatencyMs", "rocksdbFilesCopied", "rocksdbBytesCopied",
                  "rocksdbFilesReused", "rocksdbForceSnapshotCount")
READ_METRICS = ("rocksdbGetCount", "rocksdbPutCount", "rocksdbReadBlockCacheHitCount",
                "rocksdbReadBlockCacheMissCount", "rocksdbTotalBytesRead", "rocksdbTotalBytesWritten",
                "rocksdbSstFileSize")


def _state_root(ckpt: str) -> str:
    return os.path.join(ckpt, "state")


def checkpoint_files(ckpt: str):
    """pandas DataFrame: operator, partition, kind (changelog|snapshot|sst|metadata), version, bytes,
    mtime, name — one row per file of the state dir."""
    import pandas as pd

    rows = []
    root = _state_root(ckpt)
    if os.path.isdir(root):
        for op in sorted(os.listdir(root)):
            opdir = os.path.join(root, op)
            if not op.isdigit() or not os.path.isdir(opdir):
                continue
            for part in sorted(os.listdir(opdir)):
                pdir = os.path.join(opdir, part)
                if not part.isdigit() or not os.path.isdir(pdir):
                    continue
                for dp, _dn, fns in os.walk(pdir):
                    for fn in fns:
                        if fn.startswith(".") and fn.endswith(".crc"):
                            continue
                        path = os.path.join(dp, fn)
                        try:
                            st = os.stat(path)
                        except OSError:
                            continue
                        m = _FILE.match(fn) if dp == pdir else None
                        if m:
                            kind = "changelog" if m.group(3) == "changelog" else "snapshot"
                            version = int(m.group(1))
                        elif fn.endswith(".sst"):
                            kind, version = "sst", None
                        else:
                            kind, version = "metadata", None
                        rows.append({"operator": int(op), "partition": int(part), "kind": kind,
                                     "version": version, "bytes": st.st_size, "mtime": st.st_mtime,
                                     "name": os.path.relpath(path, pdir)})
    cols = ["operator", "partition", "kind", "version", "bytes", "mtime", "name"]
    df = pd.DataFrame(rows, columns=cols)
    return df.sort_values(["operator", "partition", "kind", "version"], na_position="last",
                          ignore_index=True) if len(df) else df


def changelog_lag(ckpt: str, files=None):
    """pandas DataFrame per state partition: operator, partition, latest_version, last_snapshot
    (version of the newest uploaded .zip, None before the first), changelog_lag (changelog versions
    after that snapshot = files a restore replays), changelog_files, snapshots, bytes (all files)."""
    import pandas as pd

    f = checkpoint_files(ckpt) if files is None else files
    rows = []
    if len(f):
        for (op, part), g in f.groupby(["operator", "partition"]):
            cl = g[g.kind == "changelog"]
            sn = g[g.kind == "snapshot"]
            latest = int(cl.version.max()) if len(cl) else (int(sn.version.max()) if len(sn) else 0)
            last_snap = int(sn.version.max()) if len(sn) else None
            lag = int((cl.version > (last_snap or 0)).sum())
            rows.append({"operator": op, "partition": part, "latest_version": latest,
                         "last_snapshot": last_snap, "changelog_lag": lag,
                         "changelog_files": len(cl), "snapshots": len(sn), "bytes": int(g.bytes.sum())})
    return pd.DataFrame(rows, columns=["operator", "partition", "latest_version", "last_snapshot",
                                       "changelog_lag", "changelog_files", "snapshots", "bytes"])


def lag_table(lag, stores=()):
    """The changelog engine's lag table (``App.lag()``), filled from Spark's checkpoint, so the same
    dashboard panels work for both engines: a task is a state partition, its "checkpoint" is the
    version of the last uploaded snapshot, its "changelog end" the latest version, and its lag the
    changelog files a restore would replay (versions, not records: Spark's changelog unit)."""
    import pandas as pd

    store = ",".join(stores) if stores else None
    rows = [{"task": int(r.partition), "instance": 0, "role": "active",
             "store": store or f"operator {r.operator}",
             "checkpoint": int(r.last_snapshot) if pd.notna(r.last_snapshot) else 0,
             "changelog_end": int(r.latest_version), "lag": int(r.changelog_lag),
             "unit": "changelog versions"}
            for r in lag.itertuples()]
    return pd.DataFrame(rows, columns=["task", "instance", "role", "store", "checkpoint",
                                       "changelog_end", "lag", "unit"])


def checkpoint_bytes(ckpt: str) -> int:
    """Bytes of the state dir of a checkpoint (changelogs, snapshots, SSTs, metadata)."""
    total = 0
    for dp, _dn, fns in os.walk(_state_root(ckpt)):
        for fn in fns:
            try:
                total += os.path.getsize(os.path.join(dp, fn))
            except OSError:
                pass
    return total


# --- Spark's state readers ---------------------------------------------------------------------------

def state_metadata(spark, ckpt: str):
    """spark.read.format("state-metadata").load(ckpt) as pandas."""
    return spark.read.format("state-metadata").load(ckpt).toPandas()


def read_store(spark, ckpt: str, plan, store: str, batch_id=None, groupby: bool = False):
    """A store's contents read by `spark.read.format("statestore")` (stateVarName = the store),
    decoded: columns key, value, partition (+ window_start for window stores). `groupby`: the
    state of a groupBy().count() query (key {gkey}, value {count})."""
    import pandas as pd

    from statekit.engine.spark_native.translate import gkey_serde, state_var
    from statekit.topology.graph import resolve_serde

    spec = plan.store(store)
    ks, vs = resolve_serde(gkey_serde(plan, store)), resolve_serde(spec.value_serde)
    r = spark.read.format("statestore")
    if not groupby:
        r = r.option("stateVarName", state_var(store))
    if batch_id is not None:
        r = r.option("batchId", int(batch_id))
    pdf = r.load(ckpt).toPandas()
    rows = []
    if groupby:
        for k, v, p in zip(pdf["key"], pdf["value"], pdf["partition_id"]):
            kb = bytes(k["gkey"])
            rows.append({"key": ks.from_bytes(kb) if kb else None, "value": int(v["count"]),
                         "partition": int(p)})
        return pd.DataFrame(rows, columns=["key", "value", "partition"])
    if spec.kind == "window":
        for k, uk, uv, p in zip(pdf["key"], pdf["user_map_key"], pdf["user_map_value"], pdf["partition_id"]):
            kb = bytes(k["gkey"])
            rows.append({"key": ks.from_bytes(kb) if kb else None, "window_start": int(uk["window_start"]),
                         "value": vs.from_bytes(bytes(uv["v"])), "partition": int(p)})
        cols = ["key", "window_start", "value", "partition"]
    else:
        for k, v, p in zip(pdf["key"], pdf["value"], pdf["partition_id"]):
            kb = bytes(k["gkey"])
            rows.append({"key": ks.from_bytes(kb) if kb else None, "value": vs.from_bytes(bytes(v["v"])),
                         "partition": int(p)})
        cols = ["key", "value", "partition"]
    return pd.DataFrame(rows, columns=cols)


# --- progress --------------------------------------------------------------------------------------

def state_operator_metrics(progress: list):
    """pandas DataFrame, one row per (batch, state operator): batch_id, timestamp, num_input_rows,
    batch_ms, operator, numRowsTotal, numRowsUpdated, memoryUsedBytes, commitTimeMs, allUpdatesTimeMs,
    numStateStoreInstances and the rocksdb* custom metrics."""
    import pandas as pd

    rows = []
    for p in progress:
        for op in p.get("stateOperators") or ():
            r = {"batch_id": p.get("batchId"), "timestamp": p.get("timestamp"),
                 "num_input_rows": p.get("numInputRows"),
                 "batch_ms": (p.get("durationMs") or {}).get("triggerExecution"),
                 "operator": op.get("operatorName")}
            for k in ("numRowsTotal", "numRowsUpdated", "memoryUsedBytes", "commitTimeMs",
                      "allUpdatesTimeMs", "numStateStoreInstances"):
                r[k] = op.get(k)
            r.update(op.get("customMetrics") or {})
            rows.append(r)
    return pd.DataFrame(rows)


def restore_metrics(progress: list) -> dict:
    """The state load of a (re)started query, from its first batch with state operators: batch_id,
    batch_ms (the whole first batch), the LOAD_METRICS (summed over the state partitions by Spark),
    numRowsTotal, and the stateOperators custom metrics as reported."""
    for p in progress:
        ops = p.get("stateOperators") or ()
        if not ops:
            continue
        cm = dict(ops[0].get("customMetrics") or {})
        out = {"batch_id": p.get("batchId"), "batch_ms": (p.get("durationMs") or {}).get("triggerExecution"),
               "num_input_rows": p.get("numInputRows"), "numRowsTotal": ops[0].get("numRowsTotal"),
               "commitTimeMs": ops[0].get("commitTimeMs")}
        for k in LOAD_METRICS:
            out[k] = cm.get(k)
        out["custom"] = cm
        return out
    return {}
