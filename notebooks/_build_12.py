"""Builds notebooks/12_exercises.ipynb (unexecuted): four exercises over the tour, each with a check.

    .venv/bin/python notebooks/_build.py 12_exercises

An exercise cell (tagged `exercise`) holds what the learner starts from; its reference answer sits in
its metadata (`statekit.solution`), which `make demo` and the tests put in place before running
(`statekit.demo.apply_solutions`). The checks live in notebooks/exercises.py.
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _cells import DOWN, code, md  # noqa: E402

# Small enough to start in seconds, big enough that each task's restore (a quarter of the accounts)
# is a rate worth measuring (the forecast uses restores of 10,000 records or more).
EXERCISE_KEYS = 80_000


def exercise(start: str, solution: str):
    return code(start, tags=("exercise",), solution=solution)


NOTEBOOKS: dict[str, list] = {}

NOTEBOOKS["12_exercises"] = [
    md("""
# 12 · Exercises

Four exercises over the tour, each with a **check** that tells you in plain words what is right,
or what is not yet and where to look.

1. **Find the key that moved** (notebooks 05, 07, 10): keys live in tasks, tasks on instances.
2. **Predict a restore time** (notebooks 02, 03): what a restore from scratch has to replay, and how fast.
3. **Make a sink exactly-once** (notebook 02): transactions, and readers that skip aborted records.
4. **Fix a topology the test driver rejects** (the README's "Testing a topology").

How to work: run the cells from the top. Each exercise has a cell marked `# your answer`; fill it
in, run it, then run the check below it. Change your answer and run both again until the check says
**Right**. The apps here run on the local engine (`--engine local`: the same tasks, stores and
changelogs, with the micro-batches planned in the kernel instead of Spark), so that they start in a
second.

*For teachers:* every exercise cell keeps its reference answer in its metadata
(`statekit.solution`); `make demo` runs the notebook with those answers and writes the executed copy,
answers included, to `build/notebooks/12_exercises.ipynb`.
"""),
    code("""
%load_ext kernel_ext
%statekit up --fresh --no-spark
import exercises
"""),
    md("""
## The bank

80,000 accounts, one movement each, counted by an app of two instances (four tasks, no standbys).
"""),
    code(f"""
KEYS = {EXERCISE_KEYS:_}
%statekit produce accounts --generator accounts --seed 1 --limit {{KEYS}} --keys {{KEYS}} --partitions 4 --wait
"""),
    code("""
%%statekit app bank --engine local --partitions 4 --instances 2
(app.stream("accounts", value_serde="json")
    .group_by_key()
    .count(store="movements"))
"""),
    code("""
%statekit start bank
%statekit wait bank
%statekit instances bank
"""),
    md("""
## Exercise 1 · Find the key that moved

A key lives in one task (the hash of the key picks its partition, notebook 07), and a task runs on
one instance. Here are four accounts. Then instance 1 crashes with its disk, and its tasks move to
instance 0. **Which of the four accounts moved to another instance?**

Where to look: the line the crash prints says which tasks moved; `%statekit query bank movements
KEY` says which task and instance hold a key now.
"""),
    code("""
WATCH = exercises.keys_to_watch(app, "movements", instance=1)
WATCH
"""),
    code("%statekit crash bank --mode disk-loss --instance 1"),
    exercise("""
moved = ...   # your answer: one of the four keys in WATCH, as a str
""", """
died = app.last_event("instance_died")
moved_tasks = {m["task"] for r in app.rebalances if r["generation"] > died.generation for m in r["moves"]}
moved = next(k for k in WATCH if str(app.key_owner("movements", k).task) in moved_tasks)
"""),
    code("exercises.check_moved_key(app, moved, WATCH)"),
    md("""
## Exercise 2 · Predict a restore time

The crash you just caused made instance 0 restore instance 1's two tasks from scratch; the table
below says how many changelog records each replayed, in how many seconds. Now 160,000 more
movements arrive. **If instance 0 lost its disk now, how long would restoring all four tasks from
scratch take?** Give a number of seconds; the check compares it with the restore forecast.

Where to look: the table below (how fast a restore ran), `%statekit lag bank` (a changelog's end
offset is how many records it holds: nothing was compacted yet), notebook 03.
"""),
    code("""
%statekit produce accounts --generator accounts --seed 2 --limit {2 * KEYS} --keys {2 * KEYS} --partitions 4 --wait
%statekit wait bank
app.restore_summary()[["task", "source", "records", "seconds"]]
"""),
    exercise("""
prediction = ...   # your answer, in seconds
""", """
rs = app.restore_summary()
rate = rs.records.sum() / rs.seconds.sum()                  # records/s the restore ran at
lag = app.lag()
records = lag[lag.role == "active"].changelog_end.sum()     # every record of every changelog now
prediction = records / rate
"""),
    code("exercises.check_restore_time(app, prediction)"),
    md("""
## Exercise 3 · Make a sink exactly-once

An app writes an invoice for every order to the topic `invoices`, and `read_invoices` reads them
back. The check runs the app through a crash at the worst moment — after a batch's invoices were
written, before the batch committed — restarts it, reads the invoices with your function and counts
them per order. **Make every order come out exactly once.**

Two things to decide: the app's processing guarantee (`--guarantee exactly_once` or `at_least_once`
on the app cell), and how the reader reads (`Kafka.read(..., isolation="read_uncommitted")`, the
default, or `"read_committed"`).
"""),
    code("""
from statekit.kafka import Kafka
with Kafka() as k:
    k.ensure_topic("orders", 2)   # the app cell wants its source topic to exist
"""),
    exercise("""
%%statekit app invoices --engine local --partitions 2 --guarantee at_least_once
(app.stream("orders", value_serde="json")
    .map_values(lambda o: {"order": o["order"], "amount": o["amount"], "vat": round(o["amount"] * 0.2, 2)})
    .to("invoices", value_serde="json"))
""", """
%%statekit app invoices --engine local --partitions 2 --guarantee exactly_once
(app.stream("orders", value_serde="json")
    .map_values(lambda o: {"order": o["order"], "amount": o["amount"], "vat": round(o["amount"] * 0.2, 2)})
    .to("invoices", value_serde="json"))
"""),
    exercise('''
def read_invoices(topic):
    """Every (key, value) of `topic`."""
    out = []
    with Kafka() as k:
        for p in k.end_offsets(topic):
            for chunk in k.read(topic, p):
                out += [(key, value) for _offset, _ts, key, value, _headers in chunk.records]
    return out
''', '''
def read_invoices(topic):
    """Every committed (key, value) of `topic`."""
    out = []
    with Kafka() as k:
        for p in k.end_offsets(topic):
            for chunk in k.read(topic, p, isolation="read_committed"):
                out += [(key, value) for _offset, _ts, key, value, _headers in chunk.records]
    return out
'''),
    code("exercises.check_exactly_once(app, read_invoices)"),
    md("""
## Exercise 4 · Fix a topology the test driver rejects

`statekit.testing.TopologyTestDriver` runs a topology's real processors and stores in the kernel,
without Spark or a broker. `build` below should count the words of each length in a stream of lines
and write the counts to the topic `lengths`; the check pipes four lines through it. The driver
rejects it as it is: run the check to see why, then **fix `build`** until the check says Right.
"""),
    exercise("""
def build(b):
    (b.stream("lines")
       .flat_map_values(str.split)
       .group_by(lambda _key, word: len(word))     # the new key: the word's length
       .count(store="lengths")
       .to_stream()
       .to("lengths", value_serde="int64"))
""", """
def build(b):
    (b.stream("lines")
       .flat_map_values(str.split)
       .group_by(lambda _key, word: len(word), key_serde="int64")
       .count(store="lengths")
       .to_stream()
       .to("lengths", value_serde="int64"))
"""),
    code("exercises.check_topology(build)"),
    md("## How many are right?"),
    code("exercises.summary()"),
    DOWN,
]
