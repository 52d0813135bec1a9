"""The App's view of Kafka going away: is it reachable, who waits for it, since when, and what it
cost (``App.waiting``, the WAITING state, ``KafkaUnavailable`` / ``KafkaAvailable`` events).

Two sources, because each sees what the other cannot:

* a probe in the App's process asks the broker for one topic's metadata every second (every
  three while the app idles); an answer refused or reset, or one still outstanding after
  ``SLOW_S`` seconds (a broker that stopped answering, a paused one), means Kafka is away since
  the last answer it gave. So a stall that no request of a task has timed out on yet shows at
  once;
* the instances' reports (the coordinator's last status poll): tasks waiting for Kafka
  (``TaskHost``: they closed their state and reopen with backoff) and the transactions that
  aborted because of it.

``KafkaWatch.update(statuses)`` (the runner's monitor, ten times a second) folds both into one
:class:`Wait` per outage, from its first sign to the moment Kafka answers and no task waits, and
publishes the outage's start and end as events. The runner turns it into the WAITING state.
"""
from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass, field
from typing import Callable, Optional

from statekit import events as ev

log = logging.getLogger("statekit.app")

PROBE_EVERY_S = 1.0
PROBE_IDLE_S = 3.0    # while the app idles (``every``): each probe wakes the broker and this process
SLOW_S = 3.0          # a probe unanswered this long: Kafka is away (a stall, before any timeout)


@dataclass
class Wait:
    """One outage as the App sees it: ``str()`` is the line the App's state shows."""

    bootstrap: str
    since: float                       # epoch seconds: the last moment Kafka was known to answer
    aborted: int = 0                   # transactions aborted because of it
    tasks: list = field(default_factory=list)    # tasks waiting now
    error: str = ""

    @property
    def seconds(self) -> float:
        return max(0.0, time.time() - self.since)

    def __str__(self) -> str:
        n = self.aborted
        line = f"waiting for Kafka at {self.bootstrap} since {self.seconds:.0f} s; " \
               f"{n} transaction{'' if n == 1 else 's'} aborted"
        if self.tasks:
            line += f"; tasks waiting: {', '.join(sorted(self.tasks))}"
        return line


class KafkaWatch:
    """See the module docstring. ``publish``: the App's control-side event publisher."""

    def __init__(self, bootstrap: str, probe_topic: str, request_timeout: float,
                 publish: Callable[[ev.Event], None], every: Callable[[], float] = lambda: PROBE_EVERY_S):
        self.bootstrap = bootstrap
        self.every = every
        self.probe_topic = probe_topic
        self.request_timeout = float(request_timeout)
        self.publish = publish
        self.last_ok = time.time()
        self.probe_error: Optional[str] = None
        self.probing_since: Optional[float] = None
        self.current: Optional[Wait] = None
        self.outages: list[dict] = []      # every outage that ended: since, seconds, aborted, tasks
        self._calm: dict = {}        # each instance process's aborted count before the outage
        self._baseline: dict = {}
        self._waited: set = set()
        self._stop = threading.Event()
        self._wake = threading.Event()      # probe now (the tasks are back: is Kafka?)
        self._thread: Optional[threading.Thread] = None

    # -- the probe ---------------------------------------------------------------------------
    def start(self) -> "KafkaWatch":
        if self._thread is None:
            self._stop.clear()
            self._thread = threading.Thread(target=self._probe_loop, daemon=True,
                                            name="statekit-kafka-watch")
            self._thread.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._wake.set()
        t, self._thread = self._thread, None
        if t is not None and t is not threading.current_thread():
            t.join(timeout=self.request_timeout + 1)

    def _probe_loop(self) -> None:
        from statekit.kafka import Kafka
        from statekit.kafka.retry import retriable

        k = None
        while not self._stop.is_set():
            t0 = time.time()
            self.probing_since = t0
            try:
                if k is None:
                    k = Kafka(self.bootstrap, timeout=self.request_timeout, client_id="statekit-watch")
                k.partition_counts([self.probe_topic])
                self.last_ok, self.probe_error = time.time(), None
            except Exception as exc:  # noqa: BLE001
                if k is not None:
                    k.close()
                    k = None
                if retriable(exc) or isinstance(exc, OSError):
                    self.probe_error = " ".join(str(exc).split())[:200]
                else:
                    log.info("kafka watch: %s", exc)
            finally:
                self.probing_since = None
            self._wake.wait(max(0.05, self.every() - (time.time() - t0)))
            self._wake.clear()
        if k is not None:
            k.close()

    def probe_down(self) -> bool:
        """Does the probe say Kafka is away right now?"""
        if self.probe_error is not None:
            return True
        since = self.probing_since
        return since is not None and time.time() - since > SLOW_S

    # -- one outage from both sources ------------------------------------------------------------
    def update(self, statuses: dict) -> Optional[Wait]:
        """The outage now (None when Kafka answers and no task waits), from the probe and the
        instances' last reports (``{instance: status}``); publishes its start and its end."""
        waiting, since = [], []
        aborted = {}
        for i, st in (statuses or {}).items():
            aborted[(i, st.get("pid"))] = int(st.get("aborted") or 0)
            for t, row in (st.get("tasks") or {}).items():
                if row.get("state") == "waiting":
                    waiting.append(t)
                    if row.get("waiting_since"):
                        since.append(float(row["waiting_since"]))
        down = self.probe_down()
        if down and not waiting and self.current is not None and self.current.tasks:
            self._wake.set()     # the tasks reopened: ask Kafka again now, not in a second
        if not down and not waiting:
            self._end()
            self._calm = aborted
            return None
        w = self.current
        if w is None:
            start = min([self.last_ok] + since) if down else min(since)
            if self.outages:   # outages never overlap: the last answer may predate the last one's end
                start = max(start, self.outages[-1]["since"] + self.outages[-1]["seconds"])
            w = self.current = Wait(self.bootstrap, start)
            self._baseline = dict(self._calm)
            self._waited = set()
            self.publish(ev.KafkaUnavailable(bootstrap=self.bootstrap, since=start,
                                             error=self.probe_error or "tasks are waiting for Kafka"))
        w.tasks = waiting
        self._waited.update(waiting)
        w.error = self.probe_error or ""
        w.aborted = sum(max(0, n - self._baseline.get(k, 0)) for k, n in aborted.items())
        return w

    def _end(self) -> None:
        w, self.current = self.current, None
        if w is None:
            return
        rec = {"since": w.since, "seconds": time.time() - w.since, "aborted": w.aborted,
               "tasks": sorted(self._waited)}
        self.outages.append(rec)
        self.publish(ev.KafkaAvailable(bootstrap=self.bootstrap, since=w.since, seconds=rec["seconds"],
                                       aborted=w.aborted, tasks_waited=rec["tasks"]))
