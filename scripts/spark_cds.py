"""Write the JVM class-data archive of Spark's classes for this venv (`statekit-spark.jsa`).

A JVM that maps the classes it loaded in an earlier run (Java's dynamic CDS archive) starts Spark
in about half the time and CPU: 3.4 s instead of 6.1 s to a session here, 7 s of CPU instead of 11,
for every notebook's kernel and every test that starts Spark. This runs a small session once with
`-XX:ArchiveClassesAtExit` (a batch job and a streaming query, as statekit runs them), and moves
the archive into place only once that JVM has exited cleanly; `engine.spark.session` maps it when
it is there (and starts without it, setting it aside, if the JVM does not start with it).
Java maps an archive only for the build that wrote it, so the file beside it
(`statekit-spark.jsa.java`) names that Java. `--if-stale` (every `make` target that runs
Spark): nothing to do unless an archive is there that another Java wrote (a JDK update, another
`JAVA_HOME`); then it writes one for this Java.
Without Java, or if anything fails, it says so in one line and changes nothing.
"""
import contextlib
import os
import shutil
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

WORKLOAD = r"""
import sys, time
sys.path.insert(0, {root!r})
from statekit.engine.spark.session import get_session, stop_session
spark = get_session("statekit-cds")
spark.range(100).selectExpr("id % 3 as k").groupBy("k").count().collect()
def ident(batches):
    yield from batches
q = (spark.readStream.format("rate").option("rowsPerSecond", 50).load()
     .mapInArrow(ident, "timestamp timestamp, value long").writeStream.format("noop")
     .option("checkpointLocation", {ckpt!r}).trigger(processingTime="200 milliseconds").start())
deadline = time.time() + 60
while time.time() < deadline and len(q.recentProgress) < 3:
    time.sleep(0.2)
from statekit.engine.spark.session_extensions import apply_ml_extension
apply_ml_extension(spark)   # the ML extension statekit applies after a launch: its classes too
stop_session(jvm_exit_timeout=540)   # the JVM writes the archive as it exits: 15 s here, idle
"""


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    sys.path.insert(0, ROOT)
    from statekit.engine.spark import jvm

    identity = jvm.java_identity()
    final = jvm.class_archive()
    if "--if-stale" in argv:
        if identity is None or not os.path.isfile(final) or jvm.archive_fits_java(final):
            return 0     # no Java (make's java target says so), never written, or this Java's
        print(f"the class archive for Spark was not written by this Java ({jvm.java_binary()}): "
              f"writing a new one (a minute at most) ...", flush=True)
        os.remove(final)          # not tried again at every make if this one fails
        with contextlib.suppress(OSError):
            os.remove(jvm.archive_java_path(final))
    if identity is None:
        print("no Java: no class archive for Spark (it starts without one)", file=sys.stderr)
        return 0
    return write(final, identity, jvm.JAVA_OPTS)


def write(final: str, identity: str, java_opts: str) -> int:
    from statekit.engine.spark import jvm

    work = tempfile.mkdtemp(prefix="statekit-cds-")
    tmp = os.path.join(work, "spark.jsa")
    env = dict(os.environ, STATEKIT_SPARK_JAVA_OPTS=f"{java_opts} -XX:ArchiveClassesAtExit={tmp}")
    env.pop("STATEKIT_SPARK_CDS", None)
    try:
        code = WORKLOAD.format(root=ROOT, ckpt=os.path.join(work, "ckpt"))
        r = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True,
                           timeout=600)
        if r.returncode != 0 or not os.path.isfile(tmp) or os.path.getsize(tmp) == 0:
            last = (r.stderr.strip().splitlines() or [
                f"exit code {r.returncode}, no output: the JVM ended before it wrote the archive"])[-1]
            print(f"the class archive for Spark was not written ({last}); Spark starts without it",
                  file=sys.stderr)
            return 0
        shutil.copyfile(tmp, final + ".part")     # then a rename: never a half-written archive
        note = jvm.archive_java_path(final)       # the Java that wrote it, then the archive
        with open(note + ".part", "w", encoding="utf-8") as f:
            f.write(identity)
        os.replace(note + ".part", note)
        os.replace(final + ".part", final)
        print(f"class archive for Spark: {final} ({os.path.getsize(final) >> 20} MB)")
        return 0
    except (OSError, subprocess.SubprocessError) as exc:
        print(f"the class archive for Spark was not written ({exc}); Spark starts without it",
              file=sys.stderr)
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
