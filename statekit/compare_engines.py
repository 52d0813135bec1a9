"""One input, one crash, both engines: the changelog engine (`statekit.App(engine="changelog")`,
Kafka Streams' model) and Spark's own RocksDB state store (`NativeApp`). Used by
bench/engines.py and notebooks/09_two_engines.ipynb.

    r = compare_engines(bootstrap, broker_dir, work_dir, chunks=6, lines=150)
    r["table"]   # pandas, one row per engine: restore_s, first_batch_after_restart_s, replayed,
                 # replay_unit, bytes_on_disk, steady_records_per_s, correct
    r["native"], r["changelog"]  # the raw figures

The scenario, on the same topics:
1. both engines process the same backlog (word count + 40 ms windowed click count), one engine at
   a time (they share 2 cores), with `max_records_per_trigger` records per micro-batch;
2. the crash: the changelog engine's instance loses its disk (query aborted, state dirs deleted:
   it restores from its changelog topics); more input arrives and the Spark JVM is SIGKILLed while
   a native micro-batch runs, with Spark's local RocksDB working dirs deleted (it restores from
   the checkpoint: latest snapshot + changelog files);
3. both restart (a new JVM) and catch up; results are checked against plain Python.

Restore time = the state loading each engine reports itself, summed over tasks/partitions: the
changelog engine's restore_end events (`App.restore_summary().seconds`), Spark's
`rocksdbLoadLatencyMs` of the first batch after the restart (stateOperators custom metric). Both
also get the wall time of their first batch after the restart. Steady-state throughput = input
records / micro-batch time over the batches of step 1, the first batch (warm-up) left out.
"""
from __future__ import annotations

import collections
import os
import random
import time
from typing import Callable, Optional

WINDOW_MS = 40
VOCAB = ["the", "a", "of", "stream", "state", "kafka", "rocks", "spark", "task", "store", "log",
         "commit", "crash", "replay", "window", "changelog", "snapshot", "restore"]
USERS = [f"user-{i}" for i in range(20)]


def make_input(seed: int, chunks: int, lines: int, clicks: int) -> list:
    rnd = random.Random(seed)
    w = [1.0 / (i + 1) for i in range(len(VOCAB))]
    out = []
    for c in range(chunks):
        ls = [" ".join(rnd.choices(VOCAB, weights=w, k=rnd.randint(1, 8))) + f" w{c}-{i % 50}"
              for i in range(lines)]
        cs = [(rnd.choice(USERS), f"/p{rnd.randint(0, 9)}") for _ in range(clicks)]
        out.append((ls, cs))
    return out


def produce(kafka, chunk, parts: int = 2) -> int:
    from statekit.partition import partition_for

    ls, cs = chunk
    by_p = collections.defaultdict(list)
    for i, ln in enumerate(ls):
        by_p[i % parts].append((None, ln.encode()))
    for p, recs in by_p.items():
        kafka.send("lines", p, recs)
    by_p = collections.defaultdict(list)
    for u, page in cs:
        by_p[partition_for(u.encode(), parts)].append((u.encode(), page.encode()))
    for p, recs in by_p.items():
        kafka.send("clicks", p, recs)
    time.sleep(WINDOW_MS / 1000.0)
    return len(ls) + len(cs)


def references(kafka) -> tuple:
    wc, win = collections.Counter(), collections.Counter()
    for topic in ("lines", "clicks"):
        for p, end in sorted(kafka.end_offsets(topic).items()):
            for chunk in kafka.read(topic, p, None, end):
                for _off, ts, k, v, _h in chunk.records:
                    if topic == "lines":
                        wc.update(v.decode().split())
                    else:
                        win[(k.decode(), ts - ts % WINDOW_MS)] += 1
    return dict(wc), dict(win)


def topology(app) -> None:
    from statekit.topology import tumbling

    app.stream("lines").flat_map_values(str.split).group_by(lambda k, w: w).count(store="counts")
    (app.stream("clicks").group_by_key().windowed_by(tumbling(WINDOW_MS), grace_ms=10 ** 9)
     .count(store="clicks-per-window"))


def _steady(progress: list) -> float:
    """records/s over the micro-batches with input, the first one left out."""
    rows = [(p.get("num_input_rows", p.get("numInputRows")) or 0,
             p.get("batch_duration_ms") or (p.get("durationMs") or {}).get("triggerExecution") or 0)
            for p in progress]
    rows = [r for r in rows if r[0]][1:]
    ms = sum(r[1] for r in rows)
    return sum(r[0] for r in rows) / (ms / 1000.0) if ms else float("nan")


def _dir_bytes(path: str) -> int:
    total = 0
    for dp, _dn, fns in os.walk(path):
        for fn in fns:
            try:
                total += os.path.getsize(os.path.join(dp, fn))
            except OSError:
                pass
    return total


def _as_dict(df) -> dict:
    if "window_start" in df.columns:
        return {(k, int(w)): int(v) for k, w, v in zip(df["key"], df["window_start"], df["value"])}
    return {k: int(v) for k, v in zip(df["key"], df["value"])}


def compare_engines(bootstrap: str, broker_dir: str, work_dir: str, chunks: int = 6, lines: int = 150,
                    clicks: int = 100, after_crash_chunks: int = 2, partitions: int = 2,
                    max_records_per_trigger: int = 200, min_deltas_for_snapshot: int = 10,
                    maintenance_interval=1, seed: int = 1, timeout: float = 600,
                    say: Optional[Callable[[str], None]] = None) -> dict:
    """Run the scenario above; returns {"table", "native", "changelog", "crash"} (see module doc).
    Needs topics "lines" and "clicks" to be empty or absent on `bootstrap`."""
    import pandas as pd

    import statekit
    from statekit.broker import log_stats
    from statekit.engine.spark_native import NativeApp
    from statekit.engine.spark_native.engine import native_session
    from statekit.kafka import Kafka

    say = say or (lambda s: None)
    k = Kafka(bootstrap)
    k.ensure_topic("lines", 2)
    k.ensure_topic("clicks", 2)
    data = make_input(seed, chunks + after_crash_chunks, lines, clicks)
    native = NativeApp("nat", bootstrap=bootstrap, partitions=partitions,
                       state_dir=os.path.join(work_dir, "native"),
                       min_deltas_for_snapshot=min_deltas_for_snapshot,
                       maintenance_interval=maintenance_interval)
    topology(native)
    cl = statekit.App("clg", bootstrap=bootstrap, partitions=partitions,
                      state_dir=os.path.join(work_dir, "changelog"), engine="changelog")
    topology(cl)
    res: dict = {"native": {}, "changelog": {}}
    try:
        native_session(min_deltas_for_snapshot, maintenance_interval)   # settings before any query
        n_in = sum(produce(k, c) for c in data[:chunks])
        say(f"input: {n_in} records in {chunks} chunks")
        # 1. steady state, one engine at a time
        t = time.time()
        native.start(max_records_per_trigger=max_records_per_trigger)
        native.process_all_available(timeout)
        say(f"native engine caught up in {time.time() - t:.1f}s")
        t = time.time()
        cl.start(max_records_per_trigger=max_records_per_trigger)
        cl.process_all_available(timeout)
        say(f"changelog engine caught up in {time.time() - t:.1f}s")
        res["native"]["steady_records_per_s"] = _steady(native.progress())
        res["changelog"]["steady_records_per_s"] = _steady(cl.progress())
        time.sleep(max(1.5, float(maintenance_interval) * 1.5 if isinstance(maintenance_interval, (int, float)) else 1.5))
        # 2. the crash: the changelog engine's instance loses its disk (idle: its query is aborted
        # and its state dirs deleted at once); more input arrives; the JVM dies mid-batch
        crec = cl.crash("disk-loss")
        res["crash"] = {"changelog": {kk: crec.get(kk) for kk in ("mode", "instance", "status")}}
        died = cl.wait_for_event(lambda e: e.type == "instance_died", 30)
        res["changelog"]["wiped_files"] = died.deleted if died is not None else 0
        for c in data[chunks:]:
            produce(k, c)
        lag = native.changelog_lag()
        rec = native.crash(mode="jvm", during_batch=True)
        lag_after = native.changelog_lag()
        res["crash"]["native"] = {"pid": rec["pid"], "batch_running": rec["batch_running"],
                                  "last_batch_id": rec["last_batch_id"],
                                  "wiped_dirs": rec["wiped"]["dirs"], "wiped_bytes": rec["wiped"]["bytes"]}
        res["native"]["changelog_lag_at_crash"] = lag_after
        say(f"crash: changelog instance disk lost ({res['changelog']['wiped_files']} paths deleted); Spark JVM {rec['pid']} killed "
            f"({'mid-batch' if rec['batch_running'] else 'idle'}), {rec['wiped']['dirs']} RocksDB dirs deleted")
        _ = lag
        # 3. restart both
        t = time.time()
        say("restarting the native engine (a new JVM, its state from Spark's checkpoint) ...")
        native.restart()
        native.process_all_available(timeout)
        res["native"]["restart_to_caught_up_s"] = time.time() - t
        say(f"native engine restarted and caught up in {res['native']['restart_to_caught_up_s']:.1f}s")
        t = restarted = time.time()
        cl.restart()
        cl.process_all_available(timeout)
        res["changelog"]["restart_to_caught_up_s"] = time.time() - t
        say(f"changelog engine restarted and caught up in "
            f"{res['changelog']['restart_to_caught_up_s']:.1f}s")
        deadline = time.monotonic() + 10   # restore_end events trail the batch a little
        while time.monotonic() < deadline and len(cl.restore_summary()) == 0:
            time.sleep(0.2)
        rr = native.restore_report()
        res["native"].update(
            restore_s=(rr.get("rocksdbLoadLatencyMs") or 0) / 1000.0,
            first_batch_after_restart_s=(rr.get("batch_ms") or 0) / 1000.0,
            replayed=rr.get("rocksdbNumReplayChangelogFiles"), replay_unit="changelog files",
            snapshot_load_s=(rr.get("rocksdbLoadFromSnapshotLatencyMs") or 0) / 1000.0,
            replay_s=(rr.get("rocksdbReplayChangeLogLatencyMs") or 0) / 1000.0,
            loaded_from_checkpoint=rr.get("rocksdbNumLoadedFromDfs"),
            bytes_on_disk=native.bytes_on_disk(), restore_metrics=rr)
        rs = cl.restore_summary()
        gen_prog = cl.progress(since=restarted)
        first = next((p for p in gen_prog if p.get("num_input_rows")), gen_prog[0] if gen_prog else {})
        topics = cl.plan.changelog_topics(cl.name).values() if cl.plan is not None else []
        topic_bytes = sum(int(p.get("bytes") or 0) for t_ in topics for p in log_stats(broker_dir, t_))
        res["changelog"].update(
            restore_s=float(rs.seconds.fillna(0).sum()) if len(rs) else 0.0,
            first_batch_after_restart_s=(first.get("batch_duration_ms") or 0) / 1000.0,
            replayed=int(rs.records.fillna(0).sum()) if len(rs) else 0, replay_unit="changelog records",
            bytes_on_disk=topic_bytes + _dir_bytes(cl.state_dir), changelog_topic_bytes=topic_bytes,
            restore_summary=rs)
        want_wc, want_win = references(k)
        res["native"]["correct"] = (native.store_dict("counts") == want_wc
                                    and _as_dict(native.query_all("clicks-per-window")) == want_win)
        res["changelog"]["correct"] = (_as_dict(cl.query_all("counts")) == want_wc
                                       and _as_dict(cl.query_all("clicks-per-window")) == want_win)
        res["native"]["state_metrics"] = native.state_metrics()
        res["native"]["checkpoint_files"] = native.checkpoint_files()
    finally:
        try:
            cl.stop()
        finally:
            native.stop()
            k.close()
    cols = ["restore_s", "first_batch_after_restart_s", "replayed", "replay_unit", "bytes_on_disk",
            "steady_records_per_s", "restart_to_caught_up_s", "correct"]
    res["table"] = pd.DataFrame([{"engine": name, **{c: res[key].get(c) for c in cols}}
                                 for name, key in (("changelog (Kafka Streams model)", "changelog"),
                                                   ("spark native (RocksDB state store)", "native"))])
    return res
