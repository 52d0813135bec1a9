"""The launch of the driver's JVM: kept from its first moment (`JvmKeeper`), and started without
spark-submit's detour when the same launch was seen before (`DirectLaunch`).

pyspark starts the driver's JVM through `$SPARK_HOME/bin/spark-submit`: three shell scripts and a
first JVM (`org.apache.spark.launcher.Main`) that only computes the java command line the script
then execs. That is ~0.2 s, and ~0.15 s of CPU, at the head of every cold launch, before the JVM
that runs Spark starts. The command is a function of spark-submit's arguments, of the environment
the scripts and the launcher read (SPARK_*, JAVA_*, HADOOP_*, PATH, ...) and of the files they
read (`$SPARK_HOME/bin`, the conf directory, the jars directory, the java binary). So the first
launch goes through spark-submit, and the command line of the JVM it became, with what the
scripts added to its environment, is read back from /proc and kept in the venv
(`statekit-spark-launch.json`, beside the class archive) under a digest of those inputs. A later
launch whose inputs digest the same starts that command directly; any other goes through
spark-submit, and is learned; beside a `spark-env.sh` (its exports may differ from run to run)
every launch does. A JVM started directly that fails before it hands pyspark its port is started
again through spark-submit (`session._classic_session`), and the entry is forgotten.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import signal
import sys
import tempfile
import threading
import time

from statekit.engine.spark import procs

CACHE_NAME = "statekit-spark-launch.json"
CACHE_ENV = "STATEKIT_SPARK_LAUNCH_CACHE"   # another file; "off": always through spark-submit
MAX_ENTRIES = 32       # a test suite starts sessions of many settings; a kernel, of one or two
# the environment spark-submit's scripts and Spark's launcher read (a prefix each)
ENV_PREFIXES = ("SPARK", "PYSPARK", "HADOOP", "YARN", "HIVE", "JAVA", "_JAVA", "JDK", "SCALA",
                "CLASSPATH", "PATH", "LD_LIBRARY_PATH")
SUBMIT_CLASS = "org.apache.spark.deploy.SparkSubmit"

log = logging.getLogger("statekit.spark")


class _FinePoll:
    """`time` as pyspark's `launch_gateway` sees it during a start: it looks for the JVM's
    connection file every 0.1 s, 50 ms late on average at the head of every launch; every 10 ms."""

    def __getattr__(self, name):
        return getattr(time, name)

    @staticmethod
    def sleep(seconds: float) -> None:
        time.sleep(min(seconds, 0.01))


_FINE_POLL = _FinePoll()


def cache_path() -> str | None:
    """Where learned launch commands are kept (None: not kept)."""
    path = os.environ.get(CACHE_ENV)
    if path == "off":
        return None
    return path or os.path.join(sys.prefix, CACHE_NAME)


def _stat(path: str | None):
    try:
        st = os.stat(path)
    except (OSError, TypeError):
        return None
    return [st.st_mtime_ns, st.st_size]


def _listing(directory: str):
    try:
        names = sorted(os.listdir(directory))
    except OSError:
        return None
    return [[name, _stat(os.path.join(directory, name))] for name in names]


def _replaced(argv: list, pairs: list) -> list:
    """``argv`` with each (old, new) of ``pairs`` replaced in every argument."""
    out = []
    for arg in argv:
        for old, new in pairs:
            arg = arg.replace(old, new)
        out.append(arg)
    return out


class DirectLaunch:
    """The java command spark-submit computes, learned once per set of inputs (module docstring).
    ``tokens`` name the parts of a launch that differ between processes for the same command
    (this process's log4j file): they are kept as their name and filled in at each launch."""

    def __init__(self, tokens: dict | None = None, path: str | None = None):
        self.tokens = {k: v for k, v in (tokens or {}).items() if v}
        self.path = path if path is not None else cache_path()
        self._key: str | None = None

    def _tokenized(self, argv: list) -> list:
        return _replaced(argv, [(value, f"\0{name}\0") for name, value in self.tokens.items()])

    def _filled(self, argv: list) -> list:
        return _replaced(argv, [(f"\0{name}\0", value) for name, value in self.tokens.items()])

    @staticmethod
    def _dirs(argv: list, env: dict) -> tuple:
        home = env.get("SPARK_HOME") or os.path.dirname(os.path.dirname(os.path.normpath(argv[0])))
        return home, env.get("SPARK_CONF_DIR") or os.path.join(home, "conf")

    @classmethod
    def learnable(cls, argv: list, env: dict) -> bool:
        """Whether the command is a function of what ``key`` digests: not with a
        `spark-env.sh`, a script whose exports may change from one run to the next."""
        return (bool(argv) and os.path.basename(argv[0]).startswith("spark-submit")
                and not os.path.exists(os.path.join(cls._dirs(argv, env)[1], "spark-env.sh")))

    def key(self, argv: list, env: dict) -> str:
        """A digest of everything the command spark-submit would compute depends on."""
        home, conf = self._dirs(argv, env)
        java = (os.path.join(env["JAVA_HOME"], "bin", "java") if env.get("JAVA_HOME")
                else shutil.which("java", path=env.get("PATH")))
        java = os.path.realpath(java) if java else None
        what = {"argv": self._tokenized(argv), "uid": os.getuid(),
                "env": sorted([k, v] for k, v in env.items() if k.startswith(ENV_PREFIXES)),
                "bin": _listing(os.path.join(home, "bin")), "conf": _listing(conf),
                "jars": _stat(os.path.join(home, "jars")), "java": [java, _stat(java)]}
        return hashlib.sha256(json.dumps(what, sort_keys=True).encode()).hexdigest()

    def _entries(self) -> dict:
        """The learned commands, from a file only this user can have written."""
        if not self.path:
            return {}
        try:
            with open(self.path, "rb") as f:
                st = os.fstat(f.fileno())
                if st.st_uid != os.getuid() or st.st_mode & 0o022:
                    return {}
                entries = json.loads(f.read())
        except (OSError, ValueError):
            return {}
        return entries if isinstance(entries, dict) else {}

    def command(self, argv: list, env: dict):
        """(java argv, env) for a launch of spark-submit with ``argv`` and ``env`` learned before,
        else None (the launch goes through spark-submit)."""
        if not self.learnable(argv, env):
            return None
        self._key = self.key(argv, env)
        entry = self._entries().get(self._key)
        try:
            java_argv = self._filled(entry["argv"])
            added, unset = dict(entry["env"]), list(entry["unset"])
        except (TypeError, KeyError, ValueError):
            return None
        if SUBMIT_CLASS not in java_argv or not os.access(java_argv[0], os.X_OK):
            return None
        launch_env = {k: v for k, v in env.items() if k not in unset}
        launch_env.update(added)
        return java_argv, launch_env

    def learn(self, argv: list, env: dict, pid: int) -> None:
        """Keep the command line of the JVM ``pid`` that spark-submit (``argv``, ``env``) became,
        and what the scripts changed in its environment."""
        java_argv = procs.arguments(pid)
        if SUBMIT_CLASS not in java_argv or not self.path or not self.learnable(argv, env):
            return
        jvm_env = procs.environment(pid)
        entry = {"argv": self._tokenized(java_argv),
                 "env": {k: v for k, v in jvm_env.items() if env.get(k) != v},
                 "unset": sorted(k for k in env if k not in jvm_env)}
        key, entries = self.key(argv, env), self._entries()
        entries.pop(key, None)   # the newest last: the oldest go first past MAX_ENTRIES
        entries[key] = entry
        self._write(dict(list(entries.items())[-MAX_ENTRIES:]))

    def forget(self) -> None:
        log.info("the Spark launch command kept in %s did not start a JVM: Spark starts through "
                 "spark-submit, and the command is learned again", self.path)
        entries = self._entries()
        if self._key in entries:
            del entries[self._key]
            self._write(entries)

    def _write(self, entries: dict) -> None:
        directory = os.path.dirname(self.path) or "."
        try:
            fd, tmp = tempfile.mkstemp(dir=directory, prefix=".statekit-launch-")
            with os.fdopen(fd, "w") as f:
                json.dump(entries, f)
            os.chmod(tmp, 0o644)
            os.replace(tmp, self.path)
        except OSError as exc:   # a read-only venv: every launch goes through spark-submit
            log.info("the Spark launch command is not kept (%s): %s", self.path, exc)


class JvmKeeper:
    """Hands the JVM this process launches to the lifeline's keeper (`statekit.lifeline.keep`)
    from the moment it is launched (an interrupted start never returns its pid) until statekit
    stops it. The JVM exits at EOF on its stdin, yet JVMs of notebook kernels interrupted by
    Ctrl-C were found alive 30 s and 43 minutes later, their shutdown hooks not done. The keeper
    ends it, SIGKILL after its grace, whatever the cause."""

    def __init__(self, direct: "DirectLaunch | None" = None):
        self.kept: set = set()
        self.launched: list = []    # what pyspark's Popen launched during this start
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._popen = None
        self._before: set = set()   # Spark launches that were this process's children already
        self.direct = direct        # the launch command learned before (None: spark-submit always)
        self.went_direct = False    # this start's JVM was started with it
        self._submitted = None      # (argv, env) of a launch through spark-submit, to learn from

    def __enter__(self):
        # the pid is kept as pyspark's Popen returns it, in the thread that launches the JVM, to
        # a keeper already running (one write); the watcher only covers a launch by another path.
        # (Seen in CI: a kernel shut down while its session was starting ended before the
        # watcher's next look; the JVM's main thread then failed on the connection file pyspark
        # had removed, and py4j's server thread kept it alive for good, never reading its stdin.)
        import pyspark.java_gateway as gateway

        from statekit import lifeline

        lifeline.ready()
        self._popen = original = gateway.Popen

        def popen(*args, **kwargs):
            if self.direct is not None and args:
                direct = self.direct.command(list(args[0]), kwargs.get("env") or dict(os.environ))
                if direct is None:
                    self._submitted = (list(args[0]), dict(kwargs.get("env") or os.environ))
                else:
                    args, kwargs, self.went_direct = (direct[0], *args[1:]), {**kwargs, "env": direct[1]}, True
            proc = original(*args, **kwargs)
            self.launched.append(proc)
            self.keep(proc.pid)
            return proc

        self._before = set(self._submits(settle=1.0))
        gateway.Popen = popen
        gateway.time = _FINE_POLL
        self._thread = threading.Thread(target=self._watch, name="statekit-jvm-keeper", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, exc_type, *exc):
        import pyspark.java_gateway as gateway

        gateway.Popen = self._popen
        gateway.time = time
        self._stop.set()
        self._thread.join()
        if exc_type is not None:
            self.end_launched()

    def end_launched(self) -> None:
        """A start that failed or was interrupted leaves no JVM. (Seen in CI: Ctrl-C in a
        notebook landed in pyspark's wait for the JVM, whose ``finally`` removes the JVM's
        connection file; the JVM's main thread died on it while py4j's server thread kept the
        JVM alive, with no session to stop it.)"""
        from statekit import lifeline

        for proc in self.launched:
            if proc.poll() is None:
                proc.kill()
                try:
                    proc.wait(timeout=10)
                except Exception:  # noqa: BLE001 - the keeper still holds it
                    continue
            self.kept.discard(proc.pid)
            lifeline.forget(proc.pid)
        # an interrupt inside pyspark's Popen (after the fork: seen in CI) leaves a child no Popen
        # names: a Spark launch that was not there before this start is ended and reaped too
        mine = {proc.pid for proc in self.launched}
        for pid in set(self._submits(settle=1.0, forked=True)) - self._before - mine:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                continue
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                try:
                    if os.waitpid(pid, os.WNOHANG)[0] == pid:
                        break
                except ChildProcessError:
                    break
                time.sleep(0.05)
            self.kept.discard(pid)
            lifeline.forget(pid)

    @staticmethod
    def _submits(settle: float = 0.0, forked: bool = False) -> list:
        """This process's children that are a Spark launch (spark-submit, then its JVM). A child
        in the middle of its exec shows no command line yet (Popen returns once the exec closed
        its pipe, before the kernel has set the new arguments), and with ``forked`` one not yet
        at its exec shows this process's: either is looked at again for up to ``settle`` s."""
        own, deadline = procs.cmdline(os.getpid()), time.monotonic() + settle
        while True:
            out, unsettled = [], False
            for pid in procs.children(os.getpid()):
                cmd = procs.cmdline(pid)
                if "spark-submit" in cmd or "SparkSubmit" in cmd:
                    out.append(pid)
                unsettled = unsettled or cmd == "" or (forked and cmd == own)
            if not unsettled or time.monotonic() >= deadline:
                return out
            time.sleep(0.01)

    def _watch(self) -> None:
        while not self._stop.wait(0.2):
            for pid in self._submits():   # bash spark-submit, then (exec) the JVM: one pid
                self.keep(pid)

    def keep(self, pid: int | None) -> None:
        if pid is not None and pid not in self.kept:
            from statekit import lifeline

            self.kept.add(pid)
            lifeline.keep(pid)

    def release(self) -> None:
        from statekit import lifeline

        for pid in self.kept:
            lifeline.forget(pid)

    def learn(self) -> None:
        """Keep the command spark-submit computed for this start (`DirectLaunch.learn`)."""
        if self.direct is not None and self._submitted and self.launched:
            self.direct.learn(*self._submitted, self.launched[-1].pid)

    def forget_direct(self) -> None:
        """The learned command did not start a JVM: the next start goes through spark-submit."""
        if self.direct is not None:
            self.direct.forget()
        self.went_direct = False
