"""Running the broker as a child process: its command line, its handle, found running via
`DIR/broker.json` (the lifecycle it shares with the schema registry is `statekit.child_server`'s);
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
import socket
import subprocess
import sys

from statekit.child_server import ChildServer, ensure_writable, pid_alive, remove_stale_info
from statekit.contracts import default_broker_dir
from statekit.errors import StatekitError


def default_dir() -> str:
    """The data directory of ``statekit.broker.start()`` without ``dir``: ``$STATEKIT_HOME/broker``."""
    return default_broker_dir()


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


class BrokerHandle(ChildServer):
    """A running broker. `.stop()` stops it only if this handle started it (or force=True)."""

    NAME = TITLE = "broker"
    INFO_NAME = "broker.json"

    def __init__(self, data_dir: str, info: dict, owned: bool, proc: subprocess.Popen | None = None):
        super().__init__(data_dir, info, owned, proc)
        self.bootstrap = info.get("bootstrap") or f"{self.host}:{self.port}"
        self.auth = bool(info.get("auth"))
        self.tls = bool(info.get("tls"))
        self.mtls = bool(info.get("mtls"))
        self.tied = bool(info.get("tied"))   # it stops when the process that started it ends
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

    @staticmethod
    def answers(info: dict) -> bool:
        try:
            with socket.create_connection((info.get("host", "127.0.0.1"), int(info.get("port", 0))), timeout=0.5):
                return True
        except OSError:
            return False

    @property
    def credentials(self) -> dict | None:
        """The client settings of a broker started with auth or TLS (security.protocol; with auth
        sasl.mechanism, sasl.username, sasl.password; with TLS ssl.ca.location,
        ssl.endpoint.identification.algorithm, and with mTLS ssl.certificate.location and
        ssl.key.location), else None."""
        from .auth import read_credentials

        return read_credentials(self.dir) if self.auth or self.tls else None


info_path = BrokerHandle.info_path
running_info = BrokerHandle.running_info   # broker.json of a live broker on a directory, else None


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
    ensure_writable(data_dir, "broker")
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
    remove_stale_info(info_path(data_dir))
    return BrokerHandle.spawn(data_dir, cmd, timeout, detach)


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
    return BrokerHandle.stop_running(os.path.abspath(dir or default_dir()), grace)
