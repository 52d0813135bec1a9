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

* **process**: the worker dies mid-batch (a real `SIGKILL`); its state directory survives. On restart,
  each task restores from its **checkpoint** to the changelog end: only the tail is replayed.
* **disk-loss**: the worker dies *and* its state directory is deleted. On restart the tasks restore
  from **scratch**: the whole (compacted) changelog is replayed.

Either way the counts come back exactly: nothing lost, nothing counted twice. A reference computed
in plain Python checks it.
"""),
    SETUP,
    code("%statekit produce words --from ../sample_data/words.jsonl --wait"),
    code("""
%%statekit app wc --partitions 4 --instances 2
(app.stream("words", value_serde="json")
    .group_by_key()
    .count(store="counts"))
"""),
    code("""
%statekit start wc --max-records 400
app.process_all_available()
%statekit lag wc
"""),
    md("""
## Crash 1: the process dies mid-batch

`--after 40` arms a crash: the first task on instance 0 to process 40 records of a batch kills its own
Python worker. Then more data arrives, the crash fires mid-batch and the query fails.
"""),
    code("%statekit crash wc --mode process --instance 0 --after 40"),
    code("""
%statekit produce words --generator words --seed 1 --limit 1000 --wait
app.wait_for_state(["ERROR", "NOT_RUNNING"], timeout=120)
print(app.state, "-", app.error)
"""),
    code("%statekit restart wc"),
    md("""
The crash hit before the batch committed: nothing of that batch reached the changelog or RocksDB,
so every checkpoint still matches its changelog end and the tasks reopen from their checkpoints with
nothing to replay. Spark re-runs the failed batch (same offsets, same batch id).
"""),
    code("""
app.process_all_available()
opened = app.events_frame(types="task_opened")
opened = opened[opened["generation"] == opened["generation"].max()]
opened[["task", "instance", "replayed_from", "last_batch", "open_ms"]].drop_duplicates("task")
"""),
    code("""
from collections import Counter
from statekit.datagen import generate, read_jsonl

def check(expected):
    store = app.query_all("counts")
    actual = dict(zip(store["key"], store["value"]))
    bad = {k for k in set(actual) | set(expected) if actual.get(k) != expected.get(k)}
    assert not bad, f"{len(bad)} keys differ, e.g. {sorted(bad)[:5]}"
    return actual

expected = Counter(r.key for r in read_jsonl("../sample_data/words.jsonl"))
expected.update(r.key for r in generate("words", seed=1, limit=1000))
actual = check(expected)
print(f"after the process crash: {len(actual)} keys, {sum(actual.values())} records, exactly as expected")
print("OK")
"""),
    md("""
## Crash 2: the disk is lost too

Now instance 0 dies while idle and its state directory is deleted. Its tasks have nothing local
left: they restore from the beginning of their changelogs.
"""),
    code("%statekit crash wc --mode disk-loss --instance 0"),
    code("""
%statekit produce words --generator words --seed 2 --limit 500 --wait
%statekit restart wc
"""),
    code("""
app.process_all_available()
expected.update(r.key for r in generate("words", seed=2, limit=500))
actual = check(expected)
print(f"after the disk loss: {len(actual)} keys, {sum(actual.values())} records, exactly as expected")
print("OK")
"""),
    code("""
import kernel_ext
rs = app.restore_summary()
last = rs[rs["generation"] == rs["generation"].max()] if "generation" in rs else rs
cols = [c for c in ("task", "instance", "source", "records", "records_restored", "seconds") if c in last]
display(last[cols] if cols else last)
replayed = int(last[[c for c in ("records_restored", "records") if c in last][0]].sum()) if len(last) else 0
seconds = float(last["seconds"].max()) if "seconds" in last and len(last) else 0.0
kernel_ext.report("restore", restore_seconds=round(seconds, 3), records_replayed=replayed,
                  invariant="OK")
"""),
    code("%statekit stop wc"),
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
Now lose instance 0's disk and restart: every task restores from scratch. Tasks open (and restore)
in the first micro-batch after the restart, so a few new readings follow.
"""),
    code("""
from statekit import datagen
app.crash("disk-loss", instance=0)
%statekit restart temps
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
into its own copy of the store. When the active instance dies with its disk, the task moves to the
instance holding the standby and only replays the standby's lag, not the whole changelog.
"""),
    SETUP,
    code("%statekit produce clicks --from ../sample_data/clicks.jsonl --wait"),
    code("""
%%statekit app pages --partitions 4 --instances 2 --standby 1
(app.stream("clicks", value_serde="json")
    .group_by_key()
    .count(store="clicks-per-user"))
"""),
    code("""
%statekit start pages
app.process_all_available()
import time; time.sleep(2)  # let the standbys catch up
%statekit lag pages
"""),
    code("%statekit watch pages"),
    md("""
Instance 0 dies and loses its disk. On restart its tasks move to instance 1, which promotes its
standby copies: the promoted tasks replay only what the standbys had not applied yet. Tasks open in
the first micro-batch after the restart, so more clicks arrive.
"""),
    code("""
%statekit crash pages --mode disk-loss --instance 0
%statekit restart pages --no-watch
%statekit produce clicks --generator clicks --seed 5 --limit 200 --wait
app.process_all_available()
opened = app.events_frame(types="task_opened")
opened = opened[opened["generation"] == opened["generation"].max()].drop_duplicates("task")
opened[["task", "instance", "replayed_from", "last_batch", "open_ms"]]
"""),
    md("""
The promoted tasks opened on instance 1 from the standby copies (their checkpoints), with nothing or
almost nothing to replay; without standbys they would have restored their whole changelogs from
scratch (notebook 02). Instance 1 now runs every task; the standbys are back on instance 0.
"""),
    code("%statekit lag pages"),
    code("""
from collections import Counter
from statekit.datagen import generate, read_jsonl
expected = Counter(r.key for r in read_jsonl("../sample_data/clicks.jsonl"))
expected.update(r.key for r in generate("clicks", seed=5, limit=200))
store = app.query_all("clicks-per-user")
actual = dict(zip(store["key"], store["value"]))
assert actual == dict(expected)
print(f"{len(actual)} users, failover lost nothing")
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
assert app.key_owner("counts", "record").task == partition_for(b"record", 4)
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
