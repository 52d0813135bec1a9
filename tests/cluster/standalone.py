"""The cluster tests' standalone cluster: ``statekit.engine.spark.standalone`` (shared with
``bench/cluster.py`` and the cluster notebook)."""
from statekit.engine.spark.procs import cmdline, descendants
from statekit.engine.spark.standalone import ClusterError, StandaloneCluster

__all__ = ["ClusterError", "StandaloneCluster", "cmdline", "descendants"]
