"""The store under the API, in-process: a write that fails changes nothing (50001), not even after
a restart, and concurrent registrations agree on one id."""
from __future__ import annotations

import json
import os
import threading

import pytest

from statekit.registry import errors as E
from statekit.registry.store import SchemaStore


def _body(i: int = 0) -> dict:
    """Schema i of a line of compatible ones (each adds a field with a default)."""
    fields = [{"name": "a", "type": "int"}] + [{"name": f"f{k}", "type": "int", "default": 0} for k in range(i)]
    return {"schema": json.dumps({"type": "record", "name": "R", "fields": fields})}


def test_a_failed_write_changes_nothing(tmp_path, monkeypatch):
    store = SchemaStore(str(tmp_path))
    try:
        assert store.register("s", _body(1))["id"] == 1
        before = (json.dumps(store.subjects, sort_keys=True), dict(store.schemas), store.next_id)
        size = os.path.getsize(store.path)

        def full_disk(fd):
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(os, "fsync", full_disk)
        for call in (lambda: store.register("s", _body(2)), lambda: store.delete_subject("s"),
                     lambda: store.set_config("s", {"compatibility": "NONE"})):
            with pytest.raises(E.RestError) as err:
                call()
            assert (err.value.status, err.value.code) == (500, 50001)
            assert "No space left on device" in err.value.message
        assert (json.dumps(store.subjects, sort_keys=True), dict(store.schemas), store.next_id) == before
        assert os.path.getsize(store.path) == size  # nothing a restart could bring back
        monkeypatch.undo()
        assert store.register("s", _body(2))["version"] == 2  # the disk is back: it goes on
    finally:
        store.close()
    again = SchemaStore(str(tmp_path))
    try:
        assert again.list_versions("s") == [1, 2] and again.level("s") == "BACKWARD"
    finally:
        again.close()


def test_concurrent_registrations_agree_on_one_id(tmp_path):
    store = SchemaStore(str(tmp_path))
    try:
        ids, errors = [], []

        def work(n):
            try:
                ids.append(store.register(f"sub-{n}", _body(7))["id"])
            except Exception as e:  # pragma: no cover - the assertion below shows it
                errors.append(e)

        threads = [threading.Thread(target=work, args=(n,)) for n in range(8)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert errors == [] and ids == [1] * 8
        assert store.schema_subjects("1") == [f"sub-{n}" for n in range(8)]
    finally:
        store.close()


def test_a_registry_stops_at_once_however_seldom_it_polls(tmp_path):
    """An idle registry wakes seldom (``IDLE_POLL_S``); stopping it does not wait for its next
    poll: its own connection wakes the serving loop."""
    import threading
    import urllib.request

    from statekit.registry.api import RegistryServer
    from statekit.registry.store import SchemaStore

    store = SchemaStore(str(tmp_path))
    server = RegistryServer(store, "127.0.0.1", 0)
    serving = threading.Thread(target=server.serve_forever, kwargs={"poll_interval": 60.0}, daemon=True)
    serving.start()
    host, port = server.server_address[:2]
    with urllib.request.urlopen(f"http://{host}:{port}/subjects", timeout=10) as r:
        assert r.status == 200 and r.read() == b"[]"
    server.stop_serving()
    serving.join(timeout=10)
    assert not serving.is_alive()    # not after the 60 s poll
    server.server_close()
    store.close()
