"""A Spark Connect server on this machine, from pyspark's own files: for a workshop (one server
for the room: ``statekit spark serve``), for ``spark.api.mode=connect`` sessions statekit starts,
and for the tests.

pyspark's wheel ships ``sbin/start-connect-server.sh``, which daemonizes through
``spark-daemon.sh`` (pid files, its own log names). This runs what that script runs —
``bin/spark-submit --class org.apache.spark.sql.connect.service.SparkConnectServer`` — as a child
process in a process group of its own, so that every process it starts (its Python workers'
daemons, Python data source planners, streaming source runners) can be found and stopped with it:

- on an ephemeral port (``port=0``; the port is read from the server's log: "Spark Connect server
  started at: HOST:PORT"), bound to ``host`` (127.0.0.1 by default);
- with statekit's lean JVM options and the class archive (``engine.spark.jvm``); an archive the
  JVM says stopped it is set aside (one line on stderr) and the server started without it;
- the server's log in ``<root>/server.log``, its stderr in ``<root>/server.out``;
- its Python workers run this interpreter and import this checkout's statekit (``PYSPARK_PYTHON``,
  ``PYTHONPATH``), forked from statekit's worker daemon.

    with ConnectServer(root) as server:
        spark = SparkSession.builder.remote(server.url).getOrCreate()

The server ends with the process that started it (``statekit.lifeline``: a kernel restarted or
killed leaves no server behind) unless ``detach`` (``statekit spark serve``: the room's server runs
until ``statekit spark stop``).

``server.json`` in ``root`` records ``{pid, url, master, log, started_at}`` while it runs (how
``statekit spark status|stop`` find it).
"""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from typing import Optional

from statekit import lifeline
from statekit.engine.spark import jvm
from statekit.engine.spark.procs import cmdline, descendants, spark_home
from statekit.errors import StatekitError

SERVER_CLASS = "org.apache.spark.sql.connect.service.SparkConnectServer"
_STARTED = re.compile(r"Spark Connect server started at:\s*(\S+?):(\d+)\s*$", re.MULTILINE)
STATE_FILE = "server.json"


class ConnectServerError(StatekitError):
    """The Spark Connect server did not start, or is not running."""


def alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return False


def server_conf(master: str, host: str, port: int, loopback: bool) -> dict:
    """The server's Spark settings: what statekit's own sessions use (``engine.spark.session``),
    set once for every client session of the server. ``loopback``: the master is on this machine
    (its Python workers fork from statekit's daemon; the driver binds to 127.0.0.1)."""
    local = master.startswith("local")
    conf = {
        "spark.master": master,
        "spark.connect.grpc.binding.address": host,
        "spark.connect.grpc.binding.port": str(int(port)),
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "false",
        "spark.sql.shuffle.partitions": "2",
        "spark.sql.adaptive.enabled": "false",
        "spark.sql.execution.arrow.pyspark.enabled": "true",
        "spark.sql.streaming.stopTimeout": "30s",
        "spark.sql.streaming.noDataMicroBatches.enabled": "false",
        "spark.python.worker.reuse": "true",
        "spark.sql.session.timeZone": "UTC",
        # a room's kernels start their first queries at the same moment on a few cores: a Python
        # worker forked then may take longer than Spark's 15 s to connect back
        "spark.python.authenticate.socketTimeout": "120s",
    }
    if local:
        conf.update({"spark.task.maxFailures": "1", "spark.default.parallelism":
                     (re.match(r"local\[(\d+)", master) or [None, "2"])[1]})
    else:
        conf["spark.task.maxFailures"] = "4"
    if loopback:
        conf.update({"spark.driver.host": "127.0.0.1", "spark.driver.bindAddress": "127.0.0.1",
                     "spark.python.daemon.module": "statekit.engine.spark.worker_daemon"})
        conf.update(jvm.LOCAL_DISK_CONF)   # its checkpoints are on this machine's disk
    return conf


class ConnectServer:
    """A Spark Connect server process (see the module docstring)."""

    def __init__(self, root: str, master: str = "local[2]", host: str = "127.0.0.1", port: int = 0,
                 conf: Optional[dict] = None, driver_memory: str = "1g",
                 start_timeout: float = 180.0, detach: bool = False):
        self.detach = detach
        self.root = os.path.abspath(str(root))
        self.master = master
        self.host = host
        self.port = int(port)
        self.conf = dict(conf or {})
        self.driver_memory = driver_memory
        self.start_timeout = start_timeout
        self.proc: Optional[subprocess.Popen] = None
        self.url: Optional[str] = None
        self.archive_set_aside: Optional[str] = None
        self._seen: set = set()

    # -- paths
    @property
    def log_path(self) -> str:
        return os.path.join(self.root, "server.log")

    @property
    def out_path(self) -> str:
        return os.path.join(self.root, "server.out")

    @property
    def state_path(self) -> str:
        return os.path.join(self.root, STATE_FILE)

    @property
    def pid(self) -> Optional[int]:
        return self.proc.pid if self.proc is not None else None

    # -- life
    def _env(self) -> dict:
        env = dict(os.environ)
        for k in ("SPARK_REMOTE", "SPARK_CONNECT_MODE_ENABLED", "SPARK_LOCAL_REMOTE", "SPARK_API_MODE",
                  "MASTER", "SPARK_CONF_DIR"):
            env.pop(k, None)
        pp = env.get("PYTHONPATH", "")
        here = jvm.statekit_root()
        env.update(SPARK_HOME=spark_home(), PYSPARK_PYTHON=sys.executable,
                   PYSPARK_DRIVER_PYTHON=sys.executable,
                   PYTHONPATH=here + (os.pathsep + pp if pp and here not in pp.split(os.pathsep) else ""))
        if self.host in ("127.0.0.1", "localhost"):
            env["SPARK_LOCAL_IP"] = "127.0.0.1"
        env.setdefault(*lifeline.SMALL_MALLOC)   # its Python workers' too (a room's server holds dozens)
        return env

    def _command(self, archive: Optional[str]) -> list:
        props = os.path.join(self.root, "log4j2.properties")
        with open(props, "w") as fh:
            fh.write(jvm.LOG4J.format(path=self.log_path)
                     + "logger.connect.name = org.apache.spark.sql.connect.service.SparkConnectServer\n"
                       "logger.connect.level = info\n")
        loopback = self.master.startswith("local") or bool(re.match(
            r"^spark://(127\.0\.0\.1|localhost)[:/]", self.master))
        conf = server_conf(self.master, self.host, self.port, loopback=loopback)
        conf.update({k: str(v) for k, v in self.conf.items()})
        java_opts = (f"-Dlog4j.configurationFile=file:{props} -Dlog4j2.configurationFile=file:{props} "
                     + jvm.jvm_options(archive))
        cmd = [os.path.join(spark_home(), "bin", "spark-submit"), "--class", SERVER_CLASS,
               "--name", "statekit Spark Connect server", "--driver-memory", self.driver_memory,
               "--driver-java-options", java_opts]
        for k, v in conf.items():
            cmd += ["--conf", f"{k}={v}"]
        return cmd + ["spark-internal"]

    def _spawn(self, archive: Optional[str]) -> int:
        """Start the JVM; returns where its stderr file stood before (what it says comes after)."""
        offset = jvm.file_size(self.out_path)
        out = open(self.out_path, "ab")
        try:
            self.proc = subprocess.Popen(self._command(archive), env=self._env(), cwd=self.root,
                                         stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                         start_new_session=True)
        finally:
            out.close()
        self._seen.add(self.proc.pid)
        if not self.detach:
            lifeline.keep(self.proc.pid, group=True)   # ended with this process if stop() never comes
        return offset

    def _wait_started(self, offset_log: int, deadline: float) -> Optional[str]:
        """The server's URL once it listens; None when its JVM exited first."""
        while time.monotonic() < deadline:
            m = _STARTED.search(jvm.said_since(self.log_path, offset_log))
            if m:
                port = int(m.group(2))
                return f"sc://{'127.0.0.1' if self.host in ('0.0.0.0', '::') else self.host}:{port}"
            if self.proc.poll() is not None:
                return None
            time.sleep(0.1)
        raise ConnectServerError(f"the Spark Connect server did not start in {self.start_timeout:.0f} s "
                                 f"(its log: {self.log_path}); it was stopped")

    def start(self) -> "ConnectServer":
        jvm.check_java()
        os.makedirs(self.root, exist_ok=True)
        deadline = time.monotonic() + self.start_timeout
        archive = jvm.built_class_archive()
        try:
            log0, t0 = jvm.file_size(self.log_path), time.time()
            out0 = self._spawn(archive)
            url = self._wait_started(log0, deadline)
            if url is None and archive is not None and jvm.archive_was_the_cause(
                    jvm.said_since(self.out_path, out0), t0):
                self.archive_set_aside = jvm.set_archive_aside(archive)
                print(f"statekit: the JVM did not start with the class archive {archive}; it is now "
                      f"{self.archive_set_aside} and the Spark Connect server started without it "
                      f"(make writes a new one)", file=sys.stderr)
                log0 = jvm.file_size(self.log_path)
                self._spawn(None)
                url = self._wait_started(log0, deadline)
            if url is None:
                raise ConnectServerError(f"the Spark Connect server exited with {self.proc.returncode} "
                                         f"at its start: see {self.out_path} and {self.log_path}")
        except BaseException:
            self.stop()
            raise
        self.url = url
        self._write_state()
        return self

    def _write_state(self) -> None:
        body = {"pid": self.pid, "url": self.url, "master": self.master, "host": self.host,
                "log": self.log_path, "root": self.root, "started_at": time.time()}
        tmp = self.state_path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(body, f)
        os.replace(tmp, self.state_path)

    def helpers(self) -> list:
        """The processes the server started and that still run (its Python workers' daemons and
        workers, planners, source runners): ``[(pid, command line)]``."""
        if self.proc is None:
            return []
        return [(p, cmdline(p)) for p in descendants(self.proc.pid) if alive(p)]

    def stop(self, grace: float = 20.0) -> list:
        """Stop the server and every process it started: SIGTERM to its process group, SIGKILL
        after ``grace`` seconds to whatever is left. Returns the pids still alive (none)."""
        p = self.proc
        if p is None:
            return []
        self._seen.update(descendants(p.pid))
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
            try:
                p.wait(timeout=grace)
            except subprocess.TimeoutExpired:
                pass
        for pid in sorted(self._seen):
            if alive(pid):
                self._seen.update(descendants(pid))
        for pid in sorted(self._seen):
            if alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            pass
        try:
            os.unlink(self.state_path)
        except OSError:
            pass
        if not self.detach:
            for pid in sorted(self._seen):
                lifeline.forget(pid)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and any(alive(x) for x in self._seen):
            time.sleep(0.05)
        return [x for x in sorted(self._seen) if alive(x)]

    def __enter__(self) -> "ConnectServer":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


# -- a server started by another process (the `statekit spark` CLI) -----------------------------------

def read_state(root: str) -> Optional[dict]:
    """The ``server.json`` of a server running under ``root`` (None: none runs there)."""
    try:
        with open(os.path.join(root, STATE_FILE)) as f:
            st = json.load(f)
    except (OSError, ValueError):
        return None
    pid = st.get("pid")
    if not pid or not alive(int(pid)) or SERVER_CLASS not in cmdline(int(pid)):
        return None
    return st


def stop_running(root: str, grace: float = 20.0) -> Optional[dict]:
    """Stop the server recorded under ``root`` and the processes it started; its state, or None
    when none ran there."""
    st = read_state(root)
    if st is None:
        return None
    pid = int(st["pid"])
    seen = {pid, *descendants(pid)}
    try:
        os.killpg(pid, signal.SIGTERM)
    except (ProcessLookupError, PermissionError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline and alive(pid):
        time.sleep(0.1)
    for p in sorted(seen | set(descendants(pid))):
        if alive(p):
            try:
                os.kill(p, signal.SIGKILL)
            except ProcessLookupError:
                pass
    try:
        os.unlink(os.path.join(root, STATE_FILE))
    except OSError:
        pass
    return st
