"""What two panels of one dashboard picture say differently about the same thing: every number or
state the dashboard shows in two places comes from one `model.Picture`, and `disagreements(p)`
lists where they part (empty: they agree). Tests assert it is empty on every picture: hand-made
ones, random event sequences (tests/notebook/test_dashboard_property.py) and live apps. Pure
Python, no widgets.

What is checked:

* a task's state and instance: its chip, its Tasks tab rows, its Restoration row, the Instances
  panel's lists, the live instances of the header;
* the header's figures are the totals of the panels beside it: store rows and changelog lag of
  the Tasks tab (a queued task's lag included, or said to be unknown), records and the latest
  batch of the tasks' commits, the committed rate of the Instances panel;
* a task restoring or queued has, in the Tasks tab, the lag the Restoration panel says is left;
* a Restoration row "done" replayed what it says it had to (counted in records once done: the
  offsets that held no record are said apart), "nothing to replay" and "promoted" with nothing
  replayed read nothing;
* while a task restores, its lag over time never goes above what its restore had to cross (a
  promotion that replayed nothing draws no spike);
* the header's generation is no older than the rebalance the Restoration panel and the moves
  line name;
* nothing live after the app stopped.
"""
from __future__ import annotations

from kernel_ext.dashboard.tasks import LIVE_STATUSES

TOLERANCE = 1e-6


def _close(a, b) -> bool:
    if a is None or b is None:
        return a is b
    return abs(float(a) - float(b)) <= TOLERANCE * max(1.0, abs(float(a)), abs(float(b)))


def disagreements(p) -> list[str]:
    """Every pair of panels of picture `p` that say different things (one line each)."""
    out: list[str] = []
    chips = {c["task"]: c for c in p.chips}
    active = [r for r in p.tasks if r["role"] == "active"]
    out += _states(p, chips)
    out += _header(p, chips, active)
    out += _restoration(p, chips)
    out += _spikes(p)
    out += _generation(p)
    return out


def _states(p, chips: dict) -> list[str]:
    out = []
    for t, c in chips.items():
        for r in p.tasks:
            if r["task"] == t and r["role"] == "active" and (r["state"], r["instance"]) != (c["state"], c["instance"]):
                out.append(f"task {t}: chip {c['state']}@{c['instance']} vs Tasks tab {r['state']}@{r['instance']}")
                break
    if p.round is not None:
        for t, row in p.round.rows.items():
            c = chips.get(t)
            if c is None:
                out.append(f"task {t}: in the Restoration panel ({row.status}) without a chip")
            elif not row.final and (row.status, row.instance) != (c["state"], c["instance"]):
                out.append(f"task {t}: Restoration {row.status}@{row.instance} vs chip {c['state']}@{c['instance']}")
            elif row.final and c["state"] in ("queued", "restoring"):
                out.append(f"task {t}: Restoration {row.status} vs chip {c['state']}")
            elif row.status == "failed" and c["state"] != "failed":
                out.append(f"task {t}: Restoration failed vs chip {c['state']}")
    alive = {r["instance"] for r in p.instances if r["status"] in LIVE_STATUSES}
    if p.header.get("instances") is not None and p.header["instances"][0] != len(alive):
        out.append(f"header {p.header['instances'][0]} alive vs Instances panel {len(alive)}")
    for c in p.chips:
        if c["state"] in ("queued", "restoring", "running") and c["instance"] is not None \
                and p.instances and c["instance"] not in alive:
            out.append(f"task {c['task']}: {c['state']} on instance {c['instance']}, which is not alive")
    for r in p.instances:
        for t in r["active"]:
            if chips.get(t, {}).get("instance") != r["instance"]:
                out.append(f"Instances panel: {t} active on {r['instance']}, chip says {chips.get(t, {}).get('instance')}")
    if p.state == "NOT_RUNNING":
        if alive:
            out.append(f"the app is stopped but {len(alive)} instance(s) alive")
        live = [c["task"] for c in p.chips if c["state"] in ("queued", "restoring", "running")]
        if live:
            out.append(f"the app is stopped but tasks {live} are live")
    return out


def _header(p, chips: dict, active: list) -> list[str]:
    out = []
    h = p.header
    rows = [r["rows"] for r in active if r["rows"] is not None]
    if h.get("rows") != (sum(rows) if rows else None):
        out.append(f"header store rows {h.get('rows')} vs Tasks tab {sum(rows) if rows else None}")
    lag_tab = sum(r["lag"] or 0 for r in active)
    lag_chips = sum(c["lag"] for c in chips.values())
    if h.get("lag") != lag_tab or lag_tab != lag_chips:
        out.append(f"header lag {h.get('lag')} vs Tasks tab {lag_tab} vs chips {lag_chips}")
    unknown = sum(bool(c.get("lag_unknown")) for c in chips.values())
    if (h.get("lag_unknown") or 0) != unknown:
        out.append(f"header: {h.get('lag_unknown')} task(s) of unknown lag vs chips {unknown}")
    for c in chips.values():
        if c["state"] == "queued" and not c.get("lag_unknown"):
            mine = [r for r in active if r["task"] == c["task"]]
            if any(r["lag"] is None and r["changelog_end"] is not None for r in mine):
                out.append(f"task {c['task']}: queued, its lag neither counted nor said unknown")
    if p.has_events:
        records = sum(c.get("records") or 0 for c in chips.values())
        if (h.get("records") or 0) != records:
            out.append(f"header processed {h.get('records')} vs the tasks' commits {records}")
        batches = [c["batch"] for c in chips.values() if c.get("batch") is not None]
        if h.get("batch_id") != (max(batches) if batches else None):
            out.append(f"header batch {h.get('batch_id')} vs the tasks' latest {max(batches) if batches else None}")
        if h.get("batch_id") is not None and "waiting for the first micro-batch" in (h.get("reason") or ""):
            out.append(f"header batch {h.get('batch_id')} beside a badge waiting for the first micro-batch")
        rates = [r["rate"] for r in p.instances if r.get("rate") is not None]
        if rates and not _close(h.get("input_rate"), sum(rates)):
            out.append(f"header {h.get('input_rate')} rec/s vs Instances panel {sum(rates)} committed/s")
    return out


def _restoration(p, chips: dict) -> list[str]:
    out = []
    rnd = p.round
    if rnd is None:
        return out
    for t, row in rnd.rows.items():
        c = chips.get(t)
        if row.status == "done" and row.restored != row.total:
            out.append(f"task {t}: done, replayed {row.restored:,} of {row.total} to replay")
        if row.status in ("nothing", "promoted") and row.restored:
            out.append(f"task {t}: {row.status}, yet replayed {row.restored:,}")
        if row.final or c is None:
            continue
        left = row.remaining
        if c.get("lag_unknown"):
            if row.stores and row.instance is not None:
                out.append(f"task {t}: queued on instance {row.instance} with {left:,} to replay, its "
                           f"lag not counted")
            continue
        if row.stores and left is not None and left != c["lag"]:
            out.append(f"task {t}: Restoration says {left:,} left to replay, Tasks tab lag {c['lag']:,}")
    return out


def _spikes(p) -> list[str]:
    """While a task of the current round waits or restores, its lag stays within what its restore
    has to cross: a promoted replica's lag, or its stores' offsets."""
    out = []
    rnd = p.round
    if rnd is None:
        return out
    for t, row in rnd.rows.items():
        bound = None
        if row.promoted is not None and row.promoted_lag is not None and not row.restored:
            bound = row.promoted_lag
        elif row.stores:
            bound = sum(s.total + s.skipped for s in row.stores.values())
        elif row.to_replay is not None:
            bound = row.to_replay
        if bound is None or row.queued_at is None or t not in p.lag:
            continue
        xs, ys = p.lag[t]
        start = row.queued_at - p.t0
        end = (row.finished if row.finished is not None else p.t) - p.t0
        over = [(x, y) for x, y in zip(xs, ys) if start <= x <= end and y > bound]
        if over:
            out.append(f"task {t}: lag {over[0][1]:,} drawn {over[0][0]:.1f} s in, over the {bound:,} "
                       f"its {row.status} restore had to cross")
    return out


def _generation(p) -> list[str]:
    out = []
    g = p.header.get("generation")
    named = []
    if p.round is not None and p.round.generations:
        named.append(("the Restoration panel", max(p.round.generations)))
    own = p.ownership
    if own is not None and own.last_moves_generation is not None:
        named.append(("the moves line", own.last_moves_generation))
    for where, gen in named:
        if g is None or gen > g:
            out.append(f"header generation {g} vs {where}'s {gen}")
    return out
