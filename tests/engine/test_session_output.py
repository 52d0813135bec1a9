"""Starting Spark from statekit prints nothing to the terminal or the notebook cell that started
it: the JVM's stderr (banner, warnings, Python workers' prints) goes to a log file."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys

import pytest

pytestmark = pytest.mark.spark

CODE = """
import os
from statekit.engine.spark.session import get_session, jvm_stderr_path, stop_session
spark = get_session()
try:
    assert spark.range(3).count() == 3
    print(jvm_stderr_path())
finally:
    stop_session()
"""


def test_the_jvm_writes_to_its_log_file_not_to_our_stderr(tmp_path):
    env = {**os.environ, "TMPDIR": str(tmp_path)}  # log_dir() under tmp_path: this run's files only
    proc = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, env=env,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stderr.strip() == "", proc.stderr[-2000:]
    path = proc.stdout.strip().splitlines()[-1]
    assert path.startswith(str(tmp_path)) and os.path.basename(path).startswith("jvm-stderr-")
    with open(path) as f:
        jvm_said = f.read()
    assert "Setting default log level" in jvm_said  # the banner went there


def test_spark_python_workers_import_the_installed_pyspark_not_its_zip(spark):
    """Spark puts pyspark.zip first on its Python workers' path; a module imported from a zip is
    compiled from source in every new process (scripts/spark_workers_pth.py). The venv's .pth
    makes them import the compiled copy in site-packages: a worker's pyspark and py4j are the
    driver's files."""
    import py4j
    import pyspark

    def where(batches):
        import pandas as pd
        import py4j as p4
        import pyspark as ps

        for _ in batches:
            yield pd.DataFrame({"pyspark": [ps.__file__], "py4j": [p4.__file__]})

    row = spark.range(1).mapInPandas(where, "pyspark string, py4j string").collect()[0]
    assert (row.pyspark, row.py4j) == (pyspark.__file__, py4j.__file__)
    assert ".zip" not in row.pyspark


def test_spark_python_workers_do_not_search_sparks_jars(spark):
    """Spark also puts its spark-core jar on its Python processes' path (pip's holds no Python):
    Python re-read its ~6,000-entry directory at every cache invalidation and metadata lookup
    (scripts/spark_workers_pth.py). The .pth drops it from the path and from the cached finders;
    Spark did put it there, in the worker's environment."""
    def look(batches):
        import os
        import sys

        import pandas as pd

        for _ in batches:
            jars = [p for p in sys.path + list(sys.path_importer_cache) if p.endswith(".jar")]
            given = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep)
                     if p.endswith(".jar")]
            yield pd.DataFrame({"jars": [repr(jars)], "given": [len(given)]})

    row = spark.range(1).mapInPandas(look, "jars string, given long").collect()[0]
    assert row.given >= 1           # what the .pth is for: Spark still hands the jar over
    assert row.jars == "[]"


def test_spark_python_workers_fork_with_statekits_imports_done_and_frozen(spark):
    """A local session's workers come from statekit's daemon (worker_daemon.py): statekit's
    modules are there before the worker's first task, imported by the daemon; pyarrow is imported
    by the worker before that task; both are out of the collections pyspark's daemon runs after
    each task. The daemon maps neither pyarrow nor pandas: it outlives its workers, and the
    instances placement's stage never uses pandas."""
    from statekit.engine.spark.session import map_in_arrow

    def look(batches):
        import gc
        import os
        import sys

        pa = sys.modules.get("pyarrow")
        with open(f"/proc/{os.getppid()}/maps") as f:     # the daemon that forked this worker
            daemon = f.read()
        unfrozen = {id(o) for o in gc.get_objects()}     # frozen objects are not among them
        for _ in batches:
            yield pa.RecordBatch.from_pydict({
                "daemon": [sys.argv[0]], "frozen": [gc.get_freeze_count()],
                "exchange": ["statekit.worker.exchange" in sys.modules],
                "exchange_frozen": [id(sys.modules["statekit.worker.exchange"]) not in unfrozen],
                "pyarrow_frozen": [pa is not None and id(pa) not in unfrozen],
                "daemon_pyarrow": ["/pyarrow/" in daemon], "daemon_pandas": ["/pandas/" in daemon]})

    rows = map_in_arrow(spark.range(4).repartition(2), look,
                        "daemon string, frozen long, exchange boolean, exchange_frozen boolean, "
                        "pyarrow_frozen boolean, daemon_pyarrow boolean, daemon_pandas boolean"
                        ).collect()
    assert len(rows) == 2
    for row in rows:
        assert row.daemon.endswith(os.path.join("statekit", "engine", "spark", "worker_daemon.py"))
        assert row.exchange and row.exchange_frozen and row.pyarrow_frozen, row
        assert not row.daemon_pyarrow and not row.daemon_pandas and row.frozen > 20_000, row


def test_a_damaged_class_archive_is_set_aside_and_spark_starts_without_it(tmp_path):
    """The JVM maps the venv's class archive (scripts/spark_cds.py) when it is there; a truncated
    one stops that JVM at its start (SIGBUS here): the session sets it aside, says so in one
    line, and starts without it."""
    from statekit.engine.spark.jvm import archive_java_path, built_class_archive

    good = built_class_archive()
    if good is None:
        pytest.skip("no class archive for this Java (make writes it)")
    bad = tmp_path / "spark.jsa"
    with open(good, "rb") as src:
        bad.write_bytes(src.read(1 << 20))
    shutil.copyfile(archive_java_path(good), archive_java_path(str(bad)))   # this Java's
    env = dict(os.environ, STATEKIT_SPARK_CDS=str(bad))
    r = subprocess.run([sys.executable, "-c", CODE], capture_output=True, text=True, timeout=300,
                       env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert not bad.exists() and (tmp_path / "spark.jsa.bad").exists()
    lines = [ln for ln in r.stderr.splitlines() if ln.strip()]
    assert len(lines) == 1 and "spark.jsa.bad" in lines[0] and "started without it" in lines[0], lines


BAD_MASTER = """
from statekit.engine.spark.session import get_session
try:
    get_session(master="nowhere://at-all")
except Exception as exc:
    print(type(exc).__name__, "|", exc)
"""


def test_a_failed_start_with_a_bad_master_keeps_the_class_archive(tmp_path):
    """A start that fails for a reason of its own (here a master URL Spark cannot parse) is not
    the archive's fault: the archive stays where it is, nobody is told about it, and the failure
    is one line."""
    from statekit.engine.spark.jvm import archive_java_path, built_class_archive

    good = built_class_archive()
    if good is None:
        pytest.skip("no class archive for this Java (make writes it)")
    mine = tmp_path / "spark.jsa"
    with open(good, "rb") as src:
        mine.write_bytes(src.read())
    shutil.copyfile(archive_java_path(good), archive_java_path(str(mine)))
    env = dict(os.environ, STATEKIT_SPARK_CDS=str(mine), TMPDIR=str(tmp_path))
    r = subprocess.run([sys.executable, "-c", BAD_MASTER], capture_output=True, text=True, timeout=300,
                       env=env)
    assert r.returncode == 0, r.stderr[-2000:]
    assert mine.exists() and not (tmp_path / "spark.jsa.bad").exists()
    assert "class archive" not in r.stderr, r.stderr[-2000:]
    said = r.stdout.strip().splitlines()
    assert len(said) == 1 and said[0].startswith("SparkFailure | Spark did not start"), said
