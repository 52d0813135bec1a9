"""Issue 12's invalid topologies are refused when the app cell runs — the cell's body builds the
topology on `app`, then `App.validate()` compiles it and checks its topics (what `%%statekit app`
does) — each with one line that says what to change; the changed cell then validates. And Spark's
own state store engine (`statekit.NativeApp`) refuses the operators it cannot run, in one line,
before it starts anything."""
from __future__ import annotations

import pytest

from statekit.errors import StatekitError
from statekit.topology import (JoinWindows, Processor, PunctuationType, SessionWindows,
                               SlidingWindows, tumbling, until_time_limit, until_window_closes)


class Ticker(Processor):
    """A processor with a stream-time punctuator every INTERVAL ms (a class attribute per test)."""

    interval = 1000

    def init(self, context):
        self.context = context
        context.schedule(self.interval, PunctuationType.STREAM_TIME, self.tick)

    def process(self, key, value):
        self.context.forward(key, value)

    def tick(self, ts):
        pass


def zero_ticker():
    t = Ticker()
    t.interval = 0
    return t


def negative_ticker():
    t = Ticker()
    t.interval = -250
    return t


# (id, the cell's body with the mistake, words the error must say, the body with the fix)
CASES = [
    ("stream-stream join of streams keyed differently",
     lambda app: app.stream("orders", key_serde="str").join(
         app.stream("payments", key_serde="json"), lambda o, p: o, JoinWindows.of(60_000)),
     ["not co-partitioned", "same key serde"],
     lambda app: app.stream("orders", key_serde="str").join(
         app.stream("payments", key_serde="str"), lambda o, p: o, JoinWindows.of(60_000))),
    ("stream-table join of inputs keyed differently",
     lambda app: app.stream("orders").join(app.table("payments", key_serde="int64"), lambda o, p: o),
     ["not co-partitioned", "same key serde"],
     lambda app: app.stream("orders").join(app.table("payments"), lambda o, p: o)),
    ("join window with a negative grace",
     lambda app: app.stream("orders").join(app.stream("payments"), lambda o, p: o,
                                           JoinWindows(1000, 1000, -1)),
     ["grace_ms", ">= 0", "pass 0 or more"],
     lambda app: app.stream("orders").join(app.stream("payments"), lambda o, p: o,
                                           JoinWindows(1000, 1000, 0))),
    ("session window with a negative grace",
     lambda app: app.stream("orders").group_by_key().windowed_by(SessionWindows(5000, -10)).count(),
     ["grace_ms", ">= 0", "pass 0 or more"],
     lambda app: app.stream("orders").group_by_key().windowed_by(SessionWindows(5000, 10)).count()),
    ("sliding window with a negative grace",
     lambda app: app.stream("orders").group_by_key().windowed_by(SlidingWindows(5000, -1)).count(),
     ["grace_ms", ">= 0", "pass 0 or more"],
     lambda app: app.stream("orders").group_by_key().windowed_by(SlidingWindows(5000, 0)).count()),
    ("time window with a negative grace",
     lambda app: app.stream("orders").group_by_key().windowed_by(tumbling(1000), grace_ms=-5).count(),
     ["grace_ms", ">= 0", "pass 0 or more"],
     lambda app: app.stream("orders").group_by_key().windowed_by(tumbling(1000), grace_ms=5).count()),
    ("until_window_closes on a table without windows",
     lambda app: app.stream("orders").group_by_key().count().suppress(until_window_closes()),
     ["needs a windowed table", "until_time_limit(ms)"],
     lambda app: app.stream("orders").group_by_key().count().suppress(until_time_limit(1000))),
    ("until_window_closes on a view of a plain table",
     lambda app: app.table("orders").filter(lambda k, v: True).suppress(until_window_closes()),
     ["windowed table", "until_time_limit(ms)"],
     lambda app: app.table("orders").filter(lambda k, v: True).suppress(until_time_limit(10))),
    ("punctuator interval 0",
     lambda app: app.stream("orders").process(zero_ticker),
     ["context.schedule() needs an interval > 0 ms", "got 0", "positive whole number"],
     lambda app: app.stream("orders").process(Ticker)),
    ("punctuator interval < 0",
     lambda app: app.stream("orders").process(negative_ticker),
     ["interval > 0 ms", "got -250", "positive whole number"],
     lambda app: app.stream("orders").process(Ticker)),
]


@pytest.fixture(scope="module")
def topics(shared_broker):
    from statekit.kafka import Kafka

    with Kafka(shared_broker.bootstrap) as k:
        for t in ("orders", "payments"):
            k.ensure_topic(t, 2)
    return shared_broker


def run_cell(name, body, broker, state_dir):
    """What `%%statekit app NAME` does with its body: build on a fresh App, then validate()."""
    import statekit

    app = statekit.App(name, bootstrap=broker.bootstrap, state_dir=state_dir, partitions=2)
    try:
        body(app)
        app.validate()
        return app.state, None
    except StatekitError as exc:
        return app.state, exc
    finally:
        app.close()


@pytest.mark.parametrize("what,bad,words,good", CASES, ids=[c[0] for c in CASES])
def test_refused_when_the_app_cell_runs_then_the_fix_validates(what, bad, words, good, topics,
                                                               tmp_path):
    from statekit.runtime.lifecycle import AppState

    state, err = run_cell("cell", bad, topics, str(tmp_path / "bad"))
    assert err is not None, what
    msg = str(err)
    assert "\n" not in msg and len(msg) < 400, msg
    for w in words:
        assert w in msg, (w, msg)
    assert state == AppState.CREATED            # refused before anything started
    state, err = run_cell("cell", good, topics, str(tmp_path / "good"))
    assert err is None, err


def test_a_missing_topic_is_refused_by_validate_too(topics, tmp_path):
    state, err = run_cell("cell", lambda app: app.stream("paymnets").group_by_key().count(),
                          topics, str(tmp_path / "s"))
    assert err is not None and "did you mean 'payments'?" in str(err) and "\n" not in str(err)


# -- Spark's own state store engine -------------------------------------------------------------------------

def _fk(app):
    app.table("orders", value_serde="json").join(app.table("payments"), lambda o: o["c"],
                                                 lambda o, c: o)


NATIVE_REFUSED = [
    ("stream-stream join", lambda app: app.stream("orders").join(
        app.stream("payments"), lambda o, p: o, JoinWindows.of(10)), "stream-stream join"),
    ("table-table join", lambda app: app.table("orders").join(app.table("payments"),
                                                              lambda a, b: a).to_stream().to("o"),
     "table-table join"),
    ("foreign-key join", _fk, "repartition topics"),
    ("session window", lambda app: app.stream("orders").group_by_key().windowed_by(
        SessionWindows(10)).count(), "session count"),
    ("sliding window", lambda app: app.stream("orders").group_by_key().windowed_by(
        SlidingWindows(10)).count(), "sliding count"),
    ("suppress", lambda app: app.stream("orders").group_by_key().windowed_by(tumbling(10)).count()
     .suppress(until_window_closes()), "suppress until window closes"),
    ("re-aggregation", lambda app: app.table("orders", value_serde="json").group_by(
        lambda k, v: v["r"]).count(), "repartition topics"),
    ("punctuator", lambda app: app.stream("orders").process(Ticker), "punctuators"),
]


@pytest.mark.parametrize("what,body,words", NATIVE_REFUSED, ids=[c[0] for c in NATIVE_REFUSED])
def test_native_engine_refuses_new_operators_in_one_line(what, body, words, tmp_path):
    from statekit.engine.spark_native import NativeApp

    # an address nothing listens on: the refusal comes before Spark or Kafka is touched
    app = NativeApp("native", bootstrap="127.0.0.1:9", partitions=2, state_dir=str(tmp_path))
    body(app)
    with pytest.raises(StatekitError) as ei:
        app.start()
    msg = str(ei.value)
    assert "\n" not in msg and words in msg and "statekit.App(" in msg, msg
    assert app.query is None


def test_native_engine_still_takes_what_it_runs(tmp_path):
    from statekit.engine.spark_native.translate import check_supported
    from statekit.topology import TopologyBuilder

    b = TopologyBuilder()
    users = b.table("users", store="users")
    (b.stream("clicks").join(users, lambda c, u: f"{c}/{u}").group_by_key()
     .windowed_by(tumbling(10)).count(store="w").to_stream().to("out"))
    b.stream("words").flat_map_values(str.split).group_by(lambda k, w: w).count(store="c")
    plan = b.compile("native", engine_shuffle=True)
    assert check_supported(plan) is None      # accepted: no TopologyError
    # what it accepted: the re-key is the engine's shuffle (no repartition topic), and the join's
    # table, the windowed count and the count by word are its stores
    assert not plan.repartition_topics
    assert sorted((s.name, s.kind) for s in plan.stores) == [("c", "kv"), ("users", "kv"), ("w", "window")]


def test_a_hold_on_restores_names_real_tasks_and_a_share_below_one(tmp_path):
    import statekit
    from statekit.worker import hold

    app = statekit.App("held", bootstrap="127.0.0.1:9", partitions=2, state_dir=str(tmp_path))
    app.stream("words").group_by_key().count(store="counts")
    for bad, words in (({"tasks": ["0_7"]}, "has no task '0_7' (tasks: 0_0, 0_1)"),
                       ({"at": 1.0}, "0 <= at < 1 (got 1.0)"), ({"at": "half"}, "0 <= at < 1")):
        with pytest.raises(StatekitError) as ei:
            app.hold_restores(**bad)
        msg = str(ei.value)
        assert "\n" not in msg and words in msg, msg
    assert hold.read(app.layout.control_dir) is None            # nothing held by a refusal
    assert app.hold_restores("0_1", at=0.25) == {"tasks": ["0_1"], "at": 0.25}
    assert app.release_restores() and not app.release_restores()
