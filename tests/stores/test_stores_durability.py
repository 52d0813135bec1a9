"""RocksDB only ever holds whole commits: reopen, SIGKILL, corrupt dirs, locks, the secondary
reader, the restore path and wiping."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from statekit.errors import CorruptState, StateLocked, StatekitError
from statekit.stores import RecordingSink, StoreSpec, TaskDB, build_stores, open_readonly

SPECS = [StoreSpec("a", key_serde="int64"), StoreSpec("b", key_serde="int64")]


def reopen(task_dir):
    return build_stores(SPECS, str(task_dir), RecordingSink())


def contents(stores):
    return {n: dict(s.all()) for n, s in stores.items()}


def test_uncommitted_writes_vanish_on_reopen(tmp_path):
    stores, db = reopen(tmp_path)
    stores["a"].put(1, "x")
    db.flush()  # in the overlay now, still not in RocksDB
    db.close()
    stores, db = reopen(tmp_path)
    try:
        assert contents(stores) == {"a": {}, "b": {}}
        assert db.read_meta() == {}
    finally:
        db.close()


def test_commit_persists_everything_and_meta(tmp_path):
    stores, db = reopen(tmp_path)
    for i in range(50):
        stores["a"].put(i, {"v": i})
        stores["b"].put(i, -i)
    stores["a"].delete(7)
    db.flush()
    db.commit({"batch": 3, "offsets": {"a": 51, "b": 50}})
    db.commit({"extra": True})  # meta keys merge
    stores["a"].put(1000, "uncommitted")
    db.close()
    stores, db = reopen(tmp_path)
    try:
        c = contents(stores)
        assert c["a"] == {i: {"v": i} for i in range(50) if i != 7}
        assert c["b"] == {i: -i for i in range(50)}
        assert db.read_meta() == {"batch": 3, "offsets": {"a": 51, "b": 50}, "extra": True}
    finally:
        db.close()


CHILD = textwrap.dedent("""
    import sys, time
    from statekit.stores import RecordingSink, StoreSpec, build_stores
    task_dir, mode, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    specs = [StoreSpec("a", key_serde="int64"), StoreSpec("b", key_serde="int64")]
    stores, db = build_stores(specs, task_dir, RecordingSink(), cache_bytes=1 << 16)
    a, b = stores["a"], stores["b"]
    for i in range(100):
        a.put(i, i); b.put(i, -i)
    db.flush(); db.commit({"batch": 1})
    for i in range(100, 100 + n):
        a.put(i, i); b.put(i, -i)
    a.put(0, "changed"); b.delete(1)
    db.flush()
    if mode == "during":
        print("committing", flush=True)
        db.commit({"batch": 2})
    if mode == "after":
        db.commit({"batch": 2})
    print("ready", flush=True)
    if mode == "serve":  # commit batch 2 when asked, keep the DB open until stdin closes
        sys.stdin.readline(); db.commit({"batch": 2}); print("committed", flush=True)
        sys.stdin.readline()
    else:
        time.sleep(120)  # holds the DB open until the test kills this process
""")


def spawn(task_dir, mode, n=100):
    p = subprocess.Popen([sys.executable, "-c", CHILD, str(task_dir), mode, str(n)],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    return p


def wait_line(p, want, timeout=60):
    deadline = time.time() + timeout
    while time.time() < deadline:
        line = p.stdout.readline()
        if not line:
            raise AssertionError(f"child exited ({p.poll()}) before printing {want!r}")
        if line.strip() == want:
            return
    raise AssertionError(f"no {want!r} within {timeout}s")


def kill(p):
    p.send_signal(signal.SIGKILL)
    p.wait(timeout=30)


def expect_batch(task_dir, batch, n=100):
    stores, db = reopen(task_dir)
    try:
        c = contents(stores)
        if batch == 1:
            assert c["a"] == {i: i for i in range(100)}
            assert c["b"] == {i: -i for i in range(100)}
        else:
            assert c["a"] == {**{i: i for i in range(100 + n)}, 0: "changed"}
            assert c["b"] == {i: -i for i in range(100 + n) if i != 1}
        assert db.read_meta() == {"batch": batch}
    finally:
        db.close()


def test_sigkill_before_commit_leaves_last_commit(tmp_path):
    p = spawn(tmp_path, "before")
    try:
        wait_line(p, "ready")
    finally:
        kill(p)
    expect_batch(tmp_path, 1)


def test_sigkill_after_commit_keeps_it(tmp_path):
    p = spawn(tmp_path, "after")
    try:
        wait_line(p, "ready")
    finally:
        kill(p)
    expect_batch(tmp_path, 2)


def test_sigkill_during_a_big_commit_is_all_or_nothing(tmp_path):
    n = 100_000
    p = spawn(tmp_path, "during", n)
    try:
        wait_line(p, "committing", timeout=120)
    finally:
        kill(p)
    stores, db = reopen(tmp_path)
    batch = db.read_meta()["batch"]
    db.close()
    expect_batch(tmp_path, batch, n)


def test_secondary_reader_sees_commits_while_writer_runs(tmp_path):
    p = spawn(tmp_path, "serve")
    try:
        wait_line(p, "ready")
        with pytest.raises(StateLocked, match="in use"):
            reopen(tmp_path)
        with open_readonly(str(tmp_path)) as ro:
            assert ro.read_meta() == {"batch": 1}
            assert sorted(ro.store_names) == ["a", "b"]
            assert len(list(ro.items("a"))) == 100
            df = ro.to_pandas("a")
            assert len(df) == 100 and df["key"].tolist() == list(range(100))
            assert ro.read_specs()["a"]["key_serde"] == "int64"
            p.stdin.write("commit\n")
            p.stdin.flush()
            wait_line(p, "committed")
            ro.refresh()
            assert ro.read_meta() == {"batch": 2}
            assert len(list(ro.items("a"))) == 200
            assert ro.get("a", (0).to_bytes(8, "big")) == b'"changed"'
        p.stdin.write("exit\n")
        p.stdin.flush()
        p.wait(timeout=30)
        assert p.returncode == 0
    finally:
        if p.poll() is None:
            kill(p)
    expect_batch(tmp_path, 2)


def test_corrupt_dir_raises_one_line_corrupt_state(tmp_path):
    stores, db = reopen(tmp_path)
    stores["a"].put(1, 1)
    db.flush()
    db.commit({"batch": 1})
    db.close()
    dbdir = tmp_path / "rocksdb"
    for f in os.listdir(dbdir):
        if f.startswith("MANIFEST-"):
            with open(dbdir / f, "r+b") as fh:
                fh.write(b"\x00garbage" * 64)
    with pytest.raises(CorruptState) as ei:
        reopen(tmp_path)
    msg = str(ei.value)
    assert "\n" not in msg and str(dbdir) in msg and "changelog" in msg
    TaskDB.destroy(str(tmp_path))
    stores, db = reopen(tmp_path)  # after a wipe the task starts empty
    try:
        assert contents(stores) == {"a": {}, "b": {}} and db.read_meta() == {}
    finally:
        db.close()


def test_garbage_current_file_is_corrupt_state(tmp_path):
    dbdir = tmp_path / "rocksdb"
    dbdir.mkdir()
    (dbdir / "CURRENT").write_text("MANIFEST-000042\n")
    with pytest.raises(CorruptState, match="cannot be opened"):
        reopen(tmp_path)
    with pytest.raises(CorruptState):
        open_readonly(str(tmp_path))


def test_readonly_on_missing_state(tmp_path):
    with pytest.raises(CorruptState, match="no RocksDB state"):
        open_readonly(str(tmp_path / "nothing"))


def test_second_writer_in_process_is_locked(tmp_path):
    stores, db = reopen(tmp_path)
    try:
        with pytest.raises(StateLocked):
            reopen(tmp_path)
    finally:
        db.close()
    stores, db = reopen(tmp_path)  # closing released the lock
    db.close()


def test_write_batch_raw_restores_atomically_with_meta(tmp_path):
    stores, db = reopen(tmp_path)
    log = [(b"\x00" * 7 + b"\x01", b'"one"'), (b"\x00" * 7 + b"\x02", b'"two"'),
           (b"\x00" * 7 + b"\x01", None)]
    assert db.write_batch_raw("a", log, meta={"offsets": {"a": 3}}) == 3
    assert contents(stores)["a"] == {2: "two"}
    assert db.read_meta() == {"offsets": {"a": 3}}
    stores["a"].put(5, "x")
    with pytest.raises(StatekitError, match="uncommitted writes"):
        db.write_batch_raw("a", [])
    db.discard()
    db.close()
    stores, db = reopen(tmp_path)
    try:
        assert contents(stores)["a"] == {2: "two"}
        assert db.read_meta() == {"offsets": {"a": 3}}
    finally:
        db.close()


def test_restore_clears_clean_cache_entries(tmp_path):
    stores, db = reopen(tmp_path)
    try:
        stores["a"].put(1, "old")
        db.flush()
        db.commit()
        assert stores["a"].get(1) == "old"  # cached, clean
        db.write_batch_raw("a", [((1).to_bytes(8, "big"), b'"restored"')])
        assert stores["a"].get(1) == "restored"
    finally:
        db.close()


def test_wipe_empties_the_task_and_keeps_stores_usable(tmp_path):
    stores, db = reopen(tmp_path)
    stores["a"].put(1, 1)
    db.flush()
    db.commit({"batch": 1})
    stores["b"].put(2, 2)
    db.wipe()
    assert contents(stores) == {"a": {}, "b": {}} and db.read_meta() == {}
    stores["a"].put(3, 3)
    db.flush()
    db.commit({"batch": 9})
    db.close()
    stores, db = reopen(tmp_path)
    try:
        assert contents(stores) == {"a": {3: 3}, "b": {}}
        assert db.read_meta() == {"batch": 9}
    finally:
        db.close()


def test_memory_only_task(tmp_path):
    stores, db = build_stores([StoreSpec("m", backend="memory")], None, RecordingSink())
    assert db.path is None and db.persistent("m") is False
    stores["m"].put("k", 1)
    db.flush()
    db.commit({"batch": 1})
    assert db.read_meta() == {"batch": 1}
    assert db.write_batch_raw("m", [(b'"j"', b"2")], meta={"batch": 2}) == 1
    assert dict(stores["m"].all()) == {"k": 1, "j": 2}
    db.wipe()
    assert list(stores["m"].all()) == [] and db.read_meta() == {}
    db.close()


def test_builder_validation(tmp_path):
    with pytest.raises(ValueError, match="duplicate"):
        build_stores([StoreSpec("a"), StoreSpec("a")], str(tmp_path), RecordingSink())
    with pytest.raises(ValueError, match="sink"):
        build_stores([StoreSpec("a")], str(tmp_path), None)
    with pytest.raises(ValueError, match="task_dir"):
        build_stores([StoreSpec("a")], None, RecordingSink())
    with pytest.raises(ValueError, match="reserved|'__'"):
        StoreSpec("__meta__")
    stores, db = build_stores([StoreSpec("a", logging=False)], str(tmp_path), None)
    db.close()


def test_closed_task_db_refuses_work(tmp_path):
    stores, db = reopen(tmp_path)
    db.close()
    with pytest.raises(StatekitError, match="closed"):
        db.commit({"batch": 1})
    with pytest.raises(StatekitError, match="closed"):
        db.write_batch_raw("a", [])
    with pytest.raises(StatekitError, match="closed"):
        db.read_meta()
    with pytest.raises(StatekitError, match="closed"):
        stores["a"].get(1)


def test_verify_finds_damaged_table_files(tmp_path):
    stores, db = reopen(tmp_path)
    for i in range(2000):
        stores["a"].put(i, "x" * 50)
    db.flush()
    db.commit({"batch": 1})
    assert db.verify() == 2000 + 2  # records + meta (batch, store specs)
    db._require_db().flush()  # force an SST file
    db.close()
    dbdir = tmp_path / "rocksdb"
    ssts = [f for f in os.listdir(dbdir) if f.endswith(".sst")]
    assert ssts
    for f in ssts:
        size = os.path.getsize(dbdir / f)
        with open(dbdir / f, "r+b") as fh:
            fh.seek(size // 4)
            fh.write(b"\xde\xad\xbe\xef" * 64)
    try:
        stores, db = reopen(tmp_path)
    except CorruptState:
        return  # caught at open: fine too
    try:
        with pytest.raises(CorruptState, match="damaged"):
            db.verify()
    finally:
        db.close()


def test_close_ends_open_iterators_and_releases_the_lock(tmp_path):
    stores, db = reopen(tmp_path)
    for i in range(10):
        stores["a"].put(i, i)
    db.flush()
    db.commit()
    it = stores["a"].all()
    assert next(it) == (0, 0)  # a RocksDB iterator is open now
    raw = db.items("a")
    next(raw)
    db.close()
    stores2, db2 = reopen(tmp_path)  # not StateLocked
    try:
        assert len(dict(stores2["a"].all())) == 10
    finally:
        db2.close()


def test_inspection_decodes_with_recorded_serdes_or_shows_bytes(tmp_path):
    class Rev:
        def to_bytes(self, o):
            return o[::-1].encode()

        def from_bytes(self, b):
            return b.decode()[::-1]

    stores, db = build_stores([StoreSpec("c", key_serde=Rev(), value_serde="int64"),
                               StoreSpec("w", kind="window", key_serde="str", segment_ms=10)],
                              str(tmp_path), RecordingSink())
    try:
        stores["c"].put("abc", 5)
        stores["w"].put("k", {"n": 1}, 25)
        db.flush()
        db.commit({"batch": 1})
        df = db.to_pandas("c")
        assert df.to_dict("records") == [{"key": b"cba", "value": 5}]
        assert db.to_pandas("c", key_serde=Rev())["key"].tolist() == ["abc"]
        assert db.to_pandas("w").to_dict("records") == [{"key": "k", "window_start": 25,
                                                          "value": {"n": 1}}]
        assert db.to_pandas("w", limit=0).empty
    finally:
        db.close()


def test_secondary_follows_a_writer_that_closes_and_reopens(tmp_path):
    """The contract interactive queries rely on: the task runner opens and closes a task's RocksDB
    every micro-batch (a new MANIFEST each time), and one long-lived reader still sees every commit.
    (The cross-process case that once served stale values is tests/runtime/test_app.py's
    test_interactive_queries_while_the_query_runs.)"""
    stores, db = reopen(tmp_path)
    for k in range(50):
        stores["a"].put(k, 0)
    db.flush()
    db.commit({"batch": 0})
    db.close()
    with open_readonly(str(tmp_path)) as ro:
        for batch in range(1, 6):
            stores, db = reopen(tmp_path)
            for k in range(50):
                stores["a"].put(k, batch)
            db.flush()
            db.commit({"batch": batch})
            ro.refresh()  # while the writer still has the DB open, as a query does mid-run
            assert {int.from_bytes(k, "big"): v for k, v in ro.items("a")} == \
                {k: str(batch).encode() for k in range(50)}
            db.close()
            ro.refresh()
            assert ro.read_meta() == {"batch": batch}
            assert {int.from_bytes(k, "big"): v for k, v in ro.items("a")} == \
                {k: str(batch).encode() for k in range(50)}



def test_a_read_only_copy_never_reads_an_older_value_across_flushes(tmp_path):
    """A RocksDB secondary that catches up across a flush of one column family can lose that
    family's newer memtable entries: refresh() must notice and open afresh."""
    import random

    from statekit.stores.rocksdb import META_CF

    stores, db = reopen(tmp_path)
    rnd, truth, ro = random.Random(1), {}, None
    try:
        for step in range(400):
            keys = [rnd.randrange(200).to_bytes(8, "big") for _ in range(5)]
            vals = [b"%d" % step] * 5
            db.write_batch_columns("a", keys, vals, {"batch": step})
            truth.update(zip(keys, vals))
            if rnd.random() < 0.15:   # the writer flushes a memtable (as RocksDB does when full)
                db._cf_dict(rnd.choice(["a", META_CF])).flush()
            if ro is None:
                ro = open_readonly(str(tmp_path))
            elif rnd.random() < 0.5:
                ro.refresh()
            else:
                continue
            assert ro.read_meta()["batch"] == step
            stale = {k: ro.get("a", k) for k, v in truth.items() if ro.get("a", k) != v}
            assert not stale, (step, stale)
    finally:
        if ro is not None:
            ro.close()
        db.close()
