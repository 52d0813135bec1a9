"""How events travel: one JSON record per event on ``<application>-events``.

The topic has 1 partition, ``cleanup.policy=delete`` and one hour of retention, and is created on
demand. What an event says is defined in :mod:`statekit.events` (typed records); this module only
moves them: ``EventPublisher`` (instances and the App's coordinator) and ``EventReader`` (the App,
tailing the topic in a background thread). A Kafka topic is the one channel that also works when
the publishers run on other machines.

Publishing never fails the caller. While the broker is away (``statekit.kafka.retry.retriable``)
events are held in order, in memory (up to ``HOLD_MAX`` per broker, the oldest dropped beyond), and a
thread sends them once it answers again: the events of an outage (``TaskWaiting``,
``KafkaUnavailable``, ...) reach the topic after it. Any other failure drops the event and says so
once in the log.
"""
from __future__ import annotations

import dataclasses
import json
import logging
import os
import threading
import time
from collections import deque
from typing import Callable, Optional

from statekit.contracts import events_topic
from statekit.events import Event, from_dict

log = logging.getLogger("statekit.events")

EVENTS_RETENTION_MS = 3_600_000
# a reader whose app has published nothing for QUIET_S long-polls QUIET_POLL_MS at a time: an
# event ends the poll at once, and stop() interrupts it, so the length costs nothing but the
# idle kernel's and broker's wake-ups (one a second had been a sixth of an idle broker's CPU)
QUIET_S = 10.0
QUIET_POLL_MS = 5000


def topic_configs() -> dict:
    return {"cleanup.policy": "delete", "retention.ms": str(EVENTS_RETENTION_MS)}


# -- per-process clients -------------------------------------------------------------------------
# Spark reuses Python workers across partitions and batches: one client per (process, bootstrap),
# created lazily, re-created after a fork (the pid changes) or an error.

_CLIENTS: dict = {}
_ENSURED: set = set()
_DOWN_UNTIL: dict = {}   # bootstrap -> monotonic time before which publishing is not retried
BACKOFF_S = 5.0
EVENTS_TIMEOUT_S = 5.0   # the events client's request timeout: a lost broker holds a publisher this long
HOLD_MAX = 10_000        # events held per broker while it is away
HOLD_S = 900.0           # ... for this long at most: a broker gone for good drops them
_CLIENT_LOCK = threading.Lock()
_HELD: dict = {}         # (pid, bootstrap) -> deque of (topic, [(None, json bytes)]), oldest first
_HELD_DROPPED: dict = {}
_FLUSHERS: dict = {}     # (pid, bootstrap) -> the thread sending what is held


def _client(bootstrap: str):
    from statekit.kafka import Kafka

    key = (os.getpid(), bootstrap)
    c = _CLIENTS.get(key)
    if c is None:
        c = Kafka(bootstrap, timeout=EVENTS_TIMEOUT_S, client_id="statekit-events")
        _CLIENTS[key] = c
    return c


def held(bootstrap: str) -> int:
    """Events of this process waiting for the broker at ``bootstrap`` to come back."""
    q = _HELD.get((os.getpid(), bootstrap))
    return sum(len(p) for _t, p in q) if q else 0


def _hold(bootstrap: str, topic: str, payload: list) -> None:
    """Keep events for a broker that is away (under _CLIENT_LOCK), and make sure a thread will
    send them."""
    key = (os.getpid(), bootstrap)
    q = _HELD.setdefault(key, deque())
    q.append((topic, payload))
    while sum(len(p) for _t, p in q) > HOLD_MAX and len(q) > 1:
        _t, lost = q.popleft()
        _HELD_DROPPED[key] = _HELD_DROPPED.get(key, 0) + len(lost)
    t = _FLUSHERS.get(key)
    if t is None or not t.is_alive():
        t = _FLUSHERS[key] = threading.Thread(target=_flush_held, args=(bootstrap,), daemon=True,
                                              name="statekit-events-held")
        t.start()


def _flush_held(bootstrap: str) -> None:
    """Send the held events, oldest first, once the broker answers (with backoff). The network
    calls run outside _CLIENT_LOCK, on a client of their own, so publishers are never held up:
    while anything is held they only add to the queue, which keeps the order."""
    from statekit.kafka import Kafka
    from statekit.kafka.retry import Backoff

    key = (os.getpid(), bootstrap)
    backoff = Backoff(first=0.2)
    k = None
    ensured: set = set()
    failing_since = None
    while True:
        with _CLIENT_LOCK:
            q = _HELD.get(key)
            if q and failing_since is not None and time.monotonic() - failing_since > HOLD_S:
                dropped = sum(len(p) for _t, p in q)
                q.clear()
                _HELD_DROPPED[key] = _HELD_DROPPED.get(key, 0) + dropped
                log.warning("statekit: %d events for %s dropped: the broker stayed away %.0f s",
                            dropped, bootstrap, HOLD_S)
            if not q or _FLUSHERS.get(key) is not threading.current_thread():
                if _FLUSHERS.get(key) is threading.current_thread():
                    _FLUSHERS.pop(key, None)
                break
            item = q[0]
            topic, payload = item
        try:
            if k is None:
                k = Kafka(bootstrap, timeout=EVENTS_TIMEOUT_S, client_id="statekit-events-held")
            if topic not in ensured:
                k.ensure_topic(topic, 1, topic_configs())
                ensured.add(topic)
            k.send(topic, 0, payload)
            backoff.reset()
            failing_since = None
            with _CLIENT_LOCK:
                if q and q[0] is item:   # (unless HOLD_MAX dropped it meanwhile)
                    q.popleft()
                if not q:
                    _DOWN_UNTIL.pop(bootstrap, None)
        except Exception:  # noqa: BLE001 - still away: try again later
            failing_since = failing_since or time.monotonic()
            if k is not None:
                try:
                    k.close()
                except Exception:
                    pass
                k = None
            time.sleep(backoff.next())
    if k is not None:
        k.close()


def _drop_client(bootstrap: str) -> None:
    c = _CLIENTS.pop((os.getpid(), bootstrap), None)
    if c is not None:
        try:
            c.close()
        except Exception:
            pass


def close_clients() -> None:
    """Close every cached client of this process (tests, shutdown); events still held are
    dropped and their threads end."""
    with _CLIENT_LOCK:
        _HELD.clear()
        _FLUSHERS.clear()
        for c in list(_CLIENTS.values()):
            try:
                c.close()
            except Exception:
                pass
        _CLIENTS.clear()
        _ENSURED.clear()


def ensure_events_topic(kafka, application: str) -> str:
    topic = events_topic(application)
    key = (os.getpid(), kafka.bootstrap, topic)
    if key not in _ENSURED:
        kafka.ensure_topic(topic, 1, topic_configs())
        _ENSURED.add(key)
    return topic


def _dumps(ev: dict) -> bytes:
    return json.dumps(ev, separators=(",", ":"), default=_default).encode("utf-8")


def _default(o):
    if isinstance(o, (set, frozenset, tuple)):
        return list(o)
    if isinstance(o, bytes):
        return o.decode("utf-8", "replace")
    if hasattr(o, "item"):  # numpy scalars
        try:
            return o.item()
        except Exception:
            pass
    return str(o)


class EventPublisher:
    """Publishes JSON events to ``<application>-events``. Cheap to create (the Kafka client is
    shared per process and bootstrap); ``close()`` only detaches this publisher."""

    _warned: set = set()

    def __init__(self, bootstrap: str, application: str, defaults: Optional[dict] = None) -> None:
        self.bootstrap = bootstrap
        self.application = application
        self.topic = events_topic(application)
        self.defaults = dict(defaults or {})
        self.published = 0
        self.dropped = 0

    def _stamp(self, ev) -> dict:
        """The event's fields; a default of this publisher (e.g. its instance) fills a field the
        event left at its own default."""
        out = dict(self.defaults)
        if isinstance(ev, Event):
            unset = {f.name for f in dataclasses.fields(ev)
                     if f.name in self.defaults and getattr(ev, f.name) == f.default}
            out.update({k: v for k, v in ev.to_dict().items() if k not in unset})
        else:
            out.update(ev)
        if out.get("ts") == 0.0:
            out.pop("ts")
        if out.get("pid") == 0:
            out.pop("pid")
        if not out.get("app"):
            out.pop("app", None)
        out.pop("offset", None)
        out.setdefault("app", self.application)
        out.setdefault("ts", time.time())
        out.setdefault("pid", os.getpid())
        return out

    def publish(self, event) -> bool:
        """Publish one event (a ``statekit.events.Event``; a dict is accepted as it is)."""
        return self.publish_many([event])

    def publish_many(self, events) -> bool:
        """Send events in order (one produce request); False when they were held (the broker is
        away: they follow once it is back) or dropped."""
        from statekit.kafka.retry import retriable

        evs = [self._stamp(e) for e in events]
        if not evs:
            return True
        payload = [(None, _dumps(e)) for e in evs]
        with _CLIENT_LOCK:
            if _HELD.get((os.getpid(), self.bootstrap)) or \
                    _DOWN_UNTIL.get(self.bootstrap, 0.0) > time.monotonic():
                _hold(self.bootstrap, self.topic, payload)   # after what waits: in order, no stall
                return False
            for attempt in (0, 1):
                try:
                    k = _client(self.bootstrap)
                    ensure_events_topic(k, self.application)
                    k.send(self.topic, 0, payload)
                    _DOWN_UNTIL.pop(self.bootstrap, None)
                    self.published += len(evs)
                    return True
                except Exception as exc:  # noqa: BLE001 - events are best effort
                    _drop_client(self.bootstrap)
                    _ENSURED.discard((os.getpid(), self.bootstrap, self.topic))
                    if retriable(exc):   # away: hold them (and what follows) until it is back
                        _DOWN_UNTIL[self.bootstrap] = time.monotonic() + BACKOFF_S
                        _hold(self.bootstrap, self.topic, payload)
                        return False
                    if attempt:
                        _DOWN_UNTIL[self.bootstrap] = time.monotonic() + BACKOFF_S
                        self.dropped += len(evs)
                        if self.topic not in EventPublisher._warned:
                            EventPublisher._warned.add(self.topic)
                            log.warning("statekit: events to %s dropped: %s", self.topic,
                                        " ".join(str(exc).split())[:200])
                        return False
        return False

    def close(self) -> None:
        """Detach (the shared per-process client stays for the next publisher)."""


class NullPublisher:
    """Events disabled."""

    published = 0
    dropped = 0

    def publish(self, event: dict) -> bool:
        return True

    def publish_many(self, events) -> bool:
        return True

    def close(self) -> None:
        pass


class EventReader:
    """Tails ``<application>-events`` in a background thread into a bounded deque.

    ``start="end"`` (default) sees the events published after the reader was created; ``"beginning"``
    also the ones still retained. Each event gets ``offset`` (its position in the topic).
    ``events(since=None)``: events with ``offset > since`` (an offset) — or, with ``since_ts``, with
    ``ts >= since_ts``. ``subscribe(callback)`` calls ``callback(event)`` from the reader thread for
    every new event (exceptions are logged and ignored). ``poll(timeout)`` returns the events that
    arrived since the previous poll (for a consumer loop). ``stop()``/``close()`` end the thread."""

    def __init__(self, bootstrap: str, application: str, start: str = "end", maxlen: int = 50_000,
                 poll_ms: int = 200) -> None:
        from statekit.kafka import Kafka

        self.bootstrap = bootstrap
        self.application = application
        self.topic = events_topic(application)
        self.poll_ms = int(poll_ms)
        self._events: deque = deque(maxlen=maxlen)
        self._callbacks: list = []
        self._cond = threading.Condition()
        self._stop = threading.Event()
        self._poll_cursor = -1
        self.errors = 0
        self.last_error: Optional[str] = None
        self._kafka = Kafka(bootstrap, timeout=10.0, client_id="statekit-events-reader")
        self._kafka.ensure_topic(self.topic, 1, topic_configs())
        if start == "beginning":
            self.position = self._kafka.begin_offsets(self.topic, [0])[0]
        else:
            self.position = self._kafka.end_offsets(self.topic, [0])[0]
        self._thread = threading.Thread(target=self._run, name=f"statekit-events-{application}",
                                        daemon=True)
        self._thread.start()

    # -- thread ------------------------------------------------------------------------------
    def _run(self) -> None:
        from statekit.kafka import Kafka

        last = time.monotonic()
        while not self._stop.is_set():
            try:
                if self._kafka is None:
                    self._kafka = Kafka(self.bootstrap, timeout=10.0, client_id="statekit-events-reader")
                t0 = time.monotonic()
                # an event ends the long poll at once, whatever its length; a quiet app is asked
                # less often
                wait_ms = self.poll_ms if t0 - last < QUIET_S else max(self.poll_ms, QUIET_POLL_MS)
                chunk = self._kafka.fetch(self.topic, 0, self.position, max_wait_ms=wait_ms)
                self.position = max(self.position, chunk.next_offset)
                if chunk.records:
                    last = time.monotonic()
                    self._deliver(chunk.records)
                elif time.monotonic() - t0 < wait_ms / 2000.0:
                    self._stop.wait(wait_ms / 1000.0)  # the broker did not long-poll
            except Exception as exc:  # noqa: BLE001 - keep tailing through broker restarts
                if self._stop.is_set():
                    break                  # stop() interrupted the poll: not an error
                self.errors += 1
                self.last_error = " ".join(str(exc).split())[:200]
                k, self._kafka = self._kafka, None
                if k is not None:
                    try:
                        k.close()
                    except Exception:
                        pass
                self._stop.wait(1.0)
        k, self._kafka = self._kafka, None
        if k is not None:
            try:
                k.close()
            except Exception:
                pass

    def _deliver(self, records) -> None:
        new = []
        for off, _ts, _key, value, _headers in records:
            if value is None:
                continue
            try:
                ev = json.loads(value)
            except ValueError:
                continue
            if not isinstance(ev, dict):
                continue
            ev["offset"] = off
            new.append(from_dict(ev))
        if not new:
            return
        with self._cond:
            self._events.extend(new)
            self._cond.notify_all()
        for ev in new:
            for cb in list(self._callbacks):
                try:
                    cb(ev)
                except Exception as exc:  # noqa: BLE001
                    log.info("event callback failed: %s", exc)

    # -- API ---------------------------------------------------------------------------------
    def events(self, since: Optional[int] = None, since_ts: Optional[float] = None,
               types=None) -> list:
        with self._cond:
            out = list(self._events)
        if since is not None:
            out = [e for e in out if e.offset > since]
        if since_ts is not None:
            out = [e for e in out if e.ts >= since_ts]
        if types is not None:
            types = {types} if isinstance(types, str) else set(types)
            out = [e for e in out if e.type in types]
        return out

    def poll(self, timeout: float = 0.5) -> list:
        """Events newer than the last poll (waits up to `timeout` seconds for one)."""
        deadline = time.monotonic() + timeout
        with self._cond:
            while True:
                new = [e for e in self._events if e.offset > self._poll_cursor]
                if new or self._stop.is_set():
                    break
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cond.wait(left)
        if new:
            self._poll_cursor = new[-1].offset
        return new

    def wait_for(self, predicate: Callable[[Event], bool], timeout: float = 30.0) -> Optional[Event]:
        """The first event (already seen or new) for which predicate(event) is true, or None."""
        deadline = time.monotonic() + timeout
        seen = 0
        with self._cond:
            while True:
                evs = list(self._events)
                for e in evs[seen:]:
                    if predicate(e):
                        return e
                seen = len(evs)
                left = deadline - time.monotonic()
                if left <= 0:
                    return None
                self._cond.wait(min(left, 0.5))

    def subscribe(self, callback: Callable[[Event], None]) -> Callable[[Event], None]:
        self._callbacks.append(callback)
        return callback

    def unsubscribe(self, callback) -> None:
        try:
            self._callbacks.remove(callback)
        except ValueError:
            pass

    @property
    def running(self) -> bool:
        return self._thread.is_alive()

    def stop(self, timeout: float = 5.0) -> None:
        self._stop.set()
        k = self._kafka
        if k is not None:
            k.interrupt()          # the long poll in flight ends now
        with self._cond:
            self._cond.notify_all()
        if self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def close(self) -> None:
        self.stop()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()
