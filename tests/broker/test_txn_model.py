"""Random schedules of transactions against a model: commits, aborts, plain writes, zombies fenced
by a new instance, the broker killed (-9) in the middle of a transaction or right after a commit,
cleaner passes. After every step a read_committed reader sees exactly what the model committed
(every record of a delete-policy topic in order, the latest value per key of a compacted one) and
no transaction is left open. Seeded: a failure reproduces with its seed; the long run is `slow`."""
from __future__ import annotations

import random

import pytest

from statekit import broker as broker_mod
from statekit.kafka import Kafka, ProducerFenced

PARTS = 2


class Run:
    def __init__(self, dir_: str, tid: str):
        self.dir = dir_
        self.tid = tid
        self.h = broker_mod.start(dir=dir_, port=0, configs={"log.cleaner.backoff.ms": "100000"})
        self.k = Kafka(self.h.bootstrap)
        self.k.ensure_topic("m-log", PARTS)
        self.k.ensure_topic("m-cmp", PARTS, {"cleanup.policy": "compact", "segment.bytes": "1500",
                                             "min.cleanable.dirty.ratio": "0.01"})
        self.txp = self.k.transactional_producer(tid)

    def restart(self, kill: bool) -> None:
        if kill:
            self.h.kill()
        else:
            self.h.stop()
        self.k.close()
        self.h = broker_mod.start(dir=self.dir, port=0, configs={"log.cleaner.backoff.ms": "100000"})
        self.k = Kafka(self.h.bootstrap)
        self.txp = self.k.transactional_producer(self.tid)  # aborts what the crash left open

    def close(self) -> None:
        try:
            self.k.close()
        finally:
            self.h.stop()


def _batch(rng, step):
    items = []
    for p in range(PARTS):
        if rng.random() < 0.7:
            recs = [(b"key%d" % rng.randrange(12), b"s%d-%d" % (step, i)) for i in range(rng.randrange(1, 6))]
            items.append(("m-log", p, recs))
            items.append(("m-cmp", p, recs))
    return items


def _check(run: Run, log_model, latest_model, step):
    k = run.k
    for p in range(PARTS):
        got = [(bytes(key), bytes(v)) for ch in k.read("m-log", p, isolation="read_committed")
               for _, _, key, v, _ in ch]
        assert got == log_model[p], f"step {step}: m-log[{p}]"
        latest = {}
        for ch in k.read("m-cmp", p, isolation="read_committed"):
            for _, _, key, v, _ in ch:
                latest[bytes(key)] = bytes(v)
        assert latest == latest_model[p], f"step {step}: m-cmp[{p}]"
    for t in ("m-log", "m-cmp"):
        assert k.end_offsets(t, isolation="read_committed") == k.end_offsets(t), f"step {step}: an open transaction"


def _apply(items, log_model, latest_model):
    for topic, p, recs in items:
        if topic == "m-log":
            log_model[p].extend(recs)
        else:
            latest_model[p].update(recs)


def schedule(dir_: str, seed: int, steps: int) -> None:
    rng = random.Random(seed)
    run = Run(dir_, f"model-{seed}")
    log_model = [[] for _ in range(PARTS)]
    latest_model = [{} for _ in range(PARTS)]
    try:
        for step in range(steps):
            op = rng.choices(["txn", "plain", "kill-mid", "kill-after", "zombie", "clean"],
                             weights=[12, 2, 1, 1, 1, 2])[0]
            items = _batch(rng, step)
            if op in ("txn", "kill-mid", "kill-after", "zombie") and items:
                run.txp.begin()
                half = len(items) // 2
                run.txp.send_many(items[:half] or items)
                if half:
                    run.txp.send_many(items[half:])
                if op == "kill-mid":
                    run.restart(kill=True)  # never committed: aborted by the new producer
                elif op == "zombie":
                    newer = run.k.transactional_producer(run.tid)
                    with pytest.raises(ProducerFenced):
                        run.txp.commit()
                    run.txp = newer
                elif rng.random() < 0.75:
                    run.txp.commit()
                    _apply(items, log_model, latest_model)
                    if op == "kill-after":
                        run.restart(kill=True)  # a commit that returned survives kill -9
                else:
                    run.txp.abort()
            elif op == "plain" and items:
                run.k.send_many(items)
                _apply(items, log_model, latest_model)
            elif op == "clean":
                broker_mod.request_clean(run.h.dir)
            _check(run, log_model, latest_model, step)
        broker_mod.request_clean(run.h.dir)
        _check(run, log_model, latest_model, steps)
    finally:
        run.close()


@pytest.mark.parametrize("seed", [7, 8])
def test_random_transaction_schedules(tmp_path, seed):
    schedule(str(tmp_path / "b"), seed, 30)


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(100, 120))
def test_random_transaction_schedules_long(tmp_path, seed):
    schedule(str(tmp_path / "b"), seed, 150)
