"""How the engines and the App talk to instance processes.

Transport: ``multiprocessing.connection`` over TCP on 127.0.0.1, authenticated with the secret in
``control/authkey`` (HMAC challenge; the file is 0600), so another user of a shared machine cannot
drive an instance. A message is a pickled tuple; the first element names the call:

    ("batch", task, batch_id, generation, ranges)        engine -> instance
        ranges: [(topic, partition, start, end)], the task's part of the micro-batch, which the
        instance reads from Kafka itself (statekit.worker.batch_input)
        -> ("done", outputs_count) | ("spooled", backlog)
           | ("not_owner", generation) | ("failed", one_line, kind)
    ("assign", generation, assignment_dict, options)     App -> instance
        -> ("ok", {task: how it will open})
    ("status",)                                          App -> instance
        -> ("ok", {...}) (see TaskHost.status)
    ("pause_replicas", paused)                           App -> instance
        -> ("ok", [task])
    ("calibrate", topic, partition, settle)              App -> instance: a restore rate now
        -> ("ok", records_per_second, load)
    ("stop",)                                            App -> instance: close every task, exit
        -> ("ok",)
"""
from __future__ import annotations

import os
import pickle
import secrets
from typing import Optional


# -- the secret ----------------------------------------------------------------------------------

def ensure_authkey(path: str) -> bytes:
    """The control directory's secret, created (0600) if missing."""
    try:
        with open(path, "rb") as f:
            key = f.read()
        if key:
            return key
    except FileNotFoundError:
        pass
    key = secrets.token_bytes(32)
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key)
    os.replace(tmp, path)
    return key


def read_authkey(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


# -- calls ---------------------------------------------------------------------------------------

class InstanceUnreachable(ConnectionError):
    """The instance did not answer (it is dead, or not listening yet)."""


def _handshake_timeout(sock, seconds: float) -> None:
    """Bound every read and write of a blocking socket (0: unbounded again). A Connection reads its
    file descriptor directly, so a socket timeout would not reach it; SO_RCVTIMEO does."""
    import socket
    import struct

    tv = struct.pack("ll", int(seconds), int((seconds % 1) * 1e6))
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, tv)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, tv)


def _authenticated(sock, authkey: bytes, server: bool, timeout: float):
    """The multiprocessing Connection over ``sock`` once both sides proved the key, within
    ``timeout`` (a peer that never answers must not hold anyone up)."""
    import socket
    from multiprocessing.connection import Connection, answer_challenge, deliver_challenge

    sock.setblocking(True)
    _handshake_timeout(sock, timeout)
    conn = Connection(sock.detach())
    try:
        if server:
            deliver_challenge(conn, authkey)
            answer_challenge(conn, authkey)
        else:
            answer_challenge(conn, authkey)
            deliver_challenge(conn, authkey)
        with socket.socket(fileno=os.dup(conn.fileno())) as s:
            _handshake_timeout(s, 0)
    except BaseException:
        conn.close()
        raise
    return conn


def listen(authkey: bytes, backlog: int = 128):
    """The instance's listening socket on 127.0.0.1 (an ephemeral port). After a rebalance every
    engine thread connects at once: a backlog of 1 (multiprocessing's Listener) drops connections
    that the clients then wait on forever."""
    import socket

    return socket.create_server(("127.0.0.1", 0), backlog=backlog)


def accept(server_sock, authkey: bytes, timeout: float = 10.0):
    """Accept one connection: (the raw socket, a function that authenticates it). The handshake
    runs in the caller's connection thread, not in the accept loop."""
    sock, _addr = server_sock.accept()
    return lambda: _authenticated(sock, authkey, True, timeout)


def connect(port: int, authkey: bytes, timeout: float = 10.0):
    """A connection to the instance listening on 127.0.0.1:port."""
    import socket

    try:
        sock = socket.create_connection(("127.0.0.1", int(port)), timeout=timeout)
        return _authenticated(sock, authkey, False, timeout)
    except (OSError, EOFError) as exc:
        raise InstanceUnreachable(f"instance on port {port}: {exc}") from None


def call(conn, *msg, timeout: Optional[float] = None):
    """Send one message and wait for its answer (``InstanceUnreachable`` when the peer dies)."""
    try:
        conn.send_bytes(pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL))
        if timeout is not None and not conn.poll(timeout):
            raise InstanceUnreachable(f"no answer to {msg[0]} within {timeout:.0f}s")
        return pickle.loads(conn.recv_bytes())
    except (EOFError, OSError) as exc:
        raise InstanceUnreachable(f"the instance went away during {msg[0]}: {exc}") from None
