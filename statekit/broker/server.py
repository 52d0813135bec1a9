"""The asyncio server: framing, authentication, request dispatch, bounded buffering, background
duties (flush, retention, cleaner, transaction timeouts, stats).

One event loop serves every connection. Requests of one connection start in arrival order and are
answered in order, as Kafka does (a client may pipeline; ordering of produce requests depends on it).

Memory is bounded three ways. A request frame's bytes are taken from a pool shared by all
connections (`queued.max.request.bytes`) before its body is read, and given back once it is
handled: partial giant frames on many connections wait for the pool instead of growing the
broker. Each connection reads at most MAX_IN_FLIGHT requests ahead of its answers. The answers a
connection has waiting to be sent count against `fetch.max.bytes` for that connection and four
times that for all of them; Fetch fills only what is left (see handlers._fetch_once), so a client
that pipelines fetches and never reads gets empty answers rather than gigabytes.

With authentication on (`auth.py`), a connection must complete SASL before anything but
ApiVersions; other requests get SASL_AUTHENTICATION_FAILED and the connection is closed.

With a TLS listener (`tls.py`), each connection's handshake comes first, on this same loop; the
framing, the pool and the limits above then apply to the decrypted stream unchanged. A client
whose handshake fails (a certificate refused on either side, plaintext on this port) is closed
with one line in the log; a ClientHello arriving at a plaintext listener is named as such too.
"""
from __future__ import annotations

import asyncio
import collections
import fcntl
import io
import json
import logging
import os
import resource
import signal
import struct
import time
import uuid

import kafka.protocol.admin as _admin
import kafka.protocol.consumer as _consumer
import kafka.protocol.metadata as _metadata
import kafka.protocol.producer as _producer
from kafka.protocol.api_header import ResponseClassRegistry
from kafka.protocol.api_message import ApiMessage
from kafka.protocol.metadata import ApiVersionsResponse
from kafka.protocol.sasl import (SaslAuthenticateRequest, SaslAuthenticateResponse, SaslHandshakeRequest,
                                 SaslHandshakeResponse)

from . import handlers as H
from .auth import AuthFailed, Users
from .config import BrokerConfig, ConfigError
from .duties import Duties
from .log import write_json_atomic
from .schema_check import illegal_null
from .tls import TlsListener
from .topics import TopicManager

log = logging.getLogger("statekit.broker")

_HDR = struct.Struct(">hhi")
MAX_IN_FLIGHT = 128  # requests read ahead of their responses, per connection
READER_LIMIT = 256 << 10  # bytes a connection's stream reader buffers before pausing the socket
WRITE_HIGH_WATER = 1 << 20  # answer bytes in a socket's send buffer before the writer waits
TLS_WRITE_CHUNK = 256 << 10  # the slices a big answer is handed to TLS in
SASL_HANDSHAKE, SASL_AUTHENTICATE, API_VERSIONS = 17, 36, 18
UNSUPPORTED_SASL_MECHANISM, ILLEGAL_SASL_STATE = 33, 34
SASL_MAX_RECEIVE = 512 << 10  # largest frame before authentication (Kafka's sasl.server.max.receive.size)
FRAME_BODY_TIMEOUT = 120.0  # seconds a request frame may take to arrive once its size is read
IDLE_AFTER = 3        # duty runs in a row with stats.json unchanged: an idle broker (duties.py)
FD_RESERVE_MIN = 64  # open files kept for connections and transient files, at least


def _request_classes() -> dict[int, type]:
    out = {}
    for mod in (_metadata, _producer, _consumer, _admin):
        for name in dir(mod):
            obj = getattr(mod, name)
            if isinstance(obj, type) and issubclass(obj, ApiMessage) and obj is not ApiMessage and obj.is_request():
                out[obj.API_KEY] = obj
    return out


REQUEST_CLASSES = _request_classes()


class Malformed(Exception):
    pass


class BrokerError(Exception):
    """A one-line reason the broker cannot start."""


class BytePool:
    """Bytes of request frames read but not yet handled, shared by all connections (Kafka's
    queued.max.request.bytes memory pool). A frame that fits is read at once; the others wait,
    served in order as bytes come back; limit < 0: unbounded."""

    def __init__(self, limit: int):
        self.limit = limit
        self.used = 0
        self._waiters: collections.deque = collections.deque()

    async def acquire(self, n: int) -> None:
        if self.limit < 0:
            return
        if self.used + n <= self.limit:  # what fits goes: small frames never queue behind big ones
            self.used += n
            return
        fut = asyncio.get_running_loop().create_future()
        self._waiters.append((n, fut))
        try:
            await fut
        except asyncio.CancelledError:
            if fut.done() and not fut.cancelled():
                self.release(n)
            else:
                try:
                    self._waiters.remove((n, fut))
                except ValueError:
                    pass
            raise

    def release(self, n: int) -> None:
        if self.limit < 0:
            return
        self.used -= n
        while self._waiters and self.used + self._waiters[0][0] <= self.limit:
            need, fut = self._waiters.popleft()
            if fut.done():
                continue
            self.used += need
            fut.set_result(None)


class Connection:
    """Per-connection state: authentication, and the answer bytes waiting to be sent."""

    __slots__ = ("broker", "peer", "client_host", "sasl", "authenticated", "raw_sasl", "buffered")

    def __init__(self, broker, peer, client_host: str):
        self.broker = broker
        self.peer = peer
        self.client_host = client_host
        self.sasl = broker.users.session() if broker.users is not None else None
        self.authenticated = broker.users is None
        self.raw_sasl = False  # after a v0 SaslHandshake, tokens come as bare frames
        self.buffered = 0

    def hold(self, n: int) -> None:
        self.buffered += n
        self.broker.buffered += n

    def free(self, n: int) -> None:
        n = min(n, self.buffered)
        self.buffered -= n
        self.broker.buffered -= n


class Broker:
    node_id = 0

    def __init__(self, data_dir: str, host: str = "127.0.0.1", port: int = 0, configs: dict | None = None,
                 advertised_host: str | None = None, users: dict[str, str] | None = None,
                 tls: TlsListener | None = None, lock_fd: int = -1):
        """`tls`: serve TLS only (see tls.py); `lock_fd`: the directory lock when the caller took
        it already (lock_dir), to write the client settings before the broker starts."""
        self.dir = os.path.abspath(data_dir)
        self.host = host
        self.port = port
        try:
            self.config = BrokerConfig(configs or {})
        except ConfigError as e:
            raise BrokerError(str(e)) from None
        self.advertised_host = advertised_host or (host if host not in ("0.0.0.0", "::", "") else "127.0.0.1")
        self.advertised_port = port
        self._txn_pause = None   # (seconds, token): statekit.broker.pause(..., mid_transaction=True)
        self.topics = TopicManager(self.dir, self.config.topic_defaults())
        self.coordinator = None
        self.transactions = None
        self.cleaner = None
        self.server = None
        self.stopping = False
        self._waiter: asyncio.Future | None = None
        self._tasks: list[asyncio.Task] = []
        self._stats_same = 0     # duty runs in a row that found stats.json's figures unchanged
        self.duties = Duties(self._idle)
        self._lock_fd = lock_fd
        self.tls = tls
        self._pid_next = 0
        self._pid_block_end = 0
        self.cluster_id = ""
        self.max_request = self.config.get("socket.request.max.bytes")
        self.pool = BytePool(self.config.get("queued.max.request.bytes"))
        self.buffered = 0  # answer bytes waiting to be sent, all connections
        self.max_buffered = 4 * max(self.config.get("fetch.max.bytes"), 1 << 20)
        self.users = Users(users, self.config.get("sasl.enabled.mechanisms").split(",")) if users else None
        self._group_versions: dict[int, tuple[int, int]] = {}
        self._conns: set[asyncio.StreamWriter] = set()

    # -- lifecycle ---------------------------------------------------------------------------
    @property
    def auto_create(self) -> bool:
        return self.config.get("auto.create.topics.enable")

    async def start(self) -> None:
        if self._lock_fd < 0:
            self._lock_fd = lock_dir(self.dir)
        meta_path = os.path.join(self.dir, "meta.json")
        try:
            with open(meta_path) as f:
                meta = json.load(f)
        except (FileNotFoundError, ValueError):
            meta = {}
        self.cluster_id = meta.get("cluster_id") or _cluster_id()
        self._pid_next = self._pid_block_end = int(meta.get("producer_id_block_end", 1000))
        meta.update(cluster_id=self.cluster_id, producer_id_block_end=self._pid_block_end)
        write_json_atomic(meta_path, meta)
        self.topics.fd_budget = _fd_budget()
        self.topics.open()
        self.coordinator = await self._start_coordinator()
        from .cleaner import LogCleaner
        from .transactions import TransactionCoordinator

        self.transactions = TransactionCoordinator(self)
        self.transactions.start()
        self.cleaner = LogCleaner(self)
        try:
            self.server = await asyncio.start_server(self._serve, self.host, self.port,
                                                     limit=READER_LIMIT, reuse_address=True)
        except OSError as e:
            self.topics.close()
            self.transactions.close()
            if self.coordinator is not None:
                await self.coordinator.close()
            if e.errno in (98, 48):
                raise BrokerError(f"port {self.port} on {self.host} is already in use: pick another with --port, "
                                  f"or --port 0 for a free one") from None
            raise BrokerError(f"cannot listen on {self.host}:{self.port} ({e.strerror}): check --host/--port") from None
        self.port = self.server.sockets[0].getsockname()[1]
        self.advertised_port = self.port
        listener = self.config.get("advertised.listeners")   # PLAINTEXT://HOST:PORT (a proxy)
        if listener:
            self.advertised_host, _, port = listener.split("//", 1)[1].rpartition(":")
            self.advertised_port = int(port)
        self._tasks = [
            asyncio.create_task(self.duties.run([
                (self.config.get("log.retention.check.interval.ms"), self._retention),
                (self.config.get("transaction.abort.timed.out.transaction.cleanup.interval.ms"),
                 self.transactions.tick),
                (1000, self._write_stats),
                (self.config.get("log.flush.interval.ms"), self._flush_all_async),
            ])),
            asyncio.create_task(self.cleaner.run()),
        ]
        self._write_stats()
        try:   # statekit.broker.pause: SIGUSR2 (the main thread's loop only; not in-process tests)
            asyncio.get_running_loop().add_signal_handler(signal.SIGUSR2, self._pause_requested)
        except (ValueError, RuntimeError, NotImplementedError):
            pass
        security = ("SASL_" if self.users else "") + ("SSL" if self.tls else "PLAINTEXT")
        if self.tls is not None and self.tls.require_client_cert:
            security += " with client certificates"
        log.info("broker listening on %s:%d (%s), data in %s (room for %s more partitions)", self.advertised_host,
                 self.port, security, self.dir, self.topics.partition_room())

    def _pause_requested(self) -> None:
        """A pause asked for by ``statekit.broker.pause`` (``broker/faults.py``): the event loop
        stops here for the seconds asked — nothing is read or answered, connections stay open —
        after saying so in ``DIR/paused.json``."""
        from .faults import MAX_PAUSE_S, PAUSE_REQUEST, PAUSED

        path = os.path.join(self.dir, PAUSE_REQUEST)
        try:
            with open(path) as f:
                req = json.load(f)
            os.unlink(path)
            seconds = min(max(0.0, float(req["seconds"])), MAX_PAUSE_S)
        except (OSError, ValueError, KeyError, TypeError):
            return
        if req.get("mid_transaction"):   # armed: the next transactional produce stalls (_handle)
            self._txn_pause = (seconds, req.get("token"))
            write_json_atomic(os.path.join(self.dir, PAUSED), {"token": req.get("token"), "armed": True},
                              durable=False)
            return
        self._stall(seconds, req.get("token"))

    def _stall(self, seconds: float, token) -> None:
        """Stop the event loop here for ``seconds`` — the pause itself — after saying so."""
        from .faults import PAUSED

        now = time.time()
        write_json_atomic(os.path.join(self.dir, PAUSED), {"token": token, "since": now,
                                                           "until": now + seconds}, durable=False)
        log.warning("paused for %.1f s (statekit.broker.pause): nothing is read or answered", seconds)
        time.sleep(seconds)   # noqa: the stall itself
        log.warning("resumed after a pause of %.1f s", seconds)

    async def _start_coordinator(self):
        try:
            from .groups import GroupCoordinator
        except ImportError:
            log.info("no group coordinator (statekit.broker.groups): group APIs answer COORDINATOR_NOT_AVAILABLE")
            return None
        coord = GroupCoordinator(
            self.dir, initial_rebalance_delay_ms=self.config.get("group.initial.rebalance.delay.ms"))
        await coord.start()
        declared = coord.supported_versions() if hasattr(coord, "supported_versions") else \
            getattr(coord, "SUPPORTED_VERSIONS", None)
        self._group_versions = dict(declared) if declared else {}
        return coord

    async def stop(self) -> None:
        if self.stopping:
            return
        self.stopping = True
        self.notify_append()
        if self.server is not None:
            self.server.close()
        for w in list(self._conns):
            w.close()
        if self.cleaner is not None:   # first: a cancel that meets its wait just woken is lost
            await self.cleaner.close()
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.coordinator is not None:
            try:
                await self.coordinator.close()
            except Exception:  # noqa: BLE001 - stopping must finish
                log.exception("group coordinator close failed")
        if self.transactions is not None:
            self.transactions.close()
        self._write_stats()
        self.topics.close()  # fsyncs
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1
        log.info("broker stopped")

    def _idle(self) -> bool:
        """Nothing written at the last IDLE_AFTER runs of the duties, and no transaction open."""
        return self._stats_same >= IDLE_AFTER and not (
            self.transactions is not None and self.transactions.open())

    async def _flush_all_async(self) -> None:
        segs = [s for p in self.topics.all_partitions() for s in p.segments[-2:] if s.dirty]
        if segs:
            await asyncio.to_thread(_fsync_all, segs)

    def _retention(self) -> None:
        now = int(time.time() * 1000)
        for plog in self.topics.all_partitions():
            plog.maybe_roll_by_time(now)
            if plog.apply_retention(now):
                log.info("retention removed old segments of %s-%d; log start is now %d",
                         plog.topic, plog.partition, plog.log_start_offset)

    def _write_stats(self) -> None:
        """DIR/stats.json, rewritten when a figure in it changed (an idle broker writes nothing)."""
        token = self.cleaner.done_token if self.cleaner else None
        parts = [p.stats() for p in self.topics.all_partitions()]
        if (token, parts) == getattr(self, "_stats_written", None):
            self._stats_same += 1
            return
        self._stats_same = 0
        doc = {"pid": os.getpid(), "updated_at": time.time(), "clean_token": token,
               "partitions": parts}
        write_json_atomic(os.path.join(self.dir, "stats.json"), doc, durable=False)
        self._stats_written = (token, parts)

    # -- services to handlers ----------------------------------------------------------------
    def supported_versions(self) -> dict[int, tuple[int, int]]:
        out = {k: (lo, hi) for k, (_, _, lo, hi, _) in H.API_TABLE.items()}
        if self.coordinator is not None:
            for k in H.GROUP_API_KEYS:
                v = self._group_versions.get(k) or H.GROUP_DEFAULT_VERSIONS.get(k)
                if v:
                    out[k] = tuple(v)
        if self.users is not None:
            out[SASL_HANDSHAKE] = (0, 1)
            out[SASL_AUTHENTICATE] = (0, 2)
        return out

    def create_topic(self, name, partitions, configs):
        """Raises ConfigError, PartitionBudgetExceeded or OSError; then nothing was created."""
        topic = self.topics.create(name, partitions, configs)
        log.info("created topic %s (%d partitions, %s)", name, partitions, configs or "defaults")
        return topic

    def delete_topic(self, name):
        self.topics.delete(name)
        log.info("deleted topic %s", name)

    def set_topic_configs(self, topic, overrides: dict) -> None:
        self.topics.set_configs(topic, overrides)
        if self.cleaner is not None:
            self.cleaner.wake()

    def next_producer_id(self) -> int:
        if self._pid_next >= self._pid_block_end:
            end = self._pid_next + 1000
            meta_path = os.path.join(self.dir, "meta.json")
            write_json_atomic(meta_path, {"cluster_id": self.cluster_id, "producer_id_block_end": end})
            self._pid_block_end = end
        pid = self._pid_next
        self._pid_next += 1
        return pid

    def append_waiter(self) -> asyncio.Future:
        if self._waiter is None or self._waiter.done():
            self._waiter = asyncio.get_running_loop().create_future()
        return self._waiter

    def notify_append(self) -> None:
        w = self._waiter
        if w is not None and not w.done():
            w.set_result(None)
        self._waiter = None
        if self.duties.wake() and self.cleaner is not None and not self.stopping:
            self.cleaner.wake()               # (its pace was the idle one too)

    # -- connections -------------------------------------------------------------------------
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Read requests and start each at once; a writer sends the responses in request order.

        Handlers start in arrival order and run without suspending until they have changed the
        log, so produce requests of one connection are appended in order; only waiting requests
        (a Fetch long poll, a JoinGroup parked for a rebalance) overlap later ones. Until the
        connection has authenticated (when the broker requires it), each request is handled
        before the next is read.
        """
        peer = writer.get_extra_info("peername")
        self._conns.add(writer)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            try:
                import socket

                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        if self.tls is not None:
            try:  # the encrypted bytes' buffer, under the TLS transport, holds as much as a plaintext one
                writer.transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
            except (AttributeError, ValueError):
                pass
            if not await self._tls_handshake(writer, peer):
                self._conns.discard(writer)
                return
        conn = Connection(self, peer, "/" + (peer[0] if isinstance(peer, tuple) else "127.0.0.1"))
        H.CONNECTION.set(conn)  # this task's context; the dispatch tasks copy it
        try:
            writer.transport.set_write_buffer_limits(high=WRITE_HIGH_WATER)
        except (AttributeError, ValueError):
            pass
        pending: asyncio.Queue = asyncio.Queue(maxsize=MAX_IN_FLIGHT)
        out_task = asyncio.create_task(self._write_responses(pending, writer, conn))
        try:
            while not self.stopping and not out_task.done():
                try:
                    head = await reader.readexactly(4)
                except (asyncio.IncompleteReadError, ConnectionError):
                    break
                (size,) = struct.unpack(">i", head)
                if size > self.max_request and head[:2] == b"\x16\x03":  # a TLS record: a ClientHello
                    log.warning("closing connection from %s: it began a TLS handshake on this plaintext listener: "
                                "the client needs security.protocol=PLAINTEXT (SASL_PLAINTEXT with SASL), or "
                                "start the broker with --tls", peer)
                    break
                if not conn.authenticated and size > SASL_MAX_RECEIVE:
                    log.warning("closing connection from %s: a %d-byte request before authentication "
                                "(at most %d)", peer, size, SASL_MAX_RECEIVE)
                    break
                if size < 8 or size > self.max_request:
                    if not conn.raw_sasl or size < 0 or size > self.max_request:
                        log.warning("closing connection from %s: frame size %d outside 8..%d bytes", peer, size,
                                    self.max_request)
                        break
                await self.pool.acquire(size)
                try:
                    if size <= READER_LIMIT:
                        frame = await reader.readexactly(size)
                    else:  # a big frame holds pool bytes: it may not trickle in forever
                        frame = await asyncio.wait_for(reader.readexactly(size), FRAME_BODY_TIMEOUT)
                except (asyncio.IncompleteReadError, ConnectionError):
                    self.pool.release(size)
                    break
                except asyncio.TimeoutError:
                    self.pool.release(size)
                    log.warning("closing connection from %s: a %d-byte request did not arrive within %.0f s",
                                peer, size, FRAME_BODY_TIMEOUT)
                    break
                except BaseException:
                    self.pool.release(size)
                    raise
                if not conn.authenticated:
                    try:
                        out, close = self._authenticate(conn, frame)
                    except Malformed as e:
                        log.warning("closing connection from %s: malformed request (%s)", peer, e)
                        break
                    finally:
                        self.pool.release(size)
                    done = asyncio.get_running_loop().create_future()
                    done.set_result(out)
                    await pending.put(done)
                    if close:
                        break
                    continue
                task = asyncio.create_task(self._dispatch(frame, conn))
                task.add_done_callback(lambda _t, n=size: self.pool.release(n))
                await pending.put(task)
        except asyncio.CancelledError:
            pass
        finally:
            # let the answers to what was read go out, then close
            if not out_task.done():
                try:
                    pending.put_nowait(None)
                except asyncio.QueueFull:
                    out_task.cancel()
            try:
                await out_task
            except (asyncio.CancelledError, Exception):  # noqa: BLE001
                pass
            self._conns.discard(writer)
            conn.free(conn.buffered)
            try:
                writer.close()
            except Exception:  # noqa: BLE001
                pass

    async def _tls_handshake(self, writer: asyncio.StreamWriter, peer) -> bool:
        """The connection's TLS handshake, before its first request is read. Called before the
        task first waits, so the client's hello is still in the socket, not in the stream reader:
        asyncio's TLS transport reads it (non-blocking, as every other read of this loop), and a
        handshake not done within the listener's timeout is dropped. A failure is one line."""
        try:
            await writer.start_tls(self.tls.context, ssl_handshake_timeout=self.tls.handshake_timeout)
            return True
        except asyncio.CancelledError:
            writer.transport.abort()
            raise
        except Exception as e:  # noqa: BLE001 - every failed handshake ends only its connection
            line = self.tls.explain(e)
            if line:
                log.warning("closing connection from %s: %s", peer, line)
            else:
                log.debug("connection from %s closed during the TLS handshake (%s)", peer, e)
            writer.transport.abort()
            return False

    async def _write_responses(self, pending: asyncio.Queue, writer: asyncio.StreamWriter, conn: Connection) -> None:
        peer = conn.peer
        sent = 0  # answer bytes handed to the socket, not yet freed
        try:
            while True:
                task = await pending.get()
                if task is None:
                    break
                try:
                    out = await task
                except Malformed as e:
                    log.warning("closing connection from %s: malformed request (%s)", peer, e)
                    break
                except Exception as e:  # noqa: BLE001 - a bug answers nothing but must not stop the broker
                    log.exception("closing connection from %s: request failed: %s", peer, e)
                    break
                if out is not None:
                    if self.tls is not None and len(out) > TLS_WRITE_CHUNK:
                        # TLS encrypts what it is given into one memory buffer before any of it is
                        # sent: a few MB at once costs several times the CPU of slices (bench/broker.py)
                        view = memoryview(out)
                        for i in range(0, len(out), TLS_WRITE_CHUNK):
                            writer.write(view[i:i + TLS_WRITE_CHUNK])
                            await writer.drain()
                    else:
                        writer.write(out)
                    sent += len(out)
                    await writer.drain()  # waits only while the socket holds more than WRITE_HIGH_WATER
                    gone = sent - writer.transport.get_write_buffer_size()
                    if gone > 0:
                        conn.free(gone)
                        sent -= gone
            await writer.drain()
        except (ConnectionError, asyncio.CancelledError):
            pass
        finally:
            # whatever is still queued will never be answered
            while not pending.empty():
                t = pending.get_nowait()
                if t is not None:
                    t.cancel()
            try:
                writer.close()
            except Exception:  # noqa: BLE001
                pass

    async def _dispatch(self, frame: bytes, conn: Connection | None = None):
        out = await self._handle(frame, conn)
        if out is not None and conn is not None:
            conn.hold(len(out))
        return out

    async def _handle(self, frame: bytes, conn: Connection | None):
        api_key, api_version, corr = _HDR.unpack_from(frame, 0)
        entry = H.API_TABLE.get(api_key)
        supported = self.supported_versions().get(api_key)
        if supported is None or not supported[0] <= api_version <= supported[1]:
            return self._unsupported(api_key, api_version, corr)
        if api_key in (SASL_HANDSHAKE, SASL_AUTHENTICATE):
            return self._sasl_after_auth(api_key, api_version, corr)
        req_cls = entry[0] if entry else REQUEST_CLASSES.get(api_key)
        try:
            bio = io.BytesIO(frame)
            hdr = req_cls.parse_header(bio, version=api_version)
            req = req_cls.decode(memoryview(frame)[bio.tell():], version=api_version)
        except Exception as e:  # noqa: BLE001 - any decode failure is the client's
            raise Malformed(f"cannot decode {req_cls.__name__} v{api_version}: {type(e).__name__}: {e}") from None
        bad = illegal_null(req, api_version)
        if bad:
            raise Malformed(f"{req_cls.__name__} v{api_version}: required field {bad} is null")
        if self._txn_pause is not None and api_key == 0 and getattr(req, "transactional_id", None):
            (seconds, token), self._txn_pause = self._txn_pause, None
            self._stall(seconds, token)    # a pause armed for the middle of a transaction
        if entry is not None:
            resp = await entry[4](self, req, api_version)
        else:
            try:
                resp = await self.coordinator.handle(api_key, api_version, req,
                                                     client_id=getattr(hdr, "client_id", None) or "",
                                                     client_host=conn.client_host if conn else "/127.0.0.1")
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - answer with an error of the right shape, keep serving
                log.exception("group coordinator failed on api %d v%d", api_key, api_version)
                make = getattr(self.coordinator, "error_response", None)
                if make is None:
                    raise
                resp = make(api_key, api_version, req, H.COORDINATOR_NOT_AVAILABLE)
        if resp is None:
            return None
        return _encode(resp, api_version, corr)

    # -- SASL --------------------------------------------------------------------------------
    def _authenticate(self, conn: Connection, frame: bytes) -> tuple[bytes | None, bool]:
        """One frame before authentication: (answer, close the connection after it)."""
        if conn.raw_sasl:  # a bare token after a v0 handshake; failure closes without an answer
            try:
                answer = conn.sasl.step(frame)
            except AuthFailed as e:
                log.warning("SASL authentication of %s failed: %s", conn.peer, e)
                return None, True
            conn.authenticated = conn.sasl.done
            conn.raw_sasl = not conn.sasl.done
            if conn.authenticated:
                log.info("%s authenticated as %s", conn.peer, conn.sasl.principal)
            return struct.pack(">i", len(answer)) + answer, False
        api_key, api_version, corr = _HDR.unpack_from(frame, 0)
        supported = self.supported_versions().get(api_key)
        if api_key == API_VERSIONS or (supported and not supported[0] <= api_version <= supported[1]):
            return self._handle_sync(frame), False
        if api_key == SASL_HANDSHAKE:
            req = self._decode(SaslHandshakeRequest, frame, api_version)
            ok = conn.sasl.mechanism is None and conn.sasl.handshake(req.mechanism)
            code = 0 if ok else (ILLEGAL_SASL_STATE if conn.sasl.mechanism else UNSUPPORTED_SASL_MECHANISM)
            resp = SaslHandshakeResponse(version=api_version, error_code=code, mechanisms=self.users.mechanisms)
            conn.raw_sasl = ok and api_version == 0
            return _encode(resp, api_version, corr), not ok
        if api_key == SASL_AUTHENTICATE and conn.sasl.mechanism is not None:
            req = self._decode(SaslAuthenticateRequest, frame, api_version)
            resp = SaslAuthenticateResponse(version=api_version, error_code=0, error_message=None,
                                            auth_bytes=b"", session_lifetime_ms=0)
            try:
                resp.auth_bytes = conn.sasl.step(req.auth_bytes)
            except AuthFailed as e:
                log.warning("SASL authentication of %s failed: %s", conn.peer, e)
                resp.error_code, resp.error_message = H.SASL_AUTHENTICATION_FAILED, str(e)
                return _encode(resp, api_version, corr), True
            if conn.sasl.done:
                conn.authenticated = True
                log.info("%s authenticated as %s", conn.peer, conn.sasl.principal)
            return _encode(resp, api_version, corr), False
        log.warning("refusing api %d from %s: SASL authentication is required first", api_key, conn.peer)
        return self._refusal(api_key, api_version, corr, frame), True

    def _handle_sync(self, frame: bytes) -> bytes:
        """ApiVersions (or an unsupported version) before authentication: no await needed."""
        api_key, api_version, corr = _HDR.unpack_from(frame, 0)
        supported = self.supported_versions().get(api_key)
        if supported is None or not supported[0] <= api_version <= supported[1]:
            return self._unsupported(api_key, api_version, corr)
        self._decode(H.API_TABLE[api_key][0], frame, api_version)  # a malformed one closes the connection
        return _encode(H.api_versions_response(self, api_version), api_version, corr)

    @staticmethod
    def _decode(req_cls, frame: bytes, version: int):
        try:
            bio = io.BytesIO(frame)
            req_cls.parse_header(bio, version=version)
            return req_cls.decode(memoryview(frame)[bio.tell():], version=version)
        except Exception as e:  # noqa: BLE001
            raise Malformed(f"cannot decode {req_cls.__name__} v{version}: {type(e).__name__}: {e}") from None

    def _refusal(self, api_key: int, api_version: int, corr: int, frame: bytes) -> bytes:
        """SASL_AUTHENTICATION_FAILED in the shape of the request's answer: on every topic of a
        Metadata, CreateTopics, DeleteTopics or Produce answer, else at the top-level error code
        where the schema has one."""
        code = H.SASL_AUTHENTICATION_FAILED
        cls = H.API_TABLE[api_key][0] if api_key in H.API_TABLE else None
        if api_key in (0, 19, 20):
            req = self._decode(cls, frame, api_version)
            resp_cls = H.API_TABLE[api_key][1]
            if api_key == 0:
                T = resp_cls.TopicProduceResponse
                P = T.PartitionProduceResponse
                resp = resp_cls(version=api_version, throttle_time_ms=0, responses=[
                    T(name=t.name, partition_responses=[
                        P(index=p.index, error_code=code, base_offset=-1, log_append_time_ms=-1, log_start_offset=-1,
                          record_errors=[], error_message="SASL authentication is required")
                        for p in t.partition_data]) for t in req.topic_data])
            elif api_key == 19:
                R_ = resp_cls.CreatableTopicResult
                resp = resp_cls(version=api_version, throttle_time_ms=0, topics=[
                    R_(name=t.name, topic_id=uuid.UUID(int=0), error_code=code,
                       error_message="SASL authentication is required", topic_config_error_code=0,
                       num_partitions=-1, replication_factor=-1, configs=[]) for t in req.topics])
            else:
                R_ = resp_cls.DeletableTopicResult
                names = [t.name for t in req.topics] if api_version >= 6 else list(req.topic_names)
                resp = resp_cls(version=api_version, throttle_time_ms=0, responses=[
                    R_(name=n, topic_id=uuid.UUID(int=0), error_code=code,
                       error_message="SASL authentication is required") for n in names])
            return _encode(resp, api_version, corr)
        if api_key == 3:
            req = self._decode(REQUEST_CLASSES[3], frame, api_version)
            from kafka.protocol.metadata import MetadataResponse

            T = MetadataResponse.MetadataResponseTopic
            # no brokers; the topics asked for by name carry the error (never a null name: clients
            # crash on one)
            names = [t.name for t in (req.topics or []) if t.name is not None]
            resp = MetadataResponse(version=api_version, throttle_time_ms=0, brokers=[], cluster_id=None,
                                    controller_id=-1, error_code=H.SASL_AUTHENTICATION_FAILED,
                                    topics=[T(error_code=H.SASL_AUTHENTICATION_FAILED, name=n,
                                              topic_id=uuid.UUID(int=0), is_internal=False, partitions=[])
                                            for n in names])
            return _encode(resp, api_version, corr)
        return self._error_answer(api_key, api_version, corr, H.SASL_AUTHENTICATION_FAILED)

    def _sasl_after_auth(self, api_key: int, api_version: int, corr: int) -> bytes:
        """A second SaslHandshake/SaslAuthenticate on an authenticated (or open) connection."""
        if api_key == SASL_HANDSHAKE:
            resp = SaslHandshakeResponse(version=api_version, error_code=ILLEGAL_SASL_STATE,
                                         mechanisms=self.users.mechanisms if self.users else [])
        else:
            resp = SaslAuthenticateResponse(version=api_version, error_code=ILLEGAL_SASL_STATE,
                                            error_message="already authenticated", auth_bytes=b"",
                                            session_lifetime_ms=0)
        return _encode(resp, api_version, corr)

    def _unsupported(self, api_key: int, api_version: int, corr: int):
        """UNSUPPORTED_VERSION in the best shape the client can read."""
        code = H.UNSUPPORTED_VERSION
        if api_key in H.GROUP_API_KEYS and self.coordinator is None:
            code = H.COORDINATOR_NOT_AVAILABLE
        if api_key != 18:
            log.info("answering api %d v%d with error %d (not supported)", api_key, api_version, code)
        return self._error_answer(api_key, api_version, corr, code)

    def _error_answer(self, api_key: int, api_version: int, corr: int, code: int):
        """An answer carrying only an error code, in the best shape the client can read."""
        if api_key == 18:
            # KIP-511: answer an unknown ApiVersions version with v0 and the versions we do support
            resp = ApiVersionsResponse(version=0, error_code=code, api_keys=[
                ApiVersionsResponse.ApiVersion(api_key=k, min_version=lo, max_version=hi)
                for k, (lo, hi) in sorted(self.supported_versions().items())])
            resp.with_header(correlation_id=corr)
            return resp.encode(header=True, framed=True)
        resp_cls = ResponseClassRegistry._response_class_registry.get(api_key)
        if resp_cls is not None and 0 <= api_version <= resp_cls.max_version:
            try:
                resp = resp_cls[None](version=api_version)
                if "error_code" in resp_cls._struct.fields:
                    resp.error_code = code
                resp.with_header(correlation_id=corr)
                return resp.encode(header=True, framed=True)
            except Exception:  # noqa: BLE001 - fall back to the minimal answer
                pass
        body = struct.pack(">ih", corr, code)
        return struct.pack(">i", len(body)) + body


def lock_dir(data_dir: str) -> int:
    """Take the broker directory (an exclusive flock on DIR/.lock, held while the process lives);
    returns the lock's descriptor. Raises BrokerError when another broker holds it."""
    try:
        os.makedirs(data_dir, exist_ok=True)
        fd = os.open(os.path.join(data_dir, ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise BrokerError(f"cannot use {data_dir} as the broker directory ({e.strerror}): pass a writable --dir") from None
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        raise BrokerError(f"another broker already runs on {data_dir}: reuse it, or stop it with "
                          f"`statekit broker stop --dir {data_dir}`") from None
    return fd


def _encode(resp, api_version: int, corr: int) -> bytes:
    if resp.API_VERSION != api_version:
        resp.API_VERSION = api_version  # before with_header: the setter touches a request header
    resp.with_header(correlation_id=corr)
    return resp.encode(header=True, framed=True)


def _fd_budget() -> int:
    """Open files the partition logs may hold: the soft limit (raised to the hard one first, as
    Kafka's docs advise) minus a reserve for connections and transient files."""
    try:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = hard if hard != resource.RLIM_INFINITY else 1 << 20
        want = min(want, 1 << 20)
        if soft != resource.RLIM_INFINITY and soft < want:
            try:
                resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))
                soft = want
            except (ValueError, OSError):
                pass
        if soft == resource.RLIM_INFINITY:
            soft = 1 << 20
    except (ValueError, OSError):
        soft = 1024
    return max(0, soft - max(FD_RESERVE_MIN, soft // 4))


def _fsync_all(segs) -> None:
    for s in segs:
        try:
            s.flush()
        except OSError:
            pass


def _cluster_id() -> str:
    import base64

    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
