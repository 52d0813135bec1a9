"""`StandaloneCluster.stop()` leaves no `/tmp/statekit-cluster-*` behind: a cluster made without a
root works in a temporary directory of its own and removes it; a root it was given stays (the
caller's, e.g. a test's tmp_path)."""
from __future__ import annotations

import os

from statekit.engine.spark.standalone import StandaloneCluster


def test_a_cluster_without_a_root_removes_its_own_directory_at_stop(tmp_path):
    own = StandaloneCluster(workers=1)
    assert os.path.isdir(own.root) and os.path.basename(own.root).startswith("statekit-cluster-")
    open(os.path.join(own.root, "master.log"), "w").close()
    assert own.stop(grace=1) == []
    assert not os.path.exists(own.root)
    given = StandaloneCluster(str(tmp_path / "c"), workers=1)
    os.makedirs(given.root)
    given.stop(grace=1)
    assert os.path.isdir(given.root)
