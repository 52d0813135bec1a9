"""Spark ML's session extension, applied once statekit's first query runs instead of while its
session is built.

A classic SparkSession applies, as it is built, every `SparkSessionExtensionsProvider` its class
path declares. pyspark's jars declare one: Spark ML's `InternalFunctionRegistration`, whose `apply`
only makes sure that a Scala object has registered three internal functions (`vector_to_array`,
...) in Spark's JVM-wide registry of internal functions. Making that object starts Scala's runtime
reflection and Spark's encoders for those functions: ~0.5 s of CPU on the thread that builds the
session, in the critical path of every cold launch, for functions no statekit query calls (cold
launch to the first commit here: median 2.99 s against 3.35 s, eight interleaved pairs).

When that provider is the only one Spark would load and no `spark.sql.extensions` is set, the
session statekit starts is built without loading providers (Spark's static setting
`spark.sql.extensions.test.loadFromCp`, false on the context only while the session is made) and
statekit applies the same provider to the session's extensions itself, once no statekit query is
being started or waits for its first micro-batch (`apply_ml_extension_when_quiet`). What it
registers is JVM-wide, so every session sees the same functions from then on, as it would have.
Any other provider, an extensions setting, that setting given by the user, or a Spark that answers
otherwise: the session is built as Spark builds it.
"""
from __future__ import annotations

import contextlib
import time
from typing import Callable

SERVICE = "META-INF/services/org.apache.spark.sql.SparkSessionExtensionsProvider"
ML_PROVIDER = "org.apache.spark.sql.ml.InternalFunctionRegistration"
LOAD_FROM_CLASSPATH = "spark.sql.extensions.test.loadFromCp"
EXTENSIONS = "spark.sql.extensions"
QUIET_WAIT_S = 30.0     # at most this long for statekit's queries to be past their first batch


def declared_providers(text: str) -> set:
    """The class names a service file declares (comments and blank lines left out)."""
    return {ln.split("#", 1)[0].strip() for ln in text.splitlines()} - {""}


def can_defer(conf_get: Callable[[str], "str | None"], providers: set) -> bool:
    """Spark ML's provider alone on the class path, and nothing set that changes which
    extensions a session gets."""
    return (providers == {ML_PROVIDER} and not (conf_get(EXTENSIONS) or "").strip()
            and conf_get(LOAD_FROM_CLASSPATH) is None)


def _class_path_providers(jvm) -> set:
    """The providers the context's class loader declares, read as Spark's `ServiceLoader` reads
    them (the loader `Utils.getContextOrSparkClassLoader` gives the thread that builds it)."""
    loader = jvm.org.apache.spark.util.Utils.getContextOrSparkClassLoader()
    urls, names = loader.getResources(SERVICE), set()
    while urls.hasMoreElements():
        stream = urls.nextElement().openStream()
        try:
            names |= declared_providers(bytes(stream.readAllBytes()).decode("utf-8", "replace"))
        finally:
            stream.close()
    return names


@contextlib.contextmanager
def ml_extension_deferred(sc):
    """Around building the first session on ``sc``: yields whether Spark ML's extension was left
    for `apply_ml_extension` (False: the session is built as Spark builds it)."""
    jconf = sc._jsc.sc().conf()
    try:
        defer = can_defer(lambda k: jconf.get(k, None), _class_path_providers(sc._jvm))
    except Exception:  # noqa: BLE001 - a Spark that answers otherwise: built as Spark builds it
        defer = False
    if not defer:
        yield False
        return
    jconf.set(LOAD_FROM_CLASSPATH, "false")
    try:
        yield True
    finally:   # later sessions on this context (the user's own) load the providers again
        jconf.remove(LOAD_FROM_CLASSPATH)


def apply_ml_extension(spark) -> bool:
    """Apply Spark ML's provider to ``spark``'s extensions, as Spark would have; False when the
    JVM is gone or refuses."""
    try:
        jvm = spark._jvm
        getattr(jvm, ML_PROVIDER)().apply(spark._jsparkSession.extensions())
        return True
    except Exception:  # noqa: BLE001 - a stopped session: nothing left to register in
        return False


def apply_ml_extension_when_quiet(spark, starting: Callable[[], bool],
                                  wait_s: float = QUIET_WAIT_S, poll_s: float = 0.2) -> bool:
    """Once ``starting()`` says no statekit query is being started or waits for its first
    micro-batch (at most ``wait_s`` later), apply the extension."""
    deadline = time.monotonic() + wait_s
    while time.monotonic() < deadline:
        try:
            if not starting():
                break
        except Exception:  # noqa: BLE001 - the JVM went away meanwhile
            return False
        time.sleep(poll_s)
    return apply_ml_extension(spark)
