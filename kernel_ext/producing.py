"""`%statekit produce`: records into a topic from a background thread, with a progress bar.

A generator with `--limit` and no `--rate` takes the fast path (pre-encoded record batches, millions
per run); a file or a paced generator goes record by record. `--format avro` (protobuf,
json_schema) writes a generator's values with its schema, registered in the schema registry. The
bar says how far it got, the rate, and an error in one line.

A produce cell run twice does not write its records twice: a produce of a file or of a seeded
generator with `--limit` leaves a receipt (`$STATEKIT_HOME/produced/<topic>.json`: what it wrote
and the offsets the topic ended at); the same produce run again finds the topic exactly as the
receipt says (nothing written or removed since) and writes nothing, in one line (`--again` writes
them anyway). Otherwise records already in the topic stay, these are added, and the line says so.
"""
from __future__ import annotations

import html
import json
import os
import threading
from dataclasses import dataclass
from typing import Any, Callable


@dataclass
class ProducerJob:
    topic: str
    source: str
    thread: threading.Thread
    stop: threading.Event
    progress: Any = None  # statekit.datagen.ProduceProgress
    widget: Any = None

    @property
    def running(self) -> bool:
        return self.thread.is_alive()


def resolve_file(path: str) -> str:
    """`path` as given, else under the repository or its sample_data/."""
    cands = [path]
    if not os.path.isabs(path):
        here = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
        cands += [os.path.join(here, path), os.path.join(here, "sample_data", os.path.basename(path))]
    for c in cands:
        if os.path.exists(c):
            return c
    from statekit.errors import StatekitError

    raise StatekitError(f"no such file: {path} (the samples are in sample_data/: words.jsonl, "
                        f"clicks.jsonl, sensors.jsonl)")


def signature(cmd) -> dict | None:
    """What a produce writes, when it is the same every time (a file, or a seeded generator with
    a limit); None for an endless generator."""
    if cmd.file:
        path = resolve_file(cmd.file)
        st = os.stat(path)
        return {"file": os.path.abspath(path), "size": st.st_size, "mtime": st.st_mtime, "limit": cmd.limit}
    if cmd.limit is None:
        return None
    return {"generator": cmd.generator, "seed": 42 if cmd.seed is None else cmd.seed,
            "keys": cmd.args.get("keys"), "limit": cmd.limit,
            "format": cmd.args.get("value_format") or "json"}


def _receipt_path(topic: str) -> str:
    from statekit.contracts import statekit_home

    return os.path.join(statekit_home(), "produced", f"{topic}.json")


def offsets(kafka, topic: str) -> tuple[dict, dict] | None:
    """(begin, end) offsets per partition, None when the topic does not exist."""
    if topic not in kafka.topics():
        return None
    return ({str(p): o for p, o in kafka.begin_offsets(topic).items()},
            {str(p): o for p, o in kafka.end_offsets(topic).items()})


def held(kafka, topic: str) -> int:
    """Records the topic holds now (0 when it does not exist)."""
    found = offsets(kafka, topic)
    return 0 if found is None else sum(found[1].values()) - sum(found[0].values())


def written_before(kafka, topic: str, sig: dict | None) -> int | None:
    """The records the last produce into this topic wrote, when it was this same produce (`sig`)
    and nothing was written to or removed from the topic since, else None."""
    if sig is None:
        return None
    try:
        with open(_receipt_path(topic)) as f:
            receipt = json.load(f)
    except (OSError, ValueError):
        return None
    now = offsets(kafka, topic)
    if receipt.get("signature") != sig or now is None or [now[0], now[1]] != receipt.get("offsets"):
        return None
    return int(receipt.get("records", 0))


def write_receipt(kafka, topic: str, sig: dict | None, before: int, sent: int) -> None:
    """After a produce of `sig` that wrote `sent` records into a topic that held `before`: its
    offsets now, unless someone else wrote meanwhile."""
    now = offsets(kafka, topic) if sig is not None else None
    if now is None or sum(now[1].values()) - sum(now[0].values()) != before + sent:
        return
    path = _receipt_path(topic)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump({"signature": sig, "offsets": [now[0], now[1]], "records": sent}, f)
    os.replace(tmp, path)


def start_producer(cmd, bootstrap: str, display: Callable, on_done: Callable | None = None) -> ProducerJob:
    """Start producing what `cmd` (a parsed `produce`) names; shows the bar with `display`;
    ``on_done(progress)`` once every record is written."""
    import ipywidgets as W

    from statekit import datagen

    keys = seed = None
    if cmd.file:
        path = resolve_file(cmd.file)
        records = datagen.read_jsonl(path)
        source = os.path.basename(path)
        if cmd.limit is None:
            with open(path, encoding="utf-8") as f:
                total = sum(1 for line in f if line.strip())
        else:
            total = cmd.limit
    else:
        seed = 42 if cmd.seed is None else cmd.seed
        keys = cmd.args.get("keys")
        records = datagen.generate(cmd.generator, seed=seed, keys=keys)
        source = f"generator {cmd.generator}"
        total = cmd.limit
    fast = cmd.generator and cmd.rate is None and cmd.limit is not None
    bar = W.IntProgress(value=0, min=0, max=total or 1, bar_style="info", layout=W.Layout(width="320px"))
    label = W.HTML()
    box = W.HBox([W.HTML(f"<b>{html.escape(cmd.topic)}</b> ← {html.escape(source)}&nbsp;"), bar, label])
    stop = threading.Event()

    def report(p):
        job.progress = p
        if total:
            bar.value = min(p.sent, total)
        else:
            bar.max = max(bar.max, p.sent + 1)
            bar.value = p.sent
        if p.error:
            bar.bar_style = "danger"
            label.value = f"&nbsp;<span style='color:#c62828'>{html.escape(str(p.error))}</span>"
            return
        if p.done:
            bar.bar_style = "success"
        rate = f"{p.rate:,.0f}/s" if p.elapsed > 0 else ""
        label.value = (f"&nbsp;{p.sent:,}{f' / {total:,}' if total else ''} records · {rate}"
                       f"{' · done' if p.done else ''}")

    fmt = cmd.args.get("value_format") or "json"
    if fmt != "json":
        source += f" ({fmt})"

    def work():
        try:
            if fast:
                datagen.produce_fast(cmd.topic, cmd.generator, seed, cmd.limit, bootstrap, keys=keys,
                                     partitions=cmd.partitions or 4, stop=stop, progress=report,
                                     value_format=fmt)
            else:
                datagen.produce(cmd.topic, records, bootstrap, partitions=cmd.partitions or 4,
                                rate=cmd.rate, limit=cmd.limit, stop=stop, progress=report,
                                value_format=fmt, generator=cmd.generator)
            p = job.progress
            if on_done is not None and p is not None and p.done and not p.error and not stop.is_set():
                on_done(p)
        except Exception:  # shown in the progress label (one line)
            pass

    th = threading.Thread(target=work, name=f"statekit-produce-{cmd.topic}", daemon=True)
    job = ProducerJob(cmd.topic, source, th, stop, None, box)
    display(box)
    th.start()
    return job


def produce(cmd, bootstrap: str, kafka: Callable, display: Callable, producers: dict) -> None:
    """Run a parsed `produce` (``kafka()``: a new client; ``producers``: the kernel's jobs by
    topic): nothing when this same produce ran last and the topic is as it left it, else start
    the job, saying when the topic already holds records; with ``--wait``, until it is done."""
    from kernel_ext.lines import say
    from statekit.errors import StatekitError

    old = producers.get(cmd.topic)
    if old is not None and old.running:
        raise StatekitError(f"a producer is already writing to {cmd.topic!r}; wait for it or "
                            f"`%statekit down`")
    sig = signature(cmd)
    with kafka() as k:
        before = written_before(k, cmd.topic, sig) if not cmd.again else None
        if before is not None:   # the cell ran before: its records are there, exactly
            say(f"{cmd.topic} already holds these {before:,} records, written when this produce ran "
                f"before: nothing written (`--again` writes them once more)")
            return
        there = held(k, cmd.topic)
    if there:
        say(f"{cmd.topic} already holds {there:,} records: these are added to them")

    def done(p):   # the receipt that a second run of this produce finds
        with kafka() as k:
            write_receipt(k, cmd.topic, sig, there, p.sent)

    job = start_producer(cmd, bootstrap, display, on_done=done)
    producers[cmd.topic] = job
    if cmd.wait:
        job.thread.join()
        if job.progress is not None and job.progress.error:
            raise StatekitError(f"produce to {cmd.topic!r} failed: {job.progress.error}")
