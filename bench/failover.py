"""Failover while records flow: three instances of a word count on Spark, one of them killed.

    .venv/bin/python bench/failover.py [--rate 4000] [--window 10] [--partitions 6]

Starts its own embedded broker (temp dir, port 0) and a local Spark session, stops both at the end
(also on failure). A producer thread writes `--rate` words/s to the input topic, steadily. The app
(`partitions` tasks, 3 instances) reaches a steady state, then instance 1 is SIGKILLed
(`App.kill`). Measured from the events the instances publish:

* recovery: from the kill to the moment every task the dead instance owned has committed a batch on
  its new owner (restored and caught up with the batches spooled meanwhile) — once with one standby
  replica per task (a promotion replays only the standby's lag), once without (a restore of the
  whole changelog), in the same run;
* survivors: the records the surviving instances' own tasks committed per second in the `--window`
  seconds after the kill, against the `--window` seconds before it (with the standby run).

* restart: a one-instance app on a warm session loses its disk; a record arrives; the time from
  `restart()` to that record committed (the restore from scratch of the changelog included), against
  the same after a process crash (its disk kept: a restore from its checkpoint).

Ends with three lines, the summary last:

    FIGURE name=failover_recovery value=<s, with a standby> unit=s baseline=<s, without> ratio=<with/without>
    FIGURE name=failover_survivors value=<records/s after> unit=records/s baseline=<records/s before> ratio=<after/before>
    RESULT name=restart_first_record value=<s, disk lost> unit=s baseline=<s, disk kept> ratio=<lost/kept>
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

WORDS = [f"w{i:04d}" for i in range(2000)]
RECOVERY_LIMIT_S = 120.0


class Producer(threading.Thread):
    """Writes `rate` words/s (lines of 10 words), in 20 sends a second."""

    def __init__(self, kafka, topic, rate, partitions, seed=1):
        super().__init__(daemon=True)
        self.kafka, self.topic, self.rate, self.partitions = kafka, topic, rate, partitions
        self.rnd = random.Random(seed)
        self.stop_ = threading.Event()
        self.sent = 0

    def run(self):
        tick = 0.05
        per_tick = max(1, int(self.rate * tick / 10))
        nxt = time.monotonic()
        i = 0
        while not self.stop_.is_set():
            recs = [(None, " ".join(self.rnd.choice(WORDS) for _ in range(10)).encode())
                    for _ in range(per_tick)]
            self.kafka.send(self.topic, i % self.partitions, recs)
            self.sent += 10 * len(recs)
            i += 1
            nxt += tick
            self.stop_.wait(max(0.0, nxt - time.monotonic()))


def scenario(bootstrap, work, name, standby, rate, window, partitions, say):
    import statekit
    from statekit.kafka import Kafka

    k = Kafka(bootstrap)
    topic = f"{name}-lines"
    k.ensure_topic(topic, partitions)     # a task is its source partition: one per task
    app = statekit.App(name, bootstrap=bootstrap, partitions=partitions, instances=3,
                       standby_replicas=standby, state_dir=os.path.join(work, name), engine="changelog")
    app.stream(topic).flat_map_values(str.split).group_by(lambda _k, w: w).count(store="counts")
    prod = Producer(k, topic, rate, partitions)
    try:
        app.start(sink="none")
        prod.start()
        app.wait_for_state("RUNNING", 120)
        time.sleep(window + 3)                     # steady state, and a full window before the kill
        victim = 1
        moved = {str(t) for t in app.assignment.active_tasks(victim)}
        t_kill = time.time()
        app.kill(victim)

        def back_on_new_owners(commits):
            back = {}
            for e in commits:
                if e.task in moved and e.ts > t_kill and e.instance != victim and e.task not in back:
                    back[e.task] = e.ts
            return back

        # the recovery is measured, not bounded by the window: a busy machine takes longer
        deadline = t_kill + max(window, RECOVERY_LIMIT_S)
        while True:
            commits = app.events(types="commit")
            back = back_on_new_owners(commits)
            if set(back) == moved and time.time() >= t_kill + window + 0.5:
                break
            if time.time() > deadline:
                raise RuntimeError(f"moved tasks not committing again {RECOVERY_LIMIT_S:.0f} s after "
                                   f"the kill: {sorted(moved - set(back))}")
            time.sleep(0.2)
        recovery = max(back.values()) - t_kill

        def rate_in(lo, hi):
            n = sum(e.records for e in commits if e.task not in moved and lo <= e.ts < hi)
            return n / (hi - lo)

        before, after = rate_in(t_kill - window, t_kill), rate_in(t_kill, t_kill + window)
        opened = [e for e in app.events(types="task_opened") if e.ts > t_kill and e.task in moved]
        say(f"{name}: standby={standby}: killed instance {victim} ({len(moved)} tasks); every one "
            f"committing again after {recovery:.2f} s (sources: "
            f"{sorted({e.source for e in opened})}, replayed {sum(e.restored for e in opened)} records); "
            f"survivors {before:.0f} -> {after:.0f} records/s")
        return recovery, before, after
    finally:
        prod.stop_.set()
        if prod.is_alive():              # not started when start() itself failed: its error stands
            prod.join()
        app.stop()
        k.close()


def restart_to_first_record(bootstrap, work, name, mode, words, say):
    """Seconds from restart() after a crash of the only instance to a new record committed."""
    import statekit
    from statekit.kafka import Kafka

    k = Kafka(bootstrap)
    topic = f"{name}-lines"
    k.ensure_topic(topic, 2)
    rnd = random.Random(3)
    for i in range(0, words, 1000):
        k.send(topic, i // 1000 % 2, [(None, " ".join(rnd.choice(WORDS) for _ in range(10)).encode())
                                       for _ in range(100)])
    app = statekit.App(name, bootstrap=bootstrap, partitions=2, instances=1,
                       state_dir=os.path.join(work, name), engine="changelog")
    app.stream(topic).flat_map_values(str.split).group_by(lambda _k, w: w).count(store="counts")
    try:
        app.start(sink="none")
        app.process_all_available()
        app.crash(mode, instance=0)
        k.send(topic, 0, [(None, b"restart-probe")])
        t0 = time.time()
        app.restart()
        e = app.wait_for_event(lambda e: e.type == "commit" and e.ts > t0 and e.records > 0, 120)
        if e is None:
            raise RuntimeError(f"{name}: nothing committed within 120 s of restart()")
        opened = [x for x in app.events(types="task_opened") if x.ts > t0]
        say(f"{name}: {mode}: first new record committed {e.ts - t0:.2f} s after restart() "
            f"({sum(x.restored for x in opened)} changelog records restored, sources "
            f"{sorted({x.source for x in opened})})")
        return e.ts - t0
    finally:
        app.stop()
        k.close()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--rate", type=int, default=4000, help="input words/s")
    ap.add_argument("--window", type=float, default=10.0, help="seconds before/after the kill")
    ap.add_argument("--partitions", type=int, default=6)
    ap.add_argument("--restart-words", type=int, default=200_000,
                    help="words in the restart scenario's changelog history")
    args = ap.parse_args(argv)
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    from statekit import broker as broker_mod
    from statekit.engine.spark.session import get_session, stop_session

    work = tempfile.mkdtemp(prefix="statekit-bench-failover-")
    handle = None
    try:
        handle = broker_mod.start(dir=os.path.join(work, "broker"), port=0)
        get_session("statekit-bench-failover")
        say = lambda *a: print(*a, flush=True)  # noqa: E731
        rec_sb, before, after = scenario(handle.bootstrap, work, "fo-standby", 1, args.rate,
                                         args.window, args.partitions, say)
        rec_none, _b, _a = scenario(handle.bootstrap, work, "fo-scratch", 0, args.rate, args.window,
                                    args.partitions, say)
        print(f"FIGURE name=failover_recovery value={rec_sb:.3f} unit=s baseline={rec_none:.3f} "
              f"ratio={rec_sb / rec_none:.3f}", flush=True)
        lost = restart_to_first_record(handle.bootstrap, work, "rs-lost", "disk-loss",
                                       args.restart_words, say)
        kept = restart_to_first_record(handle.bootstrap, work, "rs-kept", "process",
                                       args.restart_words, say)
        print(f"FIGURE name=failover_survivors value={after:.0f} unit=records/s baseline={before:.0f} "
              f"ratio={after / before if before else 0:.3f}", flush=True)
        print(f"RESULT name=restart_first_record value={lost:.3f} unit=s baseline={kept:.3f} "
              f"ratio={lost / kept:.3f}", flush=True)
        return 0
    finally:
        try:
            stop_session()
        finally:
            if handle is not None:
                handle.stop()
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
