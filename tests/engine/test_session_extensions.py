"""When statekit builds its session without Spark ML's session extension and applies it later
(engine.spark.session_extensions): the decision, and the context setting around the build, with
small fakes of py4j's objects. The real session's side is in test_engine.py."""
from __future__ import annotations

import threading
from types import SimpleNamespace

from statekit.engine.spark.session_extensions import (
    LOAD_FROM_CLASSPATH,
    ML_PROVIDER,
    SERVICE,
    apply_ml_extension_when_quiet,
    can_defer,
    declared_providers,
    ml_extension_deferred,
)

PYSPARK_SERVICE_FILE = f"""#
# Licensed to the Apache Software Foundation (ASF) ...
#

{ML_PROVIDER}
"""


def test_a_service_file_declares_its_non_comment_lines():
    assert declared_providers(PYSPARK_SERVICE_FILE) == {ML_PROVIDER}
    assert declared_providers("a.B  # trailing\n\n  c.D\n#e.F\n") == {"a.B", "c.D"}


def test_deferred_only_with_spark_ml_alone_and_nothing_set_about_extensions():
    nothing = {}.get
    assert can_defer(nothing, {ML_PROVIDER})
    assert not can_defer(nothing, {ML_PROVIDER, "io.delta.Provider"})   # another provider
    assert not can_defer(nothing, set())                                 # a Spark without ML's
    assert not can_defer({"spark.sql.extensions": "io.delta.sql.DeltaSparkSessionExtension"}.get,
                         {ML_PROVIDER})
    assert can_defer({"spark.sql.extensions": " "}.get, {ML_PROVIDER})
    for given in ("true", "false"):   # the user's own say on the class path's providers
        assert not can_defer({LOAD_FROM_CLASSPATH: given}.get, {ML_PROVIDER})


class _Stream:
    def __init__(self, text):
        self.data, self.closed = text.encode(), False

    def readAllBytes(self):
        return bytearray(self.data)

    def close(self):
        self.closed = True


class _Url:
    def __init__(self, text):
        self.stream = _Stream(text)

    def openStream(self):
        return self.stream


class _Urls:
    def __init__(self, urls):
        self.left = list(urls)

    def hasMoreElements(self):
        return bool(self.left)

    def nextElement(self):
        return self.left.pop(0)


class _Conf(dict):
    def get(self, key, default=None):
        return dict.get(self, key, default)

    def set(self, key, value):
        self[key] = value

    def remove(self, key):
        del self[key]


class _Context:
    """What ml_extension_deferred asks of a SparkContext: its JVM conf and its class loader."""

    def __init__(self, service_files, conf=None):
        self.urls = [_Url(t) for t in service_files]
        self.conf = _Conf(conf or {})
        self.asked = []

        def get_resources(name):
            self.asked.append(name)
            return _Urls(self.urls)

        loader = SimpleNamespace(getResources=get_resources)
        utils = SimpleNamespace(getContextOrSparkClassLoader=lambda: loader)
        self._jvm = SimpleNamespace(org=SimpleNamespace(apache=SimpleNamespace(
            spark=SimpleNamespace(util=SimpleNamespace(Utils=utils)))))
        self._jsc = SimpleNamespace(sc=lambda: SimpleNamespace(conf=lambda: self.conf))


def test_the_setting_holds_only_while_the_session_is_built():
    sc = _Context([PYSPARK_SERVICE_FILE])
    with ml_extension_deferred(sc) as later:
        assert later is True
        assert sc.conf == {LOAD_FROM_CLASSPATH: "false"}
    assert sc.conf == {}                      # the user's later sessions load providers again
    assert sc.asked == [SERVICE]
    assert all(u.stream.closed for u in sc.urls)


def test_the_setting_is_removed_when_the_build_fails():
    sc = _Context([PYSPARK_SERVICE_FILE])
    try:
        with ml_extension_deferred(sc):
            raise RuntimeError("the session did not start")
    except RuntimeError:
        pass
    assert sc.conf == {}


def test_another_provider_in_another_jar_keeps_spark_s_own_build():
    sc = _Context([PYSPARK_SERVICE_FILE, "org.example.MyExtensions\n"])
    with ml_extension_deferred(sc) as later:
        assert later is False
        assert sc.conf == {}


def test_a_context_that_cannot_answer_keeps_spark_s_own_build():
    sc = _Context([PYSPARK_SERVICE_FILE])
    sc._jvm = object()                      # no Utils: another Spark
    with ml_extension_deferred(sc) as later:
        assert later is False
    assert sc.conf == {}


class _Session:
    """What apply_ml_extension asks of a session: the provider's class and its extensions."""

    def __init__(self):
        self.applied = []
        provider = SimpleNamespace(apply=self.applied.append)
        self._jvm = SimpleNamespace(**{ML_PROVIDER: lambda: provider})
        self._jsparkSession = SimpleNamespace(extensions=lambda: "the session's extensions")


def test_applied_to_the_session_s_extensions_once_no_query_is_starting():
    spark, calls = _Session(), []
    states = iter([True, True, False])

    def starting():
        calls.append(len(spark.applied))
        return next(states)

    assert apply_ml_extension_when_quiet(spark, starting, wait_s=10, poll_s=0.01)
    assert calls == [0, 0, 0]                 # never applied while a query was starting
    assert spark.applied == ["the session's extensions"]


def test_applied_after_the_wait_when_a_query_never_gets_past_its_start():
    spark, done = _Session(), threading.Event()

    def run():
        apply_ml_extension_when_quiet(spark, lambda: True, wait_s=0.3, poll_s=0.01)
        done.set()

    threading.Thread(target=run, daemon=True).start()
    assert done.wait(10)
    assert spark.applied == ["the session's extensions"]


def test_a_session_gone_meanwhile_is_left_alone():
    spark = _Session()

    def starting():
        raise ConnectionError("the JVM is gone")

    assert apply_ml_extension_when_quiet(spark, starting, wait_s=10, poll_s=0.01) is False
    assert spark.applied == []
