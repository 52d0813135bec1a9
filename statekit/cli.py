"""The `statekit` command. Each subcommand group registers itself in `build_parser`."""
from __future__ import annotations

import argparse
import json
import os
import sys

from statekit.errors import StatekitError


def _add_broker(sub) -> None:
    from statekit.broker.__main__ import add_serve_args

    p = sub.add_parser("broker", help="the embedded Kafka-compatible broker",
                       description="Start, inspect and stop statekit's embedded Kafka-compatible broker.")
    bsub = p.add_subparsers(dest="broker_cmd", metavar="{start,status,stop,run,stats,clean,pause,restart}")
    bsub.required = True

    s = bsub.add_parser("start", help="start a broker in the background (or reuse the one running on --dir)")
    add_serve_args(s)
    s.set_defaults(func=_broker_start)

    r = bsub.add_parser("run", help="run a broker in the foreground (Ctrl-C stops it)")
    add_serve_args(r)
    r.set_defaults(func=_broker_run)

    for name, fn, text in (("status", _broker_status, "say whether a broker runs on --dir, and where"),
                           ("stop", _broker_stop, "stop the broker running on --dir"),
                           ("stats", _broker_stats, "per-partition log statistics (segments, offsets, cleaner)"),
                           ("clean", _broker_clean, "run a log cleaner pass now and print the stats")):
        q = bsub.add_parser(name, help=text)
        q.add_argument("--dir", default=None, help="data directory (default: $STATEKIT_HOME/broker)")
        if name in ("stats", "clean"):
            q.add_argument("--topic", default=None)
            q.add_argument("--json", action="store_true", help="print JSON")
        q.set_defaults(func=fn)
    q = bsub.add_parser("pause", help="stop answering for SECONDS (connections stay open: a stall)")
    q.add_argument("seconds", type=float)
    q.add_argument("--dir", default=None, help="data directory (default: $STATEKIT_HOME/broker)")
    q.set_defaults(func=_broker_pause)
    q = bsub.add_parser("restart", help="kill -9 the broker and start it again on the same dir and port")
    q.add_argument("--down", type=float, default=0.0, help="seconds between the kill and the start")
    q.add_argument("--dir", default=None, help="data directory (default: $STATEKIT_HOME/broker)")
    q.set_defaults(func=_broker_restart)


def _broker_pause(args) -> int:
    from statekit import broker

    r = broker.pause(args.dir, args.seconds)
    print(f"the broker on {r['dir']} stops answering for {r['seconds']:g} s")
    return 0


def _broker_restart(args) -> int:
    from statekit import broker

    h = broker.restart(args.dir, down=args.down, detach=True)   # (this process ends now)
    print(f"restarted the broker on {h.dir}: {h.bootstrap} (pid {h.pid})")
    return 0


def _broker_start(args) -> int:
    from statekit import broker
    from statekit.broker.process import parse_configs

    try:
        configs = parse_configs(args.config, args.auto_create_topics)
    except ValueError as e:
        raise StatekitError(str(e)) from None
    h = broker.start(dir=args.dir, host=args.host, port=args.port, configs=configs, detach=True, auth=args.auth,
                     tls=args.tls, mtls=args.mtls)
    if not h.owned:
        print(f"statekit broker already running on {h.dir} (pid {h.pid}); reusing it", file=sys.stderr)
    if h.auth or h.tls:
        props = os.path.join(h.dir, "client.properties")
        print(f"{_security(h.auth, h.tls, h.mtls)}; client settings in {props} (e.g. kcat -F {props} -L)",
              file=sys.stderr)
    print(h.bootstrap)
    return 0


def _broker_run(args) -> int:
    from statekit.broker.__main__ import main as run_main

    argv = ["--host", args.host, "--port", str(args.port)]
    if args.dir:
        argv += ["--dir", args.dir]
    for c in args.config:
        argv += ["--config", c]
    if args.auto_create_topics:
        argv.append("--auto-create-topics")
    for flag in ("auth", "tls", "mtls"):
        if getattr(args, flag):
            argv.append(f"--{flag}")
    return run_main(argv)


def _security(auth: bool, tls: bool, mtls: bool) -> str:
    """How clients reach a broker, in a few words."""
    what = {(True, False): "SASL required", (False, True): "TLS", (True, True): "TLS and SASL required"}[(auth, tls)]
    return what + (", client certificates required" if mtls else "")


def _dir(args) -> str:
    from statekit.broker import default_dir

    return os.path.abspath(args.dir or default_dir())


def _broker_status(args) -> int:
    from statekit import broker

    info = broker.status(args.dir)
    if info is None:
        print(f"no broker running on {_dir(args)}")
        return 1
    secure = info.get("auth") or info.get("tls")
    how = (f", {_security(bool(info.get('auth')), bool(info.get('tls')), bool(info.get('mtls')))}: client settings in "
           f"{os.path.join(_dir(args), 'client.properties')}") if secure else ""
    print(f"running: {info['bootstrap']} (pid {info['pid']}, data in {_dir(args)}{how})")
    return 0


def _broker_stop(args) -> int:
    from statekit import broker

    if broker.stop(args.dir):
        print(f"stopped the broker on {_dir(args)}")
        return 0
    print(f"no broker running on {_dir(args)}")
    return 1


def _print_stats(rows, as_json: bool) -> None:
    if as_json:
        print(json.dumps(rows, indent=1))
        return
    cols = ["topic", "partition", "log_start_offset", "high_watermark", "segments", "bytes", "records",
            "dirty_ratio", "cleaner_runs", "records_removed"]
    table = [cols] + [[str(r.get(c, "")) for c in cols] for r in rows]
    widths = [max(len(row[i]) for row in table) for i in range(len(cols))]
    for row in table:
        print("  ".join(v.ljust(w) for v, w in zip(row, widths)))


def _broker_stats(args) -> int:
    from statekit import broker

    _print_stats(broker.log_stats(args.dir, topic=args.topic), args.json)
    return 0


def _broker_clean(args) -> int:
    from statekit import broker

    rows = broker.request_clean(args.dir)
    _print_stats([r for r in rows if args.topic is None or r["topic"] == args.topic], args.json)
    return 0


def _add_registry(sub) -> None:
    from statekit.registry.__main__ import add_serve_args

    p = sub.add_parser("registry", help="the embedded Schema Registry",
                       description="Start, inspect and stop statekit's embedded Schema Registry (Confluent's "
                                   "REST API; its schemas live in the broker's data directory).")
    rsub = p.add_subparsers(dest="registry_cmd", metavar="{start,status,stop,run}")
    rsub.required = True
    s = rsub.add_parser("start", help="start a registry in the background (or reuse the one running on --dir)")
    add_serve_args(s)
    s.set_defaults(func=_registry_start)
    r = rsub.add_parser("run", help="run a registry in the foreground (Ctrl-C stops it)")
    add_serve_args(r)
    r.set_defaults(func=_registry_run)
    for name, fn, text in (("status", _registry_status, "say whether a registry runs on --dir, and where"),
                           ("stop", _registry_stop, "stop the registry running on --dir")):
        q = rsub.add_parser(name, help=text)
        q.add_argument("--dir", default=None, help="data directory (default: $STATEKIT_HOME/broker)")
        q.set_defaults(func=fn)


def _registry_dir(args) -> str:
    from statekit.registry import default_dir

    return os.path.abspath(args.dir or default_dir())


def _registry_start(args) -> int:
    from statekit import registry

    h = registry.start(dir=args.dir, host=args.host, port=args.port, detach=True, auth=args.auth,
                       tls=args.tls)
    if not h.owned:
        print(f"statekit registry already running on {h.dir} (pid {h.pid}); reusing it", file=sys.stderr)
    if h.auth:
        print(f"basic auth required; credentials in {os.path.join(h.dir, 'registry-credentials.json')}",
              file=sys.stderr)
    if h.tls:
        print(f"HTTPS; clients trust {h.ca} (ssl.ca.location)", file=sys.stderr)
    print(h.url)
    return 0


def _registry_run(args) -> int:
    from statekit.registry.__main__ import main as run_main

    argv = ["--host", args.host, "--port", str(args.port)] + (["--dir", args.dir] if args.dir else [])
    return run_main(argv + (["--auth"] if args.auth else []) + (["--tls"] if args.tls else []))


def _registry_status(args) -> int:
    from statekit import registry

    info = registry.status(args.dir)
    if info is None:
        print(f"no registry running on {_registry_dir(args)}")
        return 1
    auth = ", basic auth required" if info.get("auth") else ""
    print(f"running: {info['url']} (pid {info['pid']}, data in {_registry_dir(args)}{auth})")
    return 0


def _registry_stop(args) -> int:
    from statekit import registry

    if registry.stop(args.dir):
        print(f"stopped the registry on {_registry_dir(args)}")
        return 0
    print(f"no registry running on {_registry_dir(args)}")
    return 1


def _add_produce(sub) -> None:
    from statekit.datagen import GENERATORS

    p = sub.add_parser("produce", help="write a seeded generator's records to a topic",
                       description="Write the first --limit records of a seeded generator to "
                                   "TOPIC. Without --rate: the fast path (pre-encoded record "
                                   "batches, millions of records per run); with --rate: one "
                                   "record batch at a time at that pace.")
    p.add_argument("topic", metavar="TOPIC")
    p.add_argument("--generator", required=True, choices=sorted(GENERATORS))
    p.add_argument("--limit", type=int, required=True, metavar="N", help="how many records")
    p.add_argument("--seed", type=int, default=42)
    p.add_argument("--keys", type=int, default=None, metavar="K",
                   help="distinct keys (accounts: accounts; words: vocabulary; clicks: users; "
                        "sensors: sensors)")
    p.add_argument("--partitions", type=int, default=4, metavar="N",
                   help="partitions of the topic if it is created (default 4)")
    p.add_argument("--rate", type=float, default=None, metavar="R", help="records per second")
    p.add_argument("--bootstrap", default=None, metavar="HOST:PORT",
                   help="Kafka to write to (default: STATEKIT_BOOTSTRAP or the embedded broker)")
    p.add_argument("--format", dest="value_format", default="json",
                   choices=("json", "avro", "protobuf", "json_schema"),
                   help="the values' format (default json); the others register the generator's "
                        "schema under TOPIC-value in the schema registry (STATEKIT_SCHEMA_REGISTRY_URL, "
                        "else the embedded one)")
    p.set_defaults(func=_produce)


def _produce(args) -> int:
    from statekit import datagen
    from statekit.bootstrap import resolve_bootstrap

    if args.limit < 1:
        raise StatekitError(f"--limit must be >= 1 (got {args.limit})")
    if args.rate is not None and not args.rate > 0:
        raise StatekitError(f"--rate must be > 0 records per second (got {args.rate})")
    args.bootstrap = resolve_bootstrap(args.bootstrap, detach=True)   # a broker started here outlives the command
    if args.rate is None:
        prog = datagen.produce_fast(args.topic, args.generator, args.seed, args.limit,
                                    args.bootstrap, keys=args.keys, partitions=args.partitions,
                                    value_format=args.value_format)
    else:
        recs = datagen.generate(args.generator, seed=args.seed, keys=args.keys)
        prog = datagen.produce(args.topic, recs, args.bootstrap, partitions=args.partitions,
                               rate=args.rate, limit=args.limit, value_format=args.value_format,
                               generator=args.generator)
    fmt = "" if args.value_format == "json" else f" in {args.value_format}"
    print(f"wrote {prog.sent:,} {args.generator} records{fmt} (seed {args.seed}) to {args.topic} "
          f"in {prog.elapsed:.2f}s ({prog.rate:,.0f} records/s)")
    return 0


def _add_spark(sub) -> None:
    p = sub.add_parser("spark", help="a Spark Connect server for a workshop room",
                       description="Start, inspect and stop one Spark Connect server on this machine "
                                   "that every participant's notebook runs on (participants set "
                                   "SPARK_REMOTE to its URL; %statekit up then connects to it).")
    ssub = p.add_subparsers(dest="spark_cmd", metavar="{serve,status,stop}")
    ssub.required = True
    s = ssub.add_parser("serve", help="start the server in the background (or say where it runs)")
    s.add_argument("--master", default="local[4]",
                   help="the server's Spark master (default local[4]: four task slots)")
    s.add_argument("--host", default="127.0.0.1",
                   help="address to listen on (default 127.0.0.1: participants' kernels on this machine)")
    s.add_argument("--port", type=int, default=15002, help="port (default 15002, Spark Connect's; 0: any free one)")
    s.add_argument("--driver-memory", default="2g", help="the server JVM's heap (default 2g)")
    s.add_argument("--conf", action="append", default=[], metavar="K=V", help="a Spark setting of the server")
    for name, text in (("status", "say whether a server runs, and its URL"),
                       ("stop", "stop the server and every process it started")):
        ssub.add_parser(name, help=text)
    for q in ssub.choices.values():
        q.add_argument("--dir", default=None, help="its directory (default: $STATEKIT_HOME/spark-connect)")
    s.set_defaults(func=_spark_serve)
    ssub.choices["status"].set_defaults(func=_spark_status)
    ssub.choices["stop"].set_defaults(func=_spark_stop)


def _spark_dir(args) -> str:
    from statekit.contracts import statekit_home

    return os.path.abspath(args.dir or os.path.join(statekit_home(), "spark-connect"))


def _participants(url: str) -> str:
    return (f"participants: export SPARK_REMOTE={url} before starting Jupyter (or in the kernel's "
            f"environment); `%statekit up` then runs their apps on this server, no code change")


def _spark_serve(args) -> int:
    from statekit.engine.spark.connect_server import ConnectServer, read_state

    root = _spark_dir(args)
    st = read_state(root)
    if st is not None:
        print(f"a Spark Connect server already runs at {st['url']} (pid {st['pid']}, master "
              f"{st['master']}); `statekit spark stop` stops it", file=sys.stderr)
        print(_participants(st["url"]))
        return 0
    conf = {}
    for kv in args.conf:
        k, sep, v = kv.partition("=")
        if not sep or not k.strip():
            raise StatekitError(f"--conf wants KEY=VALUE, got {kv!r}")
        conf[k.strip()] = v
    server = ConnectServer(root, master=args.master, host=args.host, port=args.port, conf=conf,
                           driver_memory=args.driver_memory, detach=True).start()
    print(f"Spark Connect server running at {server.url} (pid {server.pid}, master {args.master}; "
          f"log {server.log_path})")
    print(_participants(server.url))
    return 0


def _spark_status(args) -> int:
    from statekit.engine.spark.connect_server import read_state

    root = _spark_dir(args)
    st = read_state(root)
    if st is None:
        print(f"no Spark Connect server runs from {root}")
        return 1
    print(f"running: {st['url']} (pid {st['pid']}, master {st['master']}, log {st['log']})")
    return 0


def _spark_stop(args) -> int:
    from statekit.engine.spark.connect_server import stop_running

    root = _spark_dir(args)
    st = stop_running(root)
    if st is None:
        print(f"no Spark Connect server runs from {root}")
        return 1
    print(f"stopped the Spark Connect server at {st['url']} and the processes it started")
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="statekit", description="statekit: see how stream processing keeps its state.")
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    sub.required = True
    _add_broker(sub)
    _add_registry(sub)
    _add_produce(sub)
    _add_spark(sub)
    return parser


def main(argv=None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    try:
        return args.func(args) or 0
    except StatekitError as e:
        print(f"statekit: {e}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


if __name__ == "__main__":
    sys.exit(main())
