"""Which Java statekit accepts for Spark (17 and 21), in the library and in make's check, and the
one line that says how to get one: fake ``java`` binaries under a JAVA_HOME."""
from __future__ import annotations

import os
import subprocess

import pytest

from statekit.engine.spark import jvm

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _java_home(tmp_path, version_line: str) -> str:
    home = tmp_path / "jdk"
    (home / "bin").mkdir(parents=True)
    java = home / "bin" / "java"
    java.write_text(f"#!/bin/sh\necho '{version_line}' >&2\n"
                    "echo 'OpenJDK Runtime Environment (build 0+0)' >&2\n")
    java.chmod(0o755)
    return str(home)


@pytest.fixture
def fresh(monkeypatch):
    monkeypatch.setattr(jvm, "_JAVA_OK", None)
    monkeypatch.setattr(jvm, "_JAVA_ID", None)
    return monkeypatch


@pytest.mark.parametrize("line, major", [('openjdk version "17.0.15" 2025-04-15', "17"),
                                         ('openjdk version "21.0.7" 2025-04-15', "21")])
def test_java_17_and_21_are_taken(tmp_path, fresh, line, major):
    home = _java_home(tmp_path, line)
    fresh.setenv("JAVA_HOME", home)
    assert jvm.check_java() == major
    assert jvm.java_identity() == f"{os.path.realpath(home)}/bin/java\n{line}\n" \
                                  "OpenJDK Runtime Environment (build 0+0)"
    r = subprocess.run(["bash", os.path.join(ROOT, "scripts", "check_java.sh")], capture_output=True,
                       text=True, env=dict(os.environ, JAVA_HOME=home))
    assert r.returncode == 0 and r.stderr == "", r.stderr


@pytest.mark.parametrize("line, major", [('openjdk version "11.0.22" 2024-01-16', "11"),
                                         ('java version "1.8.0_392"', "8"),
                                         ('openjdk version "25.0.3" 2026-04-21 LTS', "25")])
def test_another_java_is_refused_in_one_line_that_says_what_to_install(tmp_path, fresh, line, major):
    home = _java_home(tmp_path, line)
    fresh.setenv("JAVA_HOME", home)
    with pytest.raises(jvm.JavaMissing) as e:
        jvm.check_java()
    said = str(e.value)
    assert "\n" not in said and said.startswith(f"Found Java {major} at {home}/bin/java"), said
    assert "Spark needs Java 17 or 21" in said and "apt-get install -y openjdk-17" in said
    assert jvm.java_identity() is None and jvm.built_class_archive() is None
    r = subprocess.run(["bash", os.path.join(ROOT, "scripts", "check_java.sh")], capture_output=True,
                       text=True, env=dict(os.environ, JAVA_HOME=home))
    assert r.returncode == 1
    assert r.stderr.strip().splitlines() == [
        f"statekit: found Java {major}, but Spark needs Java 17 or 21 (sudo apt-get install -y "
        "openjdk-17-jre-headless, or set JAVA_HOME)."]


def test_no_java_at_all(tmp_path, fresh):
    fresh.setenv("JAVA_HOME", str(tmp_path / "nothing-here"))
    with pytest.raises(jvm.JavaMissing, match=r"^Java was not found, and Spark needs Java 17 or 21: "
                                              r"install one \(sudo apt-get"):
        jvm.check_java()


def test_java_asked_early_answers_the_check_once(tmp_path, fresh):
    """A cold launch asks `java -version` as it begins (`ask_java_early`), while pyspark imports;
    the check reads that answer instead of asking again."""
    home = _java_home(tmp_path, 'openjdk version "17.0.15" 2025-04-15')
    java = os.path.join(home, "bin", "java")
    runs = tmp_path / "runs"
    with open(java, "a") as f:
        f.write(f"echo run >> {runs}\n")
    fresh.setenv("JAVA_HOME", home)
    fresh.setattr(jvm, "_JAVA_ASKED", {})
    jvm.ask_java_early()
    jvm.ask_java_early()                         # asked once, however often the early ask comes
    assert list(jvm._JAVA_ASKED) == [java]
    assert jvm.check_java() == "17"
    assert jvm._JAVA_ASKED == {} and runs.read_text() == "run\n"
    assert jvm.check_java() == "17" and runs.read_text() == "run\n"
