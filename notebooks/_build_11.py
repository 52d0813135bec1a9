"""Builds notebooks/11_joins_sessions_final_results.ipynb (unexecuted).

    .venv/bin/python notebooks/_build_11.py

Kept apart from _build.py (the tour's other notebooks) and self-contained (its own cell helpers,
the same house style: what you will see, a clean slate with `%statekit up --fresh`, checks against
plain Python that print OK, `%statekit down`, what happened). `PER_MINUTE` is the chart's data,
kept apart so that a test runs it on several pages per minute (tests/notebook/test_notebooks.py).
"""
from __future__ import annotations

import os

import nbformat
from nbformat.v4 import new_code_cell, new_markdown_cell, new_notebook

HERE = os.path.dirname(os.path.abspath(__file__))
NAME = "11_joins_sessions_final_results"


def md(text: str):
    return new_markdown_cell(text.strip("\n"))


def code(text: str):
    return new_code_cell(text.strip("\n"))


# The chart's data: every page's final count of a minute, added up per minute (a dict keyed by the
# minute alone would keep one page per minute).
PER_MINUTE = """
per_minute = Counter()
for (page, minute), n in emitted.items():
    per_minute[minute] += n
"""

CELLS = [
    md("""
# 11 · Joins, sessions and final results

Three stateful operators beyond counting, each keeping its state in a store with a changelog
topic, as Kafka Streams does:

* **a windowed stream-stream join** — an order meets the payments of the same order id made from
  10 s before it to 60 s after it. Both sides wait in window stores. It is a *left* join: an order
  nobody paid comes out once, as unpaid, when its window (plus a 30 s grace period) has closed;
  until then it waits in a third store.
* **session windows** — a user's clicks less than 30 s apart form one visit; a late click can bridge
  two visits, which then merge.
* **final results with suppress** — clicks per page per minute, emitted **once per window**, when
  the window can no longer change: `suppress(until_window_closes())` holds the updates back in a
  buffer store, which has a changelog too, so a crash neither loses nor repeats a final result.

The data flows in as it would live, one slice of event time after the other; half-way, an instance
crashes with its disk, and the app restarts. The results are then checked against plain Python.

**What you will see:** ten minutes of orders, payments and clicks fed slice by slice to an app of
two instances, with its live dashboard; instance 1 crashing with its disk half-way, its tasks
restoring on instance 0 — join buffers, open visits, held-back counts — while the data goes on;
then the join, the visits and the final counts checked against plain Python, and a chart of the
clicks per minute.
"""),
    code("""
%load_ext kernel_ext
%statekit up --fresh
"""),
    md("""
## Event time

Joins and windows go by **event time**: the timestamp each record carries. The seeded generators
of `statekit.datagen` make orders with their payments (some paid late, some twice in halves, some
never, a few just *before* the order) and clicks in visits, each record timestamped when it
happened; `produce_timed` writes that timestamp as the Kafka record timestamp. Records arrive up to
5 s out of order, as they do from real producers.
"""),
    code("""
import pandas as pd
from statekit.datagen import now_ms, produce_timed, session_clicks, shop_events

T0 = now_ms() - 600_000        # the last ten minutes
shop = shop_events(seed=11, orders=60, start_ms=T0, spacing_ms=5_000, pay_after_ms=60_000,
                   pay_before_ms=10_000, late_ms=5_000)
order_events = [r for r in shop if r.value["type"] == "order"]
payment_events = [r for r in shop if r.value["type"] == "payment"]
click_events = session_clicks(seed=12, users=12, sessions=(2, 4), clicks=(1, 6), start_ms=T0,
                        gap_ms=30_000, late_ms=5_000)
print(f"{len(order_events)} orders, {len(payment_events)} payments, {len(click_events)} clicks")
pd.DataFrame([{"t (s)": (r.timestamp - T0) / 1000, "key": r.key, **r.value} for r in shop[:8]])
"""),
    code("""
from statekit.kafka import Kafka

kafka = Kafka()
for topic in ("orders", "payments", "clicks"):   # the app cell checks its source topics exist
    kafka.ensure_topic(topic, 4)
"""),
    md("""
## The application

One app, three topologies. The join's stores are `paid-left`, `paid-right` (window stores: each
record waits there for the other side) and `paid-outer` (orders without a payment yet); the visits
live in a session store; the per-minute counts in a window store, and their final values wait in
the suppression's buffer store `page-minutes-final`.
"""),
    code("""
%%statekit app shop --partitions 4 --instances 2
from statekit.topology import (JoinWindows, SessionWindows, WindowedSerde, tumbling,
                               until_window_closes)

orders = app.stream("orders", value_serde="json")
payments = app.stream("payments", value_serde="json")
(orders.left_join(payments,
                  lambda o, p: {"order": o["order"], "amount": o["amount"],
                                "paid": None if p is None else p["amount"]},
                  JoinWindows(before_ms=10_000, after_ms=60_000, grace_ms=30_000), store="paid")
       .to("paid", value_serde="json"))

clicks = app.stream("clicks", value_serde="json")
# closed visits stay queryable for an hour (the default keeps them gap + grace)
(clicks.group_by_key().windowed_by(SessionWindows(gap_ms=30_000, grace_ms=30_000))
       .count(store="visits", retention_ms=3_600_000))
(clicks.group_by(lambda user, c: c["page"])
       .windowed_by(tumbling(60_000), grace_ms=30_000).count(store="page-minutes")
       .suppress(until_window_closes(), store="page-minutes-final")
       .to_stream().to("page-minutes", key_serde=WindowedSerde("str"), value_serde="int64"))
"""),
    code("""
stores = [(s.name, s.kind, app.changelog_topic(s.name)) for p in app.subplans.values()
          for s in p.stores]
pd.DataFrame(stores, columns=["store", "kind", "changelog topic"])
"""),
    md("""
## Live, one slice at a time

The topics exist since before the app cell; every 15 s of event time is produced and processed
before the next (`feed`). Within a slice Spark cuts the records into micro-batches where it likes
(`--max-records 20`), so records really are processed out of order — but never by more than the
grace periods allow, which is what makes the plain-Python answer exact.
"""),
    code("""
SLICE = 15_000
END = max(r.timestamp for r in shop + click_events)
slices = list(range(T0, END + 1, SLICE))

fed = set()   # the slices produced so far: a feed cell run again produces nothing twice

def feed(first, last):
    todo = [lo for lo in slices[first:last] if lo not in fed]
    if not todo:
        print(f"slices {first + 1}–{last} were fed already")
        return
    print(f"feeding slices {first + 1}–{last} of {len(slices)}, each processed before the next…")
    for lo in todo:
        for topic, recs in (("orders", order_events), ("payments", payment_events),
                            ("clicks", click_events)):
            produce_timed(topic, [r for r in recs if lo <= r.timestamp < lo + SLICE], kafka=kafka)
        fed.add(lo)
        assert app.process_all_available(timeout=120)
    print(f"event time {(slices[first] - T0) // 1000}–{(slices[last - 1] + SLICE - T0) // 1000} s processed")
print(f"{len(slices)} slices of {SLICE // 1000} s")
"""),
    code("%statekit start shop --sink memory --max-records 20 --watch"),
    code("""
feed(0, len(slices) // 2)
app.instances_frame()[["instance", "status", "active"]]
"""),
    md("""
## Crash half-way

Instance 1 dies at the first record of its next micro-batch, and its state directory is deleted
(`disk-loss`). Its tasks move to instance 0, which restores them from the changelogs — the join's
buffers, the open visits, the held-back final counts — while the next slices flow in.
"""),
    code("%statekit crash shop --mode disk-loss --instance 1 --after 1"),
    code("""
feed(len(slices) // 2, len(slices) * 3 // 4)
inst = app.instances_frame().set_index("instance")
assert inst.loc[1, "status"] == "dead", "the crash did not fire"
inst[["status", "active"]]
"""),
    md("""
`%statekit restart` brings instance 1 back (empty: its disk is gone); a warmup replica restores its
share before tasks move back to it. The rest of the data flows in.
"""),
    code("""
%statekit restart shop
feed(len(slices) * 3 // 4, len(slices))
rs = app.restore_summary(since_generation=0)
rs.groupby("store")[["records"]].sum().rename(columns={"records": "changelog records restored"})
"""),
    md("""
## Check against plain Python

**The join.** An order is paid when a payment of the same order id falls in [order − 10 s,
order + 60 s]. Every (order, payment) pair must have come out exactly once; every order without a
payment must either have come out once as unpaid, or still wait in `paid-outer` because its window
plus grace has not closed yet (stream time has not reached it).
"""),
    code("""
from collections import Counter

out = app.output()
paid_rows = [v for t, v in zip(out["topic"], out["value"]) if t == "paid"]
matched = Counter()
unpaid_ref = set()
for o in order_events:
    mine = [p for p in payment_events
            if p.key == o.key and o.timestamp - 10_000 <= p.timestamp <= o.timestamp + 60_000]
    matched.update((o.key, p.value["amount"]) for p in mine)
    if not mine:
        unpaid_ref.add(o.key)
got_matched = Counter((v["order"], v["paid"]) for v in paid_rows if v["paid"] is not None)
got_unpaid = Counter(v["order"] for v in paid_rows if v["paid"] is None)
waiting = {k for (_ts, _left, k) in app.query_all("paid-outer")["key"]}
assert got_matched == matched, "join results differ"
assert all(n == 1 for n in got_unpaid.values()), "an unpaid order came out twice"
assert set(got_unpaid) | waiting == unpaid_ref and not set(got_unpaid) & waiting
print(f"{sum(matched.values())} payments joined, {len(got_unpaid)} orders reported unpaid, "
      f"{len(waiting)} still inside their window")
print("OK")
"""),
    md("""
**The visits.** A user's clicks cut where two neighbours are more than 30 s apart: the session
store must hold exactly those sessions, with their click counts.
"""),
    code("""
by_user = {}
for c in click_events:
    by_user.setdefault(c.key, []).append(c.timestamp)
ref_sessions = {}
for user, ts in by_user.items():
    ts.sort()
    start = prev = ts[0]
    n = 0
    for t in ts:
        if t - prev > 30_000:
            ref_sessions[(user, start, prev)] = n
            start, n = t, 0
        n += 1
        prev = t
    ref_sessions[(user, start, prev)] = n
v = app.query_all("visits")
got_sessions = {(k, s, e): n for k, s, e, n in zip(v["key"], v["start"], v["end"], v["value"])}
assert got_sessions == ref_sessions
print(f"{len(ref_sessions)} visits of {len(by_user)} users match")
print("OK")
"""),
    md("""
**Final results.** Each (page, minute) window came out at most once, with its complete count;
the windows that did not come out yet are the ones still held in the buffer, with the count so
far — together, exactly the plain-Python count per page and minute.
"""),
    code("""
ref_minutes = Counter((c.value["page"], c.timestamp - c.timestamp % 60_000) for c in click_events)
finals = [(tuple(k), n) for t, k, n in zip(out["topic"], out["key"], out["value"]) if t == "page-minutes"]
emitted = dict(finals)
assert len(emitted) == len(finals), "a window came out twice"
held = app.query_all("page-minutes-final")
pending = {tuple(k): int(n) for k, n in zip(held["key"], held["value"])}
assert not set(emitted) & set(pending)
assert {**emitted, **pending} == dict(ref_minutes)
print(f"{len(emitted)} final counts emitted once each, {len(pending)} windows still open")
print("OK")
"""),
    md("""
The final counts, added up per minute over every page: the clicks of each minute whose windows
have closed.
"""),
    code(PER_MINUTE + """
import matplotlib.pyplot as plt

bars = pd.Series(per_minute).sort_index()
bars.index = [pd.Timestamp(ms, unit="ms").strftime("%H:%M") for ms in bars.index]
ax = bars.plot.bar(figsize=(6, 2.4), color="#4C72B0", rot=0)
ax.set_title("clicks per minute (final results, all pages)", loc="left", fontsize=10)
for s in ("top", "right"):
    ax.spines[s].set_visible(False)
plt.show()
"""),
    code("""
plain = Counter()
for c in click_events:   # every click of a (page, minute) window that came out
    minute = c.timestamp - c.timestamp % 60_000
    if (c.value["page"], minute) in emitted:
        plain[minute] += 1
assert dict(per_minute) == dict(plain), (dict(per_minute), dict(plain))
print(f"each bar is the clicks of all pages in its minute, as plain Python counts them "
      f"({', '.join(str(n) for _, n in sorted(plain.items()))})")
print("OK")
"""),
    code("""
kafka.close()
%statekit stop shop
"""),
    code("%statekit down"),
    md("""
## What happened

The join kept each side's records in window stores until the other side's could arrive; the
sessions merged as late clicks bridged them; the per-minute counts waited in the suppression buffer
until their windows closed, and came out once. Instance 1's crash with its disk moved all of that
state to instance 0 through the changelogs — and every result still matched plain Python: no
payment joined twice, no final count emitted twice or lost.
"""),
]


NOTEBOOKS = {NAME: CELLS}


def build() -> list:
    nb = new_notebook(cells=CELLS)
    nb.metadata["kernelspec"] = {"name": "python3", "display_name": "Python 3 (ipykernel)",
                                 "language": "python"}
    nb.metadata["language_info"] = {"name": "python"}
    for i, c in enumerate(nb.cells):  # stable ids: a rebuild changes nothing unless a cell did
        c["id"] = f"{NAME[:2]}-{i:02d}"
    path = os.path.join(HERE, f"{NAME}.ipynb")
    nbformat.validate(nb)
    with open(path, "w", encoding="utf-8") as f:
        nbformat.write(nb, f)
    return [path]


if __name__ == "__main__":
    for p in build():
        print(p)
