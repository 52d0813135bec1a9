"""`python -m statekit.broker`: run the embedded broker in the foreground until SIGTERM/SIGINT."""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys

from statekit import lifeline
from statekit.child_server import port_arg, remove_own_info

from .auth import write_client_settings
from .process import default_dir, info_path, parse_configs, register_client_settings, unregister_client_settings
from .server import Broker, BrokerError, lock_dir
from .log import write_json_atomic


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m statekit.broker",
                                description="Run statekit's embedded Kafka-compatible broker in the foreground.")
    add_serve_args(p)
    return p


def add_serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dir", default=None, help="data directory (default: $STATEKIT_HOME/broker or ~/.statekit/broker)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=port_arg, default=9092, help="port to listen on; 0 picks a free one (default 9092)")
    p.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                   help="broker config, e.g. auto.create.topics.enable=true or log.cleaner.backoff.ms=500 (repeatable)")
    p.add_argument("--auto-create-topics", action="store_true",
                   help="create unknown topics on metadata/produce requests (auto.create.topics.enable=true)")
    p.add_argument("--auth", action="store_true",
                   help="require SASL (PLAIN or SCRAM-SHA-256) with credentials generated into DIR/credentials.json "
                        "(readable by you only); statekit's clients pick them up")
    p.add_argument("--tls", action="store_true",
                   help="listen with TLS only (SSL; SASL_SSL with --auth): a CA and certificates are made in "
                        "DIR/tls, DIR/client.properties names them; statekit's clients pick them up")
    p.add_argument("--mtls", action="store_true",
                   help="--tls, and require a client certificate signed by DIR/tls/ca.pem "
                        "(Kafka's ssl.client.auth=required); statekit's own is DIR/tls/client.pem")


def main(argv=None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=os.environ.get("STATEKIT_BROKER_LOG", "INFO"),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s", stream=sys.stderr)
    try:
        configs = parse_configs(args.config, args.auto_create_topics)
    except ValueError as e:
        print(f"statekit broker: {e}", file=sys.stderr)
        return 2
    data_dir = os.path.abspath(args.dir or default_dir())
    try:
        return asyncio.run(_run(data_dir, args.host, args.port, configs, args.auth, args.tls or args.mtls, args.mtls))
    except BrokerError as e:
        print(f"statekit broker: {e}", file=sys.stderr)
        return 2


async def _run(data_dir, host, port, configs, auth=False, tls=False, mtls=False) -> int:
    tied = lifeline.given()   # started by a process it is to end with (statekit.broker.start)
    lock_fd = lock_dir(data_dir)  # the directory is ours before its certificates and settings are written
    try:
        settings, listener = _secure(data_dir, host, auth, tls, mtls)
    except BaseException:
        os.close(lock_fd)
        raise
    users = {settings["sasl.username"]: settings["sasl.password"]} if auth else None
    broker = Broker(data_dir, host, port, configs, users=users, tls=listener, lock_fd=lock_fd)
    await broker.start()
    path = info_path(data_dir)
    bootstrap = f"{broker.advertised_host}:{broker.port}"
    write_json_atomic(path, {"pid": os.getpid(), "host": broker.advertised_host, "port": broker.port,
                             "bootstrap": bootstrap, "dir": data_dir, "auth": auth, "tls": tls, "mtls": mtls,
                             "tied": tied})
    if settings:
        register_client_settings(bootstrap, data_dir)
    protocol = settings.get("security.protocol", "PLAINTEXT")
    print(f"statekit broker listening on {bootstrap} ({protocol}{', client certificates required' if mtls else ''}; "
          f"data in {data_dir})", file=sys.stderr, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    loop.add_signal_handler(signal.SIGUSR1, broker.cleaner.wake)   # request_clean: a pass now
    if tied:
        lifeline.watch_parent(lambda: _stop_soon(loop, stop))
    try:
        await stop.wait()
    finally:
        remove_own_info(path)
        if settings:
            unregister_client_settings(bootstrap)
        await broker.stop()
    return 0


def _secure(data_dir, host, auth, tls, mtls):
    """(client settings, TLS listener or None): the settings that reach the broker, written to
    DIR/credentials.json and DIR/client.properties ({} for a plaintext broker without SASL)."""
    if not (auth or tls):
        return {}, None
    ssl_settings = listener = None
    if tls:
        from . import tls as tls_mod

        advertised = host if host not in tls_mod.WILDCARD_HOSTS else "127.0.0.1"
        names = tls_mod.broker_names(host, advertised)
        try:
            files = tls_mod.ensure_files(data_dir, names)
            listener = tls_mod.listener(files, names, require_client_cert=mtls)
        except tls_mod.TlsError as e:
            raise BrokerError(str(e)) from None
        problem = tls_mod.certificate_problem(files, advertised)
        if problem:
            logging.getLogger("statekit.broker").warning("%s: clients will refuse it", problem)
        ssl_settings = files.client_settings(client_cert=mtls)
    try:
        return write_client_settings(data_dir, auth, ssl_settings), listener
    except OSError as e:
        raise BrokerError(f"cannot write the client settings in {data_dir} ({e.strerror}): pass a writable --dir") from None


def _stop_soon(loop, stop: asyncio.Event) -> None:
    """The process that started the broker is gone: stop as on SIGTERM, and for sure within 20 s."""
    import threading

    t = threading.Timer(20.0, os._exit, args=(0,))
    t.daemon = True
    t.start()
    loop.call_soon_threadsafe(stop.set)


if __name__ == "__main__":
    sys.exit(main())
