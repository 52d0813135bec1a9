"""The class archive is mapped only by the Java that wrote it (``engine.spark.jvm``), and ``make``
writes it again once another Java did (``scripts/spark_cds.py --if-stale``): Java ignores another
build's archive, so after a JDK update every JVM would start without it (7.5 s to a first output here
instead of ~5), said only in its log."""
from __future__ import annotations

import importlib.util
import logging
import os
import shutil
import subprocess
import sys

import pytest

from statekit.engine.spark import jvm

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
THIS_JAVA = '/opt/jdk-17.0.16/bin/java\nopenjdk version "17.0.16" 2025-07-15'
UPDATED_AWAY = '/opt/jdk-17.0.15/bin/java\nopenjdk version "17.0.15" 2025-04-15'


def _spark_cds():
    spec = importlib.util.spec_from_file_location("spark_cds", os.path.join(ROOT, "scripts", "spark_cds.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def _note(archive, identity: str) -> str:
    path = jvm.archive_java_path(str(archive))
    with open(path, "w", encoding="utf-8") as f:
        f.write(identity)
    return path


@pytest.fixture
def archive(tmp_path, monkeypatch):
    path = tmp_path / "spark.jsa"
    path.write_bytes(b"classes")
    monkeypatch.setenv("STATEKIT_SPARK_CDS", str(path))
    monkeypatch.setattr(jvm, "java_identity", lambda: THIS_JAVA)
    return path


def test_an_archive_is_mapped_only_by_the_java_that_wrote_it(archive, caplog):
    assert jvm.built_class_archive() is None            # nothing says which Java wrote it
    _note(archive, THIS_JAVA)
    assert jvm.built_class_archive() == str(archive)
    assert f"-XX:SharedArchiveFile={archive} " in jvm.jvm_options(jvm.built_class_archive()) + " "
    _note(archive, UPDATED_AWAY)                        # the JDK was updated since
    with caplog.at_level(logging.INFO, logger="statekit.spark"):
        assert jvm.built_class_archive() is None
    said = [r.getMessage() for r in caplog.records if r.name == "statekit.spark"]
    assert len(said) == 1 and "written by another Java" in said[0] and "make" in said[0], said
    assert "-XX:SharedArchiveFile" not in jvm.jvm_options(jvm.built_class_archive())
    assert archive.exists()                             # left for make to replace


def test_make_writes_the_archive_again_only_when_another_java_wrote_it(archive, monkeypatch, capsys):
    cds = _spark_cds()
    wrote = []
    monkeypatch.setattr(cds, "write", lambda final, identity, opts: wrote.append((final, identity)) or 0)
    note = _note(archive, THIS_JAVA)
    assert cds.main(["--if-stale"]) == 0
    assert wrote == [] and archive.exists() and capsys.readouterr().out == ""   # this Java's
    _note(archive, UPDATED_AWAY)
    assert cds.main(["--if-stale"]) == 0
    assert wrote == [(str(archive), THIS_JAVA)]
    out = capsys.readouterr().out.strip().splitlines()
    assert len(out) == 1 and "not written by this Java" in out[0], out
    # the stale one is gone before the new one is written: a write that fails is not tried again
    # at every make (and no JVM maps the stale one meanwhile)
    assert not archive.exists() and not os.path.exists(note)
    wrote.clear()
    assert cds.main(["--if-stale"]) == 0 and wrote == []   # none at all: make's install writes it


@pytest.mark.slow
def test_after_a_jdk_update_make_writes_an_archive_for_this_java(tmp_path):
    """The real thing: a Spark session run with -XX:ArchiveClassesAtExit, then the note."""
    good = jvm.built_class_archive()
    if good is None:
        pytest.skip("no class archive for this Java (make writes it)")
    mine = tmp_path / "spark.jsa"
    shutil.copyfile(good, mine)
    note = _note(mine, UPDATED_AWAY)
    env = dict(os.environ, STATEKIT_SPARK_CDS=str(mine))
    r = subprocess.run([sys.executable, os.path.join("scripts", "spark_cds.py"), "--if-stale"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    out = r.stdout.strip().splitlines()
    assert len(out) == 2 and "not written by this Java" in out[0], out
    assert out[1].startswith(f"class archive for Spark: {mine} ("), out
    with open(note, encoding="utf-8") as f:
        assert f.read() == jvm.java_identity()
    assert mine.stat().st_size > 50 << 20
