"""A server statekit runs as a child process (the embedded broker, the schema registry), found by
any process through the info file it writes into its data directory while it serves.

One lifecycle for both, so that they cannot drift apart: a second ``start`` on a directory whose
server is alive hands out a handle that does not own it (``stop()`` leaves it running unless
``force``: it may be another kernel's); a server is tied to the process that started it
(`statekit.lifeline`) unless started apart (``detach``); a server that cannot start says why in
one line, the last line it logged. What each server is (its command line, how it answers, its
settings) stays in its own package.
"""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import threading
import time

from statekit import lifeline
from statekit.errors import BrokerUnreachable, StatekitError


def pid_alive(pid: int) -> bool:
    """Whether ``pid`` runs (a zombie does not: it is dead, only not yet reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def ensure_writable(data_dir: str, what: str) -> None:
    """Create ``data_dir`` and write into it, so that an unusable directory is a one-line error
    here rather than a child that dies with a traceback in its log."""
    try:
        os.makedirs(data_dir, exist_ok=True)
        probe = os.path.join(data_dir, f".write-test-{os.getpid()}-{threading.get_ident()}")
        with open(probe, "w"):
            pass
        os.unlink(probe)
    except OSError as e:
        raise StatekitError(f"the {what} directory {data_dir} is not writable ({e.strerror}): pass another dir") from None


def remove_stale_info(path: str) -> None:
    """The info file of a dead server (kill -9 leaves it behind); a live one's is left alone."""
    try:
        with open(path) as f:
            pid = int(json.load(f).get("pid", -1))
    except FileNotFoundError:
        return
    except (OSError, ValueError, AttributeError):
        pid = -1
    if pid <= 0 or not pid_alive(pid):
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass


def remove_own_info(path: str) -> None:
    """In the server, as it stops: its info file, unless a newer server on the directory wrote its own."""
    try:
        with open(path) as f:
            if json.load(f).get("pid") == os.getpid():
                os.unlink(path)
    except (OSError, ValueError):
        pass


def port_arg(text: str) -> int:
    """``--port`` of a server's command line: a bad one is an argparse error that says what to use."""
    try:
        n = int(text)
    except ValueError:
        n = -1
    if not 0 <= n <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port: use 0..65535 (0 picks a free one)")
    return n


def _last_error(log_path: str, start_pos: int, name: str) -> str | None:
    """The server's own error line (``statekit NAME: ...``) among what it logged since start_pos,
    else its last line."""
    prefix = f"statekit {name}:"
    try:
        with open(log_path, "rb") as f:
            f.seek(start_pos)
            lines = [ln.strip() for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return None
    for ln in reversed(lines):
        if ln.startswith(prefix):
            return ln[len(prefix):].strip()
    return lines[-1] if lines else None


class ChildServer:
    """A running server. ``.stop()`` stops it only if this handle started it (or ``force=True``).

    A subclass names its server (``NAME``: its log ``DIR/NAME.log`` and error prefix; ``TITLE``: in
    words), its info file (``INFO_NAME``) and how a live one is told from a dead one's leftovers
    (``answers``)."""

    NAME = "server"
    TITLE = "server"
    INFO_NAME = "server.json"

    def __init__(self, data_dir: str, info: dict, owned: bool, proc: subprocess.Popen | None = None):
        self.dir = data_dir
        self.host = info["host"]
        self.port = int(info["port"])
        self.pid = int(info["pid"])
        self.owned = owned
        self._proc = proc   # our child, reaped when it ends; None for one found running or detached

    @staticmethod
    def answers(info: dict) -> bool:
        """Whether the server the info file describes answers at its address."""
        return True

    @classmethod
    def info_path(cls, data_dir: str) -> str:
        return os.path.join(data_dir, cls.INFO_NAME)

    @classmethod
    def running_info(cls, data_dir: str) -> dict | None:
        """The info file of a live server on data_dir, else None."""
        try:
            with open(cls.info_path(data_dir)) as f:
                info = json.load(f)
        except (OSError, ValueError):
            return None
        if not isinstance(info, dict) or not pid_alive(int(info.get("pid", -1))) or not cls.answers(info):
            return None
        return info

    @classmethod
    def spawn(cls, data_dir: str, cmd: list, timeout: float, detach: bool):
        """Run ``cmd`` (the server, which writes its info file once it serves) logging to
        ``DIR/NAME.log``, and return an owned handle once the info file names it. Tied to this
        process unless ``detach``. A concurrent start that won the directory's lock (this one then
        exits saying ``another NAME already runs``) gives a handle to that server, not owned."""
        log_path = os.path.join(data_dir, f"{cls.NAME}.log")
        with open(log_path, "ab") as logf:
            start_pos = logf.tell()
            proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf,
                                    start_new_session=True, close_fds=True,
                                    **({} if detach else lifeline.child_options()))
        deadline = time.monotonic() + timeout
        while True:
            code = proc.poll()
            if code is not None:
                err = (_last_error(log_path, start_pos, cls.NAME)
                       or f"the {cls.NAME} exited with code {code}; see {log_path}")
                if f"another {cls.NAME} already runs" in err:
                    while time.monotonic() < deadline:
                        other = cls.running_info(data_dir)
                        if other is not None:
                            return cls(data_dir, other, owned=False)
                        time.sleep(0.05)
                raise StatekitError(err)
            try:
                with open(cls.info_path(data_dir)) as f:
                    info = json.load(f)
                if info.get("pid") == proc.pid:
                    break
            except (OSError, ValueError):
                pass
            if time.monotonic() > deadline:
                proc.kill()
                proc.wait()
                raise BrokerUnreachable(f"the {cls.TITLE} did not start within {timeout:.0f}s; see {log_path}")
            time.sleep(0.02)
        return cls(data_dir, info, owned=True, proc=None if detach else proc)

    @classmethod
    def stop_running(cls, data_dir: str, grace: float = 10.0) -> bool:
        """Stop the server running on data_dir, whoever started it; False if none was running."""
        info = cls.running_info(data_dir)
        if info is None:
            return False
        cls(data_dir, info, owned=True).stop(grace=grace)
        return True

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.stop()

    @property
    def alive(self) -> bool:
        if self._proc is not None:
            return self._proc.poll() is None
        return pid_alive(self.pid)

    def _wait_exit(self, timeout: float) -> bool:
        if self._proc is not None:
            try:
                self._proc.wait(timeout)
                return True
            except subprocess.TimeoutExpired:
                return False
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if not pid_alive(self.pid):
                return True
            time.sleep(0.02)
        return not pid_alive(self.pid)

    def stop(self, grace: float = 10.0, force: bool = False) -> None:
        """SIGTERM, then SIGKILL after ``grace`` seconds."""
        if not self.owned and not force:
            return
        if not self.alive:
            self._wait_exit(0)
            return
        try:
            os.kill(self.pid, signal.SIGTERM)
        except ProcessLookupError:
            return
        if not self._wait_exit(grace):
            self.kill()

    def kill(self) -> None:
        """SIGKILL: a crash, as far as the server's files know."""
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._wait_exit(10.0)
