"""Topic and path names come from statekit.contracts only: a name spelled by hand in a second place
is a name that can drift (the worker, the control side and the dashboard must agree on it)."""
from __future__ import annotations

import ast
import os
import re

import pytest

from statekit import contracts

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SOURCES = ("statekit", "kernel_ext")
SUFFIXES = ("changelog", "repartition", "events")
NAMES = "|".join(SUFFIXES)
# a literal part that starts with the suffix right after an interpolation: f"{app}-events"
AFTER_VALUE = re.compile(rf"^-({NAMES})\b")
# a format template that puts a value before the suffix: "%s-changelog", "{}-changelog", "{app}-events"
TEMPLATE = re.compile(r"(%[sdr]|\{[^{}]*\})-(" + NAMES + r")\b")


def project_modules():
    for top in SOURCES:
        for dirpath, dirnames, filenames in os.walk(os.path.join(ROOT, top)):
            dirnames[:] = [d for d in dirnames if d != "__pycache__"]
            for name in sorted(filenames):
                if name.endswith(".py"):
                    yield os.path.join(dirpath, name)


def hand_built_names(source: str) -> list[tuple[int, str]]:
    """(line, text) of every expression that builds a ``<x>-changelog``, ``<x>-repartition`` or
    ``<x>-events`` name from a value: an f-string, a %- or str.format template, a concatenation."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.JoinedStr):
            parts = node.values
            for before, part in zip(parts, parts[1:]):
                if (isinstance(before, ast.FormattedValue) and isinstance(part, ast.Constant)
                        and isinstance(part.value, str) and AFTER_VALUE.match(part.value)):
                    found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add):
            right = node.right
            if (isinstance(right, ast.Constant) and isinstance(right.value, str)
                    and AFTER_VALUE.match(right.value)):
                found.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.BinOp) and isinstance(node.op, ast.Mod):
            left = node.left
            if isinstance(left, ast.Constant) and isinstance(left.value, str) and TEMPLATE.search(left.value):
                found.append((node.lineno, ast.unparse(node)))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and node.func.attr == "format" and isinstance(node.func.value, ast.Constant)
              and isinstance(node.func.value.value, str) and TEMPLATE.search(node.func.value.value)):
            found.append((node.lineno, ast.unparse(node)))
    return found


def test_no_module_but_contracts_builds_a_topic_name_by_hand():
    offenders = []
    for path in project_modules():
        rel = os.path.relpath(path, ROOT)
        if rel == os.path.join("statekit", "contracts.py"):
            continue
        with open(path, encoding="utf-8") as f:
            for line, text in hand_built_names(f.read()):
                offenders.append(f"{rel}:{line}: {text}")
    assert offenders == [], ("build these names with statekit.contracts (changelog_topic, "
                             "repartition_topic, events_topic, ...):\n" + "\n".join(offenders))


@pytest.mark.parametrize("source", [
    'topic = f"{app}-{store}-changelog"',
    'topic = f"{app}-events"',
    'node = f"KSTREAM-SINK-{name}-repartition"',
    'topic = app + "-events"',
    'topic = "%s-%s-changelog" % (app, store)',
    'topic = "{}-{}-repartition".format(app, name)',
    'msg = f"needs a topic ({app}-{name}-repartition) first"',
])
def test_the_scan_finds_a_hand_built_name(source):
    assert len(hand_built_names(source)) == 1


@pytest.mark.parametrize("source", [
    'ok = topic.endswith("-changelog")',
    'label = f"{store} changelog"',
    'client_id = f"statekit-events-{app}"',
    'kind = "repartition"',
    '"""<application>-<store>-changelog"""',
])
def test_the_scan_leaves_what_builds_no_name(source):
    assert hand_built_names(source) == []


def test_the_names():
    assert contracts.changelog_topic("wordcount", "counts") == "wordcount-counts-changelog"
    assert contracts.changelog_name("counts") == "counts-changelog"
    assert contracts.repartition_topic("wc", "by-word") == "wc-by-word-repartition"
    assert contracts.repartition_name("by-word") == "by-word-repartition"
    assert contracts.events_topic("wc") == "wc-events"


def test_statekit_home_is_read_in_contracts_only(monkeypatch, tmp_path):
    monkeypatch.setenv("STATEKIT_HOME", str(tmp_path))
    assert contracts.statekit_home() == str(tmp_path)
    assert contracts.default_broker_dir() == os.path.join(str(tmp_path), "broker")
    assert contracts.default_state_dir("wc") == os.path.join(str(tmp_path), "apps", "wc")
    readers = []
    for path in project_modules():
        rel = os.path.relpath(path, ROOT)
        with open(path, encoding="utf-8") as f:
            tree = ast.parse(f.read())
        for node in ast.walk(tree):
            # os.environ.get("STATEKIT_HOME"), os.environ["STATEKIT_HOME"], os.getenv("STATEKIT_HOME")
            if isinstance(node, (ast.Call, ast.Subscript)):
                args = node.args if isinstance(node, ast.Call) else [node.slice]
                target = ast.unparse(node.func if isinstance(node, ast.Call) else node.value)
                if (target in ("os.environ.get", "os.environ", "os.getenv", "environ.get")
                        and args and isinstance(args[0], ast.Constant)
                        and args[0].value == "STATEKIT_HOME"):
                    readers.append(f"{rel}:{node.lineno}")
    assert [r.split(":")[0] for r in readers] == [os.path.join("statekit", "contracts.py")], readers
