"""The user's own Spark session, and what statekit may stop of it — run in a process of its own
(``python tests/connect/owner.py ROOT MODE URL BOOTSTRAP``: pyspark runs one mode per process).

MODE ``classic`` (a local session the user builds) or ``connect`` (a Spark Connect session on URL).
Prints one JSON line:

1. the user's session, with the user's own streaming query running: an App on it (``spark=``)
   starts, counts, stops; ``%statekit up`` / ``%statekit down`` (the kernel's commands) run beside
   it. The user's query and session must survive both.
2. the user's session stopped by the user; ``%statekit up`` starts statekit's own session (over
   Connect: on ``SPARK_REMOTE``, set now); the user
   starts a query on it (``SparkSession.builder.getOrCreate()`` hands out the active one); ``down``
   must leave it running and say why; once the user's query is stopped, ``down`` stops it.
"""
from __future__ import annotations

import io
import json
import os
import sys
from contextlib import redirect_stdout


def _session(mode: str, url: str):
    from pyspark.sql import SparkSession

    if mode == "classic":
        return (SparkSession.builder.master("local[1]").appName("mine")
                .config("spark.ui.enabled", "false").getOrCreate())
    return SparkSession.builder.remote(url).getOrCreate()


def _my_query(spark, name: str):
    return (spark.readStream.format("rate").option("rowsPerSecond", 5).load()
            .writeStream.format("noop").queryName(name).start())


def _magic(sess, line: str) -> str:
    from kernel_ext.parser import parse

    out = io.StringIO()
    with redirect_stdout(out):
        sess.run(parse(line))
    return out.getvalue()


def main(root: str, mode: str, url: str, bootstrap: str) -> dict:
    import statekit
    from kernel_ext.commands import Session
    from statekit.kafka import Kafka

    res: dict = {}
    spark = _session(mode, url)
    mine = _my_query(spark, "my_query")
    k = Kafka(bootstrap)
    topic = f"own-{mode}"
    k.ensure_topic(topic, 2)
    lines = ["the user owns this session", "the app borrows it"]
    for i, ln in enumerate(lines):
        k.send(topic, i % 2, [(None, ln.encode())])
    app = statekit.App(f"own{mode}", bootstrap=bootstrap, partitions=2,
                       state_dir=os.path.join(root, "state"), spark=spark)
    app.stream(topic).flat_map_values(str.split).group_by(lambda key, w: w).count(store="counts")
    app.start()
    res["drained"] = app.process_all_available(timeout=180)
    res["counted"] = sum(int(v) for v in app.query_all("counts")["value"])
    res["app_queries_running"] = sorted(q.name for q in spark.streams.active if q.name != "my_query")
    app.stop()
    res["after_app_stop"] = {"mine_active": bool(mine.isActive),
                             "app_queries": sorted(q.name for q in spark.streams.active
                                                   if q.name != "my_query"),
                             "usable": spark.range(3).count() == 3}
    sess = Session()
    res["up"] = _magic(sess, f"up --bootstrap {bootstrap}")
    res["same_session"] = sess.spark is spark
    res["down"] = _magic(sess, "down")
    res["after_down"] = {"mine_active": bool(mine.isActive), "usable": spark.range(3).count() == 3}
    mine.stop()
    spark.stop()

    # statekit's own session (over Connect: found through SPARK_REMOTE, as a workshop's kernels
    # find the room's server), with a query of the user's on it
    if mode == "connect":
        os.environ["SPARK_REMOTE"] = url
    sess = Session()
    _magic(sess, f"up --bootstrap {bootstrap}")
    from pyspark.sql import SparkSession

    theirs = SparkSession.builder.getOrCreate()
    res["handed_out_statekits"] = theirs is sess.spark
    mine = _my_query(theirs, "my_query_2")
    res["down_with_mine"] = _magic(sess, "down")
    res["mine_2_active"] = bool(mine.isActive)
    res["usable_2"] = theirs.range(2).count() == 2
    mine.stop()
    sess.spark = theirs
    res["down_after"] = _magic(sess, "down")
    from statekit.engine.spark import session_api

    res["stopped_at_last"] = not session_api.of(theirs).alive()
    k.close()
    return res


if __name__ == "__main__":
    out = main(*sys.argv[1:5])
    print(json.dumps(out))
