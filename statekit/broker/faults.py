"""Outages on purpose, for the tour and the tests: a broker that stops answering for a while, and
one that is killed and started again on the same directory and port.

* ``pause(target, seconds)`` — the broker's event loop stops for ``seconds`` (SIGUSR2 and
  ``DIR/pause-request``, answered in ``DIR/paused.json`` before it stops): nothing is read or
  answered, connections stay open, new ones wait in the kernel's backlog — a real stall, as a long
  GC pause or a frozen VM gives; then everything queued is served. It ends by itself, whatever
  happens to the process that asked. ``mid_transaction=True`` arms it for the next produce
  request of a transaction instead: the stall begins with a transaction's records in flight.
* ``restart(target, down=0)`` — ``kill -9`` (or a graceful stop with ``kill=False``), ``down``
  seconds of nothing, then a new broker on the same directory, host, port, configs, auth and TLS: what
  survives a crash comes back (the logs, the transactions' state, the groups).

``target``: a ``BrokerHandle``, a broker directory, a bootstrap address (``HOST:PORT``) of a broker
this machine runs, or None for the default directory.
"""
from __future__ import annotations

import json
import os
import signal
import time
import uuid

from statekit.errors import BrokerUnreachable, StatekitError

from .process import _KNOWN, BrokerHandle, default_dir, info_path, pid_alive, running_info, start

__all__ = ["pause", "restart", "find"]

PAUSE_REQUEST = "pause-request"
PAUSED = "paused.json"
MAX_PAUSE_S = 3600.0


def find(target=None) -> tuple[str, dict]:
    """``(data dir, broker.json)`` of the running broker ``target`` names (see the module
    docstring); one line saying what to do when there is none."""
    if isinstance(target, BrokerHandle):
        data_dir = target.dir
    elif target is None:
        data_dir = default_dir()
    elif isinstance(target, str) and not os.path.isdir(target) and ":" in target:
        data_dir = _KNOWN.get(target) or _dir_of(target)
        if data_dir is None:
            raise BrokerUnreachable(f"no statekit broker known at {target}: pass its directory "
                                    f"(statekit.broker.pause(DIR, seconds)) or its handle")
    else:
        data_dir = str(target)
    data_dir = os.path.abspath(data_dir)
    info = running_info(data_dir)
    if info is None:
        raise BrokerUnreachable(f"no broker is running on {data_dir}: start it with "
                                f"`statekit broker start --dir {data_dir}`")
    return data_dir, info


def _dir_of(bootstrap: str):
    """The directory of a broker at ``bootstrap``: the default one, or a registered auth one."""
    for d in (default_dir(),):
        info = running_info(d)
        if info is not None and info.get("bootstrap") == bootstrap:
            return d
    try:
        from .process import _reg_path, _run_dir

        run = _run_dir()
        if run is not None:
            with open(_reg_path(run, bootstrap)) as f:
                return json.load(f).get("dir")
    except (OSError, ValueError, AttributeError):
        pass
    return None


def pause(target=None, seconds: float = 10.0, timeout: float = 10.0,
          mid_transaction: bool = False) -> dict:
    """Make the broker stop answering for ``seconds`` (see the module docstring). Returns once the
    pause has begun: ``{"dir", "bootstrap", "seconds", "since", "until"}`` (epoch seconds).
    ``mid_transaction``: the pause begins with the next produce request of a transaction (its
    records sent, its commit to come: what a transactional client then waits for is aborted by
    the client's next producer) and this returns once it is armed (``"armed": True``)."""
    try:
        seconds = float(seconds)
    except (TypeError, ValueError):
        seconds = -1.0
    if not 0 < seconds <= MAX_PAUSE_S:
        raise StatekitError(f"a pause lasts more than 0 and at most {MAX_PAUSE_S:.0f} seconds, "
                            f"got {seconds}")
    data_dir, info = find(target)
    token = uuid.uuid4().hex
    path = os.path.join(data_dir, PAUSE_REQUEST)
    with open(path + ".tmp", "w") as f:
        json.dump({"seconds": seconds, "token": token, "mid_transaction": bool(mid_transaction)}, f)
    os.replace(path + ".tmp", path)
    os.kill(int(info["pid"]), signal.SIGUSR2)   # (SIGUSR1 wakes the log cleaner)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with open(os.path.join(data_dir, PAUSED)) as f:
                ack = json.load(f)
            if ack.get("token") == token:
                return {"dir": data_dir, "bootstrap": info.get("bootstrap"), "seconds": seconds,
                        "since": ack.get("since"), "until": ack.get("until"),
                        "armed": bool(ack.get("armed"))}
        except (OSError, ValueError):
            pass
        time.sleep(0.02)
    raise BrokerUnreachable(f"the broker on {data_dir} did not take the pause within {timeout:.0f} s; "
                            f"see {data_dir}/broker.log")


def _cmdline_configs(pid: int) -> dict:
    """The ``--config K=V`` a running broker was started with (Linux: its command line)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            args = f.read().decode().split("\0")
    except OSError:
        return {}
    out = {}
    for a, b in zip(args, args[1:]):
        if a == "--config" and "=" in b:
            k, v = b.split("=", 1)
            out[k] = v
    return out


def restart(target=None, down: float = 0.0, kill: bool = True, timeout: float = 30.0,
            detach: bool | None = None) -> BrokerHandle:
    """Kill the broker (SIGKILL; ``kill=False``: a graceful stop), wait ``down`` seconds, and start
    a broker on the same directory, host, port, configs, auth and TLS. Returns its handle.
    ``detach``: whether the new broker runs apart (`statekit.lifeline`); by default as the old
    one did — a broker tied to a kernel is tied to the process that restarts it, so a restart
    from another process (the CLI) passes ``detach=True``."""
    if float(down) < 0:
        raise StatekitError(f"down must be >= 0 seconds, got {down}")
    data_dir, info = find(target)
    pid = int(info["pid"])
    configs = _cmdline_configs(pid)
    try:
        os.kill(pid, signal.SIGKILL if kill else signal.SIGTERM)
    except ProcessLookupError:
        pass
    deadline = time.monotonic() + timeout
    while pid_alive(pid):
        if time.monotonic() > deadline:
            raise StatekitError(f"the broker (pid {pid}) on {data_dir} did not exit within {timeout:.0f} s")
        time.sleep(0.02)
    if kill:
        try:
            os.unlink(info_path(data_dir))   # what a SIGKILL leaves behind
        except OSError:
            pass
    time.sleep(float(down))
    return start(data_dir, host=info.get("host") or "127.0.0.1", port=int(info["port"]),
                 configs=configs, auth=bool(info.get("auth")), tls=bool(info.get("tls")),
                 mtls=bool(info.get("mtls")), timeout=timeout,
                 detach=not info.get("tied") if detach is None else detach)
