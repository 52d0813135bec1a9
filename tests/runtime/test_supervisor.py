"""The supervisor keeps one spare instance process, whatever the apps ask for: a spare costs the
memory of an idle instance, and a shared server runs many kernels."""
from __future__ import annotations

import time

import pytest

from statekit.runtime import supervisor


@pytest.fixture
def clean_spares():
    supervisor.SPARES.close()
    try:
        yield
    finally:
        supervisor.SPARES.close()


def test_one_spare_whatever_the_number_of_instances(clean_spares, tmp_path):
    import statekit

    statekit.App("three", bootstrap="127.0.0.1:1", instances=3, state_dir=str(tmp_path / "a"))
    statekit.App("four", bootstrap="127.0.0.1:1", instances=4, state_dir=str(tmp_path / "b"))
    assert len(supervisor.spares()) == 1


def test_a_spare_taken_is_replaced_by_one(clean_spares, monkeypatch):
    monkeypatch.setattr(supervisor, "REPLACE_AFTER_S", 0.1)
    supervisor.warm()
    first = supervisor.spares()
    taken = supervisor.SPARES.take()
    try:
        assert [taken.pid] == first
        assert supervisor.SPARES.take() is None          # none left until the replacement
        deadline = time.monotonic() + 30
        while not supervisor.spares() and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(0.3)                                   # a second replacement would show now
        again = supervisor.spares()
        assert len(again) == 1 and again != first
    finally:
        taken.stdin.close()
        taken.wait(timeout=30)
