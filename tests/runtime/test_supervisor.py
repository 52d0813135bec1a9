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


def test_a_busy_machine_defers_the_replacement_until_it_is_quiet(clean_spares, monkeypatch):
    """While the machine is busy (an app starting) the replacement waits, at most
    REPLACE_WITHIN_S; once it is quiet, it starts."""
    monkeypatch.setattr(supervisor, "REPLACE_AFTER_S", 0.1)
    monkeypatch.setattr(supervisor, "REPLACE_WITHIN_S", 60.0)
    busy = {"now": True}
    monkeypatch.setattr(supervisor, "_busy_since", lambda mark: 0.95 if busy["now"] else 0.1)
    supervisor.warm()
    taken = supervisor.SPARES.take()
    try:
        time.sleep(1.0)                                   # ten looks, all busy
        assert supervisor.spares() == []
        busy["now"] = False
        deadline = time.monotonic() + 30
        while not supervisor.spares() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(supervisor.spares()) == 1
    finally:
        taken.stdin.close()
        taken.wait(timeout=30)


def test_a_machine_busy_for_good_gets_its_replacement_after_the_longest_wait(clean_spares,
                                                                              monkeypatch):
    monkeypatch.setattr(supervisor, "REPLACE_AFTER_S", 0.1)
    monkeypatch.setattr(supervisor, "REPLACE_WITHIN_S", 1.0)
    monkeypatch.setattr(supervisor, "_busy_since", lambda mark: 1.0)
    supervisor.warm()
    taken = supervisor.SPARES.take()
    t0 = time.monotonic()
    try:
        deadline = t0 + 30
        while not supervisor.spares() and time.monotonic() < deadline:
            time.sleep(0.05)
        waited = time.monotonic() - t0
        assert len(supervisor.spares()) == 1 and waited >= 0.8, waited
    finally:
        taken.stdin.close()
        taken.wait(timeout=30)


def test_the_machines_busy_share_is_read_from_proc_stat():
    mark = supervisor._cpu_times()
    if mark is None:
        pytest.skip("no /proc/stat")
    end = time.monotonic() + 0.3
    while time.monotonic() < end:   # this process keeps a core busy
        pass
    assert 0.0 < supervisor._busy_since(mark) <= 1.0
