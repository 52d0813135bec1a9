"""The instance's socket: every engine thread connects at once after a rebalance, a client with a
wrong key is refused, and a peer that never speaks holds nobody up."""
from __future__ import annotations

import socket
import threading
from concurrent.futures import ThreadPoolExecutor
from multiprocessing import AuthenticationError

import pytest

from statekit.worker.protocol import InstanceUnreachable, accept, call, connect, listen

KEY = b"k" * 32


class EchoServer:
    """listen() + accept() as the instance uses them; each connection echoes in its own thread."""

    def __init__(self, timeout=10.0):
        self.sock = listen(KEY)
        self.port = self.sock.getsockname()[1]
        self.refused: list = []
        self.served = 0
        self._lock = threading.Lock()
        self.timeout = timeout
        threading.Thread(target=self._loop, daemon=True).start()

    def _loop(self):
        while True:
            try:
                hs = accept(self.sock, KEY, timeout=self.timeout)
            except OSError:
                return
            threading.Thread(target=self._serve, args=(hs,), daemon=True).start()

    def _serve(self, hs):
        try:
            conn = hs()
        except Exception as exc:  # noqa: BLE001
            with self._lock:
                self.refused.append(type(exc).__name__)
            return
        with self._lock:
            self.served += 1
        try:
            while True:
                conn.send_bytes(conn.recv_bytes())
        except (EOFError, OSError):
            conn.close()

    def close(self):
        self.sock.close()


@pytest.fixture
def server():
    s = EchoServer(timeout=1.0)
    yield s
    s.close()


def test_many_clients_at_once_all_get_through(server):
    # multiprocessing's Listener has a backlog of 1: after a rebalance the overflowing clients sat
    # in an established-looking connection forever
    def one(i):
        c = connect(server.port, KEY, timeout=5)
        try:
            return call(c, "ping", i)
        finally:
            c.close()

    with ThreadPoolExecutor(max_workers=48) as pool:
        replies = list(pool.map(one, range(96)))
    assert replies == [("ping", i) for i in range(96)]
    assert server.served == 96 and server.refused == []


def test_a_wrong_key_is_refused(server):
    with pytest.raises(AuthenticationError):
        connect(server.port, b"x" * 32, timeout=5)
    c = connect(server.port, KEY, timeout=5)
    assert call(c, "still", "serving") == ("still", "serving")
    c.close()


def test_a_peer_that_never_speaks_holds_nobody_up(server):
    mute = socket.create_connection(("127.0.0.1", server.port))
    try:
        c = connect(server.port, KEY, timeout=5)     # not queued behind the mute peer
        assert call(c, "hello") == ("hello",)
        c.close()
        deadline = threading.Event()
        for _ in range(50):
            if "BlockingIOError" in server.refused or "TimeoutError" in server.refused:
                break
            deadline.wait(0.1)
        assert server.refused and server.refused[0] in ("BlockingIOError", "TimeoutError")
    finally:
        mute.close()


def test_a_server_that_never_answers_is_unreachable_not_a_hang():
    silent = socket.create_server(("127.0.0.1", 0), backlog=8)   # accepts (kernel), never speaks
    try:
        with pytest.raises(InstanceUnreachable):
            connect(silent.getsockname()[1], KEY, timeout=0.5)
    finally:
        silent.close()
