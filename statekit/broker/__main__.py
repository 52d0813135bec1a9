"""`python -m statekit.broker`: run the embedded broker in the foreground until SIGTERM/SIGINT."""
from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys

from .auth import ensure_credentials
from .process import default_dir, info_path, parse_configs, register_auth_broker, unregister_auth_broker
from .server import Broker, BrokerError
from .log import write_json_atomic


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m statekit.broker",
                                description="Run statekit's embedded Kafka-compatible broker in the foreground.")
    add_serve_args(p)
    return p


def _port(text: str) -> int:
    try:
        n = int(text)
    except ValueError:
        n = -1
    if not 0 <= n <= 65535:
        raise argparse.ArgumentTypeError(f"{text!r} is not a port: use 0..65535 (0 picks a free one)")
    return n


def add_serve_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--dir", default=None, help="data directory (default: $STATEKIT_HOME/broker or ~/.statekit/broker)")
    p.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1)")
    p.add_argument("--port", type=_port, default=9092, help="port to listen on; 0 picks a free one (default 9092)")
    p.add_argument("--config", action="append", default=[], metavar="KEY=VALUE",
                   help="broker config, e.g. auto.create.topics.enable=true or log.cleaner.backoff.ms=500 (repeatable)")
    p.add_argument("--auto-create-topics", action="store_true",
                   help="create unknown topics on metadata/produce requests (auto.create.topics.enable=true)")
    p.add_argument("--auth", action="store_true",
                   help="require SASL (PLAIN or SCRAM-SHA-256) with credentials generated into DIR/credentials.json "
                        "(readable by you only); statekit's clients pick them up")


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
    users = None
    if args.auth:
        try:
            creds = ensure_credentials(data_dir)
        except OSError as e:
            print(f"statekit broker: cannot write the credentials file in {data_dir} ({e.strerror}): "
                  f"pass a writable --dir", file=sys.stderr)
            return 2
        users = {creds["sasl.username"]: creds["sasl.password"]}
    try:
        return asyncio.run(_run(data_dir, args.host, args.port, configs, users))
    except BrokerError as e:
        print(f"statekit broker: {e}", file=sys.stderr)
        return 2


async def _run(data_dir, host, port, configs, users=None) -> int:
    broker = Broker(data_dir, host, port, configs, users=users)
    await broker.start()
    path = info_path(data_dir)
    bootstrap = f"{broker.advertised_host}:{broker.port}"
    write_json_atomic(path, {"pid": os.getpid(), "host": broker.advertised_host, "port": broker.port,
                             "bootstrap": bootstrap, "dir": data_dir, "auth": users is not None})
    if users is not None:
        register_auth_broker(bootstrap, data_dir)
    print(f"statekit broker listening on {bootstrap} (data in {data_dir}"
          f"{', SASL required' if users else ''})", file=sys.stderr, flush=True)
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    try:
        await stop.wait()
    finally:
        try:
            import json

            with open(path) as f:
                if json.load(f).get("pid") == os.getpid():
                    os.unlink(path)
        except (OSError, ValueError):
            pass
        if users is not None:
            unregister_auth_broker(bootstrap)
        await broker.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
