"""Running the registry as a child process: spawn, find a running one via ``DIR/registry.json``,
stop. The same lifecycle as the embedded broker's (``statekit.broker.process``): a second ``start``
on a directory whose registry is alive returns a handle to it that does not own it.

Its data directory is the embedded broker's by default (``$STATEKIT_HOME/broker``): the schemas
and their ids live and go with the topics whose records carry those ids (``%statekit up --fresh``
deletes both)."""
from __future__ import annotations

import json
import os
import secrets
import signal
import subprocess
import sys
import threading
import time

from statekit import lifeline
from statekit.broker.process import pid_alive
from statekit.contracts import default_broker_dir
from statekit.errors import BrokerUnreachable, StatekitError

INFO_NAME = "registry.json"
CREDENTIALS_NAME = "registry-credentials.json"


def default_dir() -> str:
    """The registry's data directory without ``dir``: the embedded broker's, ``$STATEKIT_HOME/broker``."""
    return default_broker_dir()


def info_path(data_dir: str) -> str:
    return os.path.join(data_dir, INFO_NAME)


def _answers(url: str, ca: str | None = None, timeout: float = 1.0) -> bool:
    import ssl
    import urllib.error
    import urllib.request

    context = ssl.create_default_context(cafile=ca) if url.startswith("https:") else None
    try:
        with urllib.request.urlopen(url + "/schemas/types", timeout=timeout, context=context):
            return True
    except urllib.error.HTTPError:
        return True  # it answered (401 with auth on)
    except (OSError, ValueError):
        return False


def running_info(data_dir: str) -> dict | None:
    """registry.json of a live registry on data_dir, else None."""
    try:
        with open(info_path(data_dir)) as f:
            info = json.load(f)
    except (OSError, ValueError):
        return None
    if (not isinstance(info, dict) or not pid_alive(int(info.get("pid", -1)))
            or not _answers(info.get("url", ""), info.get("ca"))):
        return None
    return info


def ensure_credentials(data_dir: str) -> dict:
    """``{"username", "password"}`` for basic auth, generated once into DIR/registry-credentials.json (0600)."""
    path = os.path.join(data_dir, CREDENTIALS_NAME)
    try:
        with open(path) as f:
            return json.load(f)
    except (OSError, ValueError):
        pass
    creds = {"username": "statekit", "password": secrets.token_urlsafe(24)}
    fd = os.open(path + ".tmp", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(creds, f)
    os.replace(path + ".tmp", path)
    return creds


class RegistryHandle:
    """A running registry. ``.url``; ``.client_config`` is what confluent-kafka's
    ``SchemaRegistryClient`` takes (with ``basic.auth.user.info`` when it requires auth);
    ``.stop()`` stops it only if this handle started it (or ``force=True``)."""

    def __init__(self, data_dir: str, info: dict, owned: bool, proc: subprocess.Popen | None = None):
        self.dir = data_dir
        self.url = info["url"]
        self.host, self.port, self.pid = info["host"], int(info["port"]), int(info["pid"])
        self.auth = bool(info.get("auth"))
        self.tls = bool(info.get("tls"))
        self.ca = info.get("ca")  # the CA that signed its certificate, with tls
        self.owned = owned
        self._proc = proc

    def __repr__(self):
        return (f"RegistryHandle(url={self.url!r}, dir={self.dir!r}, pid={self.pid}, owned={self.owned}"
                f"{', auth=True' if self.auth else ''}{', tls=True' if self.tls else ''})")

    @property
    def credentials(self) -> str | None:
        """``user:password`` of a registry started with auth, else None."""
        if not self.auth:
            return None
        creds = ensure_credentials(self.dir)
        return f"{creds['username']}:{creds['password']}"

    @property
    def client_config(self) -> dict:
        conf = {"url": self.url}
        if self.auth:
            conf["basic.auth.user.info"] = self.credentials
        if self.tls and self.ca:
            conf["ssl.ca.location"] = self.ca
        return conf

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
        """SIGKILL: a crash, as far as the registry's files know."""
        try:
            os.kill(self.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self._wait_exit(10.0)


def start(dir: str | None = None, host: str = "127.0.0.1", port: int = 0, timeout: float = 30.0,
          detach: bool = False, auth: bool = False, tls: bool = False) -> RegistryHandle:
    """Start a registry on dir (or return a handle to the one already running there, as it runs).
    ``auth=True`` requires HTTP basic auth with credentials generated into
    ``DIR/registry-credentials.json`` (0600). ``tls=True`` serves HTTPS with the certificate of the
    broker's TLS listener in ``DIR/tls`` (``client_config`` then names its CA). It stops when this process ends
    (`statekit.lifeline`), unless ``detach`` (`statekit registry start`)."""
    data_dir = os.path.abspath(dir or default_dir())
    info = running_info(data_dir)
    if info is not None:
        if auth and not info.get("auth"):
            import logging

            logging.getLogger("statekit.registry").warning(
                "the registry already running on %s does not require authentication; stop it and start it "
                "again with auth=True to require it", data_dir)
        if tls and not info.get("tls"):
            raise StatekitError(f"the schema registry running on {data_dir} ({info['url']}) serves plain "
                                f"HTTP: stop it (statekit registry stop --dir {data_dir}) and start it with TLS")
        return RegistryHandle(data_dir, info, owned=False)
    try:
        os.makedirs(data_dir, exist_ok=True)
        probe = os.path.join(data_dir, f".write-test-{os.getpid()}-{threading.get_ident()}")
        with open(probe, "w"):
            pass
        os.unlink(probe)
    except OSError as e:
        raise StatekitError(f"the registry directory {data_dir} is not writable ({e.strerror}): pass another dir") from None
    cmd = [sys.executable, "-m", "statekit.registry", "--dir", data_dir, "--host", host, "--port", str(port)]
    if auth:
        cmd.append("--auth")
    if tls:
        cmd.append("--tls")
    log_path = os.path.join(data_dir, "registry.log")
    with open(log_path, "ab") as logf:
        start_pos = logf.tell()
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=logf, stderr=logf,
                                start_new_session=True, close_fds=True,
                                **({} if detach else lifeline.child_options()))
    deadline = time.monotonic() + timeout
    while True:
        code = proc.poll()
        if code is not None:
            err = _last_error(log_path, start_pos) or f"the registry exited with code {code}; see {log_path}"
            if "another registry already runs" in err:
                while time.monotonic() < deadline:  # a concurrent start() won the directory
                    other = running_info(data_dir)
                    if other is not None:
                        return RegistryHandle(data_dir, other, owned=False)
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
            raise BrokerUnreachable(f"the schema registry did not start within {timeout:.0f}s; see {log_path}")
        time.sleep(0.02)
    return RegistryHandle(data_dir, info, owned=True, proc=None if detach else proc)


def _last_error(log_path: str, start_pos: int) -> str | None:
    try:
        with open(log_path, "rb") as f:
            f.seek(start_pos)
            lines = [ln.strip() for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
    except OSError:
        return None
    for ln in reversed(lines):
        if ln.startswith("statekit registry:"):
            return ln[len("statekit registry:"):].strip()
    return lines[-1] if lines else None


def stop(dir: str | None = None, grace: float = 10.0) -> bool:
    """Stop the registry running on dir; False if none was running."""
    data_dir = os.path.abspath(dir or default_dir())
    info = running_info(data_dir)
    if info is None:
        return False
    RegistryHandle(data_dir, info, owned=True).stop(grace=grace)
    return True
