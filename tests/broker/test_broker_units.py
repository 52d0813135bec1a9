"""The log and the cleaner without a server: segments, index, recovery of an interrupted swap."""
from __future__ import annotations

import json
import os
import time

import pytest

from statekit.broker import records as R
from statekit.broker.cleaner import SWAP_FILE, build_cleaned, clean_job
from statekit.broker.config import ConfigError, TopicConfig, validate_topic_configs
from statekit.broker.log import PartitionLog, ProduceError

from _broker_util import build_batch, decode_records


def _log(tmp_path, **configs):
    plog = PartitionLog(str(tmp_path / "t-0"), "t", 0, TopicConfig(validate_topic_configs(configs)))
    plog.open()
    return plog


def _append(plog, records, **kw):
    data = bytearray(build_batch(records, **kw))
    return plog.append(data, R.validate_produce(data), int(time.time() * 1000))[0]


def _all(plog):
    return decode_records(plog.read(plog.log_start_offset, 1 << 30, True))


def test_offsets_are_dense_and_segments_roll(tmp_path):
    plog = _log(tmp_path, **{"segment.bytes": "2000", "index.interval.bytes": "100"})
    base = 0
    for i in range(30):
        assert _append(plog, [(b"k%d" % i, b"v" * 20)] * 3) == base
        base += 3
    assert plog.log_end_offset == 90 and len(plog.segments) == 3  # 13 batches of 148 bytes fill one
    assert [o for o, _, _ in _all(plog)] == list(range(90))
    # reads from the middle start at the batch holding the offset, whichever segment it is in
    assert decode_records(plog.read(44, 10, True))[0][0] == 42
    plog.close()
    # reopen: same offsets, the next append continues at 90
    plog = _log(tmp_path, **{"segment.bytes": "2000", "index.interval.bytes": "100"})
    assert plog.log_end_offset == 90
    assert _append(plog, [(b"x", b"y")]) == 90
    plog.close()


def test_corrupt_index_is_rebuilt(tmp_path):
    plog = _log(tmp_path, **{"index.interval.bytes": "50"})
    for i in range(20):
        _append(plog, [(b"k", b"v%d" % i)])
    plog.close()
    idx = os.path.join(str(tmp_path / "t-0"), "%020d.index" % 0)
    good = open(idx, "rb").read()
    with open(idx, "wb") as f:
        f.write(b"\x7f" * 13)
    plog = _log(tmp_path, **{"index.interval.bytes": "50"})
    assert open(idx, "rb").read() == good
    assert [v for _, _, v in decode_records(plog.read(7, 1 << 20, True))][:2] == [b"v7", b"v8"]
    plog.close()


def test_idempotent_state_survives_reopen(tmp_path):
    plog = _log(tmp_path)
    assert _append(plog, [(b"a", b"1")] * 4, producer_id=7, producer_epoch=0, base_sequence=0) == 0
    plog.close()
    plog = _log(tmp_path)
    # the retry of the last batch after a broker restart is still recognised
    assert _append(plog, [(b"a", b"1")] * 4, producer_id=7, producer_epoch=0, base_sequence=0) == 0
    assert plog.log_end_offset == 4
    with pytest.raises(ProduceError) as e:
        _append(plog, [(b"b", b"2")], producer_id=7, producer_epoch=0, base_sequence=9)
    assert e.value.code == 45
    assert _append(plog, [(b"b", b"2")], producer_id=7, producer_epoch=0, base_sequence=4) == 4
    plog.close()


@pytest.mark.parametrize("finished_renames", [0, 1])
def test_swap_interrupted_by_a_crash_is_rolled_forward(tmp_path, finished_renames):
    plog = _log(tmp_path, **{"cleanup.policy": "compact", "segment.bytes": "600"})
    for i in range(60):
        _append(plog, [(b"k%d" % (i % 5), b"%d" % i)])
    plog.roll()
    plan = build_cleaned(clean_job(plog, int(time.time() * 1000)))
    groups = plan["groups"]
    assert groups and plan["removed"] == 55
    plog.close()
    d = plog.dir
    # the crash: the plan is on disk, `finished_renames` groups were swapped, nothing deleted yet
    with open(os.path.join(d, SWAP_FILE), "w") as f:
        json.dump({"groups": groups}, f)
    for g in groups[:finished_renames]:
        os.replace(os.path.join(d, g["tmp"]), os.path.join(d, "%020d.log" % g["first"]))
    plog = _log(tmp_path, **{"cleanup.policy": "compact", "segment.bytes": "600"})
    assert not os.path.exists(os.path.join(d, SWAP_FILE))
    got = _all(plog)
    assert sorted((k, v) for _, k, v in got) == sorted((b"k%d" % k, b"%d" % (55 + k)) for k in range(5))
    assert all(int(v) == o for o, _, v in got)
    assert plog.log_end_offset == 60
    plog.close()


def test_config_validation_messages():
    # Kafka's wording, which clients match on
    with pytest.raises(ConfigError) as e:
        validate_topic_configs({"retention.hours": "1"})
    assert str(e.value) == "Unknown topic config name: retention.hours"
    with pytest.raises(ConfigError) as e:
        validate_topic_configs({"cleanup.policy": "forever"})
    assert str(e.value) == "Invalid value forever for configuration cleanup.policy: String must be one of: compact, delete"
    with pytest.raises(ConfigError) as e:
        validate_topic_configs({"retention.ms": "soon"})
    assert str(e.value) == "Invalid value soon for configuration retention.ms: Not a number of type LONG"
    assert validate_topic_configs({"cleanup.policy": "delete,compact"}) == {"cleanup.policy": "compact,delete"}


def _long_batch(order, ts0=1_700_000_000_000):
    from kafka.record.default_records import DefaultRecordBatchBuilder

    b = DefaultRecordBatchBuilder(2, 0, False, -1, -1, -1, 1 << 30)
    for pos, delta in enumerate(order):     # timestamp deltas of one, two and three bytes too
        b.append(delta, ts0 + (pos * 7) % 20_000, f"k{pos}".encode(), b"v" * (pos % 300), [])
    return bytes(b.build())


@pytest.mark.parametrize("swap", [None, 10, 100, 9_000])
def test_offset_deltas_of_one_two_and_three_bytes_are_checked(swap):
    order = list(range(20_000))
    if swap is None:
        assert [h.count for _p, h in R.validate_produce(_long_batch(order))] == [20_000]
        return
    order[swap], order[swap + 1] = order[swap + 1], order[swap]
    with pytest.raises(R.InvalidBatch, match=f"record {swap} has offset delta {swap + 1}"):
        R.validate_produce(_long_batch(order))


def test_the_periodic_duties_share_one_timer_and_keep_their_intervals(monkeypatch):
    """Duties due together run on one wake-up (an idle broker's CPU is mostly wake-ups), each at
    its own interval, and one that raises runs again at its next turn."""
    import asyncio

    from statekit.broker.duties import Duties

    calls, sleeps = [], []
    real_sleep = asyncio.sleep

    def counted_sleep(delay, *a, **kw):
        sleeps.append(delay)
        return real_sleep(delay, *a, **kw)

    monkeypatch.setattr(asyncio, "sleep", counted_sleep)

    def duty(name, fail=False):
        def fn():
            calls.append((name, len(sleeps)))      # which wake-up it ran on
            if fail:
                raise RuntimeError("a bad pass")
        return fn

    async def run(seconds):
        task = asyncio.create_task(Duties(lambda: False).run([(100, duty("a")), (100, duty("b")),
                                                   (250, duty("c")), (100, duty("d", fail=True))]))
        await real_sleep(seconds)
        task.cancel()
        await asyncio.gather(task, return_exceptions=True)

    asyncio.run(run(0.58))
    names = [n for n, _ in calls]
    count = {n: names.count(n) for n in "abcd"}
    # a, b and d are due together: always on the same wake-ups; c at its own, longer interval
    assert count["a"] == count["b"] == count["d"] >= 3 and 1 <= count["c"] < count["a"], count
    wakes = {n: [w for m, w in calls if m == n] for n in "abcd"}
    assert wakes["a"] == wakes["b"] == wakes["d"]
    # one timer: a wake-up per turn of the shortest interval (c's turns mostly ride on them),
    # not one per duty per turn (~17 here)
    assert len(sleeps) <= count["a"] + count["c"] + 1 < len(calls), (sleeps, count)


def test_an_idle_broker_runs_its_duties_less_often_until_a_write(monkeypatch):
    """Stats unchanged IDLE_AFTER times in a row and no transaction open: the duties wait
    IDLE_DUTIES_S; a write (notify_append) puts them back on their own pace at once."""
    import asyncio

    from statekit.broker import duties, server

    monkeypatch.setattr(duties, "IDLE_DUTIES_S", 0.6)
    runs: list = []

    class Txns:
        ongoing = False

        def open(self):
            return self.ongoing

    async def run():
        broker = server.Broker.__new__(server.Broker)
        broker._stats_same, broker.transactions = 0, Txns()
        broker._waiter, broker.cleaner = None, None
        broker.duties = duties.Duties(broker._idle)
        loop = asyncio.get_running_loop()

        def stats():                       # the stats duty: nothing changes
            runs.append(loop.time())
            broker._stats_same += 1

        task = asyncio.create_task(broker.duties.run([(50, stats)]))
        t0 = loop.time()
        await asyncio.sleep(1.0)
        busy = [t - t0 for t in runs]
        assert broker.duties.idle
        runs.clear()
        broker._stats_same = 0             # a write changes the stats ...
        t1 = loop.time()
        broker.notify_append()             # ... and wakes the duties
        await asyncio.sleep(0.3)
        woken = [t - t1 for t in runs]
        broker.transactions.ongoing = True  # an open transaction: never the idle pace
        broker._stats_same = 10
        runs.clear()
        await asyncio.sleep(1.0)
        during_txn = len(runs)
        broker.transactions.ongoing = False   # idle again: a cancel still ends the duties
        await asyncio.sleep(0.4)
        assert broker.duties.idle
        task.cancel()
        await asyncio.wait_for(asyncio.gather(task, return_exceptions=True), 5)
        assert task.cancelled()
        return busy, woken, during_txn

    busy, woken, during_txn = asyncio.run(run())
    # IDLE_AFTER runs 50 ms apart, then one per 0.6 s: 4 or 5 runs in the first second
    assert server.IDLE_AFTER <= len(busy) <= server.IDLE_AFTER + 2, busy
    assert busy[server.IDLE_AFTER] - busy[server.IDLE_AFTER - 1] >= 0.5, busy
    assert woken and woken[0] < 0.2, woken          # at its own pace again, not 0.6 s later
    assert during_txn >= 8, during_txn              # 50 ms apart while a transaction is open


def test_an_idle_broker_stops_on_sigterm_and_says_so(tmp_path):
    """Stopping wakes the idle duties and the cleaner; a cancel that met the cleaner's wait just
    woken was lost, the broker never finished stopping, and was killed after its grace."""
    import time

    from statekit import broker as broker_mod
    from statekit.broker import duties

    d = str(tmp_path / "b")
    handle = broker_mod.start(dir=d, port=0)
    try:
        time.sleep(duties.IDLE_DUTIES_S)          # three unchanged runs: the idle pace
    finally:
        handle.stop(grace=60)
    with open(tmp_path / "b" / "broker.log") as f:
        assert "broker stopped" in f.read()
