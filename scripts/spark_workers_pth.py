"""Write `statekit-spark-workers.pth` into this environment's site-packages.

Spark starts every Python process it needs (the workers' daemon, a streaming source's runner, the
planners of a Python data source) with `$SPARK_HOME/python/lib/pyspark.zip` first on PYTHONPATH.
Python cannot cache bytecode for a module imported from a zip, so each of those processes compiles
pyspark from source: about 0.65 s of CPU more than importing the same pyspark from site-packages
(0.94 s against 0.29 s here), paid on the path of every query start. With pip's pyspark the zip
holds the same files as site-packages, so the .pth drops the zips from `sys.path` at start-up and
Python imports the installed, compiled copy. Spark also puts its `spark-core` jar on that path
(for a Spark whose jar carries pyspark; pip's holds no Python, only its ~6,000 classes): Python
read that jar's directory once for every import it searched there, again at pyspark's
`importlib.invalidate_caches()` (each process's first task) and again for every
`importlib.metadata.version()` (crc32c's, at its import): ~0.1 s of CPU per process, ~0.3 s in
a launch. The .pth drops pip's jars too, from `sys.path` and from the finders Python cached for
them before the .pth ran.

Its second line acts in Spark's streaming source runner alone: that process then imports pyspark's
runner without pyarrow, which statekit's source never needs there (statekit/engine/spark/
lean_runner.py: about 30 MB and 0.1 s of start less per running query).

Its third acts only in a process whose environment names a fork server (the JVM of a local
session statekit started): a Python process Spark starts for its driver (a planner daemon, a
source's runner, the workers' daemon) then has the server run its module in a child that has
imported it already, and stands in for that child (statekit/engine/spark/fork_server.py).
Nothing else is touched.
"""
import os
import sys
import sysconfig

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
from statekit.engine.spark.lean_runner import RUNNER  # noqa: E402 - standard library only

# (site runs a .pth line with its own globals: the comprehensions may name only `sys` and `p`)
LINE = ('import sys; [(sys.path.remove(p), sys.path_importer_cache.pop(p, None)) for p in '
        '[p for p in sys.path if (p.endswith(".zip") and "/pyspark/python/lib/" in '
        'p.replace("\\\\", "/")) or (p.endswith(".jar") and "/pyspark/jars/" in '
        'p.replace("\\\\", "/"))]]\n')
# Spark's streaming source runner only: pyspark's runner without pyarrow (engine/spark/lean_runner.py)
LEAN = (f'import sys; "{RUNNER}" in sys.orig_argv[1:3] '
        'and __import__("statekit.engine.spark.lean_runner", fromlist=["install"]).install()\n')

# a local session's Python processes, forked from one that has imported them (engine/spark/fork_server.py)
FORK = ('import os; os.environ.get("STATEKIT_FORK_SERVER") and '
        '__import__("statekit.engine.spark.fork_server", fromlist=["hand_over"]).hand_over()\n')


def main() -> int:
    site = sysconfig.get_paths()["purelib"]
    if not os.path.isdir(os.path.join(site, "pyspark")):
        print(f"no pyspark in {site}: nothing to do", file=sys.stderr)
        return 0
    path = os.path.join(site, "statekit-spark-workers.pth")
    with open(path, "w") as f:
        f.write(LINE + LEAN + FORK)
    return 0


if __name__ == "__main__":
    sys.exit(main())
