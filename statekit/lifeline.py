"""The processes statekit starts end with the process that started them (a notebook's kernel),
however it ends: `%statekit down`, a kernel restart, a crash, a SIGKILL.

The lifeline is a pipe whose write end only this process holds (Python opens it non-inheritable,
so no child gets it across exec) and nobody ever writes: every Python child statekit starts (the
embedded broker of `%statekit up`, instance processes, their spares) gets the read end
(`child_options`) and watches it (`watch_parent`); when this process ends, the OS closes the write
end and every child reads EOF at once. Linux's PR_SET_PDEATHSIG is not used: it fires when the
*thread* that forked the child ends (a timer thread that started a spare), not the process.

A process that is not Python (a standalone Spark cluster's JVMs) cannot watch a pipe: `keep(pid)`
hands it to the keeper, a small process of this file's own (no statekit import) whose stdin is
its lifeline; on EOF it sends SIGTERM to every process it keeps that is still the one it was given
(same start time), and SIGKILL to those left after a grace period. The local Spark driver's JVM
exits at EOF on the stdin pipe pyspark gives it, but JVMs of interrupted kernels were seen to
outlive them: it is kept too (`engine.spark.session`).

A broker started apart (`statekit broker start`) gets no lifeline: it runs until stopped.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from typing import Callable, Optional

ENV = "STATEKIT_LIFELINE"   # the read end's descriptor number, in a child's environment
# statekit's Python children are small threaded servers: glibc's default of 8 malloc arenas per
# core leaves each holding pages its threads freed (~6 MB of PSS per instance process here)
SMALL_MALLOC = ("MALLOC_ARENA_MAX", "2")
KEEPER_GRACE_S = 10.0       # SIGTERM, then SIGKILL this much later

_lock = threading.Lock()
_pipe: Optional[tuple] = None     # (pid that made it, read fd, write fd)
_keeper: Optional[subprocess.Popen] = None
_kept: set = set()                # what the keeper holds: it runs only while that is not empty


def _read_end() -> int:
    global _pipe
    with _lock:
        if _pipe is None or _pipe[0] != os.getpid():   # a forked child makes its own
            r, w = os.pipe()
            _pipe = (os.getpid(), r, w)
        return _pipe[1]


def child_options(env: Optional[dict] = None) -> dict:
    """`subprocess.Popen` keyword arguments for a Python child that is to end with this process:
    the read end passed (``pass_fds``) and named in its environment (``env``: the child's
    environment, default this one's)."""
    r = _read_end()
    env = dict(os.environ if env is None else env)
    env[ENV] = str(r)
    env.setdefault(*SMALL_MALLOC)
    return {"pass_fds": (r,), "env": env}


def given() -> bool:
    """Whether this process was started with a lifeline (`child_options`)."""
    return bool(os.environ.get(ENV))


def watch_parent(on_death: Optional[Callable[[], None]] = None) -> None:
    """In a child: call ``on_death`` (default: exit at once) when the process that started it
    ends: at EOF on the lifeline, or, without one, when the parent pid changes (polled twice a
    second)."""
    fd = os.environ.pop(ENV, None)   # not handed on: the number means nothing to our children
    parent = os.getppid()

    def wait() -> None:
        watched = False
        if fd is not None:
            try:
                while os.read(int(fd), 64):
                    pass
                watched = True
            except (OSError, ValueError):
                pass   # not a pipe we were given: watch the parent pid instead
        if not watched:
            while os.getppid() == parent:
                time.sleep(0.5)
        (on_death or _exit_now)()

    threading.Thread(target=wait, name="statekit-lifeline", daemon=True).start()


def _exit_now() -> None:
    os._exit(0)


# ------------------------------------------------------------------------------ the keeper
def start_time(pid: int) -> Optional[str]:
    """The process's start time in clock ticks since boot (Linux), so that a pid the OS gave to
    another process since is never signalled; None when unknown."""
    try:
        with open(f"/proc/{int(pid)}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError, ValueError):
        return None


def _ensure_keeper() -> None:
    global _keeper
    if _keeper is None or _keeper.poll() is not None:
        # (-I -S: no site, no user paths; it needs only the standard library: ~6 MB of PSS)
        _keeper = subprocess.Popen([sys.executable, "-I", "-S", os.path.abspath(__file__)],
                                   stdin=subprocess.PIPE,
                                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                   close_fds=True, start_new_session=True)


def ready() -> None:
    """Start the keeper now, before what it is to keep is launched: ``keep`` is then one write,
    with no process start in which an interrupt could land between the launch and the keeping."""
    with _lock:
        _ensure_keeper()


def keep(pid: int, group: bool = False) -> None:
    """End process ``pid`` (its whole process group with ``group``) when this process ends."""
    line = f"keep {int(pid)} {start_time(pid) or '-'} {int(bool(group))}\n".encode()
    with _lock:
        _ensure_keeper()
        try:
            _keeper.stdin.write(line)
            _keeper.stdin.flush()
            _kept.add(int(pid))
        except OSError:
            pass


def forget(pid: int) -> None:
    """``pid`` was stopped by its owner, or no longer needs keeping: the keeper lets it go, and
    ends once it holds nothing (an idle kernel pays for no keeper)."""
    global _keeper
    with _lock:
        if _keeper is None or int(pid) not in _kept:
            return
        _kept.discard(int(pid))
        try:
            _keeper.stdin.write(f"forget {int(pid)}\n".encode())
            _keeper.stdin.flush()
            if not _kept:    # EOF with nothing kept: it exits and signals no one
                _keeper.stdin.close()
                _keeper.wait(timeout=5)
                _keeper = None
        except (OSError, subprocess.TimeoutExpired):
            pass


def keeper_pid() -> Optional[int]:
    return _keeper.pid if _keeper is not None and _keeper.poll() is None else None


def _alive(pid: int, started: str, group: bool = False) -> bool:
    """Still the process we were given (a zombie is not), or for a group, any of its members."""
    if group:
        try:
            os.killpg(pid, 0)
            return True
        except OSError:
            return False
    try:
        with open(f"/proc/{int(pid)}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return fields[0] != "Z" and started in ("-", fields[19])
    except (OSError, IndexError):
        try:
            os.kill(pid, 0)
        except OSError:
            return False
        return started == "-"


def _signal(pid: int, group: bool, sig: int) -> None:
    try:
        if group:
            os.killpg(pid, sig)
        else:
            os.kill(pid, sig)
    except OSError:
        pass


def _keeper_main() -> None:
    """Read ``keep PID START GROUP`` / ``forget PID`` lines until EOF (the starter is gone), then
    end what is kept."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    kept: dict = {}
    for raw in sys.stdin.buffer:
        parts = raw.decode(errors="replace").split()
        if len(parts) == 4 and parts[0] == "keep":
            kept[int(parts[1])] = (parts[2], parts[3] == "1")
        elif len(parts) == 2 and parts[0] == "forget":
            kept.pop(int(parts[1]), None)
    # a group is checked by its leader first: a pid the OS gave to someone else is not ours
    left = {p: v for p, v in kept.items() if _alive(p, v[0]) or (v[1] and _alive(p, v[0], True)
                                                                  and start_time(p) is None)}
    for pid, (_started, group) in left.items():
        _signal(pid, group, signal.SIGTERM)
    deadline = time.monotonic() + KEEPER_GRACE_S
    while left and time.monotonic() < deadline:
        time.sleep(0.1)
        left = {p: v for p, v in left.items() if _alive(p, v[0], v[1])}
    for pid, (_started, group) in left.items():
        _signal(pid, group, signal.SIGKILL)


if __name__ == "__main__":
    _keeper_main()
