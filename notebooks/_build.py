"""Builds the guided tour's notebooks (unexecuted) from the cells below.

    .venv/bin/python notebooks/_build.py        # rewrites notebooks/0*.ipynb

Edit the cells here, not the .ipynb files. Every notebook starts from a clean slate
(`%statekit up --fresh`), ends with `%statekit down`, and checks its results against a plain-Python
reference in a cell that prints OK.
"""
from __future__ import annotations

import os
import sys

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = os.path.dirname(os.path.abspath(__file__))


def md(text: str):
    return new_markdown_cell(text.strip("\n"))


def code(text: str, tags=()):
    c = new_code_cell(text.strip("\n"))
    if tags:
        c.metadata["tags"] = list(tags)
    return c


SETUP = code("""
%load_ext kernel_ext
%statekit up --fresh
""")

DOWN = code("""
%statekit down
""")

# Workshop-scale state: bank accounts, one movement each (the `accounts` generator's first KEYS
# records visit every account once), written by the fast produce path. 2.5 million where a restore
# from scratch is timed (02, 03: a million keys restore in under two seconds here), a million
# elsewhere. The test suite runs the tour with fewer accounts (STATEKIT_TOUR_KEYS); `make demo` and
# JupyterLab use the full size.
TOUR_KEYS, RESTORE_TOUR_KEYS = 1_000_000, 2_500_000

ACCOUNTS_CELL = """
import os
from collections import Counter
from statekit.datagen import accounts_reference

KEYS = int(os.environ.get("STATEKIT_TOUR_KEYS", "{default}"))
%statekit produce accounts --generator accounts --seed 1 --limit {{KEYS}} --keys {{KEYS}} --wait
expected = Counter(accounts_reference(seed=1, limit=KEYS, keys=KEYS)[0])   # account -> movements
print(f"{{KEYS:,}} movements of {{len(expected):,}} accounts")
"""
ACCOUNTS = ACCOUNTS_CELL.format(default=TOUR_KEYS)

# The forecast before a crash: App.restore_forecast(), per task and way back, and per instance a line.
FORECAST = """
forecast = app.restore_forecast()
print("\\n".join(forecast.lines.values()))
"""

# What the last restart restored, per task: seconds, records, records/s, beside the forecast made
# before the crash (a restore from scratch).
RESTORE_REPORT = """
import kernel_ext
rs = app.restore_summary()   # since the last restart: one row per task and store that replayed records
rs = rs.groupby(["task", "instance", "source"], as_index=False)[["records", "seconds"]].sum()
rs["records/s"] = (rs["records"] / rs["seconds"].where(rs["seconds"] > 0)).round()
fc = forecast.frame[forecast.frame.source == "scratch"][["task", "records", "seconds"]]
rs = rs.merge(fc.rename(columns={"records": "forecast records", "seconds": "forecast s"}), on="task",
              how="left")
display(rs)
print(f"restore from scratch: {rs.seconds.sum():.2f} s for {int(rs.records.sum()):,} records; "
      f"forecast before the crash: {rs['forecast s'].sum():.2f} s")
kernel_ext.report("restore", restore_seconds=round(float(rs["seconds"].sum()), 3),
                  records_replayed=int(rs["records"].sum()),
                  forecast_seconds=round(float(rs["forecast s"].sum()), 3),
                  per_task=[{k: (v.item() if hasattr(v, "item") else v) for k, v in row.items()}
                            for row in rs.to_dict("records")],
                  invariant="OK")
"""

NOTEBOOKS: dict[str, list] = {}

# ---------------------------------------------------------------------------------------------
NOTEBOOKS["01_quickstart"] = [
    md("""
# 01 · Quickstart: a word count that keeps its state

A stream of words goes into a Kafka topic; a Spark Structured Streaming query counts them per word.
The counts live in a **RocksDB store** per task; every commit also writes them to a **changelog topic**
in Kafka, which is what brings the store back after a crash (notebook 02).

`%load_ext kernel_ext` gives one magic, `%statekit`, with a subcommand per action
(`%statekit --help`). `up` starts the embedded Kafka broker and a local Spark session.
"""),
    SETUP,
    md("""
## Some input

`sample_data/words.jsonl` holds 2,000 words drawn from a Zipf distribution (seeded, so always the
same). Each record is keyed by its word.
"""),
    code("%statekit produce words --from ../sample_data/words.jsonl --wait"),
    code("%statekit topics"),
    md("""
## The application

The body of a `%%statekit app` cell builds the topology with `app` (a `statekit.App`): read
`words`, group by the key, count into the store `counts`. Four partitions means four tasks, each with
its own store and its own changelog partition.
"""),
    code("""
%%statekit app wordcount --partitions 4
counts = (app.stream("words", value_serde="json")
             .group_by_key()
             .count(store="counts"))
"""),
    code("%statekit start wordcount"),
    md("""
## Watch it

The dashboard refreshes about once a second from a background thread (the kernel stays free):
tasks with their store rows, dirty cache entries, checkpoint and changelog offsets and lag; the lag
over time; the store's top keys (rows that changed since the last refresh are highlighted); the
changelog partitions; the topology; and a key's history rebuilt from the changelog.
"""),
    code("%statekit watch wordcount"),
    md("While it runs, more words arrive: 1,500 from the same generator, at 1,000 records a second."),
    code("%statekit produce words --generator words --seed 7 --limit 1500 --rate 1000/s --wait"),
    code("""
app.process_all_available()
%statekit query wordcount counts record
"""),
    code("%statekit lag wordcount"),
    md("""
## Check against plain Python

Count the same records with `collections.Counter` and compare with every key of the store.
"""),
    code("""
from collections import Counter
from statekit.datagen import generate, read_jsonl

expected = Counter(r.key for r in read_jsonl("../sample_data/words.jsonl"))
expected.update(r.key for r in generate("words", seed=7, limit=1500))
store = app.query_all("counts")
actual = dict(zip(store["key"], store["value"]))
assert actual == dict(expected), f"{len(set(actual.items()) ^ set(expected.items()))} keys differ"
print(f"{len(actual)} words, {sum(actual.values())} records counted")
print("OK")
"""),
    md("""
## A key's history

Every committed value of a key is a record in its changelog partition. The slider walks through
them (compaction will remove the older ones: notebook 03).
"""),
    code("%statekit history wordcount counts record"),
    code("%statekit stop wordcount"),
    DOWN,
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

Either way the counts come back exactly: nothing lost, nothing counted twice. A reference computed
in plain Python checks it. The app here runs as **one instance**, so a crash stops it until `restart`
(notebooks 05 and 10 show several instances, where the others take over).
"""),
    SETUP,
    md("""
## Workshop-scale state

2.5 million bank accounts, one movement each: the store counts movements per account, so it ends
up with 2.5 million rows, and each task's compacted changelog with a quarter of them. That is what a
restore from scratch replays: seconds of work, long enough to watch. (The generator writes pre-encoded record batches: a few seconds.)
"""),
    code(ACCOUNTS_CELL.format(default=RESTORE_TOUR_KEYS)),
    code("""
%%statekit app bank --partitions 4
(app.stream("accounts", value_serde="json")
    .group_by_key()
    .count(store="movements"))
"""),
    code("%statekit start bank --watch"),
    code("""
app.process_all_available()
print(f"{len(app.query_all('movements')):,} accounts in the store")
"""),
    md("""
## Crash 1: the process dies mid-batch

`--after 500` arms a crash: the first task of the instance to process 500 records of a batch kills
its own process. More movements arrive, the crash fires mid-batch, and with its only instance dead
the app stops (ERROR) until `restart`.
"""),
    code("%statekit crash bank --mode process --after 500"),
    code("""
%statekit produce accounts --generator accounts --seed 2 --limit 20000 --keys {KEYS} --wait
app.wait_for_state(["ERROR"], timeout=120)
print(app.state, "-", app.error)
"""),
    code("%statekit restart bank"),
    md("""
The crash hit before the batch committed: nothing of that batch reached the changelog or RocksDB,
so every checkpoint still matches its changelog end and the tasks reopen from their checkpoints with
nothing to replay. The engine hands the failed batch to the tasks again: same records, same batch id.
"""),
    code("""
app.process_all_available()
app.task_opens()[["task", "instance", "source", "restored", "last_batch", "open_ms"]]
"""),
    code("""
def check(expected):
    store = app.query_all("movements")
    actual = dict(zip(store["key"], store["value"]))
    bad = {k for k in set(actual) | set(expected) if actual.get(k) != expected.get(k)}
    assert not bad, f"{len(bad)} keys differ, e.g. {sorted(bad)[:5]}"
    return actual

expected.update(accounts_reference(seed=2, limit=20000, keys=KEYS)[0])
actual = check(expected)
print(f"after the process crash: {len(actual):,} accounts, {sum(actual.values()):,} movements, exactly as expected")
print("OK")
"""),
    md("""
## Crash 2: the disk is lost too

Before the crash, the **restore forecast**: for every task, how long a restore would take now (the
records in its compacted changelog, the apply rate measured so far). Then the instance dies while
idle and its state directory is deleted: its tasks have nothing local left and restore from the
beginning of their changelogs. The dashboard above follows it: every task queued with its records
to replay, then restoring (progress, records/s, ETA), then done with its time.
"""),
    code(FORECAST),
    code("""
%statekit crash bank --mode disk-loss
%statekit produce accounts --generator accounts --seed 3 --limit 20000 --keys {KEYS} --wait
%statekit restart bank
"""),
    code("""
app.process_all_available()
expected.update(accounts_reference(seed=3, limit=20000, keys=KEYS)[0])
actual = check(expected)
print(f"after the disk loss: {len(actual):,} accounts, {sum(actual.values()):,} movements, exactly as expected")
print("OK")
"""),
    code(RESTORE_REPORT),
    code("%statekit stop bank"),
    DOWN,
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
app.process_all_available();
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
    ["topic", "partition", "high_watermark", "segments", "records", "dirty_ratio", "cleaner_runs", "records_removed"]]
"""),
    code("%statekit topics temps"),
    md("""
Now lose the instance's disk and restart: every task restores from scratch, then a few new readings
follow.
"""),
    code("""
from statekit import datagen
%statekit crash temps --mode disk-loss
%statekit restart temps --no-watch
new = list(datagen.generate("sensors", seed=101, limit=20))
datagen.produce("sensors", new, partitions=2)
app.process_all_available()
rs = app.restore_summary()
rs = rs[rs["generation"] == rs["generation"].max()].copy()
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
them a second one, in two micro-batches: two commits, so the changelog gets a record per account
and then one more per account moved again — 3 million records for 2.5 million live keys, until the
cleaner keeps only the latest of each.
"""),
    code("""
import os
from statekit.datagen import accounts_reference
KEYS = int(os.environ.get("STATEKIT_TOUR_KEYS", "RESTORE_TOUR_KEYS"))
MOVES = KEYS + KEYS // 5
%statekit produce ledger --generator accounts --seed 21 --limit {MOVES} --keys {KEYS} --wait
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
app.process_all_available()
stats = broker.request_clean(os.path.join(home, "broker"))
cl = pd.DataFrame([s for s in stats if s["topic"] == "bank-movements-changelog"])
cl[["partition", "high_watermark", "segments", "records", "cleaner_runs", "records_removed"]]
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
app.process_all_available()
"""),
    code(RESTORE_REPORT),
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

The same 1,000 words run through four configurations; we count the changelog records each wrote.
"""),
    SETUP,
    code("%statekit produce words --generator words --limit 1000 --wait"),
    code("""
import time
import pandas as pd
import statekit
from statekit.kafka import Kafka

results = []

def run(label, name, cache_bytes, per_batch):
    a = statekit.App(name, partitions=2, cache_bytes=cache_bytes)
    a.stream("words", value_serde="json").group_by_key().count(store="counts")
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
    results.append({"config": label, "records per batch": per_batch, "micro-batches (commits)": commits,
                    "changelog records": sum(ends.values()),
                    "changelog records per commit": round(sum(ends.values()) / max(1, 2 * commits), 1),
                    "seconds": round(seconds, 1)})
"""),
    code("""
run("no cache, 250 per batch", "nocache", 0, 250)
run("cache, 100 per batch", "cache100", 10 << 20, 100)
run("cache, 250 per batch", "cache250", 10 << 20, 250)
run("cache, 1000 per batch", "cache1000", 10 << 20, 1000)
df = pd.DataFrame(results).set_index("config")
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
]

# ---------------------------------------------------------------------------------------------
NOTEBOOKS["05_standby_replicas"] = [
    md("""
# 05 · Standby replicas and failover

A **standby replica** is a restore that never stops: another instance tails each task's changelog
into its own copy of the store. When the active instance dies — here with its disk — its tasks move
to the instance holding their standbys, which is **promoted**: it replays only what it had not
applied yet, not the whole changelog. The other instance never stops processing.
"""),
    SETUP,
    code(ACCOUNTS),
    code("""
%%statekit app pages --partitions 4 --instances 2 --standby 1
(app.stream("accounts", value_serde="json")
    .group_by_key()
    .count(store="movements"))
"""),
    code("""
%statekit start pages
app.process_all_available()
%statekit instances pages
"""),
    md("""
Every task is active on one instance and has a standby on the other. The lag table has a row per
copy: a standby's lag is what its promotion would replay.
"""),
    code("""
import time
deadline = time.time() + 60
while time.time() < deadline:   # the standbys tail the changelogs: wait until they have caught up
    lag = app.lag()
    if (lag[lag.role == "standby"].lag == 0).all():
        break
    time.sleep(0.5)
lag
"""),
    code("%statekit watch pages"),
    md("""
## Instance 0 dies with its disk, while movements keep coming

A producer writes 4,000 more movements at 800 a second in the background. Two seconds in, instance
0 dies and loses its disk. Instance 1 promotes the standbys of instance 0's tasks and carries on; the
dashboard's input rate never drops to zero, the ownership timeline shows the move.
"""),
    code(FORECAST),
    code("""
%statekit produce accounts --generator accounts --seed 5 --limit 4000 --keys {KEYS} --rate 800/s
time.sleep(2)
%statekit crash pages --mode disk-loss --instance 0
"""),
    code("""
import kernel_ext
while kernel_ext.session().producers["accounts"].running:
    time.sleep(0.5)
app.process_all_available()
died = app.events(types="instance_died")[-1]
promoted = app.events(types="standby_promoted", since=died.ts)
opens = app.task_opens()
opens = opens[opens.generation > died.generation]   # the openings the death caused
print(f"instance {died.instance} died holding {', '.join(died.tasks)}; promoted on instance 1: "
      f"{', '.join(f'{e.task} (lag {e.lag})' for e in promoted)}")
opens[["task", "instance", "source", "restored", "open_ms"]]
"""),
    md("""
The promoted tasks replayed only their standby's lag — a few records — where a restore from
scratch replays the whole changelog (notebook 02). Now bring instance 0 back, with an empty disk: it
gets standbys again, and warmup replicas for the tasks that should move back to it once they have
caught up.
"""),
    code("%statekit revive pages --instance 0 --no-disk"),
    code("""
time.sleep(3)
app.process_all_available()
%statekit instances pages
"""),
    code("""
expected.update(accounts_reference(seed=5, limit=4000, keys=KEYS)[0])
store = app.query_all("movements")
actual = dict(zip(store["key"], store["value"]))
assert actual == dict(expected), f"{len(set(actual.items()) ^ set(expected.items()))} keys differ"
assert all(e.role == "standby" for e in promoted) and len(promoted) == len(died.tasks)
print(f"{len(actual):,} accounts; the failover lost nothing and replayed "
      f"{sum(e.lag or 0 for e in promoted)} record(s) instead of the whole changelog")
print("OK")
"""),
    code("%statekit stop pages"),
    DOWN,
]

# ---------------------------------------------------------------------------------------------
NOTEBOOKS["06_windowed_aggregation"] = [
    md("""
# 06 · Windowed aggregation

Counts per user in **tumbling one-second windows** of the record timestamps. The store is a window
store (key + window start); its changelog is `compact,delete`, so old windows expire.
"""),
    SETUP,
    code("%statekit produce clicks --generator clicks --limit 1200 --rate 600/s --wait"),
    code("""
%%statekit app windows --partitions 2
from statekit.topology import tumbling
(app.stream("clicks", value_serde="json")
    .group_by_key()
    .windowed_by(tumbling(1000), grace_ms=60_000)
    .count(store="per-second"))
"""),
    code("""
%statekit start windows
app.process_all_available();
"""),
    code("""
from collections import Counter
from statekit.kafka import Kafka

k = Kafka()
expected = Counter()
for p in range(k.topics()["clicks"]):
    for chunk in k.read("clicks", p):
        for off, ts, key, value, headers in chunk.records:
            expected[(key.decode(), ts - ts % 1000)] += 1
k.close()
users = sorted({u for u, _ in expected})
t_lo = min(w for _, w in expected); t_hi = max(w for _, w in expected)
actual = Counter()
for u in users:
    for start, n in app.query_window("per-second", u, t_lo, t_hi):
        actual[(u, start)] = n
assert actual == expected, f"{len(set(actual.items()) ^ set(expected.items()))} windows differ"
print(f"{len(actual)} (user, second) windows match")
print("OK")
"""),
    code("""
import pandas as pd
per_window = Counter()
for (u, w), n in actual.items():
    per_window[w] += n
series = pd.Series(per_window).sort_index()
series.index = [pd.Timestamp(ms, unit="ms").strftime("%H:%M:%S") for ms in series.index]
ax = series.plot.bar(figsize=(6, 2.4), color="#4C72B0", rot=0)
ax.set_title("clicks per one-second window (sum over users, from the window store)", loc="left", fontsize=10)
for s in ("top", "right"):
    ax.spines[s].set_visible(False)
"""),
    md("""
The same read from the magic: `%statekit query APP STORE KEY` on a window store gives the key's
windows (`--from MS --to MS` to narrow them by start time).
"""),
    code("""
top = max(users, key=lambda u: sum(n for (x, _), n in actual.items() if x == u))
%statekit query windows per-second {top} --limit 10
"""),
    code("%statekit stop windows"),
    DOWN,
]

# ---------------------------------------------------------------------------------------------
NOTEBOOKS["07_interactive_queries"] = [
    md("""
# 07 · Interactive queries

The store can be read while the query runs: a key is routed to its task with the same partitioner the
shuffle uses (Kafka's murmur2), and the task's RocksDB is read through a secondary instance.
"""),
    SETUP,
    code("%statekit produce words --from ../sample_data/words.jsonl --wait"),
    code("""
%%statekit app iq --partitions 4 --instances 2
(app.stream("words", value_serde="json")
    .group_by_key()
    .count(store="counts"))
"""),
    code("""
%statekit start iq
app.process_all_available();
"""),
    code("""
owner = app.key_owner("counts", "record")
print("key 'record' lives in", owner)
%statekit query iq counts record
%statekit query iq counts --range a d
"""),
    code("%statekit query iq counts --all --limit 10"),
    code("""
from collections import Counter
from statekit.datagen import read_jsonl
from statekit.partition import partition_for
expected = Counter(r.key for r in read_jsonl("../sample_data/words.jsonl"))
assert all(app.query("counts", w) == n for w, n in expected.items())
assert app.key_owner("counts", "record").task.partition == partition_for(b"record", 4)
rng = dict(app.query_range("counts", "a", "d"))
assert rng == {w: n for w, n in expected.items() if "a" <= w <= "d"}
print("OK")
"""),
    code("%statekit stop iq"),
    DOWN,
]

# ---------------------------------------------------------------------------------------------
NOTEBOOKS["08_processor_api"] = [
    md("""
# 08 · Prototyping a topology with the processor API

When the DSL is not enough, a processor sees every record and reads and writes its stores itself.
This one keeps, per user, the number of clicks and the last page, and forwards a record each time a
user reaches a new page.
"""),
    SETUP,
    code("%statekit produce clicks --from ../sample_data/clicks.jsonl --wait"),
    code("""
%%statekit app journeys --partitions 2
from statekit.topology import Processor, kv_store

class Journey(Processor):
    def init(self, context):
        self.context = context
        self.store = context.get_store("journeys")

    def process(self, key, value):
        j = self.store.get(key) or {"clicks": 0, "last_page": None, "pages": 0}
        j["clicks"] += 1
        if value["page"] != j["last_page"]:
            j["pages"] += 1
            j["last_page"] = value["page"]
            self.context.forward(key, value["page"])
        self.store.put(key, j)

(app.stream("clicks", value_serde="json")
    .process(Journey, stores=[kv_store("journeys")]))
"""),
    code("""
%statekit start journeys
app.process_all_available()
%statekit query journeys journeys u0001
"""),
    code("""
from statekit.datagen import read_jsonl
ref = {}
for r in read_jsonl("../sample_data/clicks.jsonl"):
    j = ref.setdefault(r.key, {"clicks": 0, "last_page": None, "pages": 0})
    j["clicks"] += 1
    if r.value["page"] != j["last_page"]:
        j["pages"] += 1
        j["last_page"] = r.value["page"]
store = app.query_all("journeys")
actual = dict(zip(store["key"], store["value"]))
assert actual == ref
print(f"{len(actual)} users' journeys match")
print("OK")
"""),
    code("%statekit stop journeys"),
    DOWN,
]

# ---------------------------------------------------------------------------------------------
NOTEBOOKS["10_rebalancing"] = [
    md("""
# 10 · Rebalancing: instances that come and go while the work goes on

An application runs as several **instances** — here three processes, each with its own state
directory — and the **tasks** are spread over them. When one dies, a **rebalance** moves its tasks
to the others: to the instance holding a **standby** copy first (a promotion replays only its lag),
else restoring from the changelog. Meanwhile the other instances keep processing their own tasks.

When an instance joins, tasks are not moved to it cold: the assignor (Kafka Streams'
high-availability assignor) first gives it a **warmup replica** of a task; the old owner keeps
processing until the warmup is within `acceptable.recovery.lag` of the changelog end, and a
**probing rebalance** then moves the task.
"""),
    SETUP,
    code(ACCOUNTS),
    code("""
%%statekit app rb --partitions 6 --instances 3 --standby 1 --probing-interval 4
(app.stream("accounts", value_serde="json")
    .group_by_key()
    .count(store="movements"))
"""),
    code("""
%statekit start rb
app.process_all_available()
%statekit instances rb
"""),
    code("%statekit watch rb"),
    md("""
## Kill an instance while records flow

A producer writes 9,000 movements at 300 a second (half a minute) in the background. Ten seconds
in, instance 1 is killed. Watch the dashboard: the input rate stays up, instances 0 and 2 keep
committing, and instance 1's tasks move — the ownership timeline changes colour, with a promotion
marker where a standby took over.
"""),
    code("""
import time
import kernel_ext
%statekit produce accounts --generator accounts --seed 11 --limit 9000 --keys {KEYS} --rate 300/s
time.sleep(10)
%statekit kill rb --instance 1
"""),
    code("""
time.sleep(8)
kill = app.events(types="instance_died")[-1]
commits = app.events(types="commit", since=kill.ts - 8)

def committed(lo, hi):   # records the survivors committed between kill + lo and kill + hi seconds
    return {i: sum(e.records for e in commits if e.instance == i and lo <= e.ts - kill.ts < hi)
            for i in (0, 2)}

print("records committed by instances 0 and 2 in the 8 s before the kill:", committed(-8, 0))
print("... and in the 8 s after it:                                   ", committed(0, 8))
moves = [m for r in app.rebalances if r["generation"] > kill.generation for m in r["moves"]]
print("moves:", ", ".join(f"{m['task']} {m['from']}→{m['to']} ({m['reason']})" for m in moves))
"""),
    md("""
## Bring it back, then add a fourth instance

`revive` starts instance 1 again with its disk: its old task directories are copies a little
behind, so the assignor gives it warmups and moves tasks back once they have caught up. Then a new
instance joins with an empty disk: a warmup replica catches up there before any task moves to it.
"""),
    code("""
%statekit revive rb --instance 1
time.sleep(6)
%statekit add-instance rb
"""),
    code("""
joined = app.events(types="instance_started")[-1]
deadline = time.time() + 90
while time.time() < deadline:   # until a task moved to the new instance
    if any(m["to"] == joined.instance for r in app.rebalances for m in r["moves"]):
        break
    time.sleep(0.5)
while kernel_ext.session().producers["accounts"].running:
    time.sleep(0.5)
app.process_all_available()
import pandas as pd
story = pd.DataFrame([
    {"type": e.type, "task": e.get("task") or "", "instance": "" if e.type == "rebalance" else e.instance,
     "role": e.get("role") or "", "generation": e.generation, "reason": e.get("reason") or ""}
    for e in app.events(since=joined.ts, types=["replica_started", "warmup_caught_up", "rebalance",
                                                "task_opened"])
    if e.type == "rebalance" or e.get("instance") == joined.instance])
story.head(12)
"""),
    code("%statekit instances rb"),
    md("""
## Check

The store holds exactly what a plain-Python count gives, whatever moved where; and the new
instance's first task came to it only after its warmup had caught up.
"""),
    code("""
expected.update(accounts_reference(seed=11, limit=9000, keys=KEYS)[0])
store = app.query_all("movements")
actual = dict(zip(store["key"], store["value"]))
assert actual == dict(expected), f"{len(set(actual.items()) ^ set(expected.items()))} keys differ"
evs = app.events(since=joined.ts)
first_move = next(r for r in app.rebalances if any(m["to"] == joined.instance for m in r["moves"]))
moved = [m["task"] for m in first_move["moves"] if m["to"] == joined.instance]
caught = [e for e in evs if e.type == "warmup_caught_up" and e.instance == joined.instance]
warm = [e for e in evs if e.type == "replica_started" and e.instance == joined.instance and e.role == "warmup"]
assert all(any(w.task == t for w in warm) and any(c.task == t for c in caught) for t in moved)
assert all(m["reason"] == "warmup-caught-up" for m in first_move["moves"] if m["to"] == joined.instance)
print(f"{len(actual):,} accounts counted exactly; tasks {', '.join(moved)} moved to instance "
      f"{joined.instance} after their warmup caught up")
print("OK")
"""),
    code("%statekit stop rb"),
    DOWN,
]


def build(names=None) -> list[str]:
    paths = []
    for name, cells in NOTEBOOKS.items():
        if names and name not in names:
            continue
        nb = new_notebook(cells=cells)
        nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)",
                                     "language": "python"}
        nb.metadata["language_info"] = {"name": "python"}
        for i, c in enumerate(nb.cells):  # stable ids: a rebuild changes nothing unless a cell did
            c["id"] = f"{name[:2]}-{i:02d}"
        path = os.path.join(HERE, f"{name}.ipynb")
        nbformat.validate(nb)
        with open(path, "w", encoding="utf-8") as f:
            nbformat.write(nb, f)
        paths.append(path)
    return paths


if __name__ == "__main__":
    for p in build(sys.argv[1:] or None):
        print(p)
