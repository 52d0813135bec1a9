"""The salts of the executors placement: task p's salt lands in Spark hash partition p, so each
partition of the stateful operator that keeps tasks on their executors holds exactly one task."""
from __future__ import annotations

import pytest

from statekit.engine.spark.salt import salts, spark_hash_int


def test_salts_are_distinct_and_cover_every_partition():
    for n in (1, 2, 3, 4, 8, 16, 64):
        s = salts(n)
        assert len(s) == n and len(set(s)) == n and all(v >= 0 for v in s)


@pytest.mark.spark
def test_python_murmur3_matches_spark_hash(spark):
    from pyspark.sql import functions as F

    rows = spark.range(-50, 2000).select(F.col("id").cast("int").alias("v"),
                                         F.hash(F.col("id").cast("int")).alias("h")).collect()
    assert all(spark_hash_int(r.v) == r.h for r in rows)


@pytest.mark.spark
@pytest.mark.parametrize("n", [3, 8])
def test_each_hash_partition_holds_exactly_one_task(spark, n):
    from pyspark.sql import functions as F

    s = salts(n)
    salt = F.element_at(F.array(*[F.lit(v) for v in s]), F.col("task") + 1)   # as the placement
    df = (spark.range(0, 5000).select((F.col("id") % n).cast("int").alias("task"))
          .withColumn("salt", salt)
          .repartition(n, "salt")
          .select("task", F.spark_partition_id().alias("pid")))
    pairs = {(r.task, r.pid) for r in df.distinct().collect()}
    assert pairs == {(t, t) for t in range(n)}
