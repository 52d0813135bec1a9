"""The JVMs statekit starts on this machine (a session's driver, a local Spark Connect server, a
local standalone cluster's daemons): Java itself, their lean options, the class archive they map,
where their logs and stderr go, and the Python their workers run.

- The class-data archive (``<venv>/statekit-spark.jsa``, written by ``make``) halves a JVM's
  start. It is mapped only by the Java that wrote it (named in the file beside it: Java ignores
  another build's archive), and a damaged one can stop that JVM at its start. Only the JVM's own
  words say so (a fatal error in ``FileMapInfo``, or a message about the shared archive on its
  stderr): ``archive_was_the_cause`` reads them, so a start that failed for any other reason (a
  bad master URL) never costs the archive.
"""
from __future__ import annotations

import contextlib
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile

from statekit.errors import StatekitError


class JavaMissing(StatekitError):
    pass


# The Java releases statekit runs Spark on. (Spark 4.2 and later run on 25 too, but Java 25 prints
# errors about the class archive on the JVM's stdout at every start: docs/ARCHITECTURE.md.)
JAVA_MAJORS = ("17", "21")
_JAVA_OK: str | None = None
_JAVA_ID: str | None = None   # which Java that is (``java_identity``)
_JAVA_ASKED: dict = {}        # {java binary: its `java -version` process} (``ask_java_early``)

LOG4J = """\
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
def stderr_to_file(path: str):
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


def java_binary() -> str | None:
    """The ``java`` Spark will run: ``$JAVA_HOME/bin/java``, else the one on the PATH."""
    home = os.environ.get("JAVA_HOME")
    return os.path.join(home, "bin", "java") if home else shutil.which("java")


def ask_java_early() -> None:
    """Start `java -version` now, for ``check_java`` to read later: a cold launch runs it while
    the kernel imports pyspark (~0.06 s before the JVM starts, otherwise)."""
    java = java_binary()
    if _JAVA_OK or not java or java in _JAVA_ASKED or not os.path.exists(java):
        return
    try:
        _JAVA_ASKED[java] = subprocess.Popen([java, "-version"], stdout=subprocess.PIPE,
                                             stderr=subprocess.PIPE, text=True)
    except OSError:
        pass


def check_java() -> str:
    """Return the Java major version, or raise `JavaMissing` with a one-line hint."""
    global _JAVA_OK, _JAVA_ID
    if _JAVA_OK:
        return _JAVA_OK
    java = java_binary()
    need = f"Spark needs Java {' or '.join(JAVA_MAJORS)}"
    hint = ("install one (sudo apt-get install -y openjdk-17-jre-headless, brew install openjdk@17, "
            "conda install -c conda-forge openjdk=17) or set JAVA_HOME")
    if not java or not os.path.exists(java):
        raise JavaMissing(f"Java was not found, and {need}: {hint}.")
    try:
        asked = _JAVA_ASKED.pop(java, None)
        if asked is not None:
            stdout, stderr = asked.communicate(timeout=30)
        else:
            out = subprocess.run([java, "-version"], capture_output=True, text=True, timeout=30)
            stdout, stderr = out.stdout, out.stderr
        text = stderr + stdout
    except (OSError, subprocess.SubprocessError) as exc:
        raise JavaMissing(f"Could not run {java} ({exc}); {need}: {hint}.") from None
    m = re.search(r'version "(\d+)(?:\.(\d+))?', text)
    major = m.group(1) if m else "?"
    if major == "1" and m.group(2):
        major = m.group(2)
    if major not in JAVA_MAJORS:
        raise JavaMissing(f"Found Java {major} at {java}, but {need}: {hint}.")
    _JAVA_ID = "\n".join([os.path.realpath(java)] + [
        ln.strip() for ln in text.splitlines() if "version" in ln or "build" in ln])
    _JAVA_OK = major
    return major


def java_identity() -> str | None:
    """Which Java this is, as a class archive must match it: the binary and its version and build
    lines (``java -version``, run once per process by ``check_java``); None without a usable Java."""
    try:
        check_java()
    except JavaMissing:
        return None
    return _JAVA_ID


def statekit_root() -> str:
    """The directory holding the ``statekit`` package (what a Python worker puts on its path)."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


def prepare_env(loopback: bool = True) -> None:
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
    if loopback:
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    # Python workers must import statekit from the same place as this process.
    here = statekit_root()
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
# second: ~0.0013 of a core; jcmd PID still attaches, jps no longer lists it). An idle JVM's own
# timers wake it less: the monitor deflater looks every 5 s, not 4 times a second (it still
# deflates at once past its usage threshold), and a safepoint is forced every 5 s, not every
# second (GC and deoptimization still bring theirs); on a virtual machine an idle core's wake-up
# costs ~1 ms of CPU. Flags a later Java no longer knows are ignored, not fatal.
JAVA_OPTS = ("-Xms64m -Xmn16m -XX:+UseSerialGC -XX:TieredStopAtLevel=1 -XX:ReservedCodeCacheSize=64m "
             "-XX:+UnlockDiagnosticVMOptions -XX:ArchiveRelocationMode=0 -XX:-UsePerfData "
             "-XX:+IgnoreUnrecognizedVMOptions -XX:AsyncDeflationInterval=5000 "
             "-XX:GuaranteedSafepointInterval=5000 -Xss512k")
PYTHON_WORKER_IDLE_S = 60


# A session whose JVMs run on this machine (statekit's own, a Spark Connect server statekit
# starts) keeps its checkpoints on this machine's disk. Spark's default checkpoint manager there
# (FileContext) asks every file it renames for its link status, which Hadoop answers by running
# `readlink`: with the `chmod` each file and its .crc get without Hadoop's native library, ~17
# processes forked from the JVM per micro-batch. The FileSystem checkpoint manager renames with
# rename(2), atomic on a local disk, and runs ~4: a running app here spent 9.5 s of CPU where it
# spent 10.5–11.3 (10 s of micro-batches of 200 records).
LOCAL_DISK_CONF = {
    "spark.sql.streaming.checkpointFileManagerClass":
        "org.apache.spark.sql.execution.streaming.checkpointing.FileSystemBasedCheckpointFileManager",
}


def class_archive() -> str:
    """Where the JVM's class-data archive of Spark's classes lives (``make`` writes it once per
    venv, ``scripts/spark_cds.py``): a JVM that maps it starts Spark in about half the time and
    CPU (3.4 s against 6.1 s to a session here). ``$STATEKIT_SPARK_CDS`` names another file."""
    return os.environ.get("STATEKIT_SPARK_CDS") or os.path.join(sys.prefix, "statekit-spark.jsa")


def archive_java_path(archive: str) -> str:
    """The file beside a class archive that names the Java which wrote it (``java_identity``)."""
    return archive + ".java"


def archive_fits_java(archive: str) -> bool:
    """Whether ``archive`` was written by the Java that would map it now. Java maps an archive
    only for its own build: after an update of the JDK (a distribution's security release) or
    another ``JAVA_HOME``, every JVM would start without it (~1.5 times as slow), saying so only
    in its log. An archive with no such note (or a Java that cannot be asked) does not fit."""
    try:
        with open(archive_java_path(archive), encoding="utf-8") as f:
            wrote = f.read()
    except OSError:
        return False
    now = java_identity()
    return now is not None and wrote == now


def built_class_archive() -> str | None:
    """``class_archive()`` when ``make`` has written it for this Java (``archive_fits_java``; ``make``
    writes it again once the Java differs), else None."""
    archive = class_archive()
    if not os.path.isfile(archive):
        return None
    if not archive_fits_java(archive):
        logging.getLogger("statekit.spark").info(
            "the class archive %s was written by another Java than %s: Spark starts without it "
            "(make writes one for this Java)", archive, java_binary())
        return None
    return archive


def jvm_options(archive: str | None) -> str:
    """The options of every JVM statekit starts on this machine (the driver; a local standalone
    cluster's master, workers and executors; a local Spark Connect server): ``JAVA_OPTS`` (or
    ``$STATEKIT_SPARK_JAVA_OPTS``), and the class archive when there is one."""
    opts = os.environ.get("STATEKIT_SPARK_JAVA_OPTS", JAVA_OPTS)
    opts += f" -XX:ErrorFile={os.path.join(log_dir(), 'hs_err_%p.log')}"
    if archive and "-XX:SharedArchiveFile" not in opts and "-XX:ArchiveClassesAtExit" not in opts:
        opts += f" -XX:SharedArchiveFile={archive} -Xshare:auto"
    return opts


# What a JVM says when its class archive stopped it: a fatal error whose frame is in the code that
# maps the archive (a truncated file: SIGBUS in FileMapInfo::..., or in
# SharedClassPathEntry::validate once it is mapped unrelocated), or the error it gives when it
# cannot use the archive it was told to. A warning about the archive (-Xshare:auto goes on
# without it) is not a cause: the JVM started.
_ARCHIVE_FRAME = re.compile(r"Problematic frame:\s*\n#?\s*\S+\s+\[[^\]]*\]\s*"
                            r"(?:FileMapInfo|MetaspaceShared|DynamicArchive|ArchiveBuilder|SharedClassPathEntry|"
                            r"ArchiveHeapLoader|SystemDictionaryShared|CDSProtectionDomain)::")
_ARCHIVE_ERROR = re.compile(r"error has occurred while processing the shared archive file|"
                            r"Unable to use shared archive|specified shared archive not found",
                            re.IGNORECASE)
_ERROR_FILE = re.compile(r"error report file with more information is saved as:\s*\n?#?\s*(\S+)")


def file_size(path: str) -> int:
    try:
        return os.path.getsize(path)
    except OSError:
        return 0


def said_since(path: str, offset: int, limit: int = 1 << 20) -> str:
    """What a log file gained past ``offset`` (at most ``limit`` bytes)."""
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(limit).decode(errors="replace")
    except OSError:
        return ""


def archive_was_the_cause(stderr_text: str, since: float | None = None) -> bool:
    """Whether a JVM that failed to start says its class archive stopped it: in its output, or in
    a fatal error report (``-XX:ErrorFile`` in ``log_dir()``, written since ``since``, or named in
    the output). Only a report's first lines count: it lists the archive's settings whatever the
    cause. (A fatal error's summary goes to the JVM's stdout, which pyspark does not capture: the
    report file is what a session's start can read.)"""
    text = stderr_text or ""
    if _ARCHIVE_FRAME.search(text) or _ARCHIVE_ERROR.search(text):
        return True
    reports = set(_ERROR_FILE.findall(text))
    if since is not None:
        import glob

        for path in glob.glob(os.path.join(log_dir(), "hs_err_*.log")):
            try:
                if os.path.getmtime(path) >= since - 1:
                    reports.add(path)
            except OSError:
                pass
    return any(_ARCHIVE_FRAME.search(said_since(path, 0, 4096)) for path in reports)


def set_archive_aside(archive: str) -> str:
    """Rename a damaged archive to ``.bad`` (the next ``make`` writes a new one); the new name."""
    bad = archive + ".bad"
    os.replace(archive, bad)
    return bad
