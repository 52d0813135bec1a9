"""Engine pieces that need no Spark: offset allocation, offset JSON, one-line errors."""
from __future__ import annotations

import math

from hypothesis import given, strategies as st

from statekit.engine.spark.session import one_line
from statekit.engine.spark.source import allocate, from_json, to_json
from statekit.errors import StatekitError, UnknownTopic


@given(st.lists(st.integers(0, 500), min_size=1, max_size=6), st.integers(1, 300))
def test_allocate_takes_exactly_ceil_backlog_over_limit_batches(backlogs, limit):
    start = {("t", p): 7 for p in range(len(backlogs))}
    end = {tp: start[tp] + b for tp, b in zip(sorted(start), backlogs)}
    pos, batches = dict(start), 0
    while pos != end:
        nxt = allocate(pos, end, limit)
        assert all(pos[tp] <= nxt[tp] <= end[tp] for tp in end)
        assert 0 < sum(nxt[tp] - pos[tp] for tp in end) <= limit
        pos, batches = nxt, batches + 1
    assert batches == math.ceil(sum(backlogs) / limit)


def test_offsets_json_round_trip():
    offs = {("a", 0): 5, ("a", 1): 0, ("b", 0): 12}
    assert to_json(offs) == {"a": {"0": 5, "1": 0}, "b": {"0": 12}}
    assert from_json(to_json(offs)) == offs


def test_one_line_keeps_the_statekit_error_and_drops_java():
    text = ("org.apache.spark.SparkException: Job aborted due to stage failure\n"
            "Traceback (most recent call last):\n  File \"/x/kafka.py\", line 3, in end_offsets\n"
            "statekit.errors.UnknownTopic: topic 'zz' does not exist: create it first\n"
            "\tat org.apache.spark.api.python.BasePythonRunner.foo(PythonRunner.scala:1)\n")
    err = one_line(Exception(text))
    assert isinstance(err, UnknownTopic) and str(err) == "topic 'zz' does not exist: create it first"
    died = one_line(Exception("[STREAM_FAILED] Query terminated with exception: Job aborted: "
                              "Python worker exited unexpectedly (crashed)\n\tat org.apache.x(y)"))
    assert isinstance(died, StatekitError) and "\n" not in str(died) and "worker died" in str(died)


class _Query:
    """A streaming query as `RunningQuery.stop` sees it: statuses in turn, then stopped."""

    id, name = "q", "q"

    def __init__(self, statuses):
        self.statuses = list(statuses)
        self.seen = 0
        self.stopped_at = None

    @property
    def isActive(self):
        return self.stopped_at is None

    @property
    def status(self):
        st = self.statuses[min(self.seen, len(self.statuses) - 1)]
        self.seen += 1
        return st

    def stop(self):
        self.stopped_at = self.seen


def _st(message, active):
    return {"message": message, "isTriggerActive": active, "isDataAvailable": False}


def test_a_graceful_stop_waits_for_the_batch_in_flight_not_for_an_idle_sources_long_poll():
    from statekit.engine.spark.engine import RunningQuery

    polling = "Getting offsets from PythonMicroBatchStream@1"
    # a batch in flight: stop only once it has ended (the third status is the first without one)
    q = _Query([_st("Processing new data", True), _st("Processing new data", True),
                _st("Waiting for data to arrive", False)])
    RunningQuery(None, q).stop(timeout=10)
    assert q.stopped_at == 3
    # an idle source asking for offsets (a long poll): no batch in flight, stop at once
    q = _Query([_st(polling, True)] * 5 + [_st("Waiting for data to arrive", False)])
    RunningQuery(None, q).stop(timeout=10)
    assert q.stopped_at == 1
    # a batch that does not end within the timeout: stopped anyway
    q = _Query([_st("Processing new data", True)])
    RunningQuery(None, q).stop(timeout=0.2)
    assert q.stopped_at is not None and q.stopped_at >= 2


def test_stopping_the_session_silences_only_the_accumulator_servers_hang_up():
    """The JVM hangs up on the accumulator server as the context stops: that EOFError is not
    printed; any other error of the server's handler still is."""
    from types import SimpleNamespace

    from statekit.engine.spark.session import quiet_accumulator_hangup

    printed = []
    srv = SimpleNamespace(handle_error=lambda request, addr: printed.append((request, addr)))
    quiet_accumulator_hangup(SimpleNamespace(_accumulatorServer=srv))
    for exc in (EOFError(), ValueError("bad token"), EOFError()):
        try:
            raise exc
        except Exception:
            srv.handle_error("req", ("127.0.0.1", 1))
    assert printed == [("req", ("127.0.0.1", 1))]
    quiet_accumulator_hangup(None)   # no context: nothing to do


def test_the_tasks_rows_reach_spark_as_one_arrow_batch_without_importing_pandas():
    """A `tasks` partition is read as one Arrow batch in the source's schema (pyspark passes such a
    batch through as it is), built without `pa.array` of a Python list, whose pandas shim imports
    pandas (~0.2 s of a worker's CPU before a query's first micro-batch)."""
    import subprocess
    import sys

    code = """
import json, sys
from pyspark.sql.pandas.types import to_arrow_schema
from statekit.engine.spark.source import (TASK_SCHEMA, AllTaskRanges, KafkaStreamReader, TaskRanges,
                                          _Options)
reader = KafkaStreamReader(_Options({"bootstrap": "127.0.0.1:1", "topic": "t", "tasks": "2"}),
                           TASK_SCHEMA)
one = list(reader.read(TaskRanges(1, [["t", 1, 4, 9], ["u", 1, 0, 2]])))
both = list(reader.read(AllTaskRanges([TaskRanges(0, []), TaskRanges(1, [["t", 1, 4, 9]])])))
want = to_arrow_schema(TASK_SCHEMA, timezone="UTC")
print(json.dumps({"one": [b.to_pylist() for b in one], "both": [b.to_pylist() for b in both],
                  "schema": all(b.schema.equals(want) for b in one + both),
                  "pandas": "pandas" in sys.modules}))
"""
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    import json

    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["one"] == [[{"task": 1, "ranges": '[["t", 1, 4, 9], ["u", 1, 0, 2]]'}]]
    assert got["both"] == [[{"task": 0, "ranges": "[]"}, {"task": 1, "ranges": '[["t", 1, 4, 9]]'}]]
    assert got["schema"] is True
    assert got["pandas"] is False
