"""The cluster tests' standalone cluster: ``statekit.engine.spark.standalone`` (shared with
``bench/cluster.py`` and the cluster notebook)."""
from statekit.engine.spark.standalone import ClusterError, StandaloneCluster, cmdline, descendants

__all__ = ["ClusterError", "StandaloneCluster", "cmdline", "descendants"]
