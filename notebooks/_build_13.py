"""Builds notebooks/13_cluster.ipynb (unexecuted): the tour's word count on a local Spark standalone
cluster of three workers; one executor is killed and its tasks move to their warm copies.

    .venv/bin/python notebooks/_build_13.py
    .venv/bin/python notebooks/_build.py 13_cluster
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _cells import DOWN, code, md, write  # noqa: E402

NOTEBOOKS: dict[str, list] = {}

NOTEBOOKS["13_cluster"] = [
    md("""
# 13 · On a cluster: tasks stay where their state is

So far Spark ran in this kernel's machine with `local[2]`, and the tasks ran in statekit's instance
processes beside it. On a real Spark cluster the tasks run **inside Spark's executors**
(`placement="executors"`), each with its RocksDB on that executor's disk. Spark decides where each
task runs; statekit makes that the executor holding the task's state, batch after batch, with the
store kept open between micro-batches — and keeps a **standby** of each task warm on another
executor, so that losing an executor costs little.

**What you will see:** a Spark standalone cluster of three workers started on this machine (a
master and three workers, each executor its own JVM with its own directories); the tour's word
count on it, with one standby per task; every task opened once and staying on its executor; one
executor killed; its tasks moving to the executors that held their standbys and replaying only what
those were behind; and the store checked against plain Python. It needs a few minutes and about
2 GB of memory.
"""),
    code("""
%load_ext kernel_ext
import os
from statekit.engine.spark.session import get_session
from statekit.engine.spark.standalone import StandaloneCluster

cluster = StandaloneCluster(workers=3, cores=1, memory="768m").start()   # in a temporary directory
spark = get_session("statekit-cluster", master=cluster.master_url,
                    extra_conf={"spark.executor.memory": "512m", "spark.executor.cores": "1"})
print("master", cluster.master_url, "·", len(cluster.wait_executors(3)), "executors")
"""),
    code("%statekit up --fresh --master {cluster.master_url}"),
    code("%statekit produce words --from ../sample_data/words.jsonl --partitions 4 --wait"),
    md("""
## The application

The same word count as in notebook 01. On a cluster the Spark checkpoint must be on storage every
node and the next driver reach (here the cluster's directory on this machine: a shared mount or an
object store URI on a real one). `--standby 1`: one warm copy of each task on another executor.
"""),
    code("""
%%statekit app wordcount --partitions 4 --standby 1
app.checkpoint_location = os.path.join(cluster.root, "checkpoint")
counts = (app.stream("words", value_serde="json")
             .group_by_key()
             .count(store="counts"))
"""),
    md("""
Started with at most 250 records per micro-batch, the 2,000 words take eight batches. The dashboard
lists the executors as instances.
"""),
    code("%statekit start wordcount --watch --max-records 250"),
    code("%statekit wait wordcount"),
    md("""
## Each task stays on its executor

Which executor committed each task's batches, and how often each task was opened: once, at its
first batch. Spark sends each task's batch back to the executor that ran it (a stateful operator's
locality), and that executor's Python worker keeps the task open.
"""),
    code("""
import pandas as pd
commits = pd.DataFrame([e.to_dict() for e in app.events(types="commit")])
print(commits.pivot_table(index="batch", columns="task", values="instance", aggfunc="first"))
app.task_opens()[["task", "instance", "source", "restored"]]
"""),
    code("%statekit instances wordcount"),
    md("""
## Lose an executor

The executor that runs the most tasks is killed (its JVM and its Python workers, as when a machine
dies). Spark's master starts a replacement; the driver notices the loss within a second and points
each of the lost tasks at the executor holding its standby. Then 2,000 more words arrive.
"""),
    code("""
import time
rows = app.instances_frame()
victim = int(max(rows.itertuples(), key=lambda r: len(r.active)).instance)
killed_at = time.time()
cluster.kill_executor(str(victim))
print("killed executor", victim, "which ran", rows.set_index("instance").loc[victim, "active"])
"""),
    code("%statekit produce words --from ../sample_data/words.jsonl --partitions 4 --wait --again"),
    code("%statekit wait wordcount"),
    md("""
Where the lost tasks went, and what their opening replayed: `standby` is a promoted warm copy
(it replays only what it was behind, usually nothing); `checkpoint` an older copy of that
executor's own; `scratch` the whole changelog.
"""),
    code("""
moves = [m for e in app.events(types="rebalance", since=killed_at) for m in e.moves]
print(pd.DataFrame(moves))
opens = app.task_opens()
opens[opens.instance != victim].tail(4)[["task", "instance", "source", "restored", "open_ms"]]
"""),
    md("## Check: the store against plain Python"),
    code("""
from collections import Counter
from statekit.kafka import Kafka

k = Kafka()
expected = Counter()
for p in range(k.topics()["words"]):
    for chunk in k.read("words", p):
        for off, ts, key, value, headers in chunk.records:
            expected[key.decode()] += 1
k.close()
store = app.query_all("counts")
actual = dict(zip(store["key"], store["value"]))
assert actual == dict(expected), "the store differs from plain Python"
lost = [m["task"] for m in moves if m["from"] == victim]
assert lost and all(m["to"] != victim for m in moves)
print(f"{len(actual)} words, {sum(actual.values())} records counted; tasks {lost} moved off executor {victim}")
print("OK")
"""),
    code("%statekit stop wordcount"),
    DOWN,
    code("cluster.stop()"),
    md("""
## What happened

Every task ran on one executor from its first batch to the kill, its RocksDB open in that
executor's Python worker, while another executor kept a standby of it up to date from its
changelog. When its executor died, Spark retried or scheduled its next batch on another executor —
the one with the standby, which the driver had named to Spark — and the task opened there from the
standby, replaying only what the standby was behind. The counts matched plain Python throughout.
"""),
]


if __name__ == "__main__":
    for p in write(NOTEBOOKS, sys.argv[1:] or None):
        print(p)
