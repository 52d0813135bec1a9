"""A task's database costs little memory before its first records: RocksDB allocates a column
family's memtable bloom filter whole with every memtable, written or not, so only the stores' own
column families have one, sized for a memtable's keys (at a tenth of the write buffer on every
column family, four task databases of two stores held ~64 MiB of blooms)."""
from __future__ import annotations

from statekit.stores import RecordingSink, StoreSpec, build_stores

SPECS = [StoreSpec("a", key_serde="int64"), StoreSpec("b", key_serde="int64")]


def _rss_mib() -> float:
    with open("/proc/self/smaps_rollup") as f:
        for line in f:
            if line.startswith("Rss:"):
                return int(line.split()[1]) / 1024
    raise AssertionError("no Rss in smaps_rollup")


def test_four_task_databases_take_little_memory(tmp_path):
    warm, warm_db = build_stores(SPECS, str(tmp_path / "warm"), RecordingSink())
    warm["a"].put(1, "x")
    warm_db.flush()
    warm_db.commit({"batch": 0})      # RocksDB's own one-time costs (its block cache, threads)
    before = _rss_mib()
    dbs = []
    try:
        for i in range(4):
            stores, db = build_stores(SPECS, str(tmp_path / f"task{i}"), RecordingSink())
            dbs.append(db)
            stores["a"].put(i, "x")
            stores["b"].put(i, "y")
            db.flush()
            db.commit({"batch": 0})
        grown = _rss_mib() - before
    finally:
        for db in dbs + [warm_db]:
            db.close()
    assert grown < 20, f"four task databases took {grown:.1f} MiB"
