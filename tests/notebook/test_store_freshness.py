"""Issue 19 in the notebook face: `%statekit query` and the dashboard's Store tab read the freshest
copy of each task at once and mark the rows of a task whose copy is behind its changelog (a
restore, a move, a lost disk) with its state and lag — never as if current. Fast checks on frames
made by hand; then both on a real app whose task restores from scratch."""
from __future__ import annotations

import time

import pandas as pd
import pytest

from kernel_ext.dashboard.collect import StoreCache, collect
from kernel_ext.dashboard.model import DashboardModel
from kernel_ext.dashboard.panels import render_store
from statekit.contracts import TaskId
from statekit.errors import StaleRead
from statekit.runtime.copies import Copy

T0, T1 = TaskId(0, 0), TaskId(0, 1)


def copies(restoring=True):
    return {"0_0": Copy(T0, "counts", 0, "active", "running", 40, 40, 0, 0.0),
            "0_1": Copy(T1, "counts", 1, "active", "restoring" if restoring else "running",
                        300 if restoring else 1822, 1822, 1522 if restoring else 0,
                        0.7 if restoring else 0.0, source="scratch")}


class FrameApp:
    """An app whose query_all answers like App.query_all(stale=True): rows, task, copy columns,
    .attrs["copies"]."""

    name, partitions, state = "fr", 2, "RUNNING"

    def __init__(self):
        self.restoring = True
        self.calls = []
        self.fail = None

    def query_all(self, store, stale=False, limit_per_task=None, wait=None, with_lag=False):
        self.calls.append(stale)
        if self.fail is not None:
            raise self.fail
        cs = copies(self.restoring)
        df = pd.DataFrame({"key": ["a", "b", "x"], "value": [3, 5, 1 if self.restoring else 4],
                           "task": ["0_0", "0_0", "0_1"], "instance": [0, 0, 1]})
        df["role"] = "active"
        df["state"] = [cs[t].state for t in df.task]
        df["lag"] = [cs[t].lag for t in df.task]
        df.attrs["copies"] = cs
        return df

    def metrics(self):
        return {"generation": 3}


def picture_of(app, cache=None, model=None):
    model = model or DashboardModel(name=app.name)
    model.absorb(collect(app, stores=["counts"], cache=cache, lag=False))
    model.store = "counts"
    return model, model.picture()


def test_the_store_tab_marks_the_rows_of_a_restoring_task_with_its_lag():
    app = FrameApp()
    cache = StoreCache()
    model, pic = picture_of(app, cache)
    assert app.calls == [True]                      # read at once from the freshest copies
    assert pic.store_stale == ["task 0_1: restoring on instance 1, 1,522 records (0.7 s) behind"]
    rows = {r.key: r.behind for r in pic.store_rows}
    assert rows == {"a": None, "b": None, "x": "restoring · 1,522 behind"}
    html = render_store(pic)
    assert "not current — task 0_1: restoring on instance 1, 1,522 records (0.7 s) behind" in html
    assert html.count("<tr class='stale'>") == 1 and "restoring · 1,522 behind" in html
    # rows that were not current are read again at the next poll, whatever the commits say
    model, pic = picture_of(app, cache, model)
    assert app.calls == [True, True]
    # restored: the same rows, current, unmarked; and now they are reused until a commit
    app.restoring = False
    model, pic = picture_of(app, cache, model)
    assert pic.store_stale == [] and all(r.behind is None for r in pic.store_rows)
    assert "not current" not in render_store(pic) and "class='stale'" not in render_store(pic)
    assert dict((r.key, r.value) for r in pic.store_rows)["x"] == 4


def test_a_task_with_no_copy_to_read_keeps_the_rows_read_before_marked():
    app = FrameApp()
    app.restoring = False
    cache = StoreCache()
    model, pic = picture_of(app, cache)
    assert pic.store_stale == []
    app.fail = StaleRead("store 'counts', task 0_1: owner dead (...), 1,822 changelog records "
                         "behind; no copy to read yet: ...", task=T1, state="owner dead", lag=1822)
    snap = collect(app, stores=["counts"], cache=cache, lag=False, commits={"counts": 9})
    model.absorb(snap)
    pic = model.picture()
    assert snap.error is None
    assert pic.store_stale == ["task 0_1: owner dead, no copy to read; the rows shown are from before"]
    assert {r.key: r.behind for r in pic.store_rows} == {"a": None, "b": None,
                                                          "x": "owner dead · 1,822 behind"}


def test_an_app_whose_queries_take_no_stale_is_read_as_before():
    class Plain:
        name, partitions, state = "pl", 2, "RUNNING"

        def query_all(self, store):
            return pd.DataFrame({"key": ["a"], "value": [1], "partition": [0]})

    _model, pic = picture_of(Plain())
    assert [(r.key, r.value, r.behind) for r in pic.store_rows] == [("a", 1, None)]
    assert pic.store_stale == []


# -- the magic and the Store tab on a real app ---------------------------------------------------

@pytest.fixture
def ip():
    from IPython.testing.globalipapp import get_ipython

    shell = get_ipython()
    shell.run_line_magic("load_ext", "kernel_ext")
    import kernel_ext

    sess = kernel_ext.session()
    sess._ensure_up = lambda spark=False: None
    yield shell, sess
    sess.apps.clear()


def test_the_magic_and_the_store_tab_show_a_restoring_task_the_same(ip, broker, tmp_path, capsys):
    import statekit
    from statekit.kafka import Kafka
    from statekit.partition import partition_for

    shell, sess = ip
    k = Kafka(broker.bootstrap)
    k.ensure_topic("lines", 2)
    app = statekit.App("mq", bootstrap=broker.bootstrap, partitions=2, instances=2,
                       state_dir=str(tmp_path / "st"), engine="local", restore_rate=800)
    app.stream("lines").group_by_key().count(store="counts")
    sess.apps["mq"] = app
    try:
        app.start()
        for _ in range(3):   # three commits per task
            for i in range(600):
                key = f"k{i}".encode()
                k.send("lines", partition_for(key, 2), [(key, b"x")])
            assert app.process_all_available(timeout=120)
        owner = app.key_owner("counts", "k1")
        shell.run_line_magic("statekit", "query mq counts k1")
        assert f"counts['k1'] = 3  (task {owner.task}, instance {owner.instance}, active)" in \
            capsys.readouterr().out
        app.crash("disk-loss", instance=owner.instance)
        mine = f"task {owner.task}: restoring on instance"
        magic = dash = None
        deadline = time.monotonic() + 60
        while magic is None or dash is None:
            assert time.monotonic() < deadline, (magic, dash)
            shell.run_line_magic("statekit", "query mq counts k1")
            out = capsys.readouterr().out.strip()
            if mine in out:
                assert "not current — " in out and "records" in out and "behind" in out, out
                magic = out
            model, pic = picture_of(app, model=DashboardModel(name="mq", top_k=2000))
            for r in pic.store_rows:   # a row is marked exactly when its task's copy is behind
                mark = TaskId(0, partition_for(r.key.encode(), 2)) == owner.task and pic.store_stale
                assert bool(r.behind) == bool(mark), (r, pic.store_stale)
            if any(mine in line for line in pic.store_stale):
                assert "not current — " + mine in render_store(pic)
                if any(r.behind and r.behind.startswith("restoring · ") for r in pic.store_rows):
                    dash = pic   # rows of the restoring copy shown, marked
            time.sleep(0.1)
        # restored: both say so by saying nothing
        assert app.query("counts", "k1", wait=60) == 3
        shell.run_line_magic("statekit", "query mq counts k1")
        out = capsys.readouterr().out
        assert "counts['k1'] = 3  (task" in out and "not current" not in out
        model, pic = picture_of(app)
        assert pic.store_stale == [] and not any(r.behind for r in pic.store_rows)
        df = shell.run_line_magic("statekit", "query mq counts --all --limit 5")
        assert list(df.columns) == ["key", "value", "task", "instance"] and len(df) == 5
    finally:
        app.stop()
        k.close()
