"""A fault-injecting TCP proxy between statekit and its broker, for the outage tests.

    proxy = FaultProxy()                       # listens on 127.0.0.1:<port>
    broker = statekit.broker.start(..., configs={"advertised.listeners": proxy.listener})
    proxy.upstream = broker.bootstrap          # every client connects through the proxy
    proxy.blackhole(); ...; proxy.heal()       # nothing moves, connections stay open
    proxy.reset(hold=2.0)                      # every connection reset (RST), new ones too for 2 s
    proxy.delay(0.3)                           # every chunk forwarded 0.3 s late
    proxy.cut("down")                          # the next answer is cut in the middle, then reset

The broker advertises the proxy (Kafka's ``advertised.listeners``), so the clients' connections to
the partition leader and the coordinators go through it too, not only the bootstrap one.

A blackhole is what a network partition does to TCP: bytes are not lost, they wait (the proxy
stops reading, the kernel buffers hold them) and flow again when it heals; a client that gives up
meanwhile times out and reconnects into the same hole. A reset is a broker or a middlebox dropping
every connection. A cut resets a connection in the middle of an answer (half a Fetch response, a
transaction's produce acknowledgements) or of a request.
"""
from __future__ import annotations

import socket
import struct
import threading
import time


class _Pipe:
    """One proxied connection: two pumps, client -> broker ("up") and broker -> client ("down")."""

    def __init__(self, proxy: "FaultProxy", client: socket.socket, upstream: socket.socket):
        self.proxy, self.client, self.upstream = proxy, client, upstream
        try:
            self.client_port = client.getpeername()[1]   # the client's own port
        except OSError:
            self.client_port = None
        self.closed = threading.Event()
        for src, dst, direction in ((client, upstream, "up"), (upstream, client, "down")):
            threading.Thread(target=self._pump, args=(src, dst, direction), daemon=True,
                             name=f"faultproxy-{direction}").start()

    def _pump(self, src: socket.socket, dst: socket.socket, direction: str) -> None:
        p = self.proxy
        try:
            while not self.closed.is_set():
                if not p.wait_open(self):          # a blackhole: read nothing, the bytes wait
                    return
                src.settimeout(0.05)
                try:
                    data = src.recv(65536)
                except socket.timeout:
                    continue
                if not data:
                    break
                if p.delay_s:
                    time.sleep(p.delay_s)
                if p.take_cut(direction, len(data), self.client_port):
                    dst.sendall(data[: max(1, len(data) // 2)])
                    self.reset()
                    p.cuts_done += 1
                    return
                dst.sendall(data)
                p.bytes[direction] += len(data)
        except OSError:
            pass
        self.close()

    def reset(self) -> None:
        """Close both ends with a TCP reset (SO_LINGER 0), as a dropped connection does."""
        for s in (self.client, self.upstream):
            try:
                s.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            except OSError:
                pass
        self.close()

    def close(self) -> None:
        if self.closed.is_set():
            return
        self.closed.set()
        for s in (self.client, self.upstream):
            try:
                s.close()
            except OSError:
                pass
        self.proxy.forget(self)


class FaultProxy:
    def __init__(self, upstream: str | None = None):
        self.upstream = upstream
        self.sock = socket.socket()
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(128)
        self.port = self.sock.getsockname()[1]
        self.bootstrap = f"127.0.0.1:{self.port}"
        self.listener = f"PLAINTEXT://127.0.0.1:{self.port}"   # the broker's advertised.listeners
        self.pipes: set = set()
        self.delay_s = 0.0
        self.accepted = 0
        self.resets = 0
        self.cuts_done = 0
        self.bytes = {"up": 0, "down": 0}
        self._open = threading.Event()
        self._open.set()
        self._refuse_until = 0.0
        self._cut = None                  # (direction, min bytes) of the next cut
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept_loop, daemon=True, name="faultproxy")
        self._thread.start()

    # -- faults ------------------------------------------------------------------------------
    def blackhole(self) -> None:
        """Nothing moves through any connection, old or new, until heal()."""
        self._open.clear()

    def heal(self) -> None:
        """End a blackhole, a delay and a reset's refusal window; a cut not yet done is dropped."""
        self._open.set()
        self.delay_s = 0.0
        self._refuse_until = 0.0
        self._cut = None

    def reset(self, hold: float = 0.0) -> int:
        """Reset every connection now, and every new one for ``hold`` seconds. Returns how many."""
        self._refuse_until = time.monotonic() + hold
        with self._lock:
            pipes = list(self.pipes)
        for p in pipes:
            p.reset()
        self.resets += len(pipes)
        return len(pipes)

    def delay(self, seconds: float) -> None:
        """Forward every chunk ``seconds`` late (0: no delay)."""
        self.delay_s = float(seconds)

    def cut(self, direction: str = "down", min_bytes: int = 1, spare=None) -> None:
        """Reset the next connection that forwards at least ``min_bytes`` in ``direction`` ("down":
        an answer, "up": a request), halfway through that chunk. ``spare(port)``: true for the
        client ports whose connections are left alone (the test's own client), asked at the cut."""
        self._cut = (direction, int(min_bytes), spare)

    def take_cut(self, direction: str, n: int, client_port=None) -> bool:
        with self._lock:
            c = self._cut
            if c is not None and c[0] == direction and n >= c[1] and not (c[2] and c[2](client_port)):
                self._cut = None
                return True
        return False

    # -- plumbing ----------------------------------------------------------------------------
    def wait_open(self, pipe: _Pipe) -> bool:
        while not self._open.wait(0.05):
            if pipe.closed.is_set() or self._stop.is_set():
                return False
        return not pipe.closed.is_set()

    def forget(self, pipe: _Pipe) -> None:
        with self._lock:
            self.pipes.discard(pipe)

    def _accept_loop(self) -> None:
        self.sock.settimeout(0.1)
        while not self._stop.is_set():
            try:
                client, _ = self.sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            threading.Thread(target=self._connect, args=(client,), daemon=True).start()

    def _connect(self, client: socket.socket) -> None:
        self.accepted += 1
        while not self._open.is_set() and not self._stop.is_set():   # a new connection waits too
            time.sleep(0.05)
        if time.monotonic() < self._refuse_until or self.upstream is None or self._stop.is_set():
            _Pipe(self, client, socket.socket()).reset()
            return
        host, _, port = self.upstream.rpartition(":")
        try:
            up = socket.create_connection((host, int(port)), timeout=5)
        except OSError:
            _Pipe(self, client, socket.socket()).reset()    # the broker is down: so is the proxy
            return
        up.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        client.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with self._lock:
            if self._stop.is_set():
                client.close()
                up.close()
                return
            self.pipes.add(_Pipe(self, client, up))

    def close(self) -> None:
        self._stop.set()
        self._open.set()
        try:
            self.sock.close()
        except OSError:
            pass
        self._thread.join(2)
        with self._lock:
            pipes = list(self.pipes)
        for p in pipes:
            p.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
