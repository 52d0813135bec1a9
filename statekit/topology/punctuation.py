"""Punctuators: callbacks a processor schedules on stream time or on the wall clock (Kafka Streams'
PunctuationQueue), with their schedules kept in the task's meta so they survive the per-batch
processor life cycle and restarts.

Firing rule (Kafka Streams'): a schedule fires when the time reaches its next firing time; the next
one is then the first `first + k * interval` after the current time (missed firings are skipped, not
replayed). STREAM_TIME schedules start at 0 (they fire as soon as the task has data and then at every
multiple of the interval); WALL_CLOCK_TIME ones at `now + interval`. The callback gets the current
stream time (or wall clock), not the scheduled time. Schedules due at the same time fire in order of
their next firing time, then of registration.
"""
from __future__ import annotations

from typing import Any, Callable

from statekit.errors import ProcessorError, StatekitError


def check_schedule(where: str, interval_ms: Any, punctuation_type: Any, callback: Any,
                   error=ProcessorError) -> None:
    """One line that says what to change, for a schedule() call that cannot work."""
    from statekit.topology.processor import PunctuationType

    if isinstance(interval_ms, bool) or not isinstance(interval_ms, int) or interval_ms <= 0:
        raise error(f"{where}: context.schedule() needs an interval > 0 ms, got {interval_ms!r}; "
                    f"pass a positive whole number of milliseconds")
    if not isinstance(punctuation_type, PunctuationType):
        raise error(f"{where}: context.schedule() needs PunctuationType.STREAM_TIME or "
                    f"PunctuationType.WALL_CLOCK_TIME, got {punctuation_type!r}")
    if not callable(callback):
        raise error(f"{where}: context.schedule() needs a callback(timestamp), got "
                    f"{type(callback).__name__}")


class Schedule:
    __slots__ = ("node", "key", "stream", "callback", "state", "order")

    def __init__(self, node: str, key: str, stream: bool, callback: Callable, state: dict,
                 order: int) -> None:
        self.node = node
        self.key = key
        self.stream = stream
        self.callback = callback
        self.state = state          # {"interval", "type", "next", "cancelled"}: lives in the meta
        self.order = order

    @property
    def cancelled(self) -> bool:
        return bool(self.state.get("cancelled"))

    def cancel(self) -> None:
        self.state["cancelled"] = True

    def advance(self, now: int) -> None:
        """The next firing time after `now` (skipping missed ones)."""
        interval = self.state["interval"]
        nxt = self.state["next"] + interval
        if now >= nxt:
            nxt = self.state["next"] + ((now - self.state["next"]) // interval + 1) * interval
        self.state["next"] = nxt


class Punctuation:
    """The punctuators of one task processor."""

    def __init__(self, tp) -> None:
        self.tp = tp
        self.states: dict = tp.meta.setdefault("punctuation", {})
        self.schedules: list = []
        self._calls: dict = {}      # node -> schedule() calls so far in this batch

    def schedule(self, node: str, interval_ms, punctuation_type, callback):
        from statekit.topology.processor import Cancellable, PunctuationType

        check_schedule(node, interval_ms, punctuation_type, callback)
        i = self._calls.get(node, 0)
        self._calls[node] = i + 1
        key = f"{node}#{i}"
        stream = punctuation_type is PunctuationType.STREAM_TIME
        st = self.states.get(key)
        if st is None or st.get("interval") != interval_ms or st.get("type") != punctuation_type.value:
            first = 0 if stream else self.tp.wall_clock_ms() + interval_ms
            st = self.states[key] = {"interval": interval_ms, "type": punctuation_type.value,
                                     "next": first, "cancelled": False}
        s = Schedule(node, key, stream, callback, st, len(self.schedules))
        self.schedules.append(s)
        self._refresh()
        return Cancellable(s)

    def _refresh(self) -> None:
        nxt = [s.state["next"] for s in self.schedules if s.stream and not s.cancelled]
        self.tp._next_stream_punct = min(nxt) if nxt else float("inf")

    def _fire(self, stream: bool, now: int, what: str) -> int:
        due = sorted((s for s in self.schedules
                      if s.stream is stream and not s.cancelled and s.state["next"] <= now),
                     key=lambda s: (s.state["next"], s.order))
        rec = self.tp.rec
        saved = (rec.topic, rec.partition, rec.offset, rec.timestamp)
        fired = 0
        try:
            for s in due:
                if s.cancelled:        # cancelled by an earlier punctuator of this round
                    continue
                rec.topic, rec.partition, rec.offset, rec.timestamp = None, None, None, now
                try:
                    s.callback(now)
                except StatekitError:
                    raise
                except Exception as e:
                    msg = " ".join((str(e) or "(no message)").split())[:160]
                    raise ProcessorError(f"{s.node}: a {what} punctuator failed at {now} in task "
                                         f"{self.tp.task_id}: {type(e).__name__}: {msg}") from e
                fired += 1
                if not s.cancelled:
                    s.advance(now)
        finally:
            rec.topic, rec.partition, rec.offset, rec.timestamp = saved
            self._refresh()
        return fired

    def fire_stream(self, stream_time: int) -> int:
        return self._fire(True, stream_time, "stream-time")

    def fire_wall(self, now_ms: int) -> int:
        return self._fire(False, now_ms, "wall-clock")
