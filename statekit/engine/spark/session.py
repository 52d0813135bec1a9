"""One local SparkSession for statekit, and the translation of Spark failures into one-line errors.

- `local[2]`: two task slots. Local mode never retries a failed task (`spark.task.maxFailures` is
  ignored by `local[N]`; only `local[N,F]` retries), so a worker killed mid-batch fails the job and
  with it the streaming query. We still set `spark.task.maxFailures=1` to say so.
- The Spark UI is off, memory is small, and the JVM's log goes to a file (`log_path()`), never to the
  console: a person sees one line (`statekit.errors.StatekitError`), not a Java stack trace.
- `PYSPARK_PYTHON` is this interpreter, or Python workers fail to connect back.
- An active session is reused (with the `statekit-kafka` data source registered on it).
- The master: `get_session(master=...)`, else `STATEKIT_SPARK_MASTER`, else `local[2]`. A cluster
  master (`spark://HOST:7077`, `yarn`, `k8s://...`) gets Spark's task retries
  (`spark.task.maxFailures=4`: a task of an executor lost mid-batch is replayed elsewhere with its
  batch id) and binds the driver to loopback only when the master is on loopback too.
"""
from __future__ import annotations

import contextlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import warnings

from statekit.errors import StatekitError

MASTER = "local[2]"
MASTER_ENV = "STATEKIT_SPARK_MASTER"
CLUSTER_TASK_MAX_FAILURES = 4


class JavaMissing(StatekitError):
    pass


class SparkFailure(StatekitError):
    """A Spark job, query or plan failed; the message is the one useful line."""


class SessionConflict(StatekitError):
    """A session with another master is already running in this process."""


def resolve_master(master: str | None = None) -> str:
    """The master of the session statekit creates: ``master``, else ``$STATEKIT_SPARK_MASTER``,
    else ``local[2]``."""
    return (master or os.environ.get(MASTER_ENV) or MASTER).strip()


def is_local_master(master: str | None) -> bool:
    """``local``, ``local[N]``, ``local[N,F]``, ``local-cluster[...]`` run on this machine's JVM
    (``local-cluster`` has executors in other JVMs, but on this machine)."""
    return str(master or MASTER).startswith("local")


def _loopback_master(master: str) -> bool:
    m = re.match(r"^\w+://([^:/]+)", master)
    return is_local_master(master) or (m is not None and m.group(1) in ("127.0.0.1", "localhost", "::1"))


_LOCK = threading.Lock()
_JAVA_OK: str | None = None

_LOG4J = """\
status = error
rootLogger.level = warn
rootLogger.appenderRef.file.ref = file
appender.file.type = File
appender.file.name = file
appender.file.fileName = {path}
appender.file.append = true
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %d{{HH:mm:ss.SSS}} %p %c{{1}}: %m%n%ex
logger.jetty.name = org.sparkproject.jetty
logger.jetty.level = error
logger.nativeio.name = org.apache.hadoop.util.NativeCodeLoader
logger.nativeio.level = error
logger.py.name = org.apache.spark.api.python
logger.py.level = error
logger.repl.name = org.apache.spark.repl.Main
logger.repl.level = warn
"""


def log_dir() -> str:
    d = os.path.join(tempfile.gettempdir(), f"statekit-spark-{os.getuid()}")
    os.makedirs(d, exist_ok=True)
    return d


def log_path() -> str:
    """Where the JVM of this process writes its log (Java stack traces end up here)."""
    return os.path.join(log_dir(), f"spark-{os.getpid()}.log")


def jvm_stderr_path() -> str:
    """Where the JVM started by this process writes its stderr (banner, warnings, Python workers'
    prints): a file, not the terminal or the notebook cell that happened to start Spark."""
    return os.path.join(log_dir(), f"jvm-stderr-{os.getpid()}.log")


@contextlib.contextmanager
def _stderr_to_file(path: str):
    """fd 2 points at ``path`` while the JVM is launched (it inherits fd 2, and so do its Python
    workers); this process's own stderr is put back right after."""
    try:
        sys.stderr.flush()
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    except (OSError, ValueError):  # no log file: the JVM keeps our stderr
        fd = None
    if fd is None:
        yield
        return
    saved = os.dup(2)
    os.dup2(fd, 2)
    os.close(fd)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def check_java() -> str:
    """Return the Java major version, or raise `JavaMissing` with a one-line hint."""
    global _JAVA_OK
    if _JAVA_OK:
        return _JAVA_OK
    home = os.environ.get("JAVA_HOME")
    java = os.path.join(home, "bin", "java") if home else shutil.which("java")
    hint = ("install one (sudo apt-get install -y openjdk-17-jre-headless, brew install openjdk@17, "
            "conda install -c conda-forge openjdk=17) or set JAVA_HOME")
    if not java or not os.path.exists(java):
        raise JavaMissing(f"Java was not found, and Spark needs Java 17 or 21: {hint}.")
    try:
        out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
        text = out.stderr + out.stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise JavaMissing(f"Could not run {java} ({exc}); Spark needs Java 17 or 21: {hint}.") from None
    m = re.search(r'version "(\d+)(?:\.(\d+))?', text)
    major = m.group(1) if m else "?"
    if major == "1" and m.group(2):
        major = m.group(2)
    if major not in ("17", "21"):
        raise JavaMissing(f"Found Java {major} at {java}, but Spark 4 needs Java 17 or 21: {hint}.")
    _JAVA_OK = major
    return major


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


def _prepare_env(loopback: bool = True) -> None:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if loopback:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Python workers must import statekit from the same place as this process.
    here = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    pp = os.environ.get("PYTHONPATH", "")
    if here not in pp.split(os.pathsep):
        os.environ["PYTHONPATH"] = here + (os.pathsep + pp if pp else "")


# What a workshop server runs per participant: a small heap that starts small (records do not
# pass through the JVM: tasks read their own partitions), serial GC, C1 only (the driver plans and
# schedules, it does not crunch). Spark ends a reused Python worker after a minute without a task
# (PythonWorkerFactory's idle timeout) and forks one again from its daemon for the next batch.
# A young generation of 16 MB (it grew to ~35 MB, all of it resident); the class archive mapped
# at the address it was written for (relocated, the default of this Java, it is written to: 126
# of its 159 resident MB, against 53); no perf data (its sampler woke the idle JVM 20 times a
# second: ~0.0013 of a core; jcmd PID still attaches, jps no longer lists it).
JAVA_OPTS = ("-Xms64m -Xmn16m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=64m "
             "-XX:+UnlockDiagnosticVMOptions -XX:ArchiveRelocationMode=0 -XX:-UsePerfData "
             "-Xss512k")
PYTHON_WORKER_IDLE_S = 60


def class_archive() -> str:
    """Where the JVM's class-data archive of Spark's classes lives (``make`` writes it once per
    venv, ``scripts/spark_cds.py``): a JVM that maps it starts Spark in about half the time and
    CPU (3.4 s against 6.1 s to a session here). ``$STATEKIT_SPARK_CDS`` names another file."""
    return os.environ.get("STATEKIT_SPARK_CDS") or os.path.join(sys.prefix, "statekit-spark.jsa")


def built_class_archive() -> str | None:
    """``class_archive()`` when ``make`` has written it, else None."""
    archive = class_archive()
    return archive if os.path.isfile(archive) else None


def jvm_options(archive: str | None) -> str:
    """The options of every JVM statekit starts on this machine (the driver; a local standalone
    cluster's master, workers and executors): ``JAVA_OPTS`` (or ``$STATEKIT_SPARK_JAVA_OPTS``),
    and the class archive when there is one."""
    opts = os.environ.get("STATEKIT_SPARK_JAVA_OPTS", JAVA_OPTS)
    opts += f" -XX:ErrorFile={os.path.join(log_dir(), 'hs_err_%p.log')}"
    if archive and "-XX:SharedArchiveFile" not in opts and "-XX:ArchiveClassesAtExit" not in opts:
        opts += f" -XX:SharedArchiveFile={archive} -Xshare:auto"
    return opts


def get_session(app_name: str = "statekit", *, shuffle_partitions: int | None = None,
                driver_memory: str = "512m", extra_conf: dict | None = None,
                master: str | None = None):
    """Return the active SparkSession (reused) or start the one statekit uses, on ``master`` (else
    ``$STATEKIT_SPARK_MASTER``, else ``local[2]``). Asking for a master other than the running
    session's raises ``SessionConflict``."""
    with _LOCK:
        from pyspark.sql import SparkSession

        spark = SparkSession.getActiveSession()
        if spark is not None and master:
            running = session_master(spark)
            if running and running != master.strip():
                raise SessionConflict(f"a Spark session on {running} is already running in this "
                                      f"process: stop it first (%statekit down, or statekit.engine."
                                      f"spark.stop_session()), then start one on {master}")
        if spark is None:
            check_java()
            _light_numpy_converters()
            master = resolve_master(master)
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

            def with_jvm_options(b, archive):
                b = b.config("spark.driver.extraJavaOptions", log_opts + jvm_options(archive))
                if executors_here:
                    b = b.config("spark.executor.extraJavaOptions", jvm_options(archive))
                return b

            b = (SparkSession.builder.master(master).appName(app_name)
                 .config("spark.ui.enabled", "false")
                 .config("spark.ui.showConsoleProgress", "false")
                 .config("spark.driver.memory", driver_memory)
                 .config("spark.sql.shuffle.partitions", str(shuffle_partitions or 2))
                 .config("spark.sql.adaptive.enabled", "false")
                 .config("spark.sql.execution.arrow.pyspark.enabled", "true")
                 .config("spark.sql.streaming.stopTimeout", "30s")
                 .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
                 .config("spark.python.worker.reuse", "true")
                 .config("spark.sql.session.timeZone", "UTC"))
            b = with_jvm_options(b, archive)
            if is_local_master(master):
                b = b.config("spark.task.maxFailures", "1").config("spark.default.parallelism", "2")
            else:  # a lost executor's tasks are retried elsewhere: that is how its batch replays
                b = b.config("spark.task.maxFailures", str(CLUSTER_TASK_MAX_FAILURES))
            if loopback:
                b = b.config("spark.driver.host", "127.0.0.1").config("spark.driver.bindAddress",
                                                                      "127.0.0.1")
                # workers forked with statekit's imports done and frozen (worker_daemon.py); on
                # this machine, where the executors' Python is this one
                b = b.config("spark.python.daemon.module", "statekit.engine.spark.worker_daemon")
                if not is_local_master(master):   # the executors placement's tasks use pandas
                    b = b.config("spark.executorEnv.STATEKIT_DAEMON_PANDAS", "1")
            for k, v in (extra_conf or {}).items():
                b = b.config(k, str(v))
            set_aside = False
            try:
                with _stderr_to_file(jvm_stderr_path()):
                    try:
                        spark = b.getOrCreate()
                    except Exception:
                        if archive is None:
                            raise
                        # a damaged class archive can stop the JVM at its start: set it aside
                        # (the next `make` writes a new one) and start without it
                        os.replace(archive, archive + ".bad")
                        set_aside = True
                        b = with_jvm_options(b, None)
                        spark = b.getOrCreate()
            except Exception as exc:  # the JVM did not come up
                raise one_line(exc, f"Spark did not start (the JVM's output: {jvm_stderr_path()})") from None
            from statekit.engine.spark.planners import REAPER

            REAPER.own(_jvm_pid())   # Spark's idle planner daemons end (engine.spark.planners)
            if set_aside:
                print(f"statekit: the JVM did not start with the class archive {archive}; it is "
                      f"now {archive}.bad and Spark started without it (make writes a new one)",
                      file=sys.stderr)
            # levels come from our log4j2 file (setLogLevel would print to the console). A
            # micro-batch that fails in a Python worker reaches the user once, as statekit's one-line
            # error; pyspark's own warning about the Arrow conversion it interrupted is noise.
            warnings.filterwarnings("ignore", message="toPandas attempted Arrow optimization",
                                    category=UserWarning)
        elif shuffle_partitions:
            spark.conf.set("spark.sql.shuffle.partitions", str(shuffle_partitions))
        from statekit.engine.spark.source import register

        register(spark)
        if not getattr(spark, "_statekit_warm", False):
            # in the background: a query that starts meanwhile is not held up by it
            threading.Thread(target=warm_workers, args=(spark,), name="statekit-spark-warm",
                             daemon=True).start()
            spark._statekit_warm = True
        return spark


def _jvm_pid() -> int | None:
    """The pid of the JVM this process launched for its session (None when it did not)."""
    from pyspark import SparkContext

    proc = getattr(getattr(SparkContext, "_gateway", None), "proc", None)
    return getattr(proc, "pid", None)


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


def session_master(spark) -> str | None:
    """The master of a session (None when it cannot tell, e.g. a Spark Connect client)."""
    try:
        return str(spark.sparkContext.master)
    except Exception:  # noqa: BLE001 - Spark Connect has no SparkContext
        try:
            return spark.conf.get("spark.master", None)
        except Exception:  # noqa: BLE001
            return None


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


def warm_workers(spark) -> None:
    """Start Spark's Python workers and import statekit's worker-side modules in them (Spark keeps
    them for the next jobs), so that the first micro-batch of a query does not pay for it."""
    n = max(2, int(spark.sparkContext.defaultParallelism))
    try:
        map_in_arrow(spark.range(n).repartition(n), _warm_partition, "id long").collect()
    except Exception:  # noqa: BLE001 - a warm-up only; the query says what is wrong, if anything
        pass


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


def stop_session(jvm_exit_timeout: float = 20) -> None:
    """Stop the active session (and its JVM gateway) if there is one; a JVM that has not exited
    ``jvm_exit_timeout`` seconds after its stdin closed is killed (one writing a class archive at
    exit takes 15 s here, more on a loaded machine: scripts/spark_cds.py waits longer)."""
    with _LOCK:
        from pyspark import SparkContext
        from pyspark.sql import SparkSession

        from statekit.engine.spark.planners import REAPER

        REAPER.own(None)
        quiet_accumulator_hangup(SparkContext._active_spark_context)
        spark = SparkSession.getActiveSession()
        if spark is not None:
            for q in spark.streams.active:
                try:
                    q.stop()
                except Exception:
                    pass
            spark.stop()
        gw = getattr(SparkContext, "_gateway", None)
        if gw is not None:
            try:
                gw.shutdown()
            except Exception:
                pass
            proc = getattr(gw, "proc", None)
            if proc is not None:  # the JVM exits when its stdin closes; reap it (no zombie)
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
        eng = sys.modules.get("statekit.engine.spark.engine")
        if eng is not None:
            eng._Listener._installed.clear()


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
