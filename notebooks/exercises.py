"""The checks of notebooks/12_exercises.ipynb: each says, in plain words, what is right or wrong.

    import exercises
    exercises.check_moved_key(app, moved)                # exercise 1
    exercises.check_restore_time(app, prediction)        # exercise 2
    exercises.check_exactly_once(app, read_invoices)     # exercise 3
    exercises.check_topology(build)                      # exercise 4
    exercises.summary()                                  # how many are right

A check prints one verdict ("Right: ..." or "Not yet: ...") and remembers it in `RESULTS`. The
notebook's exercise cells keep their reference answers in their metadata; `make demo` and the test
suite run the notebook with those answers (`statekit.demo.apply_solutions`) and
STATEKIT_SOLUTIONS=1, under which a check that does not pass raises: a reference answer that stops
passing fails the run instead of printing "Not yet".
"""
from __future__ import annotations

import os
import random
from collections import Counter

RESULTS: dict[int, bool] = {}
TITLES = {1: "find the key that moved", 2: "predict a restore time", 3: "make a sink exactly-once",
          4: "fix a topology the test driver rejects"}


def _verdict(exercise: int, ok: bool, text: str) -> None:
    RESULTS[exercise] = ok
    print(("Right: " if ok else "Not yet: ") + text)
    if not ok and os.environ.get("STATEKIT_SOLUTIONS") == "1":
        raise AssertionError(f"exercise {exercise} ({TITLES[exercise]}): the reference answer does "
                             f"not pass its check: {text}")


def summary() -> None:
    """How many exercises are right; "OK" on its own line when all are."""
    right = [n for n in TITLES if RESULTS.get(n)]
    todo = [f"{n} ({TITLES[n]})" for n in TITLES if not RESULTS.get(n)]
    print(f"{len(right)} of {len(TITLES)} exercises right" + (f"; still to do: {', '.join(todo)}" if todo else ""))
    if not todo:
        print("OK")


# -- exercise 1: find the key that moved ----------------------------------------------------------

def keys_to_watch(app, store: str, instance: int, n: int = 4, seed: int = 7) -> list:
    """`n` keys of `store`: exactly one in a task that `instance` runs now, the others elsewhere.
    A cell run out of order gets one line saying what to run first."""
    from statekit.errors import StatekitError

    if app.assignment is None:
        raise StatekitError(f"app {app.name!r} is not started yet: run the cells above first "
                            f"(`%statekit start {app.name}`)")
    mine = {str(t) for t in app.assignment.active_tasks(instance)}
    if not mine:
        raise StatekitError(f"instance {instance} runs no task now (was the crash cell below run "
                            f"already?): run the notebook again from the top")
    rows = app.query_all(store, limit_per_task=25)
    on, off = [], []
    for key, task in zip(rows["key"], rows["task"]):
        (on if str(task) in mine else off).append(key)
    rng = random.Random(seed)
    keys = [rng.choice(on)] + rng.sample(off, n - 1)
    rng.shuffle(keys)
    return keys


def _last_death(app):
    deaths = app.events(types="instance_died")
    return deaths[-1] if deaths else None


def check_moved_key(app, key, watched=None, store: str = "movements") -> None:
    """Right when `key` is the watched key whose task moved to another instance at the last crash."""
    died = _last_death(app)
    if died is None:
        return _verdict(1, False, "no instance has died yet: run the crash cell first")
    if key is None or key is ...:
        return _verdict(1, False, "set `moved` to one of the four keys (a str such as 'acct-0001234')")
    if watched is not None and key not in watched:
        return _verdict(1, False, f"{key!r} is not one of the four keys: {', '.join(map(repr, watched))}")
    moves = {m["task"]: m for r in app.rebalances if r["generation"] > (died.generation or 0)
             for m in r["moves"]}
    task = str(app.key_owner(store, key).task)
    if task in moves:
        m = moves[task]
        others = "" if watched is None else " The other keys live in tasks that stayed where they were."
        return _verdict(1, True, f"{key!r} lives in task {task} (its partition: the hash of the key "
                                 f"modulo the partitions), and task {task} moved from instance "
                                 f"{m['from']} to instance {m['to']} when instance {died.instance} "
                                 f"crashed: the key moved with it.{others}")
    moved = ", ".join(sorted(moves)) or "no task"
    return _verdict(1, False, f"{key!r} lives in task {task}, which stayed on instance "
                              f"{app.key_owner(store, key).instance}: it did not move. The crash of "
                              f"instance {died.instance} moved {moved}; find the key whose task is "
                              f"one of those (`%statekit query APP {store} KEY` says where a key lives).")


# -- exercise 2: predict a restore time ----------------------------------------------------------

def check_restore_time(app, seconds) -> None:
    """Right when `seconds` is within a factor of 2 of the forecast of a restore from scratch of
    every task of the app. A wrong answer gets a hint, never the forecast itself."""
    try:
        seconds = float(seconds)
    except (TypeError, ValueError):
        return _verdict(2, False, "set `prediction` to a number of seconds (such as 1.5)")
    if seconds <= 0:
        return _verdict(2, False, f"you said {seconds:g} s: a restore takes some time; give the seconds "
                                  f"it would take (more than 0)")
    fc = app.restore_forecast()
    scratch = fc.frame[fc.frame.source == "scratch"]
    total, records = float(scratch.seconds.sum()), int(scratch.records.sum())
    if total <= 0:
        return _verdict(2, False, "the forecast finds nothing to replay yet: run the cells above first "
                                  "(the app has to have counted the movements)")
    ratio = seconds / total
    if 0.5 <= ratio <= 2:
        rate = float(scratch.apply_rate.iloc[0])
        return _verdict(2, True, f"you said {seconds:.2f} s; the forecast is {total:.2f} s: {records:,} "
                                 f"changelog records to replay at {rate:,.0f} records/s "
                                 f"({scratch.rate_source.iloc[0]}). A restore from scratch reads every "
                                 f"record of the task's changelog: records to replay ÷ the rate "
                                 f"restores run at.")
    # the forecast is at the load of this moment; a prediction made at the rate the table above
    # measured is the method taught, and right when the machine's load changed since that restore
    seen = _seen_rate(app)
    if seen and 0.5 <= seconds / (records / seen) <= 2:
        return _verdict(2, True, f"you said {seconds:.2f} s: {records:,} changelog records at the "
                                 f"{seen:,.0f} records/s the restore above ran at. The forecast, at "
                                 f"this moment's load, says {total:.2f} s: a busier (or quieter) "
                                 f"machine restores slower (or faster) than it did then.")
    how = ("more than ten times" if ratio > 10 else "more than twice") if ratio > 2 else \
          ("less than a tenth of" if ratio < 0.1 else "less than half of")
    hint = ("Did you count every input record rather than the changelog's, or mix up milliseconds "
            "and seconds?" if ratio > 2 else
            "A restore from scratch replays the whole changelog of every task, not only what changed "
            "recently.")
    return _verdict(2, False, f"you said {seconds:.2f} s: {how} what the forecast says. {hint} The "
                              f"records to replay are the changelogs' end offsets (`%statekit lag "
                              f"bank`); the rate is what the table above shows a restore ran at "
                              f"(records ÷ seconds).")


def _seen_rate(app):
    """Records/s of the restores this run has seen (the table exercise 2 shows), or None."""
    try:
        rs = app.restore_summary()
        secs = float(rs.seconds.sum())
        return float(rs.records.sum()) / secs if secs > 0 else None
    except Exception:  # noqa: BLE001 - no restore seen yet
        return None


# -- exercise 3: make a sink exactly-once ---------------------------------------------------------

def _produce_orders(topic: str, n: int, first: int, bootstrap: str, partitions: int) -> list:
    from statekit.datagen import Record, produce

    rng = random.Random(first)
    recs = [Record(f"o{first + i:06d}", {"order": f"o{first + i:06d}",
                                         "amount": round(rng.uniform(5, 200), 2)}, 1_000 * (first + i))
            for i in range(n)]
    produce(topic, recs, bootstrap, partitions=partitions)
    return [r.key for r in recs]


def check_exactly_once(app, read_invoices, orders: str = "orders", invoices: str = "invoices",
                       n: int = 300) -> None:
    """Runs `app` through a crash between writing a batch's invoices and committing it, then reads
    the invoices with `read_invoices(topic)`: right when every order has exactly one invoice."""
    from statekit.kafka import Kafka

    if getattr(app, "processing_guarantee", None) != "exactly_once":
        return _verdict(3, False, f"the app runs {getattr(app, 'processing_guarantee', '?')}: without "
                                  f"transactions a crash may repeat a batch's invoices, and nothing "
                                  f"tells a reader which copy to ignore. Which guarantee writes each "
                                  f"batch in one transaction? (the app cell's `--guarantee`)")
    with Kafka(app.bootstrap) as k:
        before = sum(k.end_offsets(orders).values())
    if str(app.state) in ("CREATED", "NOT_RUNNING"):
        app.start(sink="kafka", max_records_per_trigger=max(10, n // 6))
    app.process_all_available(timeout=120)
    # armed: the next commit of instance 0 that wrote invoices (a task with no new orders commits too)
    app.crash("process", instance=0, point="before_commit", after_records=1)
    keys = _produce_orders(orders, n, first=before, bootstrap=app.bootstrap, partitions=app.partitions)
    if not app.process_all_available(timeout=120):
        app.restart()
        app.process_all_available(timeout=120)
    crashed = any(e.point == "before_commit" for e in app.events(types="crash"))
    got = Counter(k.decode() if isinstance(k, bytes) else k for k, _v in read_invoices(invoices))
    mine = Counter({k: got[k] for k in keys})
    twice = sum(1 for c in mine.values() if c > 1)
    missing = sum(1 for k in keys if not got[k])
    seen = sum(mine.values())
    if not crashed:
        return _verdict(3, False, "the crash did not happen (no batch of instance 0 reached its commit): run the check again")
    if twice:
        return _verdict(3, False, f"{seen:,} invoices for {len(keys):,} orders: {twice} came out twice. "
                                  f"The app ran exactly_once: the crash hit after the first attempt "
                                  f"of a batch had written its invoices and before its transaction "
                                  f"committed, so those invoices were aborted; your reader returns "
                                  f"aborted records too. How does a reader skip the records of "
                                  f"aborted transactions? (look at `Kafka.read`'s `isolation`)")
    if missing:
        return _verdict(3, False, f"{missing} of {len(keys):,} orders have no invoice in what your "
                                  f"reader returned: it must return every (key, value) of the topic")
    return _verdict(3, True, f"{len(keys):,} orders, {seen:,} invoices, each once, through a crash "
                             f"between writing a batch's invoices and committing it: the app wrote "
                             f"each batch in one transaction, the crashed attempt's was aborted, and "
                             f"a read_committed reader never sees aborted records.")


# -- exercise 4: fix a topology the test driver rejects -------------------------------------------

LINES = ["the cat sat on the mat", "a store keeps its state in rocksdb",
         "every change goes to a changelog topic", "a restore replays the changelog"]


def check_topology(build) -> None:
    """Runs `build(builder)` in the test driver over `LINES`: right when the output topic `lengths`
    ends with, per word length, the number of words of that length."""
    from statekit.testing import TopologyTestDriver
    from statekit.topology import TopologyBuilder

    expected = Counter(len(w) for line in LINES for w in line.split())
    b = TopologyBuilder()
    try:
        build(b)
        with TopologyTestDriver(b) as driver:
            for i, line in enumerate(LINES):
                driver.pipe_input("lines", None, line, timestamp=1_000 + i)
            out = driver.read_output("lengths")
    except Exception as err:  # noqa: BLE001 - the learner's topology: say what went wrong
        text = " ".join(str(err).split())
        hint = (" Grouping by a new key sends every record through a repartition topic, and the "
                "key has to become bytes to get there: what turns your key into bytes? (group_by's "
                "`key_serde`; a str key needs none)"
                if "serde" in text else "")
        return _verdict(4, False, f"the test driver rejects it: {type(err).__name__}: {text[:300]}.{hint}")
    final = {}
    for key, value in out:   # the latest count of each length
        final[int(key) if str(key).isdigit() else key] = value
    if final != dict(expected):
        got = ", ".join(f"{k!r}: {v}" for k, v in list(final.items())[:8]) + (" …" if len(final) > 8 else "")
        return _verdict(4, False, f"it runs, but the counts per word length differ from a plain count: "
                                  f"it gave {{{got}}}, a plain count gives {dict(sorted(expected.items()))}")
    return _verdict(4, True, f"the driver runs it, and the counts per word length "
                             f"{dict(sorted(final.items()))} are what a plain count of the words gives.")
