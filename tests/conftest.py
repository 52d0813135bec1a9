"""Shared fixtures: every server a test needs is started here on an ephemeral port and stopped
afterwards, even when the test fails."""
from __future__ import annotations

import os
import sys

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)


@pytest.fixture
def broker(tmp_path):
    """A fresh embedded broker for one test."""
    from statekit import broker as broker_mod

    handle = broker_mod.start(dir=str(tmp_path / "broker"), port=0)
    try:
        yield handle
    finally:
        handle.stop()


@pytest.fixture(scope="session")
def shared_broker(tmp_path_factory):
    """One embedded broker for a whole session, for tests that only need distinct topic names."""
    from statekit import broker as broker_mod

    handle = broker_mod.start(dir=str(tmp_path_factory.mktemp("shared-broker")), port=0)
    try:
        yield handle
    finally:
        handle.stop()
