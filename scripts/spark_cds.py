"""Write the JVM class-data archive of Spark's classes for this venv (`statekit-spark.jsa`).

A JVM that maps the classes it loaded in an earlier run (Java's dynamic CDS archive) starts Spark
in about half the time and CPU: 3.4 s instead of 6.1 s to a session here, 7 s of CPU instead of 11,
for every notebook's kernel and every test that starts Spark. This runs a small session once with
`-XX:ArchiveClassesAtExit` (a batch job and a streaming query, as statekit runs them), and moves
the archive into place only once that JVM has exited cleanly; `engine.spark.session` maps it when
it is there (and starts without it, setting it aside, if the JVM does not start with it).
Without Java, or if anything fails, it says so in one line and changes nothing.
"""
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
stop_session(jvm_exit_timeout=540)   # the JVM writes the archive as it exits: 15 s here, idle
"""


def main() -> int:
    sys.path.insert(0, ROOT)
    from statekit.engine.spark.session import JAVA_OPTS, class_archive

    if shutil.which("java") is None and not os.environ.get("JAVA_HOME"):
        print("no Java: no class archive for Spark (it starts without one)", file=sys.stderr)
        return 0
    final = class_archive()
    work = tempfile.mkdtemp(prefix="statekit-cds-")
    tmp = os.path.join(work, "spark.jsa")
    env = dict(os.environ, STATEKIT_SPARK_JAVA_OPTS=f"{JAVA_OPTS} -XX:ArchiveClassesAtExit={tmp}")
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
