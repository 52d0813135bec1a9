"""`%statekit produce`: records into a topic from a background thread, with a progress bar.

A generator with `--limit` and no `--rate` takes the fast path (pre-encoded record batches, millions
per run); a file or a paced generator goes record by record. `--format avro` (protobuf,
json_schema) writes a generator's values with its schema, registered in the schema registry. The
bar says how far it got, the rate, and an error in one line.
"""
from __future__ import annotations

import html
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


def start_producer(cmd, bootstrap: str, display: Callable) -> ProducerJob:
    """Start producing what `cmd` (a parsed `produce`) names; shows the bar with `display`."""
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
        except Exception:  # shown in the progress label (one line)
            pass

    th = threading.Thread(target=work, name=f"statekit-produce-{cmd.topic}", daemon=True)
    job = ProducerJob(cmd.topic, source, th, stop, None, box)
    display(box)
    th.start()
    return job
