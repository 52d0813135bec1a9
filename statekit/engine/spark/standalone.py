"""A real Spark standalone cluster on this machine: one master and N workers, each worker with its
own work and local directories, every port ephemeral — for the cluster tests, ``bench/cluster.py``
and the cluster notebook.

pyspark's wheel ships ``bin/spark-class`` but not ``sbin/start-master.sh`` / ``start-worker.sh``, so
this runs what those scripts run — ``spark-class org.apache.spark.deploy.master.Master`` and
``...deploy.worker.Worker`` — as child processes, reads their ports from their logs, and stops every
process it started (the daemons, the executors they launched and the executors' Python workers)
even when a test fails — and when the process that started it ends without `stop()` (a notebook's
kernel restarted): the lifeline's keeper (`statekit.lifeline.keep`) ends the daemons' process
groups then. Without a ``root`` it works in a temporary directory of its own, which `stop()`
removes.

    with StandaloneCluster(tmp_path, workers=2) as cluster:
        spark = get_session(master=cluster.master_url, extra_conf=...)
        cluster.executors()          # [{"worker": 0, "pid": ..., "executor_id": "0"}, ...]
"""
from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time

from statekit import lifeline
from statekit.child_server import pid_alive

_MASTER_URL = re.compile(r"Starting Spark master at (spark://[\w.\-]+:\d+)")
_REGISTERED = "Successfully registered with master"
from statekit.engine.spark.executor_id import EXECUTOR_ID as _EXECUTOR_ID
from statekit.engine.spark.procs import cmdline, descendants, spark_home
from statekit.engine.spark.session import built_class_archive, jvm_options


class ClusterError(RuntimeError):
    pass


class StandaloneCluster:
    def __init__(self, root: str | None = None, workers: int = 2, cores: int = 1, memory: str = "1g",
                 start_timeout: float = 180.0, daemon_memory: str = "256m"):
        self._own_root = root is None   # a temporary directory of its own: stop() removes it
        self.root = tempfile.mkdtemp(prefix="statekit-cluster-") if root is None else str(root)
        self.n_workers = int(workers)
        self.cores = int(cores)
        self.memory = memory
        self.start_timeout = start_timeout
        self.daemon_memory = daemon_memory   # the master's and workers' own heaps, not executors'
        self.master: subprocess.Popen | None = None
        self.workers: list[subprocess.Popen] = []
        self.master_url: str | None = None
        self._logs: list = []
        self._seen: set = set()   # every pid that belonged to the cluster, for the final sweep

    # -- paths
    def worker_dir(self, i: int) -> str:
        return os.path.join(self.root, f"worker-{i}")

    def local_dir(self, i: int) -> str:
        return os.path.join(self.worker_dir(i), "local")

    def work_dir(self, i: int) -> str:
        return os.path.join(self.worker_dir(i), "work")

    def log_path(self, name: str) -> str:
        return os.path.join(self.root, f"{name}.log")

    # -- life
    def _env(self, local_dir: str | None = None) -> dict:
        env = dict(os.environ)
        env.update(SPARK_HOME=spark_home(), SPARK_LOCAL_IP="127.0.0.1", SPARK_NO_DAEMONIZE="1",
                   SPARK_LOG_DIR=self.root, SPARK_DAEMON_MEMORY=self.daemon_memory,
                   # the master's REST submission server would take the fixed port 6066
                   SPARK_MASTER_OPTS="-Dspark.master.rest.enabled=false",
                   # the master and workers only keep books: the driver's lean JVM options
                   SPARK_DAEMON_JAVA_OPTS=jvm_options(built_class_archive()))
        env.pop("SPARK_CONF_DIR", None)
        if local_dir:
            env["SPARK_LOCAL_DIRS"] = local_dir
        return env

    def _spawn(self, name: str, args: list, env: dict) -> subprocess.Popen:
        log = open(self.log_path(name), "ab")
        self._logs.append(log)
        p = subprocess.Popen([os.path.join(spark_home(), "bin", "spark-class"), *args], env=env,
                             stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                             start_new_session=True)
        self._seen.add(p.pid)
        lifeline.keep(p.pid, group=True)   # ended with this process if stop() never comes
        return p

    def _wait_log(self, name: str, proc: subprocess.Popen, pattern, deadline: float) -> str:
        path = self.log_path(name)
        while time.monotonic() < deadline:
            try:
                with open(path, errors="replace") as f:
                    text = f.read()
            except FileNotFoundError:
                text = ""
            m = pattern.search(text) if hasattr(pattern, "search") else (pattern in text and pattern)
            if m:
                return m.group(1) if hasattr(m, "group") else m
            if proc.poll() is not None:
                raise ClusterError(f"{name} exited with {proc.returncode}; its log: {path}")
            time.sleep(0.2)
        raise ClusterError(f"{name} did not come up in {self.start_timeout:.0f}s; its log: {path}")

    def start(self) -> "StandaloneCluster":
        os.makedirs(self.root, exist_ok=True)
        deadline = time.monotonic() + self.start_timeout
        try:
            self.master = self._spawn("master", ["org.apache.spark.deploy.master.Master", "--host",
                                                 "127.0.0.1", "--port", "0", "--webui-port", "0"],
                                      self._env())
            self.master_url = self._wait_log("master", self.master, _MASTER_URL, deadline)
            for i in range(self.n_workers):
                os.makedirs(self.local_dir(i), exist_ok=True)
                os.makedirs(self.work_dir(i), exist_ok=True)
                self.workers.append(self._spawn(
                    f"worker-{i}", ["org.apache.spark.deploy.worker.Worker", self.master_url,
                                    "--host", "127.0.0.1", "--port", "0", "--webui-port", "0",
                                    "--work-dir", self.work_dir(i), "--cores", str(self.cores),
                                    "--memory", self.memory],
                    self._env(self.local_dir(i))))
            for i, w in enumerate(self.workers):
                self._wait_log(f"worker-{i}", w, _REGISTERED, deadline)
        except BaseException:
            self.stop()
            raise
        return self

    def executors(self) -> list:
        """The executor JVMs the workers launched: ``[{"worker", "pid", "executor_id"}]``."""
        out = []
        for i, w in enumerate(self.workers):
            if w.poll() is not None:
                continue
            for pid in descendants(w.pid):
                cl = cmdline(pid)
                if "CoarseGrainedExecutorBackend" in cl and pid_alive(pid):
                    self._seen.add(pid)
                    m = _EXECUTOR_ID.search(cl)
                    out.append({"worker": i, "pid": pid, "executor_id": m.group(1) if m else None})
        return out

    def wait_executors(self, n: int, timeout: float = 120.0) -> list:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            ex = self.executors()
            if len(ex) >= n:
                return ex
            time.sleep(0.2)
        raise ClusterError(f"{n} executors did not start in {timeout:.0f}s (have "
                           f"{len(self.executors())}); logs in {self.root}")

    def kill_executor(self, executor_id: str) -> dict:
        """SIGKILL one executor JVM and the processes it runs (its Python workers): a lost
        executor. Its worker stays, and the master starts a replacement. Returns its
        ``executors()`` row."""
        for e in self.executors():
            if e["executor_id"] == str(executor_id):
                procs = [e["pid"], *descendants(e["pid"])]
                self._seen.update(procs)
                for pid in procs:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass
                return e
        raise ClusterError(f"no live executor {executor_id} (have "
                           f"{[e['executor_id'] for e in self.executors()]})")

    def stop(self, grace: float = 15.0) -> list:
        """Stop every process of the cluster: SIGTERM, then SIGKILL after ``grace`` seconds.
        Returns the pids still alive afterwards (none, or something is badly wrong)."""
        procs = [p for p in [*self.workers, self.master] if p is not None]
        for p in procs:
            self._seen.update(descendants(p.pid))
        for p in procs:
            if p.poll() is None:
                try:
                    os.killpg(p.pid, signal.SIGTERM)
                except ProcessLookupError:
                    pass
        deadline = time.monotonic() + grace
        for p in procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                pass
        for pid in sorted(self._seen):
            if pid_alive(pid):
                self._seen.update(descendants(pid))
        for pid in sorted(self._seen):
            if pid_alive(pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        for p in procs:
            lifeline.forget(p.pid)
        for f in self._logs:
            f.close()
        self._logs = []
        time.sleep(0.2)
        left = [pid for pid in sorted(self._seen) if pid_alive(pid)]
        if self._own_root and not left:
            shutil.rmtree(self.root, ignore_errors=True)
        return left

    def __enter__(self) -> "StandaloneCluster":
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
