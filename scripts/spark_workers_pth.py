"""Write `statekit-spark-workers.pth` into this environment's site-packages.

Spark starts every Python process it needs (the workers' daemon, a streaming source's runner, the
planners of a Python data source) with `$SPARK_HOME/python/lib/pyspark.zip` first on PYTHONPATH.
Python cannot cache bytecode for a module imported from a zip, so each of those processes compiles
pyspark from source: about 0.65 s of CPU more than importing the same pyspark from site-packages
(0.94 s against 0.29 s here), paid on the path of every query start. With pip's pyspark the zip
holds the same files as site-packages, so the .pth drops the zips from `sys.path` at start-up and
Python imports the installed, compiled copy. It touches nothing else.
"""
import os
import sys
import sysconfig

LINE = ('import sys; sys.path[:] = [p for p in sys.path if not (p.endswith(".zip") and '
        '"/pyspark/python/lib/" in p.replace("\\\\", "/"))]\n')


def main() -> int:
    site = sysconfig.get_paths()["purelib"]
    if not os.path.isdir(os.path.join(site, "pyspark")):
        print(f"no pyspark in {site}: nothing to do", file=sys.stderr)
        return 0
    path = os.path.join(site, "statekit-spark-workers.pth")
    with open(path, "w") as f:
        f.write(LINE)
    return 0


if __name__ == "__main__":
    sys.exit(main())
