"""`python -m statekit.registry`: run the embedded Schema Registry in the foreground until SIGTERM/SIGINT."""
from __future__ import annotations

import argparse
import errno
import fcntl
import json
import logging
import os
import signal
import sys
import threading

from statekit import lifeline
from statekit.child_server import port_arg, remove_own_info

from .process import default_dir, ensure_credentials, info_path

IDLE_POLL_S = 5.0


def add_serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dir", default=None,
                   help="data directory (default: the embedded broker's, $STATEKIT_HOME/broker)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=port_arg, default=8081, help="port to listen on; 0 picks a free one (default 8081)")
    p.add_argument("--auth", action="store_true",
                   help="require HTTP basic auth with credentials generated into DIR/registry-credentials.json")
    p.add_argument("--tls", action="store_true",
                   help="serve HTTPS with the certificate of the broker's TLS listener in DIR/tls "
                        "(made there, with its CA, when missing); clients trust DIR/tls/ca.pem")


def _skip_slow_imports() -> None:
    """jsonschema imports rfc3987_syntax when it is installed (jupyterlab's jsonschema extras bring
    it): building its grammar costs seconds of CPU, for IRI `format` checks a registry never uses."""
    sys.modules.setdefault("rfc3987_syntax", None)


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m statekit.registry",
                                description="Run statekit's embedded Schema Registry in the foreground.")
    add_serve_args(p)
    args = p.parse_args(argv)
    logging.basicConfig(level=os.environ.get("STATEKIT_REGISTRY_LOG", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    data_dir = os.path.abspath(args.dir or default_dir())
    try:
        os.makedirs(data_dir, exist_ok=True)
        lock_fd = os.open(os.path.join(data_dir, "registry.lock"), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        print(f"statekit registry: the directory {data_dir} is not writable ({e.strerror}): pass another --dir",
              file=sys.stderr)
        return 2
    try:
        fcntl.flock(lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        print(f"statekit registry: another registry already runs on {data_dir}", file=sys.stderr)
        return 2
    _skip_slow_imports()
    from .api import RegistryServer
    from .store import SchemaStore

    users = None
    if args.auth:
        creds = ensure_credentials(data_dir)
        users = {creds["username"]: creds["password"]}
    try:
        store = SchemaStore(data_dir)
    except (OSError, ValueError, KeyError) as e:
        print(f"statekit registry: cannot read {data_dir}/_schemas.jsonl ({e}); move it away to start empty",
              file=sys.stderr)
        return 2
    ctx, ca = None, None
    if args.tls:
        from statekit.broker import tls as tls_mod

        try:
            files = tls_mod.ensure_files(data_dir, tls_mod.broker_names(args.host, args.host))
            ctx = tls_mod.server_context(files, require_client_cert=False)
        except (tls_mod.TlsError, OSError) as e:
            print(f"statekit registry: {e}", file=sys.stderr)
            return 2
        ca = files.ca
    try:
        server = RegistryServer(store, args.host, args.port, users, ssl_context=ctx)
    except OSError as e:
        why = "already in use" if e.errno == errno.EADDRINUSE else e.strerror
        print(f"statekit registry: cannot listen on {args.host}:{args.port} ({why}): pick another --port "
              f"(0 picks a free one)", file=sys.stderr)
        return 2
    host, port = server.server_address[:2]
    url = f"{'https' if ctx else 'http'}://{host}:{port}"
    path = info_path(data_dir)
    with open(path + ".tmp", "w") as f:
        json.dump({"pid": os.getpid(), "host": host, "port": port, "url": url, "dir": data_dir,
                   "auth": users is not None, "tls": ctx is not None, "ca": ca}, f)
    os.replace(path + ".tmp", path)
    print(f"statekit registry listening on {url} (data in {data_dir}{', basic auth required' if users else ''}"
          f"{f', clients trust {ca}' if ca else ''})",
          file=sys.stderr, flush=True)
    stopping = threading.Event()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: stopping.set())
    if lifeline.given():   # started by a process it is to end with (statekit.registry.start)
        lifeline.watch_parent(stopping.set)
    # an idle registry wakes every IDLE_POLL_S (a signal or the lifeline wakes it at once)
    thread = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": IDLE_POLL_S},
                              daemon=True)
    thread.start()
    try:
        while not stopping.wait(IDLE_POLL_S):
            pass
    finally:
        remove_own_info(path)
        server.stop_serving()
        server.server_close()
        store.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
