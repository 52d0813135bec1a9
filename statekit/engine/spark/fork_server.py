"""A fork server for the Python processes Spark starts on this machine.

Spark starts a fresh interpreter for each Python process its driver needs: a planner daemon per
kind of data source step (`python -m pyspark.daemon pyspark.sql.worker.<step>`), a streaming
source's runner per query, and the workers' daemon (`spark.python.daemon.module`). Each imports
pyspark, and the runner statekit's Kafka client too: ~0.15-0.45 s of CPU apiece, about 1.3 s of a
cold launch's CPU and ~0.5 s of its path, on two cores shared with the JVM starting.

For a local session statekit starts, `ForkServer` is a process that has imported those modules
once. The JVM gets its socket in `STATEKIT_FORK_SERVER`; the venv's
`statekit-spark-workers.pth` (scripts/spark_workers_pth.py) calls `hand_over()` first thing in
every Python process, which acts only in a process started as `python -m <one of HANDLED>` with
that variable set: it sends the server its argv, environment, directory and stdin/stdout/stderr,
the server forks a child that runs the module with them, and the process Spark started (the
*stand-in*) waits for that child and exits as it did, passing on the signals it gets. So Spark
talks to the child through the same pipes and sockets as before, and ends it through the stand-in:
a stand-in that dies takes its child with it (the server kills the child when the stand-in's
connection closes), and the server's children die with the server (`PR_SET_PDEATHSIG`), which
exits when the process that started it does (its stdin closes). Without an answer from the server
(not started, gone, refusing) the process starts as it always did.

The children differ from a fresh process in one way Spark could see: their hash secret is the
server's. The server runs with the `PYTHONHASHSEED` Spark gives its Python processes (pyspark sets
"0" unless the driver has one) and refuses a process whose environment names another.
`planners.REAPER` reads `stand_ins` for the child a planner daemon's stand-in stands for.
"""
from __future__ import annotations

import os
import socket
import struct
import sys

ENV = "STATEKIT_FORK_SERVER"
HANDLED = ("pyspark.daemon", "pyspark.sql.streaming.python_streaming_source_runner",
           "statekit.engine.spark.worker_daemon")
# what those processes import (pyarrow not: only the read planner's worker and the Python workers
# need it, and the server outlives them)
PRELOAD = ("pyspark.daemon", "pyspark.worker", "pyspark.sql.worker.create_data_source",
           "pyspark.sql.worker.lookup_data_sources", "statekit.engine.spark.lean_runner",
           "pyspark.sql.streaming.python_streaming_source_runner", "statekit.engine.spark.source",
           "statekit.kafka", "statekit.engine.spark.worker_daemon")
_LEN = struct.Struct("!I")
_INT = struct.Struct("!i")


def _recv_exact(s: socket.socket, n: int) -> bytes:
    buf = b""
    while len(buf) < n:
        chunk = s.recv(n - len(buf))
        if not chunk:
            raise EOFError
        buf += chunk
    return buf


# --- the stand-in: the process Spark started ------------------------------------------------------

def hand_over() -> None:
    """Run this process's module in a child of the fork server and exit as that child does; return
    (and start as usual) when this process is not one it serves or the server does not answer."""
    path, argv = os.environ.get(ENV), sys.orig_argv
    if not path or len(argv) < 3 or argv[1] != "-m" or argv[2] not in HANDLED:
        return
    import json
    import signal

    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        s.connect(path)
        body = json.dumps({"argv": argv[2:], "env": dict(os.environ), "cwd": os.getcwd(),
                           "standin": os.getpid()}).encode()
        socket.send_fds(s, [_LEN.pack(len(body)) + body], [0, 1, 2])
        pid = _INT.unpack(_recv_exact(s, _INT.size))[0]
    except (OSError, EOFError, ValueError):
        pid = 0
    if pid <= 0:
        s.close()
        return

    def pass_on(signum, _frame):
        try:
            os.kill(pid, signum)
        except ProcessLookupError:
            pass

    for sig in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(sig, pass_on)
    devnull = os.open(os.devnull, os.O_RDWR)
    for fd in (0, 1, 2):          # the child has them: Spark sees its pipes close when it exits
        os.dup2(devnull, fd)
    while True:
        try:
            code = _INT.unpack(_recv_exact(s, _INT.size))[0]
            break
        except InterruptedError:
            continue
        except (OSError, EOFError):   # the server went away: its child with it (PDEATHSIG)
            code = 1
            break
    if code < 0:                      # the child died of a signal: so does the stand-in
        signal.signal(-code, signal.SIG_DFL)
        os.kill(os.getpid(), -code)
    os._exit(code & 0xFF)


# --- the server ----------------------------------------------------------------------------------

def _dropped(p: str) -> bool:
    """pyspark's zips and pip's jars, which the .pth drops from every Spark Python process."""
    p = p.replace("\\", "/")
    return ((p.endswith(".zip") and "/pyspark/python/lib/" in p)
            or (p.endswith(".jar") and "/pyspark/jars/" in p))


def _child(body: dict, fds: list, keep_out: list) -> None:
    """In the forked child: become the process Spark started, then run its module."""
    import ctypes
    import runpy
    import signal

    for fd in keep_out:
        try:
            os.close(fd)
        except OSError:
            pass
    signal.set_wakeup_fd(-1)
    for sig in (signal.SIGCHLD, signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
        signal.signal(sig, signal.SIG_DFL)
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    for i, fd in enumerate(fds):
        os.dup2(fd, i)
        os.close(fd)
    os.chdir(body["cwd"])
    os.environ.clear()
    os.environ.update(body["env"])
    sys.path[0] = body["cwd"]      # `python -m` puts the directory it runs in first
    for p in reversed(os.environ.get("PYTHONPATH", "").split(os.pathsep)):
        if p and p not in sys.path and not _dropped(p):
            sys.path.insert(1, p)
    module, *args = body["argv"]
    sys.argv = ["-m", *args]
    sys.modules.pop(module, None)   # run as __main__ alone, as in a fresh process (its imports stay)
    code = 0
    try:
        runpy._run_module_as_main(module, alter_argv=True)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else (0 if e.code is None else 1)
    except BaseException:  # noqa: BLE001 - as the interpreter would: the traceback, then 1
        import traceback

        traceback.print_exc()
        code = 1
    import atexit

    atexit._run_exitfuncs()   # as the interpreter does at its end
    for f in (sys.stdout, sys.stderr):
        try:
            f.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


class _Server:
    def __init__(self, path: str):
        import select
        import signal

        self.path = path
        self.pids_path = path + ".pids"
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.bind(path)
        os.chmod(path, 0o600)           # this user's processes only (and `_accept` checks)
        self.sock.listen(64)
        self.wake_r, self.wake_w = os.pipe()
        for fd in (self.wake_r, self.wake_w):
            os.set_blocking(fd, False)
        signal.set_wakeup_fd(self.wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        self.conns: dict = {}     # fd -> (connection, child pid, stand-in pid)
        self.poller = select.poll()
        for fd in (self.sock.fileno(), self.wake_r, 0):
            self.poller.register(fd, select.POLLIN)

    def _publish(self) -> None:
        """{stand-in pid: child pid}, for `real_pid` (written whole, then renamed)."""
        import json

        tmp = f"{self.pids_path}.tmp"
        with open(tmp, "w") as f:
            json.dump({str(s): p for _c, p, s in self.conns.values()}, f)
        os.replace(tmp, self.pids_path)

    def _accept(self) -> None:
        import json
        import select

        conn, _ = self.sock.accept()
        peer = conn.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
        if struct.unpack("3i", peer)[1] != os.getuid():   # another user's: never run for it
            conn.close()
            return
        try:
            msg, fds, _flags, _addr = socket.recv_fds(conn, 1 << 16, 3)
            while len(msg) < _LEN.size:
                msg += _recv_exact(conn, _LEN.size - len(msg))
            n = _LEN.unpack(msg[:_LEN.size])[0]
            if len(msg) < _LEN.size + n:
                msg += _recv_exact(conn, _LEN.size + n - len(msg))
            body = json.loads(msg[_LEN.size:_LEN.size + n])
        except (OSError, EOFError, ValueError):
            conn.close()
            return
        if (len(fds) != 3 or body.get("env", {}).get("PYTHONHASHSEED")
                != os.environ.get("PYTHONHASHSEED")):
            for fd in fds:
                os.close(fd)
            try:
                conn.sendall(_INT.pack(0))   # not one this server can stand in for: start as usual
            finally:
                conn.close()
            return
        go_r, go_w = os.pipe()   # the child waits until the map names it (`real_pid` is never behind)
        pid = os.fork()
        if pid == 0:
            os.close(go_w)
            if not os.read(go_r, 1):   # the server died first
                os._exit(1)
            _child(body, fds, [go_r, self.sock.fileno(), self.wake_r, self.wake_w, conn.fileno()]
                   + [c.fileno() for c, _p, _s in self.conns.values()])
        os.close(go_r)
        for fd in fds:
            os.close(fd)
        self.conns[conn.fileno()] = (conn, pid, int(body.get("standin", 0)))
        self.poller.register(conn.fileno(), select.POLLIN)
        self._publish()
        os.write(go_w, b"!")
        os.close(go_w)
        try:
            conn.sendall(_INT.pack(pid))
        except OSError:
            pass   # the stand-in is gone already: its connection's hang-up ends the child

    def _reap(self) -> None:
        try:
            while os.read(self.wake_r, 4096):
                pass
        except OSError:
            pass
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            for fd, (conn, child, _s) in list(self.conns.items()):
                if child == pid:
                    code = os.waitstatus_to_exitcode(status)   # -n: killed by signal n
                    try:
                        conn.sendall(_INT.pack(code))
                    except OSError:
                        pass
                    self._drop(fd)

    def _drop(self, fd: int) -> None:
        conn, _p, _s = self.conns.pop(fd)
        self.poller.unregister(fd)
        conn.close()
        self._publish()

    def _hung_up(self, fd: int) -> None:
        """A stand-in's connection closed before its child ended: the stand-in died (killed), and
        so does its child."""
        import signal

        conn, child, _s = self.conns[fd]
        try:
            if conn.recv(16):
                return
        except OSError:
            pass
        try:
            os.kill(child, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._drop(fd)

    def _end(self) -> None:
        import signal

        for _c, child, _s in self.conns.values():
            try:
                os.kill(child, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for p in (self.path, self.pids_path):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass
        os._exit(0)

    def run(self) -> None:
        while True:
            for fd, _ev in self.poller.poll():
                if fd == 0:
                    if not os.read(0, 4096):   # the process that started the server is gone
                        self._end()
                elif fd == self.sock.fileno():
                    self._accept()
                elif fd == self.wake_r:
                    self._reap()
                elif fd in self.conns:
                    self._hung_up(fd)


def threads_started() -> bool:
    """Does this process run a thread besides its main one? Python's own, or a library's: pyarrow's
    jemalloc starts one at import, OpenBLAS (numpy) a pool, neither seen by ``threading``; every
    one of them is a task of the process."""
    try:
        return len(os.listdir("/proc/self/task")) > 1
    except OSError:   # no /proc: the threads Python knows of
        import threading

        return threading.active_count() > 1


def serve(path: str) -> None:
    """The server's main: import what its children run, then fork one for each stand-in."""
    import gc
    import importlib

    from statekit.engine.spark.lean_runner import install

    install()   # the runner without pyarrow (lean_runner.py), as the .pth gives a fresh one
    for m in PRELOAD:
        importlib.import_module(m)
    if threads_started():   # a fork would copy a thread's locks, held or not: no server
        raise SystemExit("statekit's fork server: an import started a thread; Spark's Python "
                         "processes start afresh")
    gc.collect()
    gc.freeze()   # the children's collections skip what they inherited, and leave its pages shared
    server = _Server(path)
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    server.run()


def stand_ins(path: str | None) -> dict:
    """{stand-in pid: the child it stands for} of the server at ``path`` (empty without one)."""
    if not path:
        return {}
    import json

    try:
        with open(path + ".pids") as f:
            return {int(k): int(v) for k, v in json.load(f).items()}
    except (OSError, ValueError, AttributeError):
        return {}


def real_pid(standin: int, path: str | None) -> int:
    """The child the stand-in ``standin`` stands for (``standin`` itself when it is not one)."""
    return stand_ins(path).get(standin, standin)


class ForkServer:
    """The fork server of this process's local session (`get_session` starts it before the JVM,
    `stop_session` stops it after)."""

    def __init__(self, directory: str, stderr: str | None = None):
        import subprocess

        from statekit import lifeline

        self.path = os.path.join(directory, f"fork-server-{os.getpid()}.sock")
        if len(os.fsencode(self.path)) > 100:   # past a Unix socket's name (108 bytes with its NUL)
            raise OSError(f"a fork server's socket cannot be named {self.path}")
        for p in (self.path, self.path + ".pids"):
            try:
                os.unlink(p)
            except FileNotFoundError:
                pass
        env = dict(os.environ)
        env.pop(ENV, None)
        env["PYTHONHASHSEED"] = os.environ.get("PYTHONHASHSEED", "0")   # as pyspark gives Spark's
        env.setdefault(*lifeline.SMALL_MALLOC)
        # numpy's OpenBLAS starts a thread pool at import unless told one thread, which is what
        # Spark gives its Python workers (OMP_NUM_THREADS = spark.task.cpus): the server must run
        # no thread when it forks (`threads_started`)
        env.setdefault("OPENBLAS_NUM_THREADS", "1")
        err = open(stderr, "ab") if stderr else None   # where the JVM's own output goes
        try:
            self.proc = subprocess.Popen([sys.executable, "-m", "statekit.engine.spark.fork_server",
                                          self.path], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                         stderr=err, env=env)
        finally:
            if err is not None:
                err.close()

    def stop(self) -> None:
        """Close its stdin (it kills its children and exits); kill it if it does not."""
        import subprocess

        try:
            self.proc.stdin.close()
            self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        except OSError:
            pass
        if self.proc.stdout:
            self.proc.stdout.close()


if __name__ == "__main__":
    serve(sys.argv[1])
