"""Builds the guided tour's notebooks (unexecuted) from the cells below and in the other builders.

    .venv/bin/python notebooks/_build.py          # rewrites every notebooks/NN_*.ipynb
    .venv/bin/python notebooks/_build.py 02_crash_and_restore

Edit the cells here (01–05), in _build_tour.py (06–08, 10), _build_09.py, _build_11.py,
_build_12.py, _build_13.py, _build_14.py, _build_15.py and _build_16.py, never the .ipynb files; the helpers they share are in _cells.py
(the builders import it, and only this module imports the builders: no circle). Every notebook is
written for a learner (see _cells.py).

Every topic is produced with the partition count of the app that reads it (a task is a source
partition, as in Kafka Streams).
"""
from __future__ import annotations

import os
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

from _cells import (DOWN, FORECAST, RECORD_RESTORE, RESTORE_TOUR_KEYS, RESTORE_VS_FORECAST, SETUP, TOUR_KEYS, WORDCOUNT_CHECK, accounts, code, hidden, md, write)  # noqa: E402

NOTEBOOKS: dict[str, list] = {}

# ---------------------------------------------------------------------------------------------
NOTEBOOKS["01_quickstart"] = [
    md("""
# 01 · Quickstart: a word count that keeps its state

A stream of words goes into a Kafka topic; a Spark Structured Streaming query counts them per word.
The counts live in a **RocksDB store** per task; every commit also writes them to a **changelog topic**
in Kafka, which is what brings the store back after a crash (notebook 02).

**What you will see:** 2,000 words produced to a topic, an app that counts them, a live dashboard
while 1,500 more words arrive, the store read while the app runs, a check against plain Python, and
one word's count rebuilt from its changelog.

`%load_ext kernel_ext` gives one magic, `%statekit`, with a subcommand per action
(`%statekit --help`). `up` starts the embedded Kafka broker and a local Spark session.
"""),
    SETUP,
    md("""
## Some input

`sample_data/words.jsonl` holds 2,000 words drawn from a Zipf distribution (seeded, so always the
same). Each record is keyed by its word; the topic gets four partitions.
"""),
    code("%statekit produce words --from ../sample_data/words.jsonl --partitions 4 --wait"),
    code("%statekit topics"),
    md("""
## The application

The body of a `%%statekit app` cell builds the topology with `app` (a `statekit.App`): read
`words`, group by the key, count into the store `counts`. A task per partition of `words`: four
tasks, each with its own store and its own changelog partition.
"""),
    code("""
%%statekit app wordcount --partitions 4
counts = (app.stream("words", value_serde="json")
             .group_by_key()
             .count(store="counts"))
"""),
    md("""
## Start it and watch it

The dashboard refreshes about once a second from a background thread (the kernel stays free):
the tasks with their store rows, checkpoint and changelog offsets and lag; the lag over time; the
store's top keys; the changelog partitions; the topology; and a key's history.
"""),
    code("%statekit start wordcount --watch"),
    md("While it runs, more words arrive: 1,500 from the same generator, at 1,000 records a second."),
    code("""
%statekit produce words --generator words --seed 7 --limit 1500 --rate 1000/s
%statekit wait wordcount
"""),
    md("""
The store can be read while the app runs (an **interactive query**): the count of one word, with
the task and instance that hold it.
"""),
    code("%statekit query wordcount counts record"),
    code("%statekit lag wordcount"),
    md("""
Every task's checkpoint has reached its changelog's end: lag 0, nothing left to replay.

## Check against plain Python

Count the same records with `collections.Counter` and compare with every key of the store.
"""),
    WORDCOUNT_CHECK,
    md("""
## A key's history

Every committed value of a key is a record in its changelog partition. The slider walks through
them (compaction will remove the older ones: notebook 03).
"""),
    code("%statekit history wordcount counts record"),
    code("%statekit stop wordcount"),
    DOWN,
    md("""
## What happened

The app counted 3,500 words in four tasks. Each task kept its counts in its own RocksDB store and
wrote every committed count to its changelog partition; the store answered queries while the app
ran, and matched a plain-Python count. A key's history is nothing but its records in the changelog:
that log is what notebook 02 replays after a crash.
"""),
]

# ---------------------------------------------------------------------------------------------
NOTEBOOKS["02_crash_and_restore"] = [
    md("""
# 02 · Crash and restore

Two ways to lose an instance, as in Kafka Streams:

* **process**: the instance dies mid-batch (a real `SIGKILL`); its state directory survives. On restart,
  each task restores from its **checkpoint** to the changelog end: only the tail is replayed.
* **disk-loss**: the instance dies *and* its state directory is deleted. On restart the tasks restore
  from **scratch**: the whole (compacted) changelog is replayed.

Either way the counts come back exactly: nothing lost, nothing counted twice. The app here runs as
**one instance**, so a crash stops it until `restart` (notebooks 05 and 10 show several instances,
where the others take over).

**What you will see:** 2.5 million accounts counted; a crash in the middle of a batch, after which
the tasks reopen with nothing to replay; then the forecast of a restore from scratch, a crash that
loses the disk, and the dashboard's **Restoration** panel while every task replays its changelog —
queued, restoring with a progress bar and an ETA, done with its time. After each crash a check
against plain Python.
"""),
    SETUP,
    md("""
## Workshop-scale state

2.5 million bank accounts, one movement each: the store counts movements per account, so it ends
up with 2.5 million rows, and each task's changelog with a quarter of them. That is what a restore
from scratch replays: seconds of work, long enough to watch. (The generator writes pre-encoded
record batches: a few seconds.)
"""),
    accounts(RESTORE_TOUR_KEYS),
    code("""
%%statekit app bank --partitions 4
(app.stream("accounts", value_serde="json")
    .group_by_key()
    .count(store="movements"))
"""),
    md("""
Start it with its dashboard, and wait until every movement is counted. The dashboard's header
shows the records processed and the input rate as the micro-batches go.
"""),
    code("%statekit start bank --watch"),
    code("%statekit wait bank"),
    md("""
## Crash 1: the process dies mid-batch

`--after 100` arms a crash: the first task of the instance to process 100 records of a batch kills
its own process. More movements arrive, the crash fires in the middle of a batch, and with its only
instance dead the app stops (ERROR) until `restart`.
"""),
    code("%statekit crash bank --mode process --after 100"),
    code("""
%statekit produce accounts --generator accounts --seed 2 --limit 20000 --keys {KEYS} --partitions 4 --wait
%statekit wait bank
"""),
    code("%statekit restart bank"),
    md("""
The crash hit before the batch committed: nothing of that batch reached the changelog or RocksDB,
so every checkpoint still matches its changelog end, and the tasks reopen from their checkpoints
with nothing to replay (`restored` 0 below). The engine hands the failed batch to the tasks again:
same records, same batch id.
"""),
    code("""
%statekit wait bank
app.task_opens()[["task", "source", "restored", "last_batch"]]
"""),
    code("""
def check(expected):
    store = app.query_all("movements")
    actual = dict(zip(store["key"], store["value"]))
    if actual != expected:
        bad = {k for k in actual.keys() | expected.keys() if actual.get(k) != expected.get(k)}
        raise AssertionError(f"{len(bad)} keys differ, e.g. {sorted(bad)[:5]}")
    return actual

expected_now = expected + Counter(accounts_reference(seed=2, limit=20000, keys=KEYS)[0])
actual = check(expected_now)
print(f"after the process crash: {len(actual):,} accounts, {sum(actual.values()):,} movements, "
      f"exactly as plain Python counts them")
print("OK")
"""),
    md("""
## Crash 2: the disk is lost too

Before the crash, the **restore forecast**: for every task, how long a restore would take now (the
records in its changelog, at the rate restores run at on this machine). Then the instance dies and
its state directory is deleted: its tasks have nothing local left and restore from the beginning of
their changelogs. Scroll up to the dashboard while the next cells run: every task is listed queued
with its records to replay, then restoring (progress, records/s, ETA), then done with its time.
"""),
    code(FORECAST),
    code("""
%statekit crash bank --mode disk-loss
%statekit produce accounts --generator accounts --seed 3 --limit 20000 --keys {KEYS} --partitions 4 --wait
%statekit restart bank
"""),
    code("""
%statekit wait bank
expected_now = (expected + Counter(accounts_reference(seed=2, limit=20000, keys=KEYS)[0])
                + Counter(accounts_reference(seed=3, limit=20000, keys=KEYS)[0]))
actual = check(expected_now)
print(f"after the disk loss: {len(actual):,} accounts, {sum(actual.values()):,} movements, "
      f"exactly as plain Python counts them")
print("OK")
"""),
    md("How long did the restore take, task by task, and how close was the forecast?"),
    code(RESTORE_VS_FORECAST),
    RECORD_RESTORE,
    code("%statekit stop bank"),
    DOWN,
    md("""
## What happened

The first crash killed the instance in the middle of a batch. Nothing of that batch had been
committed, so after the restart each task found its checkpoint equal to its changelog's end and
reopened without replaying anything; the batch ran again and counted each movement once. The second
crash took the disk as well: each task rebuilt its store by replaying its whole changelog, and the
time it took stands beside the forecast made before the crash. Both times the store ended exactly
where plain Python says it should.
"""),
]

# ---------------------------------------------------------------------------------------------
NOTEBOOKS["03_compaction_and_restore_time"] = [
    md("""
# 03 · Compaction and restore time

A changelog gets one record per key per commit. Twenty sensors reporting over many commits produce
hundreds of records for twenty live keys. A restore from scratch reads the changelog from its start:
without compaction it would replay every one of those records; with `cleanup.policy=compact` the
broker's **log cleaner** keeps only the latest record per key, and the restore replays little more
than one record per key.

**What you will see:** twenty sensors' readings in many small commits; the changelog's offsets
against the records the cleaner kept; a restore from scratch that replays only those; then the same
at workshop scale, 2.5 million accounts, with the forecast and the real restore side by side.
"""),
    SETUP,
    code("%statekit produce sensors --from ../sample_data/sensors.jsonl --partitions 2 --wait"),
    md("""
Kafka never cleans the *active* segment of a log, so the cleaner only has work once segments roll.
statekit creates changelog topics itself (`cleanup.policy=compact`); here we create this one first,
with tiny segments, so that compaction shows on a small example.
"""),
    code("""
from statekit.kafka import Kafka
k = Kafka()
k.ensure_topic("temps-latest-changelog", 2, {"cleanup.policy": "compact", "segment.bytes": "2048"})
k.close()
"""),
    code("""
%%statekit app temps --partitions 2
(app.stream("sensors", value_serde="json")
    .group_by_key()
    .aggregate(lambda: {"n": 0, "max": None},
               lambda k, v, agg: {"n": agg["n"] + 1,
                                  "max": v["temperature"] if agg["max"] is None else max(agg["max"], v["temperature"])},
               store="latest"))
"""),
    md("Small micro-batches (`--max-records 80`) mean many commits: many changelog records per key."),
    code("""
%statekit start temps --max-records 80
%statekit wait temps
"""),
    md("""
The cleaner runs on its own (every second, on logs that are dirty enough); ask for one more pass
now and look at the figures: offsets written (the high watermark), records still in the log, cleaner
runs, records removed.
"""),
    code("""
import os
import pandas as pd
from statekit import broker
home = os.environ.get("STATEKIT_HOME") or os.path.expanduser("~/.statekit")
stats = broker.request_clean(os.path.join(home, "broker"))
pd.DataFrame([s for s in stats if s["topic"] == "temps-latest-changelog"])[
    ["partition", "high_watermark", "records", "cleaner_runs", "records_removed"]]
"""),
    md("""
Now lose the instance's disk and restart: every task restores from scratch, then a few new readings
follow. The table compares, per task, the offsets of the changelog (what a restore would replay
without compaction) with the records it replayed.
"""),
    code("""
from statekit import datagen
%statekit crash temps --mode disk-loss
%statekit restart temps --no-watch
new = list(datagen.generate("sensors", seed=101, limit=20))
%statekit produce sensors --generator sensors --seed 101 --limit 20 --rate 1000/s --wait
%statekit wait temps
rs = app.restore_summary()
rs["offsets"] = rs["end_offset"] - rs["start_offset"]
rs["saved by compaction"] = rs["offsets"] - rs["records"]
rs[["task", "source", "offsets", "records", "saved by compaction", "seconds"]]
"""),
    code("""
import matplotlib.pyplot as plt
fig, ax = plt.subplots(figsize=(6, 2.6))
x = range(len(rs))
ax.bar([i - 0.2 for i in x], rs["offsets"], width=0.4, color="#C44E52", label="without compaction (offsets)")
ax.bar([i + 0.2 for i in x], rs["records"], width=0.4, color="#55A868", label="replayed (compacted log)")
ax.set_xticks(list(x), [f"task {t}" for t in rs["task"]])
ax.set_ylabel("changelog records")
ax.set_title(f"restore from scratch: {rs['records'].sum()} records in {rs['seconds'].sum():.2f} s",
             loc="left", fontsize=10)
ax.legend(fontsize=8, frameon=False)
for s in ("top", "right"):
    ax.spines[s].set_visible(False)
plt.show()
"""),
    code("""
from statekit.datagen import read_jsonl

ref = {}
for r in list(read_jsonl("../sample_data/sensors.jsonl")) + new:
    a = ref.setdefault(r.key, {"n": 0, "max": None})
    a["n"] += 1
    a["max"] = r.value["temperature"] if a["max"] is None else max(a["max"], r.value["temperature"])
store = app.query_all("latest")
actual = dict(zip(store["key"], store["value"]))
assert actual == ref, "the restored store differs from the reference"
assert rs["records"].sum() < rs["offsets"].sum(), "compaction saved nothing"
print(f"{len(actual)} sensors restored exactly from {rs['records'].sum()} changelog records; "
      f"without compaction the restore would have replayed {rs['offsets'].sum()}")
print("OK")
"""),
    code("%statekit stop temps"),
    md("""
## At workshop scale: 2.5 million accounts

The same story where it costs seconds. 2.5 million accounts get a movement each, then a fifth of
them a second one, in two micro-batches (`--max-records`: one account's worth of movements per
batch): two commits, so the changelog gets a record per account and then one more per account moved
again — 3 million records for 2.5 million live keys, until the cleaner keeps only the latest of each.
"""),
    code("""
import os
from statekit.datagen import accounts_reference
KEYS = int(os.environ.get("STATEKIT_TOUR_KEYS", "RESTORE_TOUR_KEYS"))
MOVES = KEYS + KEYS // 5
%statekit produce ledger --generator accounts --seed 21 --limit {MOVES} --keys {KEYS} --partitions 4 --wait
k = Kafka()   # the changelog in 1 MB segments, so the cleaner has closed segments to work on
k.ensure_topic("bank-movements-changelog", 4, {"cleanup.policy": "compact", "segment.bytes": str(1 << 20)})
k.close()
""".replace("RESTORE_TOUR_KEYS", str(RESTORE_TOUR_KEYS))),
    code("""
%%statekit app bank --partitions 4
(app.stream("ledger", value_serde="json")
    .group_by_key()
    .count(store="movements"))
"""),
    code("""
%statekit start bank --max-records {KEYS}
%statekit wait bank
stats = broker.request_clean(os.path.join(home, "broker"))
cl = pd.DataFrame([s for s in stats if s["topic"] == "bank-movements-changelog"])
cl[["partition", "high_watermark", "records", "cleaner_runs", "records_removed"]]
"""),
    md("""
What would a restore from scratch cost now? The forecast counts the records left in each compacted
changelog and divides by the rate restores run at on this machine. Then the disk goes, and the real
restore follows.
"""),
    code(FORECAST),
    code("""
%statekit crash bank --mode disk-loss
%statekit restart bank --no-watch
%statekit wait bank
"""),
    code(RESTORE_VS_FORECAST),
    RECORD_RESTORE,
    code("""
counts = accounts_reference(seed=21, limit=MOVES, keys=KEYS)[0]
store = app.query_all("movements")
actual = dict(zip(store["key"], store["value"]))
assert actual == counts, f"{len(set(actual.items()) ^ set(counts.items()))} accounts differ"
assert rs.records.sum() < MOVES, "the restore replayed every movement: compaction saved nothing"
print(f"{len(actual):,} accounts restored exactly from {int(rs.records.sum()):,} changelog records "
      f"({MOVES:,} movements were counted)")
print("OK")
"""),
    code("%statekit stop bank"),
    DOWN,
    md("""
## What happened

Each commit wrote a changelog record per key it changed, so the changelogs grew far past the number
of live keys. The log cleaner kept only the latest record of each key in the closed segments, and a
restore from scratch replayed those: fewer records than offsets, the same store. At 2.5 million
accounts the difference is seconds of restore, which the forecast estimates before the crash.
"""),
]

# ---------------------------------------------------------------------------------------------
NOTEBOOKS["04_cache_and_commit_interval"] = [
    md("""
# 04 · Record cache and commit interval vs changelog traffic

The **record cache** absorbs repeated writes of a key between commits: with a cache, a hot word
counted 300 times in a batch writes *one* changelog record at commit; without it, every update goes
to the changelog. How often does a task commit? In statekit, at the end of every micro-batch (the
batch id is what makes a commit exactly-once), so the **commit interval is the micro-batch size**
(`--max-records`, or a processing-time trigger). Fewer, bigger commits mean less changelog traffic;
but each record waits longer before its update is committed (and visible in the changelog).

**What you will see:** the same 1,000 words run through four configurations — no cache, and a
cache with 100, 250 and 1,000 records per micro-batch — and the changelog records each one wrote.
"""),
    SETUP,
    code("%statekit produce words --generator words --limit 1000 --partitions 2 --wait"),
    md("""
`run` starts an app from Python (`statekit.App`, the same as a `%%statekit app` cell), waits until
it has processed every word, and counts the records in its changelog.
"""),
    code("""
import time
import pandas as pd
import statekit
from statekit.kafka import Kafka

results = {}

def run(label, name, cache_bytes, per_batch):
    a = statekit.App(name, partitions=2, cache_bytes=cache_bytes)
    a.stream("words", value_serde="json").group_by_key().count(store="counts")
    a.reset()   # a fresh start each time: its state and changelog from an earlier run go
    t0 = time.monotonic()
    a.start(max_records_per_trigger=per_batch, sink="none")
    a.process_all_available()
    seconds = time.monotonic() - t0
    m = a.metrics()
    k = Kafka()
    ends = k.end_offsets(a.changelog_topic("counts"))
    k.close()
    a.stop()
    commits = m["batches"]
    results[label] = {"config": label, "records per batch": per_batch, "micro-batches (commits)": commits,
                      "changelog records": sum(ends.values()),
                      "changelog records per commit": round(sum(ends.values()) / max(1, 2 * commits), 1),
                      "seconds": round(seconds, 1)}
"""),
    code("""
print("running the four configurations, one after the other…")
run("no cache, 250 per batch", "nocache", 0, 250)
run("cache, 100 per batch", "cache100", 10 << 20, 100)
run("cache, 250 per batch", "cache250", 10 << 20, 250)
run("cache, 1000 per batch", "cache1000", 10 << 20, 1000)
df = pd.DataFrame(list(results.values())).set_index("config")
df
"""),
    code("""
import matplotlib.pyplot as plt
fig, ax = plt.subplots(figsize=(7, 2.8))
ax.barh(df.index[::-1], df["changelog records"][::-1], color=["#55A868", "#4C72B0", "#8172B3", "#C44E52"])
ax.set_xlabel("changelog records written (markers included)")
ax.set_title("changelog traffic for 1,000 input records", loc="left", fontsize=10)
for s in ("top", "right"):
    ax.spines[s].set_visible(False)
fig.tight_layout()
plt.show()
"""),
    code("""
c = df["changelog records"]
assert c["cache, 250 per batch"] < c["no cache, 250 per batch"], df
assert c["cache, 1000 per batch"] <= c["cache, 250 per batch"] <= c["cache, 100 per batch"], df
print(f"the cache cut changelog traffic from {c['no cache, 250 per batch']} to {c['cache, 250 per batch']} "
      f"records; bigger batches (fewer commits) cut it to {c['cache, 1000 per batch']}")
print("OK")
"""),
    DOWN,
    md("""
## What happened

Without a cache every update of a word went to the changelog. With one, a word updated many times
in a micro-batch wrote a single record at the commit; and the fewer the commits (the bigger the
micro-batches), the fewer records in all. The price of big batches is latency: an update is in the
changelog only once its batch commits.
"""),
]

# ---------------------------------------------------------------------------------------------
NOTEBOOKS["05_standby_replicas"] = [
    md("""
# 05 · Standby replicas and failover

A **standby replica** is a restore that never stops: another instance tails each task's changelog
into its own copy of the store. When the active instance dies — here with its disk — its tasks move
to the instance holding their standbys, which is **promoted**: it replays only what it had not
applied yet, not the whole changelog. The other instance never stops processing.

**What you will see:** a million accounts counted by two instances, each task active on one and a
standby on the other; instance 0 crashing with its disk while movements keep arriving; its tasks
promoted on instance 1 after replaying a handful of records; instance 0 coming back empty and
catching up through standbys and warmups; and a check that nothing was lost.
"""),
    SETUP,
    accounts(),
    code("""
%%statekit app pages --partitions 4 --instances 2 --standby 1
(app.stream("accounts", value_serde="json")
    .group_by_key()
    .count(store="movements"))
"""),
    code("""
%statekit start pages --watch
%statekit wait pages
"""),
    code("%statekit instances pages"),
    md("""
Every task is active on one instance and has a standby on the other. The lag table has a row per
copy: a standby's lag is what its promotion would replay. The next cell waits until every standby
has caught up with its changelog.
"""),
    code("""
import time
print("waiting until every standby has replayed its changelog to the end…")
deadline = time.time() + 120
while time.time() < deadline:
    lag = app.lag()
    if (lag[lag.role == "standby"].lag == 0).all():
        break
    time.sleep(0.5)
lag
"""),
    md("""
## Instance 0 dies with its disk, while movements keep coming

First the forecast: what each instance's death would cost now, from scratch and from the standbys.
Then a producer writes 4,000 more movements at 800 a second in the background; two seconds in,
instance 0 dies and loses its disk. Instance 1 promotes the standbys of instance 0's tasks and
carries on; in the dashboard above, the ownership timeline shows the move.
"""),
    code(FORECAST),
    code("""
%statekit produce accounts --generator accounts --seed 5 --limit 4000 --keys {KEYS} --rate 800/s
time.sleep(2)
%statekit crash pages --mode disk-loss --instance 0
"""),
    code("""
%statekit wait pages
died = app.last_event("instance_died")
for e in app.events(types="standby_promoted", since=died.ts):
    print(f"task {e.task}: its standby on instance {e.instance} was promoted, {e.lag or 0} record(s) behind")
opens = app.task_opens()
opens[opens.generation > died.generation][["task", "instance", "source", "restored"]]
"""),
    md("""
The promoted tasks replayed only their standby's lag — a few records, often none — where a restore
from scratch replays the whole changelog (notebook 02). Now bring instance 0 back, with an empty
disk: it gets standbys again, and warmup replicas for the tasks that should move back to it once
they have caught up.
"""),
    code("%statekit revive pages --instance 0 --no-disk"),
    code("""
%statekit wait pages
%statekit instances pages
"""),
    code("""
promoted = app.events(types="standby_promoted", since=died.ts)
expected_now = expected + Counter(accounts_reference(seed=5, limit=4000, keys=KEYS)[0])
store = app.query_all("movements")
actual = dict(zip(store["key"], store["value"]))
assert actual == dict(expected_now), f"{len(set(actual.items()) ^ set(expected_now.items()))} keys differ"
assert sorted(e.task for e in promoted if e.role == "standby") == sorted(died.tasks)
print(f"{len(actual):,} accounts; the failover lost nothing and replayed "
      f"{sum(e.lag or 0 for e in promoted)} record(s) instead of the whole changelog")
print("OK")
"""),
    code("%statekit stop pages"),
    DOWN,
    md("""
## What happened

Instance 1 had been replaying every changelog of instance 0's tasks into standby stores all along.
When instance 0 died with its disk, those standbys were promoted: they replayed only the few records
they were behind, and instance 1 went on processing the movements that kept arriving. Instance 0
came back empty and was given standbys and warmups rather than tasks, so that no task moves to a
copy that is far behind. The store matched plain Python throughout.
"""),
]


def build(names=None) -> list[str]:
    """Write every notebook of the tour (or those in `names`)."""
    return write(all_notebooks(), names)


def all_notebooks() -> dict:
    """Every notebook of the tour, by name, from every builder."""
    import _build_09
    import _build_11
    import _build_12
    import _build_13
    import _build_14
    import _build_15
    import _build_16
    import _build_tour

    out = dict(NOTEBOOKS)
    for mod in (_build_tour, _build_09, _build_11, _build_12, _build_13, _build_14, _build_15,
                _build_16):
        out.update(mod.NOTEBOOKS)
    return dict(sorted(out.items()))


if __name__ == "__main__":
    for p in build(sys.argv[1:] or None):
        print(p)
