"""Avro values against JSON ones, same run: what reading a topic with schemas costs.

    .venv/bin/python bench/serdes.py [--records 500000] [--partitions 4] [--instances 2] [--rounds 2]

Starts its own embedded broker and embedded Schema Registry (temp dir, port 0) and one local Spark
session, and stops them at the end, also on failure. Every App start cold-starts a Python process
for the query's source, which Spark gives ~10 s to connect back: on a machine loaded far beyond its
cores that start fails now and then ("Python worker failed to connect back"), before any record is
read; such a build is said and run once more under another name. The input is the `accounts` generator
(`statekit.datagen`), `--records` records over as many distinct keys, written twice by the fast
produce path: values in JSON, and in Avro (`--format avro`: the generator's schema registered under
`<topic>-value`, each value the 5-byte header and the Avro record).

1. produce: the fast path's records/s for each format (the Avro values are built column-wise).
2. count: `stream(topic, value_serde=...).group_by_key().count()` to a Kafka sink, exactly-once, on
   `--instances` instances and `--partitions` tasks, the App's defaults; records / (the last commit
   - the first micro-batch's start), JSON and Avro alternating for `--rounds` rounds, the best of
   each. A count never decodes a value (its task does not even cut the values out of the fetched
   batches), so this is the cost of the wire format itself. Sampled keys are checked (count 1).
3. aggregate: the same input through `aggregate()` with a Python function over the decoded value
   (count and sum of `amount`): every value decoded, JSON by the C decoder, Avro by fastavro with
   the writer's schema from the registry (fetched once per schema id and process).

Last lines:

    FIGURE name=serdes_produce value=<Avro records/s> unit=records/s baseline=<JSON records/s> ratio=...
    FIGURE name=serdes_aggregate value=<Avro records/s> unit=records/s baseline=<JSON records/s> ratio=...
    RESULT name=serdes_count value=<Avro records/s> unit=records/s baseline=<JSON records/s> ratio=<goal >= 0.8>
"""
from __future__ import annotations

import argparse
import os
import random
import shutil
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
sys.path.insert(0, os.path.join(ROOT, "bench"))

from ingest import build_rate  # noqa: E402  (the same measure as bench/ingest.py's build)


def say(msg: str) -> None:
    print(msg, flush=True)


def produce(topic: str, fmt: str, n: int, bootstrap: str, partitions: int) -> float:
    from statekit.datagen import produce_fast

    t0 = time.perf_counter()
    prog = produce_fast(topic, "accounts", seed=1, limit=n, keys=n, bootstrap=bootstrap,
                        partitions=partitions, value_format=fmt)
    if prog.sent != n:
        raise RuntimeError(f"{topic}: {prog.sent} records written, not {n}")
    return n / (time.perf_counter() - t0)


def serde_of(fmt: str) -> str:
    return "avro" if fmt == "avro" else "json"


def count_app(name, fmt, bootstrap, work, partitions, instances):
    import statekit

    app = statekit.App(name, bootstrap=bootstrap, partitions=partitions, instances=instances,
                       state_dir=os.path.join(work, name))
    app.stream(f"accounts-{fmt}", value_serde=serde_of(fmt)).group_by_key() \
        .count(store="counts").to_stream().to(f"{name}-out")
    return app


def aggregate_app(name, fmt, bootstrap, work, partitions, instances):
    import statekit

    app = statekit.App(name, bootstrap=bootstrap, partitions=partitions, instances=instances,
                       state_dir=os.path.join(work, name))
    (app.stream(f"accounts-{fmt}", value_serde=serde_of(fmt)).group_by_key()
     .aggregate(lambda: {"n": 0, "sum": 0},
                lambda k, v, a: {"n": a["n"] + 1, "sum": a["sum"] + v["amount"]}, store="totals")
     .to_stream().to(f"{name}-out", value_serde="json"))
    return app


def checked(app, n: int, want) -> None:
    from statekit.datagen import account_key

    store = app.plan.stores[0].name
    for i in random.Random(7).sample(range(n), min(20, n)):
        got = app.query(store, account_key(i, n))
        if not want(got):
            raise RuntimeError(f"{app.name}: account {i} holds {got!r}")


def run(make, name, fmt, n, boot, work, parts, instances, want, again: bool = True) -> float:
    from statekit.errors import StatekitError

    app = make(name, fmt, boot, work, parts, instances)
    try:
        info: dict = {}
        rate = build_rate(app, n, info)
        checked(app, n, want)
    except StatekitError as e:
        if not again or "failed to connect back" not in str(e):
            raise
        say(f"  {name}: Spark's source process did not connect back in time ({e}); once more")
        app.stop()
        return run(make, f"{name}-again", fmt, n, boot, work, parts, instances, want, False)
    finally:
        app.stop()
    say(f"  {name}: {rate:,.0f} records/s ({info['seconds']:.2f} s, {info['batches']} "
        f"micro-batches, {info['process_ms'] / 1000:.2f} s of tasks' processing)")
    return rate


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--records", type=int, default=500_000)
    ap.add_argument("--partitions", type=int, default=4)
    ap.add_argument("--instances", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args(argv)
    n, parts = args.records, args.partitions

    from statekit import broker as broker_mod
    from statekit import registry as registry_mod
    from statekit.engine.spark.session import get_session, stop_session
    from statekit.schemas.serdes import forget_registries

    work = tempfile.mkdtemp(prefix="statekit-bench-serdes-")
    handle = broker_mod.start(dir=os.path.join(work, "broker"), port=0)
    reg = registry_mod.start(dir=os.path.join(work, "broker"), port=0)
    os.environ["STATEKIT_SCHEMA_REGISTRY_URL"] = reg.url    # the instances find it there too
    forget_registries()
    try:
        boot = handle.bootstrap
        say(f"{n:,} accounts records over {n:,} keys, {parts} partitions, {args.instances} "
            f"instances, {args.rounds} round(s); load average {os.getloadavg()[0]:.1f}")
        prod = {fmt: produce(f"accounts-{fmt}", fmt, n, boot, parts) for fmt in ("json", "avro")}
        say(f"produce (fast path): JSON {prod['json']:,.0f} records/s, Avro {prod['avro']:,.0f} "
            f"records/s")
        get_session()
        run(count_app, "warm-up", "json", n, boot, work, parts, args.instances,
            lambda v: v == 1)                       # JIT, Python workers: outside the figures
        count = {"json": [], "avro": []}
        for r in range(args.rounds):
            say(f"count, round {r + 1}:")
            for fmt in ("json", "avro"):
                count[fmt].append(run(count_app, f"count-{fmt}-{r}", fmt, n, boot, work, parts,
                                      args.instances, lambda v: v == 1))
        say("aggregate (a Python function over every decoded value):")
        agg = {fmt: run(aggregate_app, f"agg-{fmt}", fmt, n, boot, work, parts, args.instances,
                        lambda v: v is not None and v["n"] == 1) for fmt in ("json", "avro")}
        stop_session()
        cj, ca = max(count["json"]), max(count["avro"])
        say(f"FIGURE name=serdes_produce value={prod['avro']:.0f} unit=records/s "
            f"baseline={prod['json']:.0f} ratio={prod['avro'] / prod['json']:.3f}")
        say(f"FIGURE name=serdes_aggregate value={agg['avro']:.0f} unit=records/s "
            f"baseline={agg['json']:.0f} ratio={agg['avro'] / agg['json']:.3f}")
        say(f"RESULT name=serdes_count value={ca:.0f} unit=records/s baseline={cj:.0f} "
            f"ratio={ca / cj:.3f}")
    finally:
        try:
            stop_session()
        finally:
            os.environ.pop("STATEKIT_SCHEMA_REGISTRY_URL", None)
            reg.stop()
            handle.stop()
            shutil.rmtree(work, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
