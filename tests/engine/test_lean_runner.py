"""Spark's streaming source runner imports pyspark's runner without pyarrow (engine/spark/
lean_runner.py, installed by the venv's statekit-spark-workers.pth), and a reader that does return
rows still gets the real conversion."""
import os
import socket
import struct
import subprocess
import sys
import textwrap

from statekit.engine.spark.lean_runner import RUNNER


def _maps(pid: int) -> str:
    with open(f"/proc/{pid}/maps") as f:
        return f.read()


def test_the_runner_spark_starts_maps_neither_pyarrow_nor_numpy(tmp_path):
    """Started as Spark starts it (``python -m RUNNER``, connecting back to a socket in its
    environment), the runner is past its imports once it has said its pid."""
    path = str(tmp_path / "factory.sock")
    server = socket.socket(socket.AF_UNIX)
    server.bind(path)
    server.listen(1)
    env = dict(os.environ, PYTHON_WORKER_FACTORY_SOCK_PATH=path)
    env.pop("PYTHON_WORKER_FACTORY_SECRET", None)
    proc = subprocess.Popen([sys.executable, "-m", RUNNER], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        server.settimeout(60)
        conn, _ = server.accept()
        with conn:
            conn.settimeout(60)
            (pid,) = struct.unpack("!i", conn.recv(4, socket.MSG_WAITALL))
            assert pid == proc.pid
            maps = _maps(proc.pid)
            assert "/pyarrow/" not in maps, "the runner imported pyarrow: is the venv's " \
                                            "statekit-spark-workers.pth there? (make venv)"
            assert "/numpy" not in maps
    finally:
        server.close()
        proc.kill()
        proc.communicate(timeout=30)


def test_the_stand_in_hands_a_rows_reader_the_real_conversion():
    code = textwrap.dedent(f"""
        import sys
        from statekit.engine.spark.lean_runner import install, HEAVY
        print(install(), install())                        # once only
        import {RUNNER} as runner
        print("pyarrow" in sys.modules)
        from pyspark.sql.types import StructType, StructField, LongType, StringType
        schema = StructType([StructField("n", LongType()), StructField("s", StringType())])
        batches = list(runner.records_to_arrow_batches(iter([(1, "a"), (2, "b")]), 10, schema, None))
        print("pyarrow" in sys.modules, type(sys.modules[HEAVY]).__name__)
        print(sum(b.num_rows for b in batches), batches[0].column(1).to_pylist())
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split("\n")[:4] == ["True False", "False", "True module", "2 ['a', 'b']"]
