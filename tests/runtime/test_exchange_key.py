"""A process that delivers batches (a Spark Python worker, reused from one app to the next) keeps
its connections and the control directory's key in a cache: an app made again under the same name
after `reset()` (or `%statekit up --fresh`) has a new key in the same place, and the cache must
offer that one, not the key of the app before (the instance refused it: "digest sent was
rejected")."""
from __future__ import annotations

import os
import threading

from statekit.contracts import ControlDir
from statekit.worker import exchange
from statekit.worker.protocol import accept, ensure_authkey, listen


def _instance(key: bytes):
    """A listener that authenticates one connection with `key`; its port and its outcome."""
    server = listen(key)
    seen = {}

    def serve():
        try:
            accept(server, key)()
            seen["ok"] = True
        except Exception as err:  # noqa: BLE001 - the handshake's verdict
            seen["error"] = f"{type(err).__name__}: {err}"
        finally:
            server.close()
    t = threading.Thread(target=serve, daemon=True)
    t.start()
    return server.getsockname()[1], seen, t


def test_the_cache_offers_the_key_of_the_app_made_again_not_the_one_before(tmp_path):
    control = ControlDir(str(tmp_path / "control"))
    os.makedirs(control.path)
    routes = exchange._Routes(control.path)
    first = ensure_authkey(control.authkey)
    port, seen, t = _instance(first)
    routes.conn("0", {"port": port, "incarnation": 1}).close()
    t.join(10)
    assert seen == {"ok": True}
    os.unlink(control.authkey)                  # reset(): the control directory goes ...
    second = ensure_authkey(control.authkey)    # ... and the next start writes a new key
    assert second != first
    port, seen, t = _instance(second)
    routes.conn("0", {"port": port, "incarnation": 1}).close()
    t.join(10)
    assert seen == {"ok": True}
