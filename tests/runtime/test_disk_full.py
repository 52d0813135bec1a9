"""A state directory whose disk fills up (issue 31): one line that names the store and the path,
nothing in the store that did not commit, and a restart after space is freed that resumes exactly.

Two ways to fill a disk: a store write that fails with RocksDB's ENOSPC error (injected: it always
runs, in `make test`), and a real one (`make test-slow`) — an instance's disk (its state directory) on a small tmpfs this test mounts
(root only; it is skipped where mounting is not allowed), filled up with a file while the app runs.
"""
from __future__ import annotations

import collections
import os
import struct
import subprocess
import uuid

import pytest

from harness import unique
from statekit.errors import DiskFull


def test_an_enospc_store_write_is_one_line_and_leaves_the_last_commit(broker, tmp_path):
    from statekit.kafka import Kafka
    from statekit.state import TaskState
    from statekit.stores import StoreSpec

    k = Kafka(broker.bootstrap)
    specs = [StoreSpec("counts", kind="kv", key_serde="str", value_serde="int64")]
    st = TaskState("full", 0, specs, state_dir=str(tmp_path), kafka=k)
    try:
        st.store("counts").put("a", 1)
        st.commit(0)
        st.store("counts").put("a", 2)
        st.store("counts").put("b", 7)
        real = st.db._db

        class Full:   # RocksDB's own words for a WAL append on a full disk
            def __getattr__(self, name):
                return getattr(real, name)

            def write(self, *a, **kw):
                raise Exception("IO error: No space left on device: While appending to file: "
                                f"{st.task_dir}/rocksdb/000008.log: No space left on device")

        st.db._db = Full()
        with pytest.raises(DiskFull) as info:
            st.commit(1)
        st.db._db = real
        line = str(info.value)
        assert "\n" not in line and "'counts'" in line and os.path.join(st.task_dir, "rocksdb") in line
        assert "No space left on device" in line and "restart()" in line
        assert st.store("counts").get("a") == 1 and st.store("counts").get("b") is None
        assert st.last_batch == 0
    finally:
        st.close()
    # reopened (space freed): batch 1 committed in Kafka before the write failed, so the restore
    # replays it from the changelog — and a replay of batch 1 would be skipped
    st = TaskState("full", 0, specs, state_dir=str(tmp_path), kafka=k)
    try:
        assert st.last_batch == 1 and st.already_applied(1)
        assert st.store("counts").get("a") == 2 and st.store("counts").get("b") == 7
    finally:
        st.close()
        k.close()


def _mount_tmpfs(path, size_mb: int) -> bool:
    if os.geteuid() != 0:
        return False
    os.makedirs(path, exist_ok=True)
    r = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size_mb}m", "tmpfs", str(path)],
                       capture_output=True)
    return r.returncode == 0


def _fill(path) -> str:
    """Write a file until the disk is full; returns its path."""
    filler = os.path.join(path, f"filler-{uuid.uuid4().hex}")
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        for size in (1 << 20, 4096):   # megabytes, then the last pages
            block = b"\0" * size
            try:
                while True:
                    os.write(fd, block)
            except OSError:
                pass
    finally:
        os.close(fd)
    return filler


@pytest.mark.slow
def test_a_full_state_disk_stops_the_app_in_one_line_and_a_restart_resumes_exactly(broker, tmp_path):
    import statekit
    from statekit.kafka import Kafka
    from statekit.partition import partition_for
    from statekit.runtime.lifecycle import AppState

    # the instance's own disk (<state_dir>/instance-0: its tasks' RocksDB and checkpoints) is a
    # small filesystem; the control directory and the engine's checkpoint stay where they are
    disk = tmp_path / "state" / "instance-0"
    if not _mount_tmpfs(disk, 48):
        pytest.skip("mounting a small tmpfs needs root (the injected ENOSPC test covers the rest)")
    k = Kafka(broker.bootstrap)
    app = filler = None
    try:
        for t in ("words", "counts-out"):
            k.ensure_topic(t, 2)
        app = statekit.App(unique("full"), bootstrap=broker.bootstrap, partitions=2, instances=1,
                           state_dir=str(tmp_path / "state"), engine="local")
        app.stream("words").group_by_key().count(store="counts").to_stream().to(
            "counts-out", value_serde="int64")
        sent = collections.Counter()

        def produce(n, seed):
            by = collections.defaultdict(list)
            for i in range(n):
                w = f"w{(i * 7 + seed) % 50}"
                sent[w] += 1
                by[partition_for(w.encode(), 2)].append((w.encode(), b"1"))
            for p, recs in by.items():
                k.send("words", p, recs)

        app.start(sink="kafka")
        produce(300, 1)
        assert app.process_all_available(timeout=120)
        filler = _fill(disk)
        produce(300, 2)
        assert app.wait_for_state(AppState.ERROR, 120) == AppState.ERROR, app.state
        line = str(app.error)
        assert "\n" not in line and "No space left on device" in line, line
        assert "'counts'" in line and str(disk) in line, line
        os.unlink(filler)                       # space freed
        filler = None
        app.restart()
        produce(100, 3)
        assert app.process_all_available(timeout=120)
        store = app.query_all("counts")
        assert dict(zip(store["key"], store["value"])) == dict(sent)
        out = collections.defaultdict(list)
        for p, end in k.end_offsets("counts-out", None, "read_committed").items():
            for chunk in k.read("counts-out", p, None, end, isolation="read_committed"):
                for _o, _t, key, v, _h in chunk.records:
                    out[key.decode()].append(struct.unpack(">q", v)[0])
        assert all(b > a for vals in out.values() for a, b in zip(vals, vals[1:])), "a count twice"
        assert {w: v[-1] for w, v in out.items()} == dict(sent)
    finally:
        try:
            if filler is not None:
                os.unlink(filler)
            if app is not None:
                app.stop()
        finally:
            k.close()
            subprocess.run(["umount", "-l", str(disk)], capture_output=True)
