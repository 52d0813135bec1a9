"""Running the broker as a child process: spawn, find a running one via `DIR/broker.json`, stop;
and finding the client settings of a broker started with `auth=True` or `tls=True` from its
bootstrap address.

A separate process makes `kill -9` real for crash demos and keeps the broker's work off the
notebook's GIL.

Client settings lookup (`credentials_for(bootstrap)`), for statekit's own clients: a broker
started with auth or TLS registers `bootstrap -> data dir` in a per-user directory
(`$TMPDIR/statekit-<uid>/`, mode 0700, ours only) while it runs, so any process of the user
(Spark's Python workers too) finds `DIR/credentials.json` (SASL credentials, the CA to trust, the
client certificate); brokers started or reused by this process and the default directory are
looked at first.
"""
from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time

from statekit import lifeline
from statekit.contracts import default_broker_dir
from statekit.errors import BrokerUnreachable, StatekitError


def default_dir() -> str:
    """The data directory of ``statekit.broker.start()`` without ``dir``: ``$STATEKIT_HOME/broker``."""
    return default_broker_dir()


def info_path(data_dir: str) -> str:
    return os.path.join(data_dir, "broker.json")


def parse_configs(items, auto_create: bool = False) -> dict:
    out = {}
    for item in items or []:
        if "=" not in item:
            raise ValueError(f"--config expects KEY=VALUE, got {item!r}")
        k, v = item.split("=", 1)
        out[k.strip()] = v.strip()
    if auto_create:
        out["auto.create.topics.enable"] = "true"
    from .config import ConfigError, validate_broker_configs

    try:
        return validate_broker_configs(out)
    except ConfigError as e:
        raise ValueError(str(e)) from None


def pid_alive(pid: int) -> bool:
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


def _listening(host: str, port: int, timeout: float = 0.5) -> bool:
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return True
    except OSError:
        return False


def running_info(data_dir: str) -> dict | None:
    """broker.json of a live broker on data_dir, else None."""
    try:
        with open(info_path(data_dir)) as f:
            info = json.load(f)
    except (OSError, ValueError):
        return None
    if not isinstance(info, dict) or not pid_alive(int(info.get("pid", -1))):
        return None
    if not _listening(info.get("host", "127.0.0.1"), int(info.get("port", 0))):
        return None
    return info


class BrokerHandle:
    """A running broker. `.stop()` stops it only if this handle started it (or force=True)."""

    def __init__(self, data_dir: str, info: dict, owned: bool, proc: subprocess.Popen | None = None):
        self.dir = data_dir
        self.host = info["host"]
        self.port = int(info["port"])
        self.pid = int(info["pid"])
        self.bootstrap = info.get("bootstrap") or f"{self.host}:{self.port}"
        self.auth = bool(info.get("auth"))
        self.tls = bool(info.get("tls"))
        self.mtls = bool(info.get("mtls"))
        self.tied = bool(info.get("tied"))   # it stops when the process that started it ends
        self.owned = owned
        self._proc = proc
        _KNOWN[self.bootstrap] = data_dir

    def __repr__(self):
        return (f"BrokerHandle(bootstrap={self.bootstrap!r}, dir={self.dir!r}, pid={self.pid}, owned={self.owned}"
                f"{', auth=True' if self.auth else ''}{', tls=True' if self.tls else ''}"
                f"{', mtls=True' if self.mtls else ''})")

    @property
    def security(self) -> str:
        """How clients reach the broker, in words ("" for plaintext without SASL)."""
        parts = [("TLS with client certificates" if self.mtls else "TLS")] if self.tls else []
        return ", ".join(parts + (["SASL authentication required"] if self.auth else []))

    def require(self, tls: bool = False, mtls: bool = False) -> "BrokerHandle":
        """This handle if the broker listens with the TLS asked for (a reused one may not); else a
        one-line StatekitError that says how to restart it."""
        lacks = "TLS" if (tls or mtls) and not self.tls else "client certificates" if mtls and not self.mtls else ""
        if lacks:
            raise StatekitError(f"the broker running on {self.dir} (pid {self.pid}) runs without {lacks}: stop it "
                                f"(`%statekit down` in the kernel that started it, or `statekit broker stop --dir "
                                f"{self.dir}`), then start it with --{'mtls' if mtls else 'tls'}")
        return self

    @property
    def credentials(self) -> dict | None:
        """The client settings of a broker started with auth or TLS (security.protocol; with auth
        sasl.mechanism, sasl.username, sasl.password; with TLS ssl.ca.location,
        ssl.endpoint.identification.algorithm, and with mTLS ssl.certificate.location and
        ssl.key.location), else None."""
        from .auth import read_credentials

        return read_credentials(self.dir) if self.auth or self.tls else None

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
        """SIGTERM, then SIGKILL after `grace` seconds."""
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
        """SIGKILL: a crash, as far as the broker's files know."""
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._wait_exit(10.0)


def start(dir: str | None = None, host: str = "127.0.0.1", port: int = 0, configs: dict | None = None,
          timeout: float = 30.0, detach: bool = False, auth: bool = False, tls: bool = False,
          mtls: bool = False) -> BrokerHandle:
    """Start a broker on dir (or return a handle to the one already running there, as it runs).
    ``auth=True`` requires SASL with credentials generated into ``DIR/credentials.json`` (0600);
    ``tls=True`` listens with TLS only (certificates in ``DIR/tls``); ``mtls=True`` (implies
    ``tls``) requires client certificates too.

    The broker stops when this process ends (`statekit.lifeline`: a notebook kernel restarted
    without `%statekit down` leaves none behind), unless ``detach``: then it runs apart until
    stopped (`statekit broker start`)."""
    data_dir = os.path.abspath(dir or default_dir())
    tls = tls or mtls
    info = running_info(data_dir)
    if info is not None:
        for wanted, key, what in ((auth, "auth", "require authentication"), (tls, "tls", "listen with TLS"),
                                  (mtls, "mtls", "require client certificates")):
            if wanted and not info.get(key):
                import logging

                logging.getLogger("statekit.broker").warning(
                    "the broker already running on %s does not %s; stop it and start it again with %s=True",
                    data_dir, what, key)
        return BrokerHandle(data_dir, info, owned=False)
    try:
        os.makedirs(data_dir, exist_ok=True)
        probe = os.path.join(data_dir, f".write-test-{os.getpid()}-{threading.get_ident()}")
        with open(probe, "w"):
            pass
        os.unlink(probe)
    except OSError as e:
        raise StatekitError(f"the broker directory {data_dir} is not writable ({e.strerror}): pass another dir") from None
    try:
        configs = parse_configs([f"{k}={v}" for k, v in (configs or {}).items()])
    except ValueError as e:
        raise StatekitError(f"bad broker config: {e}") from None
    cmd = [sys.executable, "-m", "statekit.broker", "--dir", data_dir, "--host", host, "--port", str(port)]
    for k, v in configs.items():
        cmd += ["--config", f"{k}={v}"]
    if auth:
        cmd.append("--auth")
    if tls:
        cmd.append("--mtls" if mtls else "--tls")
    log_path = os.path.join(data_dir, "broker.log")
    _remove_stale_info(data_dir)
    tie = {} if detach else lifeline.child_options()
    with open(log_path, "ab") as logf:
        start_pos = logf.tell()
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf,
                                start_new_session=True, close_fds=True, **tie)
    deadline = time.monotonic() + timeout
    while True:
        code = proc.poll()
        if code is not None:
            err = _last_error(log_path, start_pos) or f"the broker exited with code {code}; see {log_path}"
            if "another broker already runs" in err:
                # a concurrent start() won the directory lock: hand out that broker instead
                while time.monotonic() < deadline:
                    other = running_info(data_dir)
                    if other is not None:
                        return BrokerHandle(data_dir, other, owned=False)
                    time.sleep(0.05)
            raise StatekitError(err)
        try:
            with open(info_path(data_dir)) as f:
                info = json.load(f)
            if info.get("pid") == proc.pid:
                break
        except (OSError, ValueError):
            pass
        if time.monotonic() > deadline:
            proc.kill()
            proc.wait()
            raise BrokerUnreachable(f"the broker did not start within {timeout:.0f}s; see {log_path}")
        time.sleep(0.02)
    return BrokerHandle(data_dir, info, owned=True, proc=None if detach else proc)


def _remove_stale_info(data_dir: str) -> None:
    """broker.json of a dead broker (kill -9 leaves it behind); a live one's is left alone."""
    path = info_path(data_dir)
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


def _last_error(log_path: str, start_pos: int) -> str | None:
    try:
        with open(log_path, "rb") as f:
            f.seek(start_pos)
            lines = [ln.strip() for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return None
    for ln in reversed(lines):
        if ln.startswith("statekit broker:"):
            return ln[len("statekit broker:"):].strip()
    return lines[-1] if lines else None


# ---------------------------------------------------------------------------------------------
# client settings of brokers started with auth or TLS, found by bootstrap address
_KNOWN: dict[str, str] = {}  # bootstrap -> data dir, for brokers this process started or reused


def _run_dir(create: bool = False) -> str | None:
    """The per-user registry directory, or None when it is not safely ours (0700, our uid)."""
    import tempfile

    path = os.path.join(tempfile.gettempdir(), f"statekit-{os.getuid()}")
    if create:
        try:
            os.mkdir(path, 0o700)
        except FileExistsError:
            pass
        except OSError:
            return None
    try:
        st = os.lstat(path)
    except OSError:
        return None
    import stat

    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        return None
    return path


def _reg_path(run_dir: str, bootstrap: str) -> str:
    return os.path.join(run_dir, "broker-" + bootstrap.replace(":", "_").replace("/", "_") + ".json")


def register_client_settings(bootstrap: str, data_dir: str) -> None:
    run_dir = _run_dir(create=True)
    if run_dir is None:
        return
    from .log import write_json_atomic

    try:
        write_json_atomic(_reg_path(run_dir, bootstrap), {"dir": data_dir, "pid": os.getpid()}, durable=False)
    except OSError:
        pass


def unregister_client_settings(bootstrap: str) -> None:
    run_dir = _run_dir()
    if run_dir is not None:
        try:
            os.unlink(_reg_path(run_dir, bootstrap))
        except OSError:
            pass


def credentials_for(bootstrap: str) -> dict | None:
    """Client security settings for a statekit broker started with auth or TLS at ``bootstrap``
    (the contents of its DIR/credentials.json), else None."""
    from .auth import read_credentials

    host, _, port = bootstrap.strip().rpartition(":")
    names = [bootstrap.strip()]
    if host in ("localhost", "127.0.0.1", "[::1]", "::1"):  # the broker advertises 127.0.0.1
        names += [f"{h}:{port}" for h in ("127.0.0.1", "localhost") if h != host]
    dirs = [_KNOWN[n] for n in names if n in _KNOWN]
    dirs.append(default_dir())
    run_dir = _run_dir()
    if run_dir is not None:
        for n in names:
            try:
                with open(_reg_path(run_dir, n)) as f:
                    dirs.append(json.load(f)["dir"])
            except (OSError, ValueError, KeyError, TypeError):
                pass
    for d in dirs:
        try:
            with open(info_path(d)) as f:
                info = json.load(f)
        except (OSError, ValueError):
            continue
        if isinstance(info, dict) and info.get("bootstrap") in names and (info.get("auth") or info.get("tls")) \
                and pid_alive(int(info.get("pid", -1))):
            return read_credentials(d)
    return None


def stop(dir: str | None = None, grace: float = 10.0) -> bool:
    """Stop the broker running on dir; False if none was running."""
    data_dir = os.path.abspath(dir or default_dir())
    info = running_info(data_dir)
    if info is None:
        return False
    BrokerHandle(data_dir, info, owned=True).stop(grace=grace)
    return True
