"""The driver's JVM starts with the java command spark-submit computed before for the same launch
(``engine.spark.jvm_launch.DirectLaunch``): learned from the JVM spark-submit became, used only
while every input spark-submit reads is the same, and trusted only from a file of this user's."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from statekit.engine.spark.jvm_launch import DirectLaunch

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


@pytest.fixture
def spark_home(tmp_path):
    home = tmp_path / "spark"
    for d in ("bin", "conf", "jars"):
        (home / d).mkdir(parents=True)
    (home / "bin" / "spark-submit").write_text("#!/bin/sh\n")
    return home


@pytest.fixture
def jvm_stand_in(tmp_path):
    """A process whose command line and environment are what spark-submit's JVM's would be: the
    java binary, the props file of process 1, SparkSubmit; one variable the scripts set, one they
    removed."""
    props = str(tmp_path / "log4j2-111.properties")
    argv = [sys.executable, "-c", "import time; time.sleep(60)", f"-Dlog4j2.configurationFile={props}",
            "org.apache.spark.deploy.SparkSubmit", "--conf", "spark.app.name=x", "pyspark-shell"]
    passed = dict(os.environ, STATEKIT_GONE="1")      # what pyspark hands spark-submit
    env = {k: v for k, v in passed.items() if k != "STATEKIT_GONE"}
    env["SPARK_SCALA_VERSION"] = "2.13"
    proc = subprocess.Popen(argv, env=env)
    try:
        deadline = time.monotonic() + 10
        while b"SparkSubmit" not in open(f"/proc/{proc.pid}/cmdline", "rb").read():
            assert time.monotonic() < deadline
            time.sleep(0.01)
        yield proc, props, argv, passed
    finally:
        proc.kill()
        proc.wait()


def _submit(home, props):
    return [str(home / "bin" / "spark-submit"), "--conf", "spark.app.name=x",
            "--conf", f"spark.driver.extraJavaOptions=-Dlog4j2.configurationFile={props}", "pyspark-shell"]


def test_a_launch_learned_from_spark_submits_jvm_is_started_directly_next_time(
        tmp_path, spark_home, jvm_stand_in):
    proc, props, argv, env = jvm_stand_in
    cache = str(tmp_path / "launch.json")
    first = DirectLaunch({"log4j": props}, path=cache)
    assert first.command(_submit(spark_home, props), env) is None      # never seen: spark-submit
    first.learn(_submit(spark_home, props), env, proc.pid)

    later_props = str(tmp_path / "log4j2-222.properties")               # another process, same launch
    argv2, env2 = DirectLaunch({"log4j": later_props}, path=cache).command(
        _submit(spark_home, later_props), env)
    assert argv2 == [a.replace(props, later_props) for a in argv]
    assert env2["SPARK_SCALA_VERSION"] == "2.13" and "STATEKIT_GONE" not in env2
    assert {k: v for k, v in env2.items() if k != "SPARK_SCALA_VERSION"} == {
        k: v for k, v in env.items() if k != "STATEKIT_GONE"}


@pytest.mark.parametrize("change", ["argument", "spark variable", "bin file", "conf file", "jars",
                                    "spark-env.sh"])
def test_anything_spark_submit_reads_that_differs_goes_through_spark_submit(
        tmp_path, spark_home, jvm_stand_in, change):
    proc, props, _, env = jvm_stand_in
    cache = str(tmp_path / "launch.json")
    DirectLaunch({"log4j": props}, path=cache).learn(_submit(spark_home, props), env, proc.pid)
    assert DirectLaunch({"log4j": props}, path=cache).command(_submit(spark_home, props), env)
    submit = _submit(spark_home, props)
    if change == "argument":
        submit[2] = "spark.app.name=y"
    elif change == "spark variable":
        env["SPARK_DAEMON_MEMORY"] = "2g"
    elif change == "bin file":
        (spark_home / "bin" / "spark-submit").write_text("#!/bin/sh\necho changed\n")
    elif change == "conf file":
        (spark_home / "conf" / "spark-defaults.conf").write_text("spark.driver.memory 2g\n")
    elif change == "jars":
        (spark_home / "jars" / "extra.jar").write_bytes(b"")
        os.utime(spark_home / "jars", ns=(1, 1))
    else:   # a script whose exports may differ at each run: never learned, never used
        (spark_home / "conf" / "spark-env.sh").write_text("export SPARK_LOCAL_IP=$(hostname -i)\n")
        cache_before = open(cache).read()
        DirectLaunch({"log4j": props}, path=cache).learn(submit, env, proc.pid)
        assert open(cache).read() == cache_before
    assert DirectLaunch({"log4j": props}, path=cache).command(submit, env) is None


def test_a_cache_another_user_could_write_is_not_trusted_and_a_failed_command_is_forgotten(
        tmp_path, spark_home, jvm_stand_in):
    proc, props, _, env = jvm_stand_in
    cache = tmp_path / "launch.json"
    launch = DirectLaunch({"log4j": props}, path=str(cache))
    launch.learn(_submit(spark_home, props), env, proc.pid)
    assert len(json.loads(cache.read_text())) == 1
    os.chmod(cache, 0o666)
    assert launch.command(_submit(spark_home, props), env) is None
    os.chmod(cache, 0o644)
    assert launch.command(_submit(spark_home, props), env) is not None
    launch.forget()                          # that command did not start a JVM
    assert json.loads(cache.read_text()) == {}
    assert launch.command(_submit(spark_home, props), env) is None


START = r"""
import json, os, sys
sys.path.insert(0, {root!r})
from statekit.engine.spark import session
spark = session.get_session()
rows = spark.range(5).count()
direct = session._OWNED.launched_directly
session.stop_session()
print(json.dumps({{"rows": rows, "direct": direct}}))
"""


def test_a_second_process_starts_its_jvm_without_spark_submit(tmp_path):
    """Processes start a session one after the other: the first through spark-submit, whose
    command it keeps; the second with that command, and Spark runs on it. A kept command that no
    longer starts a JVM (here: a heap too small for Java to start) is tried once, then Spark
    starts through spark-submit and the command is learned again."""
    cache = tmp_path / "launch.json"
    env = dict(os.environ, STATEKIT_SPARK_LAUNCH_CACHE=str(cache), PYSPARK_PYTHON=sys.executable)

    def start() -> dict:
        out = subprocess.run([sys.executable, "-c", START.format(root=ROOT)], env=env,
                             capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        return json.loads(out.stdout.strip().splitlines()[-1])

    assert [start(), start()] == [{"rows": 5, "direct": False}, {"rows": 5, "direct": True}]
    ((key, entry),) = json.loads(cache.read_text()).items()
    assert os.path.basename(entry["argv"][0]).startswith("java")
    assert "org.apache.spark.deploy.SparkSubmit" in entry["argv"]

    at = entry["argv"].index("org.apache.spark.deploy.SparkSubmit")   # the last heap option wins
    broken = dict(entry, argv=[*entry["argv"][:at], "-Xmx1k", *entry["argv"][at:]])
    cache.write_text(json.dumps({key: broken}))
    assert start() == {"rows": 5, "direct": False}
    assert json.loads(cache.read_text()) == {key: entry}
