"""The asyncio server: framing, request dispatch, background duties (flush, retention, cleaner, stats).

One event loop serves every connection. Requests of one connection are answered one at a time,
in order, as Kafka does (a client may pipeline; ordering of produce requests depends on it).
"""
from __future__ import annotations

import asyncio
import fcntl
import io
import json
import logging
import os
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

from . import handlers as H
from .config import BrokerConfig, ConfigError
from .log import write_json_atomic
from .schema_check import illegal_null
from .topics import TopicManager

log = logging.getLogger("statekit.broker")

_HDR = struct.Struct(">hhi")
MAX_IN_FLIGHT = 128  # requests read ahead of their responses, per connection


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


class Broker:
    node_id = 0

    def __init__(self, data_dir: str, host: str = "127.0.0.1", port: int = 0, configs: dict | None = None,
                 advertised_host: str | None = None):
        self.dir = os.path.abspath(data_dir)
        self.host = host
        self.port = port
        try:
            self.config = BrokerConfig(configs or {})
        except ConfigError as e:
            raise BrokerError(str(e)) from None
        self.advertised_host = advertised_host or (host if host not in ("0.0.0.0", "::", "") else "127.0.0.1")
        self.topics = TopicManager(self.dir)
        self.coordinator = None
        self.cleaner = None
        self.server = None
        self.stopping = False
        self._waiter: asyncio.Future | None = None
        self._tasks: list[asyncio.Task] = []
        self._lock_fd = -1
        self._pid_next = 0
        self._pid_block_end = 0
        self.cluster_id = ""
        self.max_request = self.config.get("socket.request.max.bytes")
        self._group_versions: dict[int, tuple[int, int]] = {}
        self._conns: set[asyncio.StreamWriter] = set()

    # -- lifecycle ---------------------------------------------------------------------------
    @property
    def auto_create(self) -> bool:
        return self.config.get("auto.create.topics.enable")

    async def start(self) -> None:
        try:
            os.makedirs(self.dir, exist_ok=True)
            self._lock_fd = os.open(os.path.join(self.dir, ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
        except OSError as e:
            raise BrokerError(f"cannot use {self.dir} as the broker directory ({e.strerror}): pass a writable --dir") from None
        try:
            fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            raise BrokerError(f"another broker already runs on {self.dir}: reuse it, or stop it with "
                              f"`statekit broker stop --dir {self.dir}`") from None
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
        self.topics.open()
        self.coordinator = await self._start_coordinator()
        from .cleaner import LogCleaner

        self.cleaner = LogCleaner(self)
        try:
            self.server = await asyncio.start_server(self._serve, self.host, self.port,
                                                     limit=1 << 20, reuse_address=True)
        except OSError as e:
            self.topics.close()
            if self.coordinator is not None:
                await self.coordinator.close()
            if e.errno in (98, 48):
                raise BrokerError(f"port {self.port} on {self.host} is already in use: pick another with --port, "
                                  f"or --port 0 for a free one") from None
            raise BrokerError(f"cannot listen on {self.host}:{self.port} ({e.strerror}): check --host/--port") from None
        self.port = self.server.sockets[0].getsockname()[1]
        self._tasks = [
            asyncio.create_task(self._every(self.config.get("log.flush.interval.ms"), self._flush_all_async)),
            asyncio.create_task(self._every(self.config.get("log.retention.check.interval.ms"), self._retention)),
            asyncio.create_task(self.cleaner.run()),
            asyncio.create_task(self._every(1000, self._write_stats)),
        ]
        self._write_stats()
        log.info("broker listening on %s:%d, data in %s", self.advertised_host, self.port, self.dir)

    async def _start_coordinator(self):
        try:
            from .groups import GroupCoordinator
        except ImportError:
            log.info("no group coordinator (statekit.broker.groups): group APIs answer COORDINATOR_NOT_AVAILABLE")
            return None
        coord = GroupCoordinator(self.dir)
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
        for t in self._tasks:
            t.cancel()
        await asyncio.gather(*self._tasks, return_exceptions=True)
        if self.cleaner is not None:
            await self.cleaner.close()
        if self.coordinator is not None:
            try:
                await self.coordinator.close()
            except Exception:  # noqa: BLE001 - stopping must finish
                log.exception("group coordinator close failed")
        self._write_stats()
        self.topics.close()  # fsyncs
        if self._lock_fd >= 0:
            os.close(self._lock_fd)
            self._lock_fd = -1
        log.info("broker stopped")

    async def _every(self, interval_ms: int, fn) -> None:
        while True:
            await asyncio.sleep(interval_ms / 1000.0)
            try:
                r = fn()
                if asyncio.iscoroutine(r):
                    await r
            except asyncio.CancelledError:
                raise
            except Exception:  # noqa: BLE001 - a duty failing once must not stop it for good
                log.exception("background duty %s failed", getattr(fn, "__name__", fn))

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
        doc = {
            "pid": os.getpid(),
            "updated_at": time.time(),
            "clean_token": self.cleaner.done_token if self.cleaner else None,
            "partitions": [p.stats() for p in self.topics.all_partitions()],
        }
        write_json_atomic(os.path.join(self.dir, "stats.json"), doc, durable=False)

    # -- services to handlers ----------------------------------------------------------------
    def supported_versions(self) -> dict[int, tuple[int, int]]:
        out = {k: (lo, hi) for k, (_, _, lo, hi, _) in H.API_TABLE.items()}
        if self.coordinator is not None:
            for k in H.GROUP_API_KEYS:
                v = self._group_versions.get(k) or H.GROUP_DEFAULT_VERSIONS.get(k)
                if v:
                    out[k] = tuple(v)
        return out

    def create_topic(self, name, partitions, configs):
        topic = self.topics.create(name, partitions, configs)
        log.info("created topic %s (%d partitions, %s)", name, partitions, configs or "defaults")
        return topic

    def delete_topic(self, name):
        self.topics.delete(name)
        log.info("deleted topic %s", name)

    def set_topic_configs(self, topic, overrides: dict) -> None:
        topic.config.overrides = dict(overrides)
        topic.config._cache.clear()
        self.topics.save()
        if self.cleaner is not None:
            self.cleaner.wake()

    def next_producer_id(self) -> int:
        if self._pid_next >= self._pid_block_end:
            self._pid_block_end = self._pid_next + 1000
            meta_path = os.path.join(self.dir, "meta.json")
            write_json_atomic(meta_path, {"cluster_id": self.cluster_id,
                                          "producer_id_block_end": self._pid_block_end})
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

    # -- connections -------------------------------------------------------------------------
    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        """Read requests and start each at once; a writer sends the responses in request order.

        Handlers start in arrival order and run without suspending until they have changed the
        log, so produce requests of one connection are appended in order; only waiting requests
        (a Fetch long poll, a JoinGroup parked for a rebalance) overlap later ones.
        """
        peer = writer.get_extra_info("peername")
        client_host = "/" + (peer[0] if isinstance(peer, tuple) else "127.0.0.1")
        self._conns.add(writer)
        sock = writer.get_extra_info("socket")
        if sock is not None:
            try:
                import socket

                sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            except OSError:
                pass
        pending: asyncio.Queue = asyncio.Queue(maxsize=MAX_IN_FLIGHT)
        out_task = asyncio.create_task(self._write_responses(pending, writer, peer))
        try:
            while not self.stopping and not out_task.done():
                try:
                    head = await reader.readexactly(4)
                except (asyncio.IncompleteReadError, ConnectionError):
                    break
                (size,) = struct.unpack(">i", head)
                if size < 8 or size > self.max_request:
                    log.warning("closing connection from %s: frame size %d outside 8..%d bytes", peer, size, self.max_request)
                    break
                try:
                    frame = await reader.readexactly(size)
                except (asyncio.IncompleteReadError, ConnectionError):
                    break
                await pending.put(asyncio.create_task(self._dispatch(frame, client_host)))
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
            try:
                writer.close()
            except Exception:  # noqa: BLE001
                pass

    async def _write_responses(self, pending: asyncio.Queue, writer: asyncio.StreamWriter, peer) -> None:
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
                    writer.write(out)
                    if writer.transport.get_write_buffer_size() > (4 << 20):
                        await writer.drain()
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

    async def _dispatch(self, frame: bytes, client_host: str = "/127.0.0.1"):
        api_key, api_version, corr = _HDR.unpack_from(frame, 0)
        entry = H.API_TABLE.get(api_key)
        supported = self.supported_versions().get(api_key)
        if supported is None or not supported[0] <= api_version <= supported[1]:
            return self._unsupported(api_key, api_version, corr)
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
        if entry is not None:
            resp = await entry[4](self, req, api_version)
        else:
            try:
                resp = await self.coordinator.handle(api_key, api_version, req,
                                                     client_id=getattr(hdr, "client_id", None) or "",
                                                     client_host=client_host)
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
        if resp.API_VERSION != api_version:
            resp.API_VERSION = api_version  # before with_header: the setter touches a request header
        resp.with_header(correlation_id=corr)
        return resp.encode(header=True, framed=True)

    def _unsupported(self, api_key: int, api_version: int, corr: int):
        """UNSUPPORTED_VERSION in the best shape the client can read."""
        if api_key == 18:
            # KIP-511: answer an unknown ApiVersions version with v0 and the versions we do support
            resp = ApiVersionsResponse(version=0, error_code=H.UNSUPPORTED_VERSION, api_keys=[
                ApiVersionsResponse.ApiVersion(api_key=k, min_version=lo, max_version=hi)
                for k, (lo, hi) in sorted(self.supported_versions().items())])
            resp.with_header(correlation_id=corr)
            return resp.encode(header=True, framed=True)
        code = H.UNSUPPORTED_VERSION
        if api_key in H.GROUP_API_KEYS and self.coordinator is None:
            code = H.COORDINATOR_NOT_AVAILABLE
        log.info("answering api %d v%d with error %d (not supported)", api_key, api_version, code)
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


def _fsync_all(segs) -> None:
    for s in segs:
        try:
            s.flush()
        except OSError:
            pass


def _cluster_id() -> str:
    import base64

    return base64.urlsafe_b64encode(uuid.uuid4().bytes).decode().rstrip("=")
