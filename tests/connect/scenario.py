"""The Spark Connect scenario, run in a process of its own (``python tests/connect/scenario.py ROOT
URL PLACEMENT``): pyspark runs one mode per process, and the other Spark tests keep a classic
session in theirs.

On the Spark Connect server at URL (a client session statekit creates: ``get_session(master=URL)``)
and an embedded broker, one application with a join and a windowed aggregate:

- a word count whose counts go to ``counts-out`` (exactly-once: one transaction per task and batch);
- a tumbling-window count of clicks per user;
- each click joined with its user's country (a table), counted per country (a repartition topic).

Steps: the users, then the first chunk; a disk-loss crash in the middle of a batch; a process
crash in the middle of a batch; ``restart()``; a last chunk; ``query()`` and ``key_owner()``;
``stop()``. With ``instances`` (two instances) the other instance takes a crashed one's tasks; with
``executors`` (the server's local master does not retry a task) the query fails with one line and
``restart()`` replays the batch. After each step the stores are compared with plain-Python
references. Writes ``ROOT/result.json``.
"""
from __future__ import annotations

import json
import os
import random
import sys
import time
import traceback

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.dirname(HERE))                      # tests/ (the shared helpers)
sys.path.insert(0, os.path.join(os.path.dirname(HERE), "runtime"))

import harness as H  # noqa: E402

SEED = 28
PARTITIONS = 2
COUNTRIES = ("de", "fr", "jp", "br")


def country(user: str) -> str:
    return COUNTRIES[int(user.rsplit("-", 1)[1]) % len(COUNTRIES)]


def build(app) -> None:
    (app.stream("lines").flat_map_values(str.split).group_by(lambda k, w: w).count(store="counts")
     .to_stream().to("counts-out", value_serde="int64"))
    clicks = app.stream("clicks")
    (clicks.group_by_key().windowed_by(__import__("statekit").topology.tumbling(H.WINDOW_MS),
                                       grace_ms=10 ** 9).count(store="clicks-per-window"))
    users = app.table("users", store="users")
    (clicks.join(users, lambda page, c: c).group_by(lambda user, c: c)
     .count(store="clicks-per-country"))


def country_reference(k) -> dict:
    out: dict = {}
    for _p, _o, _ts, key, _v in H.read_topic(k, "clicks"):
        c = country(key.decode())
        out[c] = out.get(c, 0) + 1
    return out


def _write(path: str, body) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(body, f, default=str)
    os.replace(tmp, path)


def exact(app, k) -> dict:
    """What the stores hold against the references (``ok`` when all three agree)."""
    got = {"counts": H.store_as_dict(app, "counts") == H.wordcount_reference(k),
           "clicks-per-window": H.store_as_dict(app, "clicks-per-window") == H.windowed_reference(k),
           "clicks-per-country": H.store_as_dict(app, "clicks-per-country") == country_reference(k)}
    got["ok"] = all(got.values())
    return got


def drain(app, steps: list, what: str) -> None:
    """process_all_available; a failure is noted with its one line, then restart() replays."""
    t0 = time.monotonic()
    step = {"what": what}
    try:
        step["drained"] = app.process_all_available(timeout=240)
        if not step["drained"] and str(app.state) == "ERROR":   # the last live instance crashed
            step["no_instance_left"] = True
            app.restart()
            step["restarted"] = True
            step["drained"] = app.process_all_available(timeout=240)
    except Exception as exc:  # noqa: BLE001 - the failure's line is what the test checks
        step["error"] = str(exc)
        step["error_type"] = type(exc).__name__
        step["state_after_error"] = str(app.state)
        app.restart()
        step["restarted"] = True
        step["drained"] = app.process_all_available(timeout=240)
    step["state"] = str(app.state)
    step["seconds"] = round(time.monotonic() - t0, 1)
    steps.append(step)


def run(root: str, url: str, placement: str) -> dict:
    from statekit import broker as broker_mod
    from statekit.engine.spark import session_api
    from statekit.engine.spark.session import get_session, stop_session
    from statekit.kafka import Kafka

    t0 = time.monotonic()
    res: dict = {"marks": {}}
    marks = res["marks"]
    broker = k = app = None
    try:
        broker = broker_mod.start(dir=os.path.join(root, "broker"), port=0)
        spark = get_session(master=url)
        res["connect"] = session_api.is_connect(spark)
        marks["session"] = time.monotonic() - t0
        k = Kafka(broker.bootstrap)
        for t in ("lines", "clicks", "users"):
            k.ensure_topic(t, PARTITIONS)
        app = H.seeded_app("cx", broker, os.path.join(root, "state"), SEED, engine="changelog",
                           partitions=PARTITIONS, instances=2, standby_replicas=0, cache_bytes=2048,
                           placement=placement)
        build(app)
        rnd = random.Random(SEED)
        chunks = H.make_chunks(SEED, 4, lines_per_chunk=40, clicks_per_chunk=60)
        from statekit.partition import partition_for

        for u in H.USERS:
            k.send("users", partition_for(u.encode(), PARTITIONS), [(u.encode(), country(u).encode())])
        app.start(max_records_per_trigger=200, sink="kafka")
        res["placement"] = app.placement
        steps: list = []
        res["steps"] = steps
        drain(app, steps, "users")
        H.produce_chunk(k, chunks[0], rnd=rnd)
        drain(app, steps, "first chunk")
        res["exact_first"] = exact(app, k)
        marks["first"] = time.monotonic() - t0
        for i, (mode, after) in enumerate((("disk-loss", 5), ("process", 3))):
            rec = app.crash(mode, after_records=after)
            H.produce_chunk(k, chunks[1 + i], rnd=rnd)
            drain(app, steps, f"{mode} crash")
            steps[-1]["crash"] = {"mode": mode, "status": rec.get("status"), "id": rec.get("id")}
            claim = app.wait_for_event(lambda e: e.type == "crash", 30)
            steps[-1]["claimed"] = claim is not None
            steps[-1]["exact"] = exact(app, k)
            marks[mode] = time.monotonic() - t0
        rec = app.restart()
        # (the generations the restart record took under the app's lock: a rebalance of the
        # instances' own, a warm-up's promotion, may come before or after it)
        res["restart"] = {"generation_before": rec["from_generation"], "generation": rec["generation"],
                          "generation_now": app.generation, "revived": rec.get("revived")}
        H.produce_chunk(k, chunks[3], rnd=rnd)
        drain(app, steps, "after restart()")
        res["exact_last"] = exact(app, k)
        marks["restart"] = time.monotonic() - t0
        ref = H.wordcount_reference(k)
        res["queries"] = {w: [app.query("counts", w), ref[w]] for w in ("the", "state", "kafka") if w in ref}
        owner = app.key_owner("counts", "the")
        res["owner"] = {"task": str(owner.task), "role": getattr(owner, "role", None)}
        res["countries"] = [sorted(H.store_as_dict(app, "clicks-per-country").items()),
                            sorted(country_reference(k).items())]
        res["state"] = str(app.state)
        res["events_types"] = sorted({e.type for e in app.events()})
        app.stop()
        outputs = H.sink_outputs(k, "counts-out", "read_committed")
        res["output"] = {"last": {w: v[-1] for w, v in outputs.items()} == ref,
                         "duplicates": H.output_duplicates(outputs),
                         "words": len(outputs)}
        marks["stopped"] = time.monotonic() - t0
        res["report"] = stop_session().__dict__
    finally:
        if app is not None:
            app.stop()
        if k is not None:
            k.close()
        if broker is not None:
            broker.stop()
    return res


def main(root: str, url: str, placement: str) -> int:
    out = os.path.join(root, "result.json")
    try:
        res = run(root, url, placement)
    except BaseException:  # noqa: BLE001 - the parent reads the traceback
        _write(out, {"exception": traceback.format_exc()})
        return 1
    _write(out, res)
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
