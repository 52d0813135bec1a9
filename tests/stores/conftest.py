"""Fixtures for the store tests: a task db on either backend, closed after the test."""
from __future__ import annotations

import pytest

from statekit.stores import RecordingSink, StoreSpec, build_stores


@pytest.fixture(params=["rocksdb", "memory"])
def backend(request):
    return request.param


@pytest.fixture
def make_task(tmp_path):
    """make_task(*specs, cache_bytes=..., sink=...) -> (stores, db, sink); closes every db after."""
    opened = []

    def make(*specs, cache_bytes=1 << 20, sink=None, task_dir=None):
        sink = RecordingSink() if sink is None else sink
        stores, db = build_stores(list(specs), str(task_dir or tmp_path / "task"), sink,
                                  cache_bytes=cache_bytes, sync=False)
        opened.append(db)
        return stores, db, sink

    yield make
    for db in opened:
        db.close()
