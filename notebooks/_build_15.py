"""Builds notebooks/15_spark_connect.ipynb (unexecuted): the tour's word count on a Spark Connect
server — the way most people reach Spark today — through a crash and a restart; and what `down`
leaves running.

    .venv/bin/python notebooks/_build_15.py
    .venv/bin/python notebooks/_build.py 15_spark_connect
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _cells import WORDCOUNT_CHECK, code, md  # noqa: E402

NOTEBOOKS: dict[str, list] = {}

NOTEBOOKS["15_spark_connect"] = [
    md("""
# 15 · On Spark Connect: your Spark is a server

Most people reach Spark today through **Spark Connect**: a managed notebook, a shared cluster, or
`SparkSession.builder.remote("sc://host:15002")`. The notebook is then only a client; the driver,
the queries and Spark's Python workers live on the server. statekit runs there the same way.

**What you will see:** a Spark Connect server started on this machine (in a workshop the teacher
runs one for the room with `statekit spark serve`, and everyone sets `SPARK_REMOTE` to its URL);
the tour's word count on it; an instance crashed in the middle of a batch and the app restarted,
the store checked against plain Python; and `%statekit down` stopping only what statekit started —
a session of yours, with its own streaming query, keeps running.
"""),
    code("""
%load_ext kernel_ext
import tempfile
from statekit.engine.spark.connect_server import ConnectServer

server = ConnectServer(tempfile.mkdtemp(prefix="statekit-connect-")).start()
print("Spark Connect server at", server.url)
"""),
    md("""
`--master sc://...` connects statekit to the server (with `SPARK_REMOTE` set, a plain
`%statekit up` does the same). The status card says it is a Spark Connect session, and whose.
"""),
    code("%statekit up --fresh --master {server.url}"),
    code("%statekit produce words --from ../sample_data/words.jsonl --partitions 4 --wait"),
    code("""
%%statekit app wordcount --partitions 4 --instances 2
counts = (app.stream("words", value_serde="json")
             .group_by_key()
             .count(store="counts"))
"""),
    code("%statekit start wordcount --watch --max-records 250"),
    code("%statekit wait wordcount"),
    md("""
## A crash in the middle of a batch

Instance 0 crashes once one of its tasks has read 50 records of a batch, losing its disk; the other
instance takes its tasks over and restores them from their changelogs. Then `restart` brings
instance 0 back.
"""),
    code("%statekit crash wordcount --mode disk-loss --instance 0 --after 50"),
    code("%statekit produce words --generator words --seed 7 --limit 1500 --wait\n%statekit wait wordcount"),
    code("%statekit restart wordcount --no-watch\n%statekit wait wordcount"),
    code("%statekit query wordcount counts record"),
    md("## Check: the store against plain Python"),
    WORDCOUNT_CHECK,
    md("""
## Your own session is yours

A session you make yourself on the same server, with a streaming query of your own (Spark's `rate`
source into a `noop` sink). `%statekit down` stops statekit's app and statekit's session, and leaves
yours running.
"""),
    code("""
from pyspark.sql import SparkSession

mine = SparkSession.builder.remote(server.url).create()
my_query = (mine.readStream.format("rate").option("rowsPerSecond", 5).load()
            .writeStream.format("noop").queryName("my_query").start())
"""),
    code("%statekit down"),
    code("""
print("my query is still running:", my_query.isActive)
my_query.stop()
mine.stop()
server.stop()
"""),
    md("""
## What happened

The notebook was only a client: statekit's queries, Spark's Python workers and the tasks' RocksDB
ran where the server runs. The crash, the takeover, the restart and the query worked as on a
classic session, and the counts matched plain Python. `down` stopped what statekit had started —
the app, its queries, its session on the server, the embedded broker — and your own session and
query went on running.
"""),
]

