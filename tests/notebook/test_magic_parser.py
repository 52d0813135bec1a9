"""The %statekit parser: every subcommand parses, has --help, and a mistake is one line."""
from __future__ import annotations

import pytest

from kernel_ext.parser import SUBCOMMANDS, Command, Help, ParseError, parse, parse_rate

GOOD = {
    "up": ("up", {"bootstrap": None, "no_spark": False}),
    "up --bootstrap 127.0.0.1:9092": ("up", {"bootstrap": "127.0.0.1:9092"}),
    "up --fresh --no-spark": ("up", {"fresh": True, "no_spark": True}),
    "down": ("down", {}),
    "status": ("status", {}),
    "topics": ("topics", {"pattern": None, "internal": False}),
    "topics words --internal": ("topics", {"pattern": "words", "internal": True}),
    "produce words --generator words --rate 200/s --limit 1000":
        ("produce", {"topic": "words", "generator": "words", "rate": 200.0, "limit": 1000, "file": None}),
    "produce clicks --from sample_data/clicks.jsonl":
        ("produce", {"topic": "clicks", "file": "sample_data/clicks.jsonl", "generator": None, "rate": None}),
    "produce s --generator sensors --rate 1.5k/s --seed 7 --wait":
        ("produce", {"rate": 1500.0, "seed": 7, "wait": True}),
    "produce acc --generator accounts --limit 2000000 --keys 1000000 --wait":
        ("produce", {"generator": "accounts", "limit": 2000000, "keys": 1000000, "wait": True}),
    "produce c --generator clicks --limit 10 --format avro":
        ("produce", {"generator": "clicks", "value_format": "avro"}),
    "produce c --generator clicks --limit 10": ("produce", {"value_format": "json"}),
    "apps": ("apps", {}),
    "broker pause 10": ("broker", {"action": "pause", "seconds": 10.0, "down": 0.0, "mid_transaction": False}),
    "broker pause 10 --mid-transaction": ("broker", {"seconds": 10.0, "mid_transaction": True}),
    "broker restart --down 2.5": ("broker", {"action": "restart", "seconds": None, "down": 2.5}),
    "wait wc": ("wait", {"name": "wc", "timeout": None}),
    "wait wc --timeout 30": ("wait", {"timeout": 30.0}),
    "start wc": ("start", {"name": "wc", "watch": False}),
    "start wc --watch": ("start", {"name": "wc", "watch": True, "trigger": None, "sink": None}),
    "start wc --trigger availableNow --max-records 100": ("start", {"trigger": "availableNow", "max_records": 100}),
    "start wc --trigger 2s --sink kafka": ("start", {"trigger": "2 seconds", "sink": "kafka"}),
    "stop wc": ("stop", {"name": "wc"}),
    "watch wc": ("watch", {"name": "wc", "interval": 1.0, "top": 15}),
    "watch wc --interval 0.5 --top 5": ("watch", {"interval": 0.5, "top": 5}),
    "crash wc": ("crash", {"name": "wc", "mode": "process", "instance": None, "after": None}),
    "crash wc --mode disk-loss --instance 1 --after 500":
        ("crash", {"mode": "disk-loss", "instance": 1, "after": 500}),
    "crash wc --mode executor --instance 0": ("crash", {"mode": "executor", "instance": 0}),
    "up --master spark://10.0.0.5:7077": ("up", {"master": "spark://10.0.0.5:7077", "no_spark": False}),
    "restart wc": ("restart", {"name": "wc", "no_watch": False}),
    "restart wc --no-watch": ("restart", {"no_watch": True, "restore_rate": None}),
    "restart wc --restore-rate 50k/s": ("restart", {"restore_rate": 50_000.0}),
    "instances wc": ("instances", {"name": "wc"}),
    "kill wc --instance 2": ("kill", {"name": "wc", "instance": 2}),
    "revive wc --instance 2": ("revive", {"name": "wc", "instance": 2, "no_disk": False}),
    "revive wc --instance 0 --no-disk": ("revive", {"instance": 0, "no_disk": True}),
    "add-instance wc": ("add-instance", {"name": "wc"}),
    "remove-instance wc --instance 3": ("remove-instance", {"name": "wc", "instance": 3}),
    "scale wc 4": ("scale", {"name": "wc", "count": 4}),
    "query wc counts kafka": ("query", {"name": "wc", "store": "counts", "key": "kafka", "range": None, "all": False}),
    "query wc counts --range a f": ("query", {"key": None, "range": ["a", "f"]}),
    "query wc counts --all --limit 5": ("query", {"all": True, "limit": 5}),
    "query wc counts 7 --key-type int": ("query", {"key": "7", "key_type": "int"}),
    "query wc counts 'two words'": ("query", {"key": "two words"}),
    "query wc clicks u1 --from 1000 --to 5000": ("query", {"key": "u1", "window_from": 1000,
                                                          "window_to": 5000}),
    "query wc clicks u1": ("query", {"key": "u1", "window_from": None, "window_to": None}),
    "lag wc": ("lag", {"name": "wc"}),
    "history wc counts kafka": ("history", {"name": "wc", "store": "counts", "key": "kafka"}),
}


@pytest.mark.parametrize("line", sorted(GOOD))
def test_good_lines(line):
    name, expected = GOOD[line]
    cmd = parse(line)
    assert isinstance(cmd, Command)
    assert cmd.command == name
    for k, v in expected.items():
        assert cmd.args[k] == v, (k, cmd.args)


def test_cell_app():
    cmd = parse("app wc --partitions 4 --instances 2 --standby 1", "app.stream('words')\n")
    assert cmd.command == "app" and cmd.body.startswith("app.stream")
    assert (cmd.command, cmd.name, cmd.partitions, cmd.instances, cmd.standby) == ("app", "wc", 4, 2, 1)
    cmd = parse("app wc", "pass")
    assert cmd.partitions is None and cmd.instances is None and cmd.standby is None and cmd.engine is None
    cmd = parse("app wc --engine spark --acceptable-lag 500 --max-warmups 1 --probing-interval 2.5s", "pass")
    assert (cmd.engine, cmd.acceptable_lag, cmd.max_warmups, cmd.probing_interval) == ("spark", 500, 1, 2.5)
    assert parse("app wc", "pass").guarantee is None
    assert parse("app wc --guarantee at_least_once", "pass").guarantee == "at_least_once"
    assert parse("app wc --task-timeout 60", "pass").task_timeout == 60.0
    assert parse("app wc", "pass").task_timeout is None
    with pytest.raises(ParseError, match="invalid choice"):
        parse("app wc --guarantee maybe_once", "pass")


@pytest.mark.parametrize("sub", [s for s in SUBCOMMANDS if s != "help"])
def test_every_subcommand_has_help(sub):
    for flag in ("--help", "-h"):
        h = parse(f"{sub} {flag}")
        assert isinstance(h, Help)
        assert f"%statekit {sub}" in h.text and "usage:" in h.text
    assert isinstance(parse(f"help {sub}"), Help)


def test_top_level_help_lists_every_subcommand():
    for line in ("", "--help", "help"):
        h = parse(line)
        assert isinstance(h, Help)
        for sub in SUBCOMMANDS:
            assert sub in h.text


BAD = {
    "broker nap 3": "invalid choice",
    "broker pause soon": "expected seconds",
    "broker pause 5000": "expected 0 to 3600 seconds",
    "bogus": "unknown subcommand 'bogus'",
    "stat": "did you mean status",
    "up --bootstrap nohost": "expected HOST:PORT",
    "up --bootstrap h:99999": "expected HOST:PORT",
    "up extra": "unrecognized arguments",
    "produce words": "one of the arguments --from --generator is required",
    "produce words --generator nope": "invalid choice",
    "produce words --generator words --from f.jsonl": "not allowed with",
    "produce words --generator words --rate fast": "expected a rate",
    "produce words --generator words --rate 0/s": "must be > 0",
    "produce words --generator words --limit 0": ">= 1",
    "produce words --from f.jsonl --seed 3": "--seed only applies",
    "produce words --from f.jsonl --keys 3": "--keys only applies",
    "produce words --from f.jsonl --format avro": "--format avro needs --generator",
    "produce words --generator words --format xml": "invalid choice",
    "produce acc --generator accounts --keys 0": ">= 1",
    "produce 'bad name!' --generator words": "not a valid name",
    "app wc": "needs a cell body",
    "add-instance": "required: NAME",
    "start": "required: NAME",
    "start wc now": "unrecognized arguments",
    "start wc --trigger sometimes": "--trigger must be",
    "start wc --trigger 0": "must be > 0",
    "start wc --sink disk": "invalid choice",
    "watch wc --interval 0": "between 0.1 and 60",
    "crash wc --mode explode": "invalid choice",
    "crash wc --instance -1": ">= 0",
    "crash wc --after lots": "expected a whole number",
    "restart wc --restore-rate 0": "must be > 0",
    "restart wc --restore-rate quick": "expected a rate",
    "kill wc": "required: --instance",
    "kill wc --instance x": "expected a whole number",
    "revive wc --instance -2": ">= 0",
    "scale wc 0": "an app needs at least 1 live instance, got 0",
    "scale wc": "required: N",
    "scale wc two": "expected a number of instances",
    "remove-instance wc": "required: --instance",
    "app wc --engine flink": "invalid choice",
    "app wc --probing-interval 0": "expected seconds > 0",
    "query wc counts": "exactly one of KEY",
    "query wc counts k --range a b": "exactly one of KEY",
    "query wc counts --range a": "expected 2 arguments",
    "query wc clicks --all --from 5": "give the KEY",
    "query wc clicks u1 --from 9 --to 5": "--from 9 is after --to 5: swap them",
    "query wc clicks u1 --from -3": "--from",
    "lag": "required: NAME",
    "history wc counts": "required: KEY",
    "help nothing": "unknown subcommand",
    "start 'wc": "cannot split",
    "produce words --generator words --rate 10/s --ratelimit 3": "unrecognized arguments",
}


@pytest.mark.parametrize("line", sorted(BAD))
def test_bad_lines_are_one_line_errors(line):
    with pytest.raises(ParseError) as exc:
        parse(line)
    msg = str(exc.value)
    assert "\n" not in msg
    assert msg.startswith("%statekit")
    assert BAD[line] in msg, msg
    assert "Traceback" not in msg


def test_line_command_rejects_a_cell_body():
    with pytest.raises(ParseError, match="only `app` takes a cell body"):
        parse("status", "print(1)")
    assert parse("status", "  \n").command == "status"  # an empty cell is fine


def test_subcommand_errors_point_at_their_help():
    with pytest.raises(ParseError, match=r"try `%statekit crash --help`"):
        parse("crash wc --mode nope")


@pytest.mark.parametrize("text,value", [("5", 5.0), ("5/s", 5.0), ("2.5/sec", 2.5), ("1k/s", 1000.0), ("3K", 3000.0)])
def test_parse_rate(text, value):
    assert parse_rate(text) == value


def test_comments_are_ignored():
    assert parse("lag wc  # how far behind?").command == "lag"
