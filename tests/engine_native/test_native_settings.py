"""The native engine's per-run state store settings (`run.extra["native"]`) hold for the query the
run starts: SparkEngine.start asks for the session again without the run, after the engine set them."""
from __future__ import annotations

from types import SimpleNamespace

from statekit.engine.spark_native.engine import CONF_MAINTENANCE, CONF_MIN_DELTAS, SparkNativeEngine


class _Conf(dict):
    def set(self, k, v):
        self[k] = v


def test_a_runs_settings_are_not_reset_by_the_sessionless_call_that_follows():
    engine = SparkNativeEngine(min_deltas_for_snapshot=10, maintenance_interval=60)
    spark = SimpleNamespace(sparkContext=SimpleNamespace(_jsc=object()), conf=_Conf())
    engine._spark = spark
    run = SimpleNamespace(extra={"native": {"min_deltas_for_snapshot": 3,
                                            "maintenance_interval": 1}})
    assert engine.session(run) is spark
    assert (spark.conf[CONF_MIN_DELTAS], spark.conf[CONF_MAINTENANCE]) == ("3", "1000ms")
    assert engine.session() is spark                  # SparkEngine.start's own call
    assert (spark.conf[CONF_MIN_DELTAS], spark.conf[CONF_MAINTENANCE]) == ("3", "1000ms")
    engine.session(SimpleNamespace(extra=None))       # the next run without overrides: the engine's
    assert (spark.conf[CONF_MIN_DELTAS], spark.conf[CONF_MAINTENANCE]) == ("10", "60000ms")
