"""Builds notebooks 06, 07, 08 and 10 of the guided tour (unexecuted), with the cell helpers of
_cells.py.

    .venv/bin/python notebooks/_build.py 06_windowed_aggregation 10_rebalancing
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _cells import DOWN, SETUP, accounts, code, md  # noqa: E402

NOTEBOOKS: dict[str, list] = {}

# ---------------------------------------------------------------------------------------------
NOTEBOOKS["06_windowed_aggregation"] = [
    md("""
# 06 · Windowed aggregation

Counts per user in **tumbling one-second windows** of the record timestamps. The store is a window
store (key + window start); its changelog is `compact,delete`, so old windows expire.

**What you will see:** two seconds of clicks, counted per user and per second; every window read
back from the store and checked against a count of the topic's records; a chart of the clicks per
second; and one user's windows from the magic.
"""),
    SETUP,
    code("%statekit produce clicks --generator clicks --limit 1200 --rate 600/s --partitions 2 --wait"),
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
%statekit wait windows
"""),
    md("""
The reference: read the topic back and count its records per user and per second of their
timestamps. Then every (user, second) window of the store must hold the same count.
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
print(f"{len(actual)} (user, second) windows match a plain count of the topic")
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
    md("""
## What happened

Each click landed in the one-second window of its timestamp, per user: the store's key is the user
and the window's start. The counts read back window by window were exactly those of the topic's
records, and a window store answers "this user, between these times" with one query.
"""),
]

# ---------------------------------------------------------------------------------------------
NOTEBOOKS["07_interactive_queries"] = [
    md("""
# 07 · Interactive queries

The store can be read while the query runs: a key is routed to its task with the same partitioner the
shuffle uses (Kafka's murmur2), and the task's RocksDB is read through a secondary instance.

**What you will see:** a word count on two instances; which task and instance hold a key; one key,
a range of keys and the whole store read while the app runs, and checked against plain Python; then
a key queried while its store is rebuilt after a crash — the restore held halfway until you let it
go: refused, read stale with its lag, read current once the restore is done.
"""),
    SETUP,
    code("%statekit produce words --from ../sample_data/words.jsonl --partitions 4 --wait"),
    code("""
%%statekit app iq --partitions 4 --instances 2
(app.stream("words", value_serde="json")
    .group_by_key()
    .count(store="counts"))
"""),
    code("""
%statekit start iq
%statekit wait iq
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
print(f"every one of the {len(expected)} words reads back its plain-Python count; the range a..d too")
print("OK")
"""),
    md("""
## A query while a store restores

A store that is being rebuilt from its changelog is not the store yet: read halfway, it would answer
`None` for a word it has not got back yet. So a query (`stale=False`, the default) answers only from
a copy that holds every commit made before the call. When there is none it waits for one (`wait=`
seconds, 5 by default) or says in one line why not: the task, its state (restoring, moving, owner
dead) and how many changelog records it is behind. `stale=True` answers at once from the freshest
copy there is, and `with_lag=True` says which copy that was and how far behind it is.

Both instances crash and lose their disks; the restart brings them back empty, and every task
replays its whole changelog, throttled to 10 records a second. So that there is time to ask, however
long you take to read, the restore of the word's task **waits for you** halfway through its changelog
(`app.hold_restores`) until you let it go (`app.release_restores()`, three cells down).
"""),
    code("""
word_task = app.key_owner("counts", "record").task
app.hold_restores(word_task, at=0.5)
%statekit crash iq --mode disk-loss --instance 0
%statekit crash iq --mode disk-loss --instance 1
%statekit restart iq --restore-rate 10/s --no-watch
"""),
    md("""
Ask now, without waiting (`wait=0`): the store of the word's task is still being rebuilt.
"""),
    code("""
from statekit.errors import StaleRead

try:
    print("current:", app.query("counts", "record", wait=0))
except StaleRead as refusal:
    print(refusal)
"""),
    md("""
The freshest copy there is, read anyway: its value, and how far behind it is (`wait=10`: if the
restarted instance has not yet opened an empty store to restore into, give it up to 10 s). Half of
the task's changelog is in it: the count may be short, or not there yet. The magic reads the same
way and says the same.
"""),
    code("""
answer = app.query("counts", "record", stale=True, wait=10, with_lag=True)
print(answer.value, "from", answer.copy)
%statekit query iq counts record
"""),
    md("""
Now let the restore go on, and let the query wait for it (up to a minute): the answer is current
again.
"""),
    code("""
app.release_restores()
answer = app.query("counts", "record", wait=60, with_lag=True)
print(answer.value, "from", answer.copy)
assert answer.current and answer.value == expected["record"]
"""),
    code("%statekit stop iq"),
    DOWN,
    md("""
## What happened

A key's task is fixed by hashing the key, the same way the records were partitioned, so a query for
one key goes straight to the one task (and instance) that holds it; a range or the whole store asks
every task. The answers came from the live RocksDB stores while the app ran. While a store was
rebuilt from its changelog (held halfway for as long as you read), a query did not pretend: it
refused, naming the task, its state and its lag; read stale, it said how far behind its copy was;
once the restore was let go and done, it answered the count plain Python counts.
"""),
]

# ---------------------------------------------------------------------------------------------
NOTEBOOKS["08_processor_api"] = [
    md("""
# 08 · Prototyping a topology with the processor API

When the DSL is not enough, a processor sees every record and reads and writes its stores itself.
This one keeps, per user, the number of clicks and the last page, and forwards a record each time a
user reaches a new page.

**What you will see:** a processor class in an app cell, its store read back for one user, and
every user's journey checked against the same logic in plain Python.
"""),
    SETUP,
    code("%statekit produce clicks --from ../sample_data/clicks.jsonl --partitions 2 --wait"),
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
%statekit wait journeys
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
print(f"{len(actual)} users' journeys match the same logic run in plain Python")
print("OK")
"""),
    code("%statekit stop journeys"),
    DOWN,
    md("""
## What happened

The processor ran once per record, in each user's order, and kept its own state in a store that
has a changelog like any other: the same crash and restore story as the DSL's counts applies to it.
"""),
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

**What you will see:** a million accounts in six tasks on three instances; instance 1 killed while
movements flow, and a chart of what each instance committed before and after; instance 1 back and a
fourth instance joining, told as the story of its warmup; and a check that nothing was lost.
"""),
    SETUP,
    accounts(partitions=6),
    code("""
%%statekit app rb --partitions 6 --instances 3 --standby 1 --probing-interval 4
(app.stream("accounts", value_serde="json")
    .group_by_key()
    .count(store="movements"))
"""),
    code("""
%statekit start rb --watch
%statekit wait rb
"""),
    code("%statekit instances rb"),
    md("""
## Kill an instance while records flow

A producer writes 9,000 movements at 300 a second (half a minute) in the background. Once the
instances have committed 1,500 of them, instance 1 is killed. Watch the dashboard above: instances
0 and 2 keep committing, and instance 1's tasks move — the ownership timeline changes colour, with
a promotion marker where a standby took over.
"""),
    code("""
import time
%statekit produce accounts --generator accounts --seed 11 --limit 9000 --keys {KEYS} --rate 300/s
t0 = time.time()
print("waiting until the instances have committed 1,500 of the new movements…")
while sum(e.records for e in app.events(types="commit", since=t0)) < 1500:
    time.sleep(0.2)
%statekit kill rb --instance 1
"""),
    md("""
Eight seconds later, what did each instance commit since the producer started? Instance 1's line
stops at the kill. The grey line, all instances together, stands still for a moment at the kill —
the micro-batch in flight waits until the dead instance's part of it is set aside for its tasks' new
owners, and the next one waits for it — then rises again at the pace of the input, instances 0 and 2
now doing instance 1's share too. The cell says how long the pause lasted.
"""),
    code("""
import matplotlib.pyplot as plt

print("letting the two survivors work for 8 s…")
time.sleep(8)
kill = app.last_event("instance_died")
commits = [e for e in app.events(types="commit", since=t0) if e.records]
fig, ax = plt.subplots(figsize=(7, 2.6))
for i, colour in ((0, "#4C72B0"), (1, "#C44E52"), (2, "#55A868")):
    t, total = [0.0], [0]
    for e in sorted((e for e in commits if e.instance == i), key=lambda e: e.ts):
        t.append(e.ts - t0)
        total.append(total[-1] + e.records)
    t.append(time.time() - t0 if i != 1 else max(t[-1], kill.ts - t0))
    total.append(total[-1])
    ax.step(t, total, where="post", color=colour, label=f"instance {i}")
t, total = [0.0], [0]
for e in sorted(commits, key=lambda e: e.ts):
    t.append(e.ts - t0)
    total.append(total[-1] + e.records)
ax.step(t + [time.time() - t0], total + total[-1:], where="post", color="#999", label="all instances")
ax.axvline(kill.ts - t0, color="#333", linestyle="--", linewidth=1)
ax.annotate("instance 1 killed", (kill.ts - t0, 0), xytext=(4, 4), textcoords="offset points", fontsize=8)
ax.set_xlabel("seconds since the producer started")
ax.set_ylabel("records committed")
ax.set_title("records committed by each instance", loc="left", fontsize=10)
ax.legend(fontsize=8, frameon=False, loc="upper left")
for s in ("top", "right"):
    ax.spines[s].set_visible(False)
plt.show()
after = sum(e.records for e in commits if e.ts >= kill.ts and e.instance in (0, 2))
moves = [m for r in app.rebalances if r["generation"] > kill.generation for m in r["moves"]]
around = sorted(e.ts for e in commits if kill.ts - 2 <= e.ts)
pause = max((b - a for a, b in zip(around, around[1:]) if b >= kill.ts), default=0.0)
print(f"the commits of all instances paused {pause:.1f} s at the kill, then went on")
print(f"since the kill, instances 0 and 2 committed {after:,} records; the kill moved "
      + ", ".join(f"{m['task']} from instance {m['from']} to {m['to']}" for m in moves))
"""),
    md("""
## Bring it back, then add a fourth instance

`revive` starts instance 1 again with its disk: its old task directories are copies a little
behind, so the assignor gives it warmups and moves tasks back once they have caught up. Then a new
instance joins with an empty disk: a warmup replica catches up there before any task moves to it.
"""),
    code("""
%statekit revive rb --instance 1
time.sleep(6)   # a few seconds for instance 1's warmups
%statekit add-instance rb
"""),
    code("""
joined = app.last_event("instance_started")
print(f"waiting until a task has moved to instance {joined.instance} (its warmup must catch up first)…")
deadline = time.time() + 120
while time.time() < deadline and not any(m["to"] == joined.instance for r in app.rebalances for m in r["moves"]):
    time.sleep(0.5)
%statekit wait rb
"""),
    md("Instance 3's story, from the app's events:"),
    code("""
for e in app.events(since=joined.ts, types=["replica_started", "warmup_caught_up", "rebalance", "task_opened"]):
    if e.type == "rebalance":
        mine = [f"{m['task']} {m['from']}→{m['to']}" for m in e.moves if m["to"] == joined.instance]
        print(f"generation {e.generation}: rebalance ({e.reason})" + (f": moved {', '.join(mine)}" if mine else ""))
    elif e.instance == joined.instance and e.type == "replica_started":
        print(f"generation {e.generation}: a {e.role} replica of {e.task} started on instance {e.instance}")
    elif e.instance == joined.instance and e.type == "warmup_caught_up":
        print(f"generation {e.generation}: the warmup of {e.task} caught up ({e.lag:,} records behind)")
    elif e.instance == joined.instance:
        print(f"generation {e.generation}: task {e.task} opened on instance {e.instance}, from its {e.source}")
"""),
    code("%statekit instances rb"),
    md("""
## Check

The store holds exactly what a plain-Python count gives, whatever moved where; and the new
instance's first task came to it only after its warmup had caught up.
"""),
    code("""
expected_now = expected + Counter(accounts_reference(seed=11, limit=9000, keys=KEYS)[0])
store = app.query_all("movements")
actual = dict(zip(store["key"], store["value"]))
assert actual == dict(expected_now), f"{len(set(actual.items()) ^ set(expected_now.items()))} keys differ"
evs = app.events(since=joined.ts)
first_move = next(r for r in app.rebalances if any(m["to"] == joined.instance for m in r["moves"]))
moved = [m["task"] for m in first_move["moves"] if m["to"] == joined.instance]
caught = [e for e in evs if e.type == "warmup_caught_up" and e.instance == joined.instance]
warm = [e for e in evs if e.type == "replica_started" and e.instance == joined.instance and e.role == "warmup"]
assert all(any(w.task == t for w in warm) and any(c.task == t for c in caught) for t in moved)
assert all(m["reason"] == "warmup-caught-up" for m in first_move["moves"] if m["to"] == joined.instance)
print(f"{len(actual):,} accounts counted exactly; {', '.join(moved)} moved to instance "
      f"{joined.instance} only after {'its warmup' if len(moved) == 1 else 'their warmups'} caught up")
print("OK")
"""),
    code("%statekit stop rb"),
    DOWN,
    md("""
## What happened

When instance 1 was killed, its tasks went to the instances holding their standbys, and those two
instances kept committing the movements that kept arriving — the kill cost a promotion and a pause
of a moment while the micro-batch in flight was handed over, not a restore. Instance 1 came back with a stale disk and the new instance 3 with none; neither got a task
before a warmup replica had caught up on it, so no task ever moved to a copy far behind. The store
matched plain Python after all of it.
"""),
]
