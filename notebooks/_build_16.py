"""Builds notebooks/16_when_kafka_goes_away.ipynb (unexecuted): the broker frozen, then killed and
started again, under an exactly-once app that rides it out.

    .venv/bin/python notebooks/_build.py 16_when_kafka_goes_away
"""
from __future__ import annotations

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from _cells import DOWN, SETUP, accounts, code, md  # noqa: E402

NOTEBOOKS: dict[str, list] = {}

NOTEBOOKS["16_when_kafka_goes_away"] = [
    md("""
# 16 · When Kafka goes away

Until now what failed was the application's side: instances crashed, disks were lost, and the
state came back from Kafka. This time **Kafka itself** goes away — the most ordinary fault a Kafka
application meets: a rolling restart, a broker failover, a laptop waking up. Kafka Streams rides it
out: its clients retry, and a task fails only after `task.timeout.ms` (five minutes by default,
KIP-572). statekit does the same: the app goes **WAITING** and says what for, a task whose commit
was cut off **aborts its transaction** and replays the micro-batch once Kafka is back, and then
everything **catches up** by itself — no `restart()`.

**What you will see:** movements counted into a Kafka topic, exactly-once, by two instances with a
standby each; the broker frozen for 10 seconds while movements keep coming — the app WAITING, the
outage as a band on the lag chart, the transactions that were open aborted, the catch-up after;
then the broker killed and started again on the same port; and a check that the counts lost
nothing and the output topic holds every count once.
"""),
    SETUP,
    accounts(default=40_000, partitions=2),
    md("""
`--task-timeout 60`: how long a task may wait for Kafka before the app gives up with an error
(Kafka Streams' `task.timeout.ms`). Requests time out after a tenth of it, 6 seconds here, so a
10-second freeze is long enough to cut a commit off. The counts go to the topic `movements-out`;
each commit of a task — its changelog records and its outputs — is one Kafka transaction.
"""),
    code("""
%%statekit app bounce --partitions 2 --instances 2 --standby 1 --task-timeout 60
(app.stream("accounts", value_serde="json")
    .group_by_key()
    .count(store="movements")
    .to_stream()
    .to("movements-out", value_serde="int64"))
"""),
    code("""
%statekit start bounce --watch
%statekit wait bounce
"""),
    md("""
## The broker stops answering for 10 seconds

`%statekit broker pause 10` freezes the embedded broker: nothing is read or answered, connections
stay open — as a long garbage-collection pause or a frozen virtual machine would. With
`--mid-transaction` the freeze begins just as a task's commit has sent its records, so a
transaction is caught open. A producer keeps writing 3,000 movements at 300 a second meanwhile
(it waits too). Watch the dashboard above: the badge turns WAITING and says since when, the lag
chart gets a band, and after the freeze the lag rises and falls again as the tasks catch up.
"""),
    code("""
import time
%statekit produce accounts --generator accounts --seed 7 --limit 3000 --keys {KEYS} --rate 300/s
time.sleep(2)
%statekit broker pause 10 --mid-transaction
time.sleep(8)
print(app.state, "·", app.waiting)
"""),
    code("""
%statekit wait bounce
back = app.wait_for_event(lambda e: e.type == "kafka_available", 180)
print(f"Kafka was away {back.seconds:.1f} s; {back.aborted} transaction(s) aborted; "
      f"tasks that waited: {', '.join(back.tasks_waited) or 'none'}")
for e in app.events(types=["task_waiting", "task_resumed"], since=back.since - 1):
    if e.type == "task_waiting":
        print(f"  task {e.task} on instance {e.instance} waited for Kafka from batch {e.batch}: {e.error[:70]}")
    else:
        print(f"  task {e.task} reopened after {e.waited_s:.1f} s; its batch replays "
              f"({e.aborted} transaction(s) aborted)")
"""),
    md("""
A commit that was on its way when the broker froze timed out: the task closed its state without
committing (RocksDB only ever holds whole commits), put the micro-batch back in its spool, and
reopened once Kafka answered. Reopening the task's producer aborted the transaction it had left
open — its records never count for a read_committed reader — and the batch ran again. Meanwhile the
standbys simply waited, and the events of the outage reached the app's events topic once the broker
was back.

## The broker is killed and started again

Now a harder fault: `kill -9`, three seconds of nothing, and a new broker process on the same
directory and port. Its logs, its transactions and its topics survive the crash; the clients'
connections do not, and they reconnect.
"""),
    code("""
%statekit produce accounts --generator accounts --seed 8 --limit 2000 --keys {KEYS} --wait
%statekit broker restart --down 3
%statekit wait bounce
again = app.wait_for_event(lambda e: e.type == "kafka_available" and e.ts > back.ts, 180)
print(f"Kafka was away {again.seconds:.1f} s this time; {again.aborted} transaction(s) aborted; "
      f"the app is {app.wait_for_state('RUNNING', 60)} again, without a restart()")
"""),
    md("""
## Check

The store must hold exactly what a plain-Python count of every movement gives, and the output
topic, read as a read_committed consumer reads it, must hold each account's counts once: they only
ever grow, and the last one is the count.
"""),
    code("""
import struct
from statekit.kafka import Kafka

expected.update(accounts_reference(seed=7, limit=3000, keys=KEYS)[0])
expected.update(accounts_reference(seed=8, limit=2000, keys=KEYS)[0])
store = app.query_all("movements")
actual = dict(zip(store["key"], store["value"]))
assert actual == dict(expected), f"{len(set(actual.items()) ^ set(expected.items()))} keys differ"
out = {}
with Kafka(app.bootstrap) as k:
    for p, end in k.end_offsets("movements-out", None, "read_committed").items():
        for chunk in k.read("movements-out", p, None, end, isolation="read_committed"):
            for _o, _t, key, value, _h in chunk.records:
                out.setdefault(key.decode(), []).append(struct.unpack(">q", value)[0])
doubled = [key for key, counts in out.items() if any(b <= a for a, b in zip(counts, counts[1:]))]
assert not doubled, f"{len(doubled)} accounts have a count written twice"
assert {key: counts[-1] for key, counts in out.items()} == dict(expected)
assert app.restarts == [] and app.error is None
print(f"{len(actual):,} accounts: nothing lost, no count written twice, no restart()")
print("OK")
"""),
    code("%statekit stop bounce"),
    DOWN,
    md("""
## What happened

While the broker was frozen, every request went unanswered: the app's probe noticed within seconds
(WAITING, "waiting for Kafka at … since …"), and the commits that were on their way timed out. Each
such task dropped its uncommitted work, kept the micro-batch in its spool and tried again with
growing pauses; its transaction was aborted when it reopened, and the batch ran again — so the
output topic got those counts once, not twice. When the broker was killed and restarted, the same
happened through closed connections. Had Kafka stayed away longer than `--task-timeout`, the app
would have gone to ERROR with one line saying so, and `%statekit restart bounce` would have brought
it back.
"""),
]
