"""Running the registry as a child process: its command line, its handle, found running via
``DIR/registry.json``. The lifecycle is the embedded broker's (``statekit.child_server``): a second
``start`` on a directory whose registry is alive returns a handle to it that does not own it.

Its data directory is the embedded broker's by default (``$STATEKIT_HOME/broker``): the schemas
and their ids live and go with the topics whose records carry those ids (``%statekit up --fresh``
deletes both)."""
from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys

from statekit.child_server import ChildServer, ensure_writable
from statekit.contracts import default_broker_dir
from statekit.errors import StatekitError

CREDENTIALS_NAME = "registry-credentials.json"


def default_dir() -> str:
    """The registry's data directory without ``dir``: the embedded broker's, ``$STATEKIT_HOME/broker``."""
    return default_broker_dir()


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


class RegistryHandle(ChildServer):
    """A running registry. ``.url``; ``.client_config`` is what confluent-kafka's
    ``SchemaRegistryClient`` takes (with ``basic.auth.user.info`` when it requires auth);
    ``.stop()`` stops it only if this handle started it (or ``force=True``)."""

    NAME, TITLE = "registry", "schema registry"
    INFO_NAME = "registry.json"

    def __init__(self, data_dir: str, info: dict, owned: bool, proc: subprocess.Popen | None = None):
        super().__init__(data_dir, info, owned, proc)
        self.url = info["url"]
        self.auth = bool(info.get("auth"))
        self.tls = bool(info.get("tls"))
        self.ca = info.get("ca")  # the CA that signed its certificate, with tls

    def __repr__(self):
        return (f"RegistryHandle(url={self.url!r}, dir={self.dir!r}, pid={self.pid}, owned={self.owned}"
                f"{', auth=True' if self.auth else ''}{', tls=True' if self.tls else ''})")

    @staticmethod
    def answers(info: dict) -> bool:
        import ssl
        import urllib.error
        import urllib.request

        url, ca = info.get("url", ""), info.get("ca")
        context = ssl.create_default_context(cafile=ca) if url.startswith("https:") else None
        try:
            with urllib.request.urlopen(url + "/schemas/types", timeout=1.0, context=context):
                return True
        except urllib.error.HTTPError:
            return True  # it answered (401 with auth on)
        except (OSError, ValueError):
            return False

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


info_path = RegistryHandle.info_path
running_info = RegistryHandle.running_info   # registry.json of a live registry on a directory, else None


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
    ensure_writable(data_dir, "registry")
    cmd = [sys.executable, "-m", "statekit.registry", "--dir", data_dir, "--host", host, "--port", str(port)]
    if auth:
        cmd.append("--auth")
    if tls:
        cmd.append("--tls")
    return RegistryHandle.spawn(data_dir, cmd, timeout, detach)


def stop(dir: str | None = None, grace: float = 10.0) -> bool:
    """Stop the registry running on dir; False if none was running."""
    return RegistryHandle.stop_running(os.path.abspath(dir or default_dir()), grace)
