"""The `%statekit` / `%%statekit` argument parser: argv in, a `Command` out. Pure Python, no IPython.

Every subcommand has `--help`. Every user mistake becomes a `ParseError` whose str() is one line,
so the magic can print it without a stack trace.
"""
from __future__ import annotations

import argparse
import re
import shlex
from dataclasses import dataclass, field
from typing import Any

PROG = "%statekit"

_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,200}$")
_HOSTPORT_RE = re.compile(r"^[A-Za-z0-9.\-]+:\d{1,5}$|^\[[0-9a-fA-F:]+\]:\d{1,5}$")
_RATE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(k)?\s*(?:/\s*s(?:ec)?)?\s*$", re.IGNORECASE)

CRASH_MODES = ("process", "disk-loss", "executor")
GENERATORS = ("words", "clicks", "sensors", "accounts")
VALUE_FORMATS = ("json", "avro", "protobuf", "json_schema")

SUBCOMMANDS = (
    "up", "down", "status", "topics", "produce", "app", "apps", "start", "wait", "stop", "watch",
    "crash", "restart", "instances", "kill", "revive", "add-instance", "remove-instance", "scale",
    "query", "lag", "history", "broker", "help",
)
ENGINES = ("changelog", "local", "spark")


class ParseError(Exception):
    """A user mistake on the command line; str() is one line."""

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


@dataclass
class Command:
    """A parsed subcommand: `command` plus its options (`cmd.args`, also as attributes: `cmd.name`
    is the NAME argument); `body` is the cell text for `%%statekit`."""

    command: str
    args: dict[str, Any] = field(default_factory=dict)
    body: str | None = None

    def __getattr__(self, item):  # cmd.partitions instead of cmd.args["partitions"]
        try:
            return self.__dict__["args"][item]
        except KeyError:
            raise AttributeError(item) from None


@dataclass
class Help:
    """`--help` (or `help`) was asked for: show `text`, run nothing."""

    text: str


# ---------------------------------------------------------------------------------------------
# argparse, made to raise instead of exiting or printing


class _HelpRequested(Exception):
    def __init__(self, text: str):
        self.text = text


class _Parser(argparse.ArgumentParser):
    def __init__(self, *a, **kw):
        kw.setdefault("exit_on_error", False)
        kw.setdefault("allow_abbrev", False)
        super().__init__(*a, **kw)

    def error(self, message):  # noqa: D401 - argparse API
        raise ParseError(f"{self.prog}: {message} (try `{self.prog} --help`)")

    def exit(self, status=0, message=None):
        raise ParseError(message.strip() if message else f"{self.prog}: exit {status}")

    def print_help(self, file=None):
        raise _HelpRequested(self.format_help())

    def print_usage(self, file=None):
        raise _HelpRequested(self.format_usage())


def _whole_number(text: str, least: int, what: str = "a whole number", hint: str = "") -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected {what}, got {text!r}") from None
    if value < least:
        raise argparse.ArgumentTypeError(hint.format(value=value) or
                                         f"expected a number >= {least}, got {value}")
    return value


def _positive_int(text: str) -> int:
    return _whole_number(text, 1)


def _non_negative_int(text: str) -> int:
    return _whole_number(text, 0)


def _name(text: str) -> str:
    if not _NAME_RE.match(text):
        raise argparse.ArgumentTypeError(
            f"{text!r} is not a valid name (letters, digits, '.', '_', '-')")
    return text


def _hostport(text: str) -> str:
    if not _HOSTPORT_RE.match(text) or not 0 < int(text.rsplit(":", 1)[1]) < 65536:
        raise argparse.ArgumentTypeError(f"expected HOST:PORT, got {text!r}")
    return text


def parse_rate(text: str) -> float:
    """'200', '200/s', '1.5k/s' -> records per second (> 0)."""
    m = _RATE_RE.match(text)
    if not m:
        raise argparse.ArgumentTypeError(f"expected a rate like 200/s, got {text!r}")
    value = float(m.group(1)) * (1000 if m.group(2) else 1)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"the rate must be > 0, got {text!r}")
    return value


def _seconds(text: str) -> float:
    try:
        value = float(text.rstrip("s").strip())
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected seconds > 0, got {text!r}")
    return value


def _instance_count(text: str) -> int:
    return _whole_number(text, 1, "a number of instances",
                         "an app needs at least 1 live instance, got {value} (`%statekit stop` stops it)")


def _interval(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not 0.1 <= value <= 60:
        raise argparse.ArgumentTypeError(f"the interval must be between 0.1 and 60 s, got {value}")
    return value


def _seconds_arg(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected seconds, got {text!r}") from None
    if not 0 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"expected 0 to 3600 seconds, got {value:g}")
    return value


def _build() -> _Parser:
    top = _Parser(
        prog=PROG,
        description="See how stateful stream processing keeps its state. "
                    "`%statekit SUBCOMMAND --help` explains each subcommand.",
    )
    sub = top.add_subparsers(dest="command", metavar="SUBCOMMAND", parser_class=_Parser)
    sub.required = True

    p = sub.add_parser("up", help="start (or attach to) the broker and a local Spark session",
                       description="Start the embedded Kafka broker (or attach to one at "
                                   "--bootstrap) and a local Spark session; shows a status card.")
    p.add_argument("--bootstrap", type=_hostport, metavar="HOST:PORT",
                   help="attach to this broker instead of the embedded one")
    p.add_argument("--no-spark", action="store_true", help="do not start Spark now")
    p.add_argument("--master", metavar="URL",
                   help="Spark master, e.g. spark://HOST:7077, or a Spark Connect server "
                        "sc://HOST:PORT (default: $STATEKIT_SPARK_MASTER, else $SPARK_REMOTE, "
                        "else local[2])")
    p.add_argument("--fresh", action="store_true",
                   help="start from a clean slate: stop the embedded broker, delete its data and "
                        "every app's local state under STATEKIT_HOME")
    p.add_argument("--tls", action="store_true",
                   help="the embedded broker listens with TLS only (its CA and certificates in its "
                        "directory; default: $STATEKIT_BROKER_TLS)")
    p.add_argument("--mtls", action="store_true",
                   help="--tls, and the broker requires client certificates (mutual TLS)")

    sub.add_parser("down", help="stop every app, producer, Spark and the embedded broker",
                   description="Stop every running app and producer, Spark and the embedded "
                               "broker this kernel started; a Spark session or broker you (or "
                               "another process) started keeps running, and down says so.")
    sub.add_parser("status", help="broker, Spark, apps and producers at a glance",
                   description="Show the broker, the Spark session, apps and producers.")

    p = sub.add_parser("broker", help="an outage on purpose: pause the embedded broker, or restart it",
                       description="`broker pause SECONDS`: the embedded broker stops answering "
                                   "for that long (connections stay open: a real stall). `broker "
                                   "restart [--down S]`: kill -9 it and start it again on the same "
                                   "directory and port S seconds later. Apps ride it out (WAITING).")
    p.add_argument("action", choices=("pause", "restart"), metavar="pause|restart")
    p.add_argument("seconds", nargs="?", type=_seconds_arg, metavar="SECONDS",
                   help="how long a pause lasts (default 10)")
    p.add_argument("--down", type=_seconds_arg, default=0.0, metavar="S",
                   help="restart: seconds between the kill and the new start (default 0)")
    p.add_argument("--mid-transaction", action="store_true",
                   help="pause: begin the stall with the next produce request of a transaction, "
                        "its records in flight (the commit it waits for is then aborted)")

    p = sub.add_parser("topics", help="topics: partitions, end offsets, cleanup policy, compaction",
                       description="List topics with partitions, end offsets, cleanup policy and, "
                                   "for the embedded broker, compaction figures.")
    p.add_argument("pattern", nargs="?", help="only topics whose name contains this text")
    p.add_argument("--internal", action="store_true", help="also list statekit's internal topics")

    p = sub.add_parser("produce", help="stream a file or a generator into a topic",
                       description="Produce records to TOPIC from a JSON-lines FILE or a seeded "
                                   "generator, in a background thread with a progress bar. A "
                                   "generator with --limit and no --rate takes the fast path "
                                   "(millions of records per run).")
    p.add_argument("topic", type=_name, metavar="TOPIC")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--from", dest="file", metavar="FILE",
                     help="JSON lines: {\"key\": ..., \"value\": ..., \"timestamp\": ...} per line")
    src.add_argument("--generator", choices=GENERATORS, metavar="NAME",
                     help="one of: " + ", ".join(GENERATORS))
    p.add_argument("--rate", type=parse_rate, metavar="N/s", help="records per second (default: as fast as possible)")
    p.add_argument("--limit", type=_positive_int, metavar="N", help="stop after N records")
    p.add_argument("--partitions", type=_positive_int, metavar="N",
                   help="create the topic with N partitions if it does not exist (default 4)")
    p.add_argument("--seed", type=int, default=None, help="generator seed (default 42)")
    p.add_argument("--keys", type=_positive_int, metavar="K",
                   help="distinct keys of the generator (accounts: accounts, default 1000000; "
                        "words: vocabulary; clicks: users; sensors: sensors)")
    p.add_argument("--format", dest="value_format", choices=VALUE_FORMATS, default="json",
                   metavar="FORMAT",
                   help="the values' format: json (default), or avro, protobuf, json_schema "
                        "(a generator's schema, registered under TOPIC-value in the schema "
                        "registry)")
    p.add_argument("--wait", action="store_true", help="block until done instead of running in the background")
    p.add_argument("--again", action="store_true",
                   help="write the records even when the topic holds exactly them already (this "
                        "produce ran before; without --again it writes nothing then)")

    p = sub.add_parser("app", help="(cell magic) define an app; the cell body builds the topology",
                       description="%%statekit app NAME: the cell body is Python that builds the "
                                   "topology with `app` bound to a new statekit.App; the app is "
                                   "then known by NAME.")
    p.add_argument("name", type=_name, metavar="NAME")
    p.add_argument("--partitions", type=_positive_int, metavar="N", help="tasks = changelog partitions")
    p.add_argument("--instances", type=_positive_int, metavar="N",
                   help="instance processes (each with its own state directory)")
    p.add_argument("--standby", type=_non_negative_int, metavar="N", help="standby replicas per task")
    p.add_argument("--commit-interval", type=_seconds, metavar="S", help="seconds between commits")
    p.add_argument("--cache-bytes", type=_non_negative_int, metavar="B", help="record cache size")
    p.add_argument("--acceptable-lag", type=_non_negative_int, metavar="N",
                   help="a warmup replica this close to the changelog end takes its task over "
                        "(acceptable.recovery.lag, default 10000 records)")
    p.add_argument("--max-warmups", type=_non_negative_int, metavar="N",
                   help="warmup replicas at once (max.warmup.replicas, default 2)")
    p.add_argument("--probing-interval", type=_seconds, metavar="S",
                   help="seconds between probing rebalances while warmups catch up (default 10)")
    p.add_argument("--task-timeout", type=_seconds_arg, metavar="S",
                   help="seconds the app rides out a Kafka that is away before ERROR (Kafka "
                        "Streams' task.timeout.ms; default 300); requests time out after a tenth")
    p.add_argument("--guarantee", choices=("exactly_once", "at_least_once"),
                   help="exactly_once (default: each commit of a micro-batch is one Kafka "
                        "transaction) or at_least_once (no transactions: a crash may repeat a "
                        "batch's output)")
    p.add_argument("--engine", choices=ENGINES,
                   help="changelog (default: Spark reads and shuffles, statekit's stores and "
                        "changelogs keep the state), local (the same without Spark), or spark "
                        "(Spark's own RocksDB state store: statekit.NativeApp, one instance)")

    sub.add_parser("apps", help="list the apps this kernel knows", description="List apps by name.")

    for name, text in (("start", "start an app's streaming query"),
                       ("stop", "stop an app gracefully (commit, checkpoint)")):
        p = sub.add_parser(name, help=text, description=text[0].upper() + text[1:] + ".")
        p.add_argument("name", type=_name, metavar="NAME")
        if name == "start":
            p.add_argument("--watch", action="store_true", help="show the live dashboard too")
            p.add_argument("--trigger", metavar="T",
                           help="availableNow, once, or a processing-time interval in seconds "
                                "(default: as fast as possible)")
            p.add_argument("--max-records", type=_positive_int, metavar="N",
                           help="at most N input records per micro-batch")
            p.add_argument("--sink", choices=("memory", "kafka", "none"), default=None,
                           help="where outputs go: the topology's sink topics (kafka, the default when "
                                "it has any), a Spark memory table (memory; no restart after a crash), "
                                "or nowhere (none, the default otherwise)")

    p = sub.add_parser("wait", help="wait until an app has processed every record now in its sources",
                       description="Say what it waits for (the records now in the app's source "
                                   "topics), wait until they are processed and committed, then say "
                                   "what happened: caught up (and how long it took), stopped by a "
                                   "crash you asked for, or failed.")
    p.add_argument("name", type=_name, metavar="NAME")
    p.add_argument("--timeout", type=_seconds, default=None, metavar="S",
                   help="give up after S seconds (default: wait as long as it takes)")

    p = sub.add_parser("watch", help="live dashboard of an app (refreshes about once a second)",
                       description="Show the live dashboard: tasks, lag, store contents, "
                                   "restoration, changelogs, topology and key history.")
    p.add_argument("name", type=_name, metavar="NAME")
    p.add_argument("--interval", type=_interval, default=1.0, metavar="S", help="refresh period (default 1 s)")
    p.add_argument("--top", type=_positive_int, default=15, metavar="K", help="store rows to show (default 15)")

    p = sub.add_parser("crash", help="crash an instance now or mid-batch; disk-loss also wipes its disk",
                       description="Crash an instance: `process` kills it (now, or with --after N "
                                   "once one of its tasks has processed N records of a batch) and "
                                   "keeps its state directory; `disk-loss` also deletes it. Its tasks "
                                   "move to the live instances; a one-instance app stops until "
                                   "`restart`.")
    p.add_argument("name", type=_name, metavar="NAME")
    p.add_argument("--mode", choices=CRASH_MODES, default="process",
                   help="process (default) or disk-loss; executor (its executor JVM too) for an app "
                        "placed on Spark's executors")
    p.add_argument("--instance", type=_non_negative_int, default=None, metavar="I",
                   help="instance number (default: the one with the most active tasks)")
    p.add_argument("--after", type=_non_negative_int, default=None, metavar="N",
                   help="crash after N more records (default: now)")

    p = sub.add_parser("restart", help="revive crashed instances (or restart all) and watch them restore",
                       description="Revive every dead instance (with its disk; a disk-loss instance "
                                   "comes back empty), or restart every instance when none is dead; "
                                   "tasks restore from their changelogs. Updates the app's dashboard "
                                   "(or shows one) unless --no-watch.")
    p.add_argument("name", type=_name, metavar="NAME")
    p.add_argument("--no-watch", action="store_true", help="do not show the dashboard")
    p.add_argument("--restore-rate", type=parse_rate, metavar="N/s",
                   help="throttle every restore to N records/s, to watch it (teaching; default: full speed)")

    p = sub.add_parser("instances", help="an app's instances: status, active, standby and warmup tasks",
                       description="One row per instance: status (alive, leaving, dead, stopped), "
                                   "incarnation, pid, and its active, standby and warmup tasks.")
    p.add_argument("name", type=_name, metavar="NAME")

    p = sub.add_parser("kill", help="kill one instance now; its tasks move, the others keep going",
                       description="SIGKILL one instance (a crash with nothing armed). Its tasks move "
                                   "to the live instances (standby holders first); the other "
                                   "instances keep processing. Refused for the last live instance "
                                   "(use `crash`); `crash --mode disk-loss --instance I` also wipes its disk.")
    p.add_argument("name", type=_name, metavar="NAME")
    p.add_argument("--instance", type=_non_negative_int, required=True, metavar="I", help="instance number")

    p = sub.add_parser("revive", help="bring a dead instance back (with its disk, or --no-disk)",
                       description="Start a dead instance again. With its disk, its old state "
                                   "directories count as (possibly stale) copies: warmup replicas "
                                   "bring them up to date before tasks move back.")
    p.add_argument("name", type=_name, metavar="NAME")
    p.add_argument("--instance", type=_non_negative_int, required=True, metavar="I", help="instance number")
    p.add_argument("--no-disk", action="store_true", help="revive it with an empty state directory")

    p = sub.add_parser("add-instance", help="a new instance joins; warmups catch up before tasks move",
                       description="Start a new instance (empty disk). Tasks it should run get a "
                                   "warmup replica there first and move once it has caught up "
                                   "(probing rebalances).")
    p.add_argument("name", type=_name, metavar="NAME")

    p = sub.add_parser("remove-instance", help="gracefully remove an instance (its tasks move first)",
                       description="Remove an instance gracefully: its tasks move to the others "
                                   "(through warmups), then it stops. Blocks until it left.")
    p.add_argument("name", type=_name, metavar="NAME")
    p.add_argument("--instance", type=_non_negative_int, required=True, metavar="I", help="instance number")

    p = sub.add_parser("scale", help="add or remove instances until N are live",
                       description="Add instances (they join with warmups) or remove the highest "
                                   "numbered ones gracefully until N are live.")
    p.add_argument("name", type=_name, metavar="NAME")
    p.add_argument("count", type=_instance_count, metavar="N", help="live instances wanted (>= 1)")

    p = sub.add_parser("query", help="interactive query: one key, a key range, or everything",
                       description="Read an app's store while it runs: `query NAME STORE KEY`, "
                                   "`query NAME STORE --range LO HI` or `query NAME STORE --all`. "
                                   "For a window store, KEY gives the key's windows (all, or those "
                                   "starting between --from and --to, epoch ms).")
    p.add_argument("name", type=_name, metavar="NAME")
    p.add_argument("store", type=_name, metavar="STORE")
    p.add_argument("key", nargs="?", metavar="KEY")
    p.add_argument("--range", nargs=2, metavar=("LO", "HI"), dest="range")
    p.add_argument("--all", action="store_true", help="every key (first --limit rows)")
    p.add_argument("--limit", type=_positive_int, default=50, metavar="N", help="rows to show (default 50)")
    p.add_argument("--key-type", choices=("str", "int", "json"), default="str",
                   help="how to read KEY / LO / HI (default str)")
    p.add_argument("--from", type=_non_negative_int, dest="window_from", metavar="MS",
                   help="window stores: windows starting at or after MS (epoch ms)")
    p.add_argument("--to", type=_non_negative_int, dest="window_to", metavar="MS",
                   help="window stores: windows starting at or before MS (epoch ms)")

    p = sub.add_parser("lag", help="changelog lag per task (checkpoint vs changelog end)",
                       description="Show the changelog lag table of an app.")
    p.add_argument("name", type=_name, metavar="NAME")

    p = sub.add_parser("history", help="a key's values over the changelog, with a slider",
                       description="Rebuild a key's value as of every changelog offset.")
    p.add_argument("name", type=_name, metavar="NAME")
    p.add_argument("store", type=_name, metavar="STORE")
    p.add_argument("key", metavar="KEY")
    p.add_argument("--key-type", choices=("str", "int", "json"), default="str",
                   help="how to read KEY (default str)")

    p = sub.add_parser("help", help="list subcommands", description="List the subcommands.")
    p.add_argument("topic", nargs="?", metavar="SUBCOMMAND")
    return top


_PARSER: _Parser | None = None


def _parser() -> _Parser:
    global _PARSER
    if _PARSER is None:
        _PARSER = _build()
    return _PARSER


def _subparser(name: str) -> _Parser | None:
    for action in _parser()._actions:
        if isinstance(action, argparse._SubParsersAction):
            return action.choices.get(name)
    return None


def split(line: str) -> list[str]:
    try:
        return shlex.split(line, comments=True)
    except ValueError as err:
        raise ParseError(f"{PROG}: cannot split the line: {err}") from None


def _validate(cmd: Command) -> None:
    a = cmd.args
    if cmd.command == "query":
        chosen = sum(x is not None and x is not False for x in (a["key"], a["range"], a["all"] or None))
        if chosen != 1:
            raise ParseError(f"{PROG} query: give exactly one of KEY, --range LO HI or --all "
                             f"(try `{PROG} query --help`)")
        if (a["window_from"] is not None or a["window_to"] is not None) and a["key"] is None:
            raise ParseError(f"{PROG} query: --from/--to pick the windows of one KEY of a window "
                             f"store: give the KEY (try `{PROG} query --help`)")
        if (a["window_from"] is not None and a["window_to"] is not None
                and a["window_from"] > a["window_to"]):
            raise ParseError(f"{PROG} query: --from {a['window_from']} is after --to "
                             f"{a['window_to']}: swap them")
    if cmd.command == "start" and a.get("trigger") is not None:
        t = a["trigger"]
        if t not in ("availableNow", "once"):
            try:
                secs = float(t.rstrip("s").strip())
            except ValueError:
                raise ParseError(f"{PROG} start: --trigger must be availableNow, once or seconds, got {t!r}") from None
            if secs <= 0:
                raise ParseError(f"{PROG} start: --trigger seconds must be > 0, got {t!r}")
            a["trigger"] = f"{secs:g} seconds"
    if cmd.command == "produce" and a.get("file") is not None and a.get("seed") is not None:
        raise ParseError(f"{PROG} produce: --seed only applies to --generator")
    if cmd.command == "produce" and a.get("file") is not None and a.get("keys") is not None:
        raise ParseError(f"{PROG} produce: --keys only applies to --generator")
    if cmd.command == "produce" and a.get("file") is not None and a.get("value_format") != "json":
        raise ParseError(f"{PROG} produce: --format {a['value_format']} needs --generator (each "
                         f"generator has a schema; a file's records have none)")


def _blame(sub: str | None, message: str) -> str:
    """Name the subcommand in an error and point at its --help."""
    message = re.sub(r"\s*\(try `[^`]*`\)$", "", message)
    message = re.sub(r"^%statekit( [a-z]+)?: ", "", message)
    where = f"{PROG} {sub}" if sub else PROG
    return f"{where}: {message} (try `{where} --help`)"


def parse(line: str, body: str | None = None) -> Command | Help:
    """Parse a `%statekit` line (body=None) or a `%%statekit` cell (body = the cell text)."""
    argv = split(line)
    if not argv:
        return Help(_parser().format_help())
    if argv[0] not in SUBCOMMANDS and not argv[0].startswith("-"):
        close = [s for s in SUBCOMMANDS if s.startswith(argv[0][:2])]
        hint = f" (did you mean {' or '.join(close)}?)" if close else ""
        raise ParseError(f"{PROG}: unknown subcommand {argv[0]!r}{hint}; "
                         f"subcommands: {', '.join(SUBCOMMANDS)}")
    sub = argv[0] if argv[0] in SUBCOMMANDS else None
    try:
        ns = _parser().parse_args(argv)
    except _HelpRequested as h:
        return Help(h.text)
    except argparse.ArgumentError as err:  # exit_on_error=False path
        raise ParseError(_blame(sub, str(err))) from None
    except ParseError as err:
        raise ParseError(_blame(sub, str(err))) from None
    args = vars(ns)
    name = args.pop("command")
    cmd = Command(name, args, body)
    if name == "help":
        topic = args.get("topic")
        if topic:
            sp = _subparser(topic)
            if sp is None:
                raise ParseError(f"{PROG} help: unknown subcommand {topic!r}")
            return Help(sp.format_help())
        return Help(_parser().format_help())
    if name == "app" and body is None:
        raise ParseError(f"{PROG} app: needs a cell body; use `%%statekit app NAME` on the first "
                         f"line of a cell that builds the topology with `app`")
    if name != "app" and body is not None and body.strip():
        raise ParseError(f"{PROG} {name}: is a line command; only `app` takes a cell body")
    _validate(cmd)
    return cmd


def subcommand_names() -> tuple[str, ...]:
    return SUBCOMMANDS
