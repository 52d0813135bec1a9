"""The SparkSession statekit starts (classic or Spark Connect), what statekit started on it, and
the translation of Spark failures into one-line errors.

- `local[2]`: two task slots. Local mode never retries a failed task (`spark.task.maxFailures` is
  ignored by `local[N]`; only `local[N,F]` retries), so a worker killed mid-batch fails the job and
  with it the streaming query. We still set `spark.task.maxFailures=1` to say so.
- The Spark UI is off, memory is small, and the JVM's log goes to a file (`log_path()`), never to the
  console: a person sees one line (`statekit.errors.StatekitError`), not a Java stack trace.
- `PYSPARK_PYTHON` is this interpreter, or Python workers fail to connect back.
- An active session is reused (with the `statekit-kafka` data source registered on it).
- The master: `get_session(master=...)`, else `STATEKIT_SPARK_MASTER`, else `SPARK_REMOTE`, else
  `local[2]`. A cluster master (`spark://HOST:7077`, `yarn`, `k8s://...`) gets Spark's task retries
  (`spark.task.maxFailures=4`: a task of an executor lost mid-batch is replayed elsewhere with its
  batch id) and binds the driver to loopback only when the master is on loopback too.
- Spark Connect: a master `sc://HOST:PORT` (or `SPARK_REMOTE`) connects to that server;
  `spark.api.mode=connect` (in `extra_conf`, or `SPARK_API_MODE=connect`) with any other master
  starts a local Spark Connect server on it (`engine.spark.connect_server`, an ephemeral port) and
  connects to it. pyspark runs one mode per process: a classic session and a Connect one do not
  share a process.
- Ownership: statekit stops only what it started. `stop_session()` stops the queries statekit
  started and the session (and server) it created, and leaves running — saying why — a session
  the user made, or one on which queries statekit did not start still run.
"""
from __future__ import annotations

import contextlib
import os
import re
import sys
import threading
import time
import warnings

from statekit.engine.spark import session_api
from statekit.engine.spark.data_source_lookup import look_up_data_sources_early
from statekit.engine.spark.jvm_launch import DirectLaunch, JvmKeeper
from statekit.engine.spark.quiet import quiet_driver
from statekit.engine.spark.session_extensions import apply_ml_extension_when_quiet, ml_extension_deferred
from statekit.engine.spark.jvm import (  # noqa: F401 - re-exported: the JVM's options, logs, archive
    JAVA_OPTS,
    LOCAL_DISK_CONF,
    LOG4J as _LOG4J,
    PYTHON_WORKER_IDLE_S,
    JavaMissing,
    archive_was_the_cause,
    built_class_archive,
    check_java,
    class_archive,
    file_size,
    jvm_options,
    jvm_stderr_path,
    log_dir,
    log_path,
    prepare_env as _prepare_env,
    said_since,
    set_archive_aside,
    stderr_to_file as _stderr_to_file,
)
from statekit.errors import StatekitError

MASTER = "local[2]"
MASTER_ENV = "STATEKIT_SPARK_MASTER"
REMOTE_ENV = "SPARK_REMOTE"
CLUSTER_TASK_MAX_FAILURES = 4


class SparkFailure(StatekitError):
    """A Spark job, query or plan failed; the message is the one useful line."""


class SessionConflict(StatekitError):
    """A session with another master is already running in this process."""


def resolve_master(master: str | None = None) -> str:
    """The master of the session statekit creates: ``master``, else ``$STATEKIT_SPARK_MASTER``,
    else ``$SPARK_REMOTE`` (a Spark Connect server), else ``local[2]``."""
    return (master or os.environ.get(MASTER_ENV) or os.environ.get(REMOTE_ENV) or MASTER).strip()


def is_connect_url(master: str | None) -> bool:
    """``sc://HOST:PORT``: a Spark Connect server."""
    return str(master or "").strip().startswith("sc://")


def connect_mode_asked(extra_conf: dict | None = None) -> bool:
    """``spark.api.mode=connect`` in ``extra_conf`` or ``$SPARK_API_MODE`` (pyspark's own)."""
    mode = (extra_conf or {}).get("spark.api.mode") or os.environ.get("SPARK_API_MODE", "")
    return str(mode).strip().lower() == "connect"


def is_local_master(master: str | None) -> bool:
    """``local``, ``local[N]``, ``local[N,F]``, ``local-cluster[...]`` run on this machine's JVM
    (``local-cluster`` has executors in other JVMs, but on this machine)."""
    return str(master or MASTER).startswith("local")


def _loopback_master(master: str) -> bool:
    m = re.match(r"^\w+://([^:/]+)", master)
    return is_local_master(master) or (m is not None and m.group(1) in ("127.0.0.1", "localhost", "::1"))


_LOCK = threading.Lock()


# --- what statekit started ---------------------------------------------------------------------------

class _Owned:
    """The session statekit created in this process (None: the active one, if any, is the user's),
    the local Connect server it started for it, and the streaming queries statekit started (on
    any session: ``App(spark=...)`` runs on the user's)."""

    def __init__(self):
        self.session = None
        self.server = None
        self.connect_env = False     # statekit set SPARK_CONNECT_MODE_ENABLED (a Connect session)
        self.queries: dict = {}      # query id -> name
        self.launched_directly = False   # its JVM started without spark-submit (jvm_launch)
        self.fork_server = None      # its Python processes' fork server (engine.spark.fork_server)


_OWNED = _Owned()


def own_query(query) -> None:
    """Remember that statekit started ``query`` (``engine.spark.engine.launch`` calls it)."""
    try:
        _OWNED.queries[str(query.id)] = str(query.name)
    except Exception:  # noqa: BLE001 - a query that failed at its start
        pass


def started_by_statekit(query) -> bool:
    try:
        return str(query.id) in _OWNED.queries
    except Exception:  # noqa: BLE001
        return False


def statekit_owns(spark) -> bool:
    """Whether statekit created ``spark`` (and may stop it)."""
    return spark is not None and spark is _OWNED.session


def forget_owned_session() -> None:
    """The session statekit created is gone (its JVM was killed: ``spark_native.kill_jvm``)."""
    _OWNED.session = None


def _active():
    from pyspark.sql import SparkSession

    if _OWNED.session is not None and session_api.of(_OWNED.session).alive():
        return _OWNED.session
    try:
        return SparkSession.getActiveSession()
    except Exception:  # noqa: BLE001 - a Connect client whose server went away
        return None


def _classic_context_runs() -> bool:
    from pyspark import SparkContext

    return SparkContext._active_spark_context is not None


# --- starting it -------------------------------------------------------------------------------------

# the SQL settings every session of statekit's gets, classic or Spark Connect (a Connect server's
# static settings are the server's: a local server statekit starts has them,
# engine.spark.connect_server)
SQL_CONF = {
    "spark.sql.adaptive.enabled": "false",
    # No whole-stage code generation: statekit's queries hand tasks and offset ranges to Python
    # (the records never pass through the JVM), so compiling their stages bought nothing and cost
    # the first micro-batch about half a second of a cold launch's CPU (Janino). The native
    # engine, whose operators do compute in the JVM, turns it on again (engine.spark_native).
    "spark.sql.codegen.wholeStage": "false",
    # Nor any other: the projections a stage still needs (a row or two per task) are interpreted.
    # Generating the first one loads and warms Janino (a signed jar, which the class archive cannot
    # hold): ~0.25 s in the middle of a cold launch, ~0.2 s off the first output here.
    "spark.sql.codegen.factoryMode": "NO_CODEGEN",
    "spark.sql.execution.arrow.pyspark.enabled": "true",
    "spark.sql.streaming.stopTimeout": "30s",
    "spark.sql.streaming.noDataMicroBatches.enabled": "false",
    "spark.sql.session.timeZone": "UTC",
}


def _reachable(url: str, timeout: float = 10.0) -> None:
    """A TCP connection to the server answers, or a one-line error at once (pyspark's client
    retries an unreachable server for minutes)."""
    import socket

    m = re.match(r"^sc://\[?([^\]/:;]+)\]?(?::(\d+))?", url)
    if not m:
        raise SparkFailure(f"{url} is not a Spark Connect URL: use sc://HOST:PORT")
    host, port = m.group(1), int(m.group(2) or 15002)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError as exc:
        raise SparkFailure(f"could not reach the Spark Connect server at {url} ({exc.strerror or exc}): "
                           f"is it running? (`statekit spark status` on its machine)") from None


def _connect_session(url: str, shuffle_partitions: int | None):
    """A Spark Connect client session on ``url``."""
    from pyspark.sql import SparkSession

    if _classic_context_runs():
        raise SessionConflict(f"a classic Spark session runs in this process, and pyspark runs one "
                              f"mode per process: stop it first (%statekit down, or statekit.engine."
                              f"spark.stop_session()), then connect to {url}")
    _reachable(url)
    had_env = "SPARK_CONNECT_MODE_ENABLED" in os.environ
    b = SparkSession.builder.remote(url)
    for k, v in dict(SQL_CONF, **{"spark.sql.shuffle.partitions": str(shuffle_partitions or 2)}).items():
        b = b.config(k, v)
    spark = None
    try:
        spark = b.getOrCreate()
        spark.range(1).count()   # the server answers (getOrCreate alone does not ask it)
    except Exception as exc:  # noqa: BLE001
        if spark is not None:    # not handed out again by a later getOrCreate
            try:
                spark.stop()
            except Exception:  # noqa: BLE001
                pass
        if not had_env:
            os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)
        raise one_line(exc, f"could not reach the Spark Connect server at {url}") from None
    _OWNED.connect_env = not had_env
    return spark


def _local_connect_server(master: str, extra_conf: dict | None):
    from statekit.engine.spark.connect_server import ConnectServer

    conf = {k: v for k, v in (extra_conf or {}).items() if k != "spark.api.mode"}
    root = os.path.join(log_dir(), f"connect-{os.getpid()}")
    return ConnectServer(root, master=master, conf=conf).start()


def get_session(app_name: str = "statekit", *, shuffle_partitions: int | None = None,
                driver_memory: str = "512m", extra_conf: dict | None = None,
                master: str | None = None):
    """Return the active SparkSession (reused) or start the one statekit uses, on ``master`` (else
    ``$STATEKIT_SPARK_MASTER``, else ``$SPARK_REMOTE``, else ``local[2]``). Asking for a master
    other than the running session's raises ``SessionConflict``."""
    with _LOCK:
        spark = _active()
        if spark is not None and master:
            running = session_master(spark)
            want = master.strip()
            if is_connect_url(want):
                running = connect_url(spark) or running
            if is_connect_url(want) != session_api.is_connect(spark) or (
                    running and running.rstrip("/") != want.split(";")[0].rstrip("/")):
                raise SessionConflict(f"a Spark session on {running} is already running in this "
                                      f"process: stop it first (%statekit down, or statekit.engine."
                                      f"spark.stop_session()), then start one on {master}")
        if spark is None:
            master = resolve_master(master)
            if is_connect_url(master):
                spark = _connect_session(master, shuffle_partitions)
            elif connect_mode_asked(extra_conf):
                check_java()
                server = _local_connect_server(master, extra_conf)
                try:
                    spark = _connect_session(server.url, shuffle_partitions)
                except BaseException:
                    server.stop()
                    raise
                _OWNED.server = server
            else:
                spark = _classic_session(app_name, master, shuffle_partitions, driver_memory,
                                         extra_conf)
            _OWNED.session = spark
        elif shuffle_partitions:
            spark.conf.set("spark.sql.shuffle.partitions", str(shuffle_partitions))
        api = session_api.of(spark)
        api.register_source()
        if not getattr(spark, "_statekit_warm", False):
            # in the background: a query that starts meanwhile is not held up by it
            threading.Thread(target=_warm_up, args=(spark,), name="statekit-spark-warm",
                             daemon=True).start()
            try:
                spark._statekit_warm = True
            except Exception:  # noqa: BLE001
                pass
        return spark


class _NumpyOnly:
    """One of pyspark's numpy input converters, asked only about a numpy object.

    py4j asks every input converter about every argument a Python call passes to the JVM, and
    pyspark's two numpy converters answer by importing `pyspark.testing.utils` to learn whether
    numpy is installed: that module imports pandas and pyarrow (~40 MB of the driver's PSS and
    ~1 s of CPU here) on the first call that passes a list, in a driver that never uses either. An
    ndarray or a numpy scalar can only exist once numpy is imported, so asking `sys.modules`
    first answers the same."""

    def __init__(self, inner):
        self.inner = inner

    def can_convert(self, obj) -> bool:
        np = sys.modules.get("numpy")
        return (np is not None and isinstance(obj, (np.ndarray, np.generic))
                and self.inner.can_convert(obj))

    def convert(self, obj, gateway_client):
        return self.inner.convert(obj, gateway_client)


def _light_numpy_converters() -> None:
    """Wrap pyspark's numpy converters in ``_NumpyOnly`` (once; registered by pyspark.sql.types)."""
    from py4j.protocol import INPUT_CONVERTER
    from pyspark.sql import types

    numpy_kinds = tuple(getattr(types, n) for n in ("NumpyArrayConverter", "NumpyScalarConverter")
                        if hasattr(types, n))
    for i, conv in enumerate(INPUT_CONVERTER):
        if isinstance(conv, numpy_kinds):
            INPUT_CONVERTER[i] = _NumpyOnly(conv)


def _jvm_pid() -> int | None:
    """The pid of the JVM this process launched for its session (None when it did not)."""
    from pyspark import SparkContext

    proc = getattr(getattr(SparkContext, "_gateway", None), "proc", None)
    return getattr(proc, "pid", None)


FORK_SERVER_SWITCH = "STATEKIT_SPARK_FORK_SERVER"   # "off": Spark's Python processes start afresh


def _start_fork_server(master: str):
    """The fork server for a local session's Python processes (engine.spark.fork_server), started
    before the JVM so that it has imported what they need by the time Spark starts the first; None
    for another master, or when it cannot start (they then start as before)."""
    if _OWNED.fork_server is not None:   # a session before this one (stopped by its user) had it
        _OWNED.fork_server.stop()
        _OWNED.fork_server = None
    if not is_local_master(master) or os.environ.get(FORK_SERVER_SWITCH, "").lower() == "off":
        return None
    from statekit.engine.spark.fork_server import ForkServer

    try:
        return ForkServer(log_dir(), jvm_stderr_path())
    except OSError:
        return None


@contextlib.contextmanager
def _fork_server_env(forks):
    """The fork server's socket in the environment the JVM is launched with (and only there)."""
    from statekit.engine.spark.fork_server import ENV

    if forks is None:
        yield
        return
    os.environ[ENV] = forks.path
    try:
        yield
    finally:
        os.environ.pop(ENV, None)


def _build_session(opts: dict):
    """The context, then the session on it, as `SparkSession.builder.getOrCreate()` makes them,
    with Spark ML's session extension applied after the first query's start when that makes the
    same session (engine.spark.session_extensions)."""
    from pyspark import SparkConf, SparkContext
    from pyspark.sql import SparkSession

    sc = SparkContext.getOrCreate(SparkConf().setAll(list(opts.items())))
    with ml_extension_deferred(sc) as later:
        spark = SparkSession.builder.config(map=opts).getOrCreate()
    if later:
        spark._statekit_ml_extension_later = True
    return spark


def _classic_session(app_name: str, master: str, shuffle_partitions, driver_memory: str,
                     extra_conf: dict | None):
    """Start the classic session (its JVM in this process)."""
    check_java()
    _light_numpy_converters()
    quiet_driver()
    loopback = _loopback_master(master)
    _prepare_env(loopback)
    props = os.path.join(log_dir(), f"log4j2-{os.getpid()}.properties")
    with open(props, "w") as fh:
        fh.write(_LOG4J.format(path=log_path()))
    archive = built_class_archive()
    log_opts = (f"-Dlog4j.configurationFile=file:{props} "
                f"-Dlog4j2.configurationFile=file:{props} ")
    # executors on this machine (a standalone cluster here) relay records to Python workers
    # and share the cores with everything else, as the driver does: the same options (one
    # then starts on ~3 s of CPU, not ~12), unless extra_conf gives them their own
    executors_here = (loopback and not is_local_master(master)
                      and "spark.executor.extraJavaOptions" not in (extra_conf or {}))

    def with_jvm_options(opts, archive):
        opts["spark.driver.extraJavaOptions"] = log_opts + jvm_options(archive)
        if executors_here:
            opts["spark.executor.extraJavaOptions"] = jvm_options(archive)

    opts = {"spark.master": master, "spark.app.name": app_name,
            "spark.ui.enabled": "false", "spark.ui.showConsoleProgress": "false",
            "spark.driver.memory": driver_memory,
            "spark.sql.shuffle.partitions": str(shuffle_partitions or 2),
            "spark.python.worker.reuse": "true", **SQL_CONF}
    with_jvm_options(opts, archive)
    if is_local_master(master):
        opts.update({"spark.task.maxFailures": "1", "spark.default.parallelism": "2"})
    else:  # a lost executor's tasks are retried elsewhere: that is how its batch replays
        opts["spark.task.maxFailures"] = str(CLUSTER_TASK_MAX_FAILURES)
    if loopback:
        opts.update({"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1"})
        # workers forked with statekit's imports done and frozen (worker_daemon.py); on
        # this machine, where the executors' Python is this one
        opts["spark.python.daemon.module"] = "statekit.engine.spark.worker_daemon"
        opts.update(LOCAL_DISK_CONF)
        if not is_local_master(master):   # the executors placement's tasks use pandas
            opts["spark.executorEnv.STATEKIT_DAEMON_PANDAS"] = "1"
    opts.update({k: str(v) for k, v in (extra_conf or {}).items()})
    set_aside = None
    stderr = jvm_stderr_path()
    # kept from its first moment (an interrupted start leaves no JVM behind), and started with
    # the command spark-submit computed before for the same launch (engine.spark.jvm_launch)
    keeper = JvmKeeper(DirectLaunch({"log4j": props}))
    forks, started = _start_fork_server(master), False
    try:
        with _stderr_to_file(stderr), keeper, _fork_server_env(forks):
            said_from, t0 = file_size(stderr), time.time()
            look_up_data_sources_early()
            for _ in range(3):
                try:
                    spark = _build_session(opts)
                    break
                except Exception:
                    if keeper.went_direct:   # that command no longer starts: spark-submit again
                        keeper.forget_direct()
                        continue
                    # a damaged class archive can stop the JVM at its start: set it aside (the
                    # next `make` writes a new one) and start without it, only when it says so
                    if (archive is None or set_aside
                            or not archive_was_the_cause(said_since(stderr, said_from), t0)):
                        raise
                    set_aside = set_archive_aside(archive)
                    with_jvm_options(opts, None)
            keeper.learn()
            _OWNED.launched_directly = keeper.went_direct
        started = True
    except Exception as exc:  # the JVM did not come up: what it said, if it said something
        said = [ln for ln in said_since(stderr, said_from).splitlines()
                if "Exception" in ln and not ln.lstrip().startswith("at ")]
        if said:
            cause = explain(re.sub(r'^Exception in thread "[^"]*"\s*', "", said[0].strip()))
            raise SparkFailure(f"Spark did not start: {cause} (the JVM's output: "
                               f"{stderr})") from None
        raise one_line(exc, f"Spark did not start (the JVM's output: {stderr})") from None
    finally:
        if forks is not None and not started:   # no session (the keeper ended its JVM): no server
            forks.stop()
            forks = None
    _OWNED.fork_server = forks
    from statekit.engine.spark.planners import REAPER

    if "ArchiveClassesAtExit" in jvm_options(None):
        keeper.release()   # it writes a class archive as it exits (scripts/spark_cds.py): a
        # JVM whose starter has just exited is left the time that takes
    # Spark's idle planner daemons end (engine.spark.planners)
    REAPER.own(_jvm_pid(), forks.path if forks is not None else None)
    if set_aside:
        print(f"statekit: the JVM did not start with the class archive {archive}; it is "
              f"now {set_aside} and Spark started without it (make writes a new one)",
              file=sys.stderr)
    # levels come from our log4j2 file (setLogLevel would print to the console). A
    # micro-batch that fails in a Python worker reaches the user once, as statekit's one-line
    # error; pyspark's own warning about the Arrow conversion it interrupted is noise.
    warnings.filterwarnings("ignore", message="toPandas attempted Arrow optimization",
                            category=UserWarning)
    return spark


def get_session_soon(master: str | None = None) -> threading.Thread:
    """Start (or reuse) the session in a thread now, so that the JVM boots while the caller does
    other work (an App starts its instances meanwhile); a later `get_session` waits for it."""
    def boot():
        try:
            get_session(master=master)
        except Exception:  # noqa: BLE001 - the caller's own get_session says what went wrong
            pass

    t = threading.Thread(target=boot, name="statekit-spark-boot", daemon=True)
    t.start()
    return t


def connect_url(spark) -> str | None:
    """``sc://HOST:PORT`` of a Spark Connect session's server (None: not a Connect session)."""
    if not session_api.is_connect(spark):
        return None
    try:
        return f"sc://{spark.client._builder.endpoint}"
    except Exception:  # noqa: BLE001
        return None


def connect_url_is_here(url: str) -> bool:
    """Whether a Spark Connect URL's server runs on this machine (what a local master there means
    for the instances placement, whose processes listen on 127.0.0.1)."""
    import socket

    m = re.match(r"^sc://\[?([^\]/:;]+)", url or "")
    host = m.group(1) if m else ""
    return host in ("127.0.0.1", "localhost", "::1", "0.0.0.0", socket.gethostname(), socket.getfqdn())


def describe(spark) -> list:
    """What the status card says of a session: version, master, a Spark Connect session's server
    URL and whose session it is (``["stopped"]`` once it is gone)."""
    api = session_api.of(spark)
    if not api.alive():
        return ["stopped"]
    try:
        parts = [spark.version, api.master() or "?"]
    except Exception:  # noqa: BLE001 - stopped between the two questions
        return ["stopped"]
    if api.connect:
        parts.append(f"Spark Connect · {connect_url(spark) or '?'}")
    parts.append("started by statekit" if statekit_owns(spark) else "your own session")
    return parts


def session_master(spark) -> str | None:
    """The master of a session (a Spark Connect session's: the server's ``spark.master``)."""
    return session_api.of(spark).master()


def map_in_arrow(df, func, schema):
    """``df.mapInArrow(func, schema)`` without importing pandas and pyarrow into the driver.

    pyspark's ``mapInArrow`` goes through ``pandas_udf``, which checks the installed pandas and
    pyarrow versions by importing both (~80 MB of a lone process's PSS, ~1 s of CPU here), and
    checks the return type with pyarrow's types; the driver only pickles ``func`` for the Python
    workers, which import pyarrow themselves. A Spark Connect
    DataFrame (no JVM object here) takes pyspark's own path."""
    jdf = getattr(df, "_jdf", None)
    if jdf is None:
        return df.mapInArrow(func, schema)
    from pyspark.sql import DataFrame
    from pyspark.sql.types import StructType, _parse_datatype_string
    from pyspark.sql.udf import UserDefinedFunction
    from pyspark.util import PythonEvalType

    class ArrowMapFunction(UserDefinedFunction):
        """pyspark's UDF, without the check of its return type through pyarrow's types (which
        imports pyarrow into the driver, ~20 MB): the schema is a struct of plain columns, and
        the workers convert it anyway."""

        @property
        def returnType(self):
            if self._returnType_placeholder is None:
                t = self._returnType
                self._returnType_placeholder = t if isinstance(t, StructType) else _parse_datatype_string(t)
            return self._returnType_placeholder

    udf = ArrowMapFunction(func, returnType=schema, evalType=PythonEvalType.SQL_MAP_ARROW_ITER_UDF)
    column = udf(*[df[c] for c in df.columns])
    return DataFrame(jdf.mapInArrow(column._jc, False, None), df.sparkSession)


def _warm_partition(batches):
    """In a Python worker: import what a statekit query's stage uses."""
    import statekit.event_bus  # noqa: F401
    import statekit.worker.exchange  # noqa: F401

    for b in batches:
        yield b


def _artifact_id_partition(batches):
    """In a Python worker: the artifact id the server runs this session's Python under."""
    import pyarrow as pa

    from statekit.engine.spark.helpers import ENV

    for _ in batches:
        pass
    yield pa.RecordBatch.from_arrays([pa.array([os.environ.get(ENV, "default")])], names=["id"])


def artifact_ids(spark) -> set:
    """The artifact ids a Spark Connect server runs this session's Python helpers under (one
    small job; empty when it cannot tell)."""
    try:
        return {r["id"] for r in spark.range(1).mapInArrow(_artifact_id_partition, "id string").collect()}
    except Exception:  # noqa: BLE001 - a best effort
        return set()


def warm_workers(spark) -> None:
    """Start Spark's Python workers and import statekit's worker-side modules in them (Spark keeps
    them for the next jobs), so that the first micro-batch of a query does not pay for it. Not on
    Spark Connect: a server runs each streaming query on a clone of the session, whose Python
    workers are not the session's (``engine.spark.helpers``)."""
    if session_api.is_connect(spark):
        return
    try:
        n = max(2, session_api.of(spark).default_parallelism())
        map_in_arrow(spark.range(n).repartition(n), _warm_partition, "id long").collect()
    except Exception:  # noqa: BLE001 - a warm-up only; the query says what is wrong, if anything
        pass


def _warm_up(spark) -> None:
    """In the background: the workers warmed, then Spark ML's session extension applied once
    statekit's queries are past their start (when the session was built without it)."""
    warm_workers(spark)
    if getattr(spark, "_statekit_ml_extension_later", False):
        from statekit.engine.spark.planners import REAPER

        apply_ml_extension_when_quiet(spark, REAPER.starting)


def quiet_accumulator_hangup(sc) -> None:
    """The JVM closes its accumulator connection as the context stops (or as it dies), before the
    driver's accumulator server is shut down; pyspark's handler reads the hang-up as an update and
    the server prints an EOFError traceback on stderr. That EOFError is the stop we asked for; any
    other error is still printed."""
    srv = getattr(sc, "_accumulatorServer", None)
    if srv is None:
        return
    printed = srv.handle_error

    def handle_error(request, client_address):
        if not isinstance(sys.exc_info()[1], EOFError):
            printed(request, client_address)

    srv.handle_error = handle_error


# --- stopping what statekit started --------------------------------------------------------------------

class StopReport:
    """What ``stop_session`` stopped and what it left running, each with its reason, as lines."""

    def __init__(self):
        self.stopped: list = []
        self.left: list = []

    def __repr__(self):
        return f"StopReport(stopped={self.stopped}, left={self.left})"


def _queries(spark) -> list:
    try:
        return list(spark.streams.active)
    except Exception:  # noqa: BLE001 - a session going away
        return []


def stop_session(jvm_exit_timeout: float = 20) -> StopReport:
    """Stop what statekit started: its streaming queries, and the session it created (its JVM, or
    its Spark Connect client and the local server it started for it) unless queries statekit did
    not start run on it. A session the user made is left running. A JVM that has not exited
    ``jvm_exit_timeout`` seconds after its stdin closed is killed (one writing a class archive at
    exit takes 15 s here, more on a loaded machine: scripts/spark_cds.py waits longer)."""
    report = StopReport()
    with _LOCK:
        from pyspark import SparkContext

        own = _OWNED.session
        sessions = [s for s in {id(x): x for x in (own, _user_active(own)) if x is not None}.values()]
        for spark in sessions:
            for q in _queries(spark):
                if started_by_statekit(q):
                    try:
                        q.stop()
                        report.stopped.append(f"query {q.name}")
                    except Exception:  # noqa: BLE001
                        pass
        user = _user_active(own)
        if own is None:
            if user is not None:
                report.left.append("left the Spark session running: you created it, not statekit")
            return report
        if user is not None and not session_api.is_connect(own) and not session_api.is_connect(user):
            report.left.append("left the Spark session running: a session you created shares its "
                               "JVM (stop yours first)")
            return report
        foreign = [q.name or str(q.id) for q in _queries(own) if not started_by_statekit(q)]
        if foreign:
            report.left.append(f"left the Spark session running: {len(foreign)} streaming "
                               f"quer{'y' if len(foreign) == 1 else 'ies'} statekit did not start "
                               f"run{'s' if len(foreign) == 1 else ''} on it ({', '.join(foreign)}); "
                               f"stop {'it' if len(foreign) == 1 else 'them'}, then %statekit down again")
            return report
        if session_api.is_connect(own):
            _stop_connect(own, report)
        else:
            from statekit.engine.spark.planners import REAPER

            REAPER.own(None)
            quiet_accumulator_hangup(SparkContext._active_spark_context)
            own.stop()
            _stop_gateway(jvm_exit_timeout)
            if _OWNED.fork_server is not None:
                _OWNED.fork_server.stop()
                _OWNED.fork_server = None
            report.stopped.append("spark")
        _OWNED.session = None
        _OWNED.queries.clear()
        eng = sys.modules.get("statekit.engine.spark.engine")
        if eng is not None:
            eng._Listener._installed.clear()
    return report


def _user_active(own):
    """The active session when it is not statekit's (the user's own), else None."""
    from pyspark.sql import SparkSession

    try:
        active = SparkSession.getActiveSession()
    except Exception:  # noqa: BLE001
        return None
    if active is None or active is own:
        return None
    return active if session_api.of(active).alive() else None


def _stop_connect(spark, report: StopReport) -> None:
    """Release statekit's Connect session; the helpers the server started for it (its Python
    worker daemon, its data source planners) end with it, when they run on this machine."""
    from statekit.engine.spark import helpers

    ids = artifact_ids(spark) if _OWNED.server is None else set()
    try:
        spark.stop()
    except Exception:  # noqa: BLE001
        pass
    helpers.end(ids)
    if _OWNED.connect_env:
        os.environ.pop("SPARK_CONNECT_MODE_ENABLED", None)
        _OWNED.connect_env = False
    server = _OWNED.server
    _OWNED.server = None
    if server is not None:
        server.stop()
        report.stopped.append("spark (and the local Spark Connect server statekit started)")
    else:
        report.stopped.append("spark (statekit's Spark Connect session; the server runs on)")


def _stop_gateway(jvm_exit_timeout: float) -> None:
    from pyspark import SparkContext

    gw = getattr(SparkContext, "_gateway", None)
    if gw is None:
        return
    try:
        gw.shutdown()
    except Exception:
        pass
    proc = getattr(gw, "proc", None)
    if proc is not None:  # the JVM exits when its stdin closes; reap it (no zombie)
        from statekit import lifeline

        lifeline.forget(proc.pid)
        try:
            if proc.stdin is not None:
                proc.stdin.close()
        except Exception:
            pass
        try:
            proc.wait(timeout=jvm_exit_timeout)
        except Exception:
            proc.kill()
            try:
                proc.wait(timeout=10)
            except Exception:
                pass
    SparkContext._gateway = None
    SparkContext._jvm = None


# --- errors ----------------------------------------------------------------------------------------

_PY_ERR = re.compile(r"^\s*(?:[\w.]+\.)?(\w*(?:Error|Exception|Topic|Unreachable|Missing|Locked|Failure))"
                     r": (.+)$")
_STATEKIT_ERR = re.compile(r"statekit\.[\w.]*?\.?(\w+): (.+)$")
_NOISE = re.compile(r"\s*(?:at |\.\.\. \d+ more|Caused by: |Traceback|File \"|\^|~)")


def explain(text: str) -> str:
    """The most useful single line of a Spark/Py4J/Python error text."""
    lines = [ln.rstrip() for ln in str(text).splitlines() if ln.strip()]
    # 1. a statekit error raised inside a Python worker / the source runner
    for ln in reversed(lines):
        m = _STATEKIT_ERR.search(ln)
        if m:
            return m.group(2).strip()
    # 2. a Python worker that died
    for ln in lines:
        if "Python worker exited unexpectedly" in ln or "crashed" in ln and "worker" in ln.lower():
            return "a Spark Python worker died mid-batch (killed or crashed); restart the query to replay the batch"
    # 3. the last Python exception line of a worker traceback
    for ln in reversed(lines):
        if _NOISE.match(ln):
            continue
        m = _PY_ERR.match(ln)
        if m and not ln.lstrip().startswith(("org.apache", "java.", "py4j")):
            return f"{m.group(1)}: {m.group(2).strip()}"
    # 4. the first line, shorn of Spark's prefixes
    first = lines[0] if lines else str(text)
    first = re.sub(r"^(?:\[[A-Z_.]+\]\s*)+", "", first)
    first = re.sub(r"^[\w.$]+(?:Exception|Error):\s*", "", first)
    return first[:400]


def one_line(exc: BaseException, context: str = "") -> StatekitError:
    """Turn any exception coming out of Spark into a one-line `StatekitError`."""
    if isinstance(exc, StatekitError):
        return exc
    parts = []
    for attr in ("desc", "_desc"):
        v = getattr(exc, attr, None)
        if isinstance(v, str):
            parts.append(v)
    try:
        parts.append(str(exc))
    except Exception:
        pass
    java = getattr(exc, "java_exception", None)
    if java is not None:
        try:
            parts.append(str(java.toString()))
        except Exception:
            pass
    text = "\n".join(parts)
    msg = explain(text)
    cls = SparkFailure
    m = None
    for ln in reversed(text.splitlines()):
        m = _STATEKIT_ERR.search(ln)
        if m:
            break
    if m:  # keep the statekit error class raised in a worker (UnknownTopic, ProcessorError, ...)
        import statekit.errors as errs

        found = getattr(errs, m.group(1), None)
        if isinstance(found, type) and issubclass(found, StatekitError):
            cls = found
    return cls(f"{context}: {msg}" if context else msg)
