"""The tasks of one instance: active tasks open across micro-batches, standby and warmup replicas.

Kafka Streams' ``TaskManager`` in miniature. The App's coordinator sends an assignment per
rebalance generation (``assign``); the host

* closes the active tasks it lost (after the batch in flight, if any) and keeps their directory as a
  standby when the assignment says so;
* opens the active tasks it gained, one at a time in an opener thread: a standby or warmup replica of
  the task on this instance is promoted (its store is handed over as it is and only its lag is
  replayed), else the task restores from its checkpoint or from the whole changelog;
* starts and stops standby and warmup replicas (threads tailing the changelogs).

A micro-batch for a task (``batch``: its offset ranges) is processed at once when the task is open
and has nothing waiting; otherwise it goes to the task's spool (``statekit.worker.exchange``) and
the engine moves on. Once a task is open its spool is drained in batch order, before any newer
batch is processed.

When Kafka goes away (``statekit.kafka.retry.retriable``: refused, reset, timed out) in the middle
of a batch or an open, the task *waits*: its state is closed without a word to Kafka (nothing of
the batch is committed: RocksDB only ever holds whole commits), the batch goes to the spool, and
the opener reopens the task with backoff — the reopen's InitProducerId aborts the transaction in
flight and its restore reads what did commit, so the batch replays, or is skipped when its commit
landed after all. A task that has waited ``task_timeout`` seconds fails, in one line.
"""
from __future__ import annotations

import logging
import os
import queue
import threading
import time
from typing import Callable, Optional

from statekit import events as ev
from statekit.contracts import TaskId, has_state, task_dir
from statekit.kafka.retry import Backoff, give_up, retriable, timed_out
from statekit.worker.exchange import Spool, range_records
from statekit.worker.task import StreamTask, WorkerSpec, is_task_store, one_line, store_specs

log = logging.getLogger("statekit.worker")

# how often an idle task looks for batches an engine spooled for it while this instance was
# unreachable (a batch delivered meanwhile drains them first, and so does a task's open after a
# restore): a rare path, and each look was one of an idle instance's two wake-ups a second
SPOOL_CHECK_S = 5.0


class _Slot:
    """An active task of this instance, from assignment to revocation."""

    def __init__(self, task: TaskId, spool: Spool):
        self.task = task
        self.spool = spool
        self.lock = threading.RLock()     # held while a batch runs
        self.stream: Optional[StreamTask] = None
        self.state = "queued"             # queued | restoring | running | waiting | failed | closed
        self.error: Optional[str] = None
        self.kind: Optional[str] = None   # the failure's exception class
        self.revoked = False
        self.opened = threading.Event()   # set when opening ended (running, failed or revoked)
        self.draining = False
        self.source = "checkpoint"
        self.to_replay: Optional[int] = None
        # waiting for Kafka: since when (epoch s), the next reopen (monotonic), its backoff, the
        # batch whose transaction was in flight, transactions aborted by this task's waits
        self.wait_since: Optional[float] = None
        self.retry_at = 0.0
        self.backoff = Backoff(first=0.2)
        self.in_doubt: Optional[int] = None
        self.wait_batch: Optional[int] = None
        self.aborted = 0


class TaskHost:
    def __init__(self, spec: WorkerSpec, instance: int, state_dir: str, publish: Callable,
                 incarnation: int = 1):
        self.spec = spec
        self.instance = int(instance)
        self.incarnation = incarnation
        self.state_dir = state_dir            # this instance's disk
        self._publish = publish
        self.generation: Optional[int] = None
        self.options: dict = {}
        self.slots: dict[TaskId, _Slot] = {}
        self.replicas: dict[TaskId, tuple] = {}   # task -> (role, StandbyReplica)
        self._lock = threading.RLock()
        self._open_queue: "queue.Queue" = queue.Queue()
        self._stopping = threading.Event()
        self.aborted = 0       # transactions aborted because Kafka went away (this process)
        self._opener = threading.Thread(target=self._open_loop, name="statekit-opener", daemon=True)
        self._opener.start()

    @property
    def kafka_down_since(self) -> Optional[float]:
        """Since when (epoch s) a task of this instance has been waiting for Kafka, or None."""
        with self._lock:
            since = [s.wait_since for s in self.slots.values() if s.state == "waiting"]
        return min(since) if since else None

    def publish(self, e) -> None:
        """Publish with the generation this instance acts under."""
        if getattr(e, "generation", 0) is None:
            e.generation = self.generation
        self._publish(e)

    def _spool(self, task: TaskId) -> Spool:
        return Spool(self.spec.control.spool_dir(task))

    def _dir(self, task: TaskId) -> str:
        return task_dir(self.state_dir, self.spec.application, task)

    # -- assignment --------------------------------------------------------------------------
    def assign(self, generation: int, mine: dict, options: Optional[dict] = None) -> dict:
        """Apply this instance's part of a new assignment: ``{"active": [task], "standby": [task],
        "warmup": [task]}``. Returns ``{task: source}`` for the active tasks it will open."""
        active = {TaskId.parse(t) for t in mine.get("active", ())}
        roles = {TaskId.parse(t): "standby" for t in mine.get("standby", ())}
        roles.update({TaskId.parse(t): "warmup" for t in mine.get("warmup", ())})
        opening = {}
        with self._lock:
            self.generation = int(generation)
            self.options = dict(options or {})
            revoked = [(self.slots.pop(t), roles.get(t)) for t in list(self.slots) if t not in active]
            for slot, _ in revoked:
                slot.revoked = True
        # 1. revoke what moved away: an opening task stops restoring at its next batch, a batch in
        #    flight finishes; the directory stays as a replica when this instance keeps one
        for slot, keep_as in revoked:
            self._close_slot(slot, "revoked")
        with self._lock:
            for slot, keep_as in revoked:
                if keep_as:
                    self._start_replica(slot.task, keep_as)
            # 2. replicas that are no longer wanted (a promoted one is handed over in the opener)
            for t in [t for t in self.replicas if t not in roles and t not in active]:
                self._stop_replica(t, "unassigned")
            for t, role in roles.items():
                if t in active:
                    continue
                cur = self.replicas.get(t)
                if cur is None:
                    self._start_replica(t, role)
                elif cur[0] != role:
                    self.replicas[t] = (role, cur[1])
            # 3. new active tasks: queued for the opener
            for t in sorted(active):
                if t in self.slots:
                    continue
                slot = _Slot(t, self._spool(t))
                rep = self.replicas.get(t)
                # a replica is promoted; local state restores from its checkpoint; none: from scratch
                slot.source = rep[0] if rep is not None else \
                    ("checkpoint" if has_state(self._dir(t)) else "scratch")
                plan = self._replay_plan(t, rep)
                slot.to_replay = None if plan is None else sum(e - s for s, e in plan.values())
                self.slots[t] = slot
                opening[str(t)] = slot.source
                self.publish(ev.RestoreQueued(task=str(t), instance=self.instance, source=slot.source,
                                              to_replay=slot.to_replay, stores=plan or {},
                                              generation=self.generation))
                self._open_queue.put(slot)
        return opening

    def _replay_plan(self, task: TaskId, rep) -> Optional[dict]:
        """``{store: [start, end]}``: the changelog offsets the task's restore will read, per store
        (its internal store left out, as the restore's events leave it out): from a replica's
        position, the checkpoint, or the log start. None when unknown."""
        if self.kafka_down_since is not None:
            return None   # Kafka is away: a plan would wait out the request timeout
        try:
            from statekit.contracts import changelog_topic
            from statekit.state import checkpoint as ckpt

            if rep is not None:
                held = rep[1].positions()
            else:
                held = {k: v.changelog_offset
                        for k, v in (ckpt.read(self._dir(task), warn=lambda m: None) or {}).items()}
            k = self._kafka()
            plan = {}
            for spec in store_specs(self.spec.plan(task.subtopology), task.subtopology):
                if not getattr(spec, "logging", True) or is_task_store(spec.name):
                    continue
                topic = changelog_topic(self.spec.application, spec.name)
                begin, end = k.offsets_many([topic], task.partition)[topic]
                start = held.get(spec.name)
                start = begin if start is None or start < begin else min(int(start), end)
                plan[spec.name] = [start, end]
            return plan
        except Exception:  # noqa: BLE001 - an estimate; a missing topic means nothing to replay
            return None

    def calibrate(self, topic: str, partition: int, settle: float = 0.0) -> tuple:
        """``(records/s, load)`` of a restore now, measured in this process, where a restore would
        run (a forecast measured in the notebook's kernel competes with the dashboard for the
        GIL): the calibration's rate at the machine's load of the moment (``state.forecast.rate_now``)."""
        from statekit.kafka import Kafka
        from statekit.state.forecast import rate_now

        k = Kafka(self.spec.bootstrap, timeout=self.spec.request_timeout)
        def busy():   # batches share the CPU with it
            return time.monotonic() - self._last_fragment < 2.0

        try:
            return rate_now(k, topic, partition, busy=busy, settle=settle)
        finally:
            k.close()

    _k = None
    _last_fragment = float("-inf")

    def _kafka(self):
        if self._k is None:
            from statekit.kafka import Kafka

            self._k = Kafka(self.spec.bootstrap, timeout=self.spec.request_timeout)
        return self._k

    def _close_slot(self, slot: _Slot, reason: str) -> None:
        if slot.state == "queued" and not slot.opened.is_set():
            slot.opened.wait(timeout=0.5)   # the opener may be picking it up right now
        if slot.state != "queued":
            slot.opened.wait()
        with slot.lock:
            never_opened = slot.stream is None and slot.state == "queued"
            if slot.stream is not None:
                slot.stream.close(reason=reason)
                slot.stream = None
            slot.state = "closed"
        if never_opened:   # its restore_queued is answered: it will not open here
            self.publish(ev.TaskClosed(task=str(slot.task), instance=self.instance, reason=reason,
                                       generation=self.generation))

    def _start_replica(self, t: TaskId, role: str) -> None:
        from statekit.state.standby import StandbyReplica

        try:
            sb = StandbyReplica(self.spec.application, t, store_specs(self.spec.plan(t.subtopology),
                                                                      t.subtopology),
                                state_dir=self.state_dir, bootstrap=self.spec.bootstrap,
                                request_timeout=self.spec.request_timeout)
        except Exception as exc:  # noqa: BLE001 - e.g. a corrupt store: the next rebalance retries
            log.warning("replica of %s did not start: %s", t, one_line(exc))
            return
        self.replicas[t] = (role, sb)
        if not self.paused:
            sb.start()
        try:
            lag = sb.lag() if self.kafka_down_since is None else None
        except Exception:  # noqa: BLE001
            lag = None
        self.publish(ev.ReplicaStarted(task=str(t), instance=self.instance, role=role, lag=lag,
                                       generation=self.generation))

    def _stop_replica(self, t: TaskId, reason: str) -> None:
        role, sb = self.replicas.pop(t)
        try:
            sb.close()
        except Exception as exc:  # noqa: BLE001
            log.info("closing replica %s: %s", t, exc)
        self.publish(ev.ReplicaStopped(task=str(t), instance=self.instance, role=role, reason=reason,
                                       generation=self.generation))

    # -- opening -----------------------------------------------------------------------------
    def _open_loop(self) -> None:
        while not self._stopping.is_set():
            try:
                slot = self._open_queue.get(timeout=self._next_look())
            except queue.Empty:
                # tasks waiting for Kafka whose next attempt is due: reopen them
                now = time.monotonic()
                with self._lock:
                    due = [s for s in self.slots.values() if s.state == "waiting" and s.retry_at <= now]
                for s in due:
                    self._open(s, None)
                    if s.state == "running":
                        self._drain(s)
                # batches an engine spooled while this instance was unreachable: drain them (a
                # batch delivered meanwhile drains them first; this is for a task that gets none)
                with self._lock:
                    idle = [s for s in self.slots.values() if s.state == "running" and not s.draining]
                for s in idle:
                    if s.spool.batches():
                        self._drain(s)
                continue
            with self._lock:
                if slot.revoked:
                    slot.opened.set()
                    continue
                slot.state = "restoring"
                rep = self.replicas.pop(slot.task, None)
            self._open(slot, rep)
            if slot.state == "running":
                self._drain(slot)

    def _next_look(self) -> float:
        """Seconds until the open loop looks again: at the next reopen due of a task waiting for
        Kafka (its backoff starts at 0.1 s), else SPOOL_CHECK_S."""
        with self._lock:
            due = [s.retry_at for s in self.slots.values() if s.state == "waiting"]
        return SPOOL_CHECK_S if not due else min(SPOOL_CHECK_S, max(0.02, min(due) - time.monotonic()))

    def _open(self, slot: _Slot, rep) -> None:
        t = slot.task
        try:
            if rep is not None:
                role, sb = rep
                try:
                    lag = sb.lag()
                except Exception:  # noqa: BLE001
                    lag = None
                sb.promote()
                self.publish(ev.StandbyPromoted(task=str(t), instance=self.instance, role=role, lag=lag,
                                                generation=self.generation))
            stream = StreamTask(self.spec, t, self.state_dir, instance=self.instance,
                                publish=self.publish, generation=self.generation, source=slot.source,
                                restore_rate=self.options.get("restore_rate"),
                                cancel=lambda: slot.revoked)
        except Exception as exc:  # noqa: BLE001
            with slot.lock:
                if slot.revoked:
                    slot.state = "closed"
                elif retriable(exc):
                    self._wait_for_kafka(slot, exc)
                else:
                    self._fail(slot, exc)
            slot.opened.set()
            return
        with slot.lock:
            if slot.revoked:
                stream.close(reason="revoked")
                slot.state = "closed"
            else:
                if slot.wait_since is not None:   # (its counts first: a status poll may come now)
                    self._resumed(slot, stream)
                slot.stream = stream
                slot.state = "running"
        slot.opened.set()

    # -- waiting for Kafka ------------------------------------------------------------------
    def _fail(self, slot: _Slot, exc: BaseException, batch: Optional[int] = None) -> None:
        slot.state = "failed"
        slot.error = one_line(exc)
        slot.kind = type(exc).__name__
        self.publish(ev.TaskFailed(task=str(slot.task), instance=self.instance, error=slot.error,
                                   kind=type(exc).__name__, batch=-1 if batch is None else batch,
                                   generation=self.generation))

    def _wait_for_kafka(self, slot: _Slot, exc: BaseException, batch: Optional[int] = None) -> None:
        """Kafka went away under the task (its slot lock held): close its state without a word to
        Kafka and try again later — or fail once it has waited ``task_timeout``."""
        stream, slot.stream = slot.stream, None
        if stream is not None:
            phase = stream.txn_phase
            if phase == "open":       # records sent, no EndTxn: the reopen aborts it
                slot.aborted += 1
                self.aborted += 1
            elif phase == "ending":   # EndTxn sent, answer lost: the reopen's restore will tell
                slot.in_doubt = batch
            try:
                stream.abandon()
            except Exception as e:  # noqa: BLE001 - it is gone either way
                log.info("abandoning %s: %s", slot.task, one_line(e))
        now = time.time()
        first = slot.wait_since is None
        if first:
            slot.wait_since = now
            slot.wait_batch = batch
            slot.backoff.reset()
        if stream is not None and has_state(self._dir(slot.task)):
            slot.source = "checkpoint"    # what the reopen restores from
        if timed_out(slot.wait_since, self.spec.task_timeout, now):
            self._fail(slot, give_up(f"task {slot.task}", self.spec.bootstrap, now - slot.wait_since,
                                     self.spec.task_timeout, exc), batch)
            return
        slot.state = "waiting"
        slot.error = one_line(exc)
        slot.retry_at = time.monotonic() + slot.backoff.next()
        if first:
            self.publish(ev.TaskWaiting(task=str(slot.task), instance=self.instance,
                                        batch=-1 if batch is None else batch, error=slot.error,
                                        since=slot.wait_since, aborted=slot.aborted,
                                        generation=self.generation))

    def _resumed(self, slot: _Slot, stream: StreamTask) -> None:
        """The task reopened after waiting for Kafka: say how long, and what became of the
        transaction that was in flight."""
        if slot.in_doubt is not None and stream.last_batch < slot.in_doubt:
            slot.aborted += 1          # its EndTxn never took effect: the reopen aborted it
            self.aborted += 1
        committed = slot.in_doubt is not None and stream.last_batch >= slot.in_doubt
        self.publish(ev.TaskResumed(task=str(slot.task), instance=self.instance,
                                    waited_s=time.time() - slot.wait_since, attempts=slot.backoff.attempts,
                                    aborted=slot.aborted, last_batch=stream.last_batch,
                                    committed_in_doubt=committed, generation=self.generation))
        slot.wait_since = slot.in_doubt = slot.wait_batch = None
        slot.aborted = 0
        slot.error = None

    def _drain(self, slot: _Slot) -> None:
        """Process the task's spool, oldest batch first, until it is empty."""
        with slot.lock:
            if slot.draining:
                return
            slot.draining = True
        try:
            self._drain_loop(slot)
        finally:
            slot.draining = False

    def _drain_loop(self, slot: _Slot) -> None:
        while not self._stopping.is_set():
            with slot.lock:
                if slot.revoked or slot.state != "running":
                    return
                ids = slot.spool.batches()
                if not ids:
                    return
                if self._process_head(slot, ids[0], from_spool=True) is None:
                    return

    def _process_head(self, slot: _Slot, b: int, from_spool: bool) -> Optional[int]:
        """Process spooled batch ``b`` (the oldest there); None when the task failed. A batch the
        task has applied is dropped."""
        if b <= slot.stream.last_batch:
            slot.spool.remove(b)          # applied: a retried task, or committed before a death
            return 0
        try:
            n = self._run(slot, b, slot.spool.get(b), from_spool=from_spool)
        except Exception as exc:  # noqa: BLE001 - already published as TaskFailed
            if from_spool and retriable(exc):
                self._wait_for_kafka(slot, exc, b)   # the batch stays in the spool
                return None
            if from_spool:
                slot.state = "failed"
                slot.error = one_line(exc)
                return None
            raise
        slot.spool.remove(b)
        return n

    def _run(self, slot: _Slot, batch: int, ranges, from_spool: bool = False) -> int:
        return slot.stream.process(batch, ranges, from_spool=from_spool)

    # -- micro-batches -----------------------------------------------------------------------
    def batch(self, task, batch: int, generation: Optional[int], ranges) -> tuple:
        """Take a task's part of a micro-batch (its offset ranges): process and commit it now, or
        spool it when the task cannot process it now (see the module docstring)."""
        self._last_fragment = time.monotonic()
        t = TaskId.parse(task)
        with self._lock:
            slot = self.slots.get(t)
        if slot is None:
            return ("not_owner", self.generation)
        with slot.lock:
            if slot.revoked:
                return ("not_owner", self.generation)
            if slot.state == "failed":
                return ("failed", slot.error or "the task failed", "ProcessorError")
            running = slot.state == "running"
            if running and batch <= slot.stream.last_batch:
                return ("done", 0)        # applied already: a task Spark retried
            try:
                if running and not slot.spool.batches():      # nothing before it: run it now
                    try:
                        return ("done", self._run(slot, batch, ranges))
                    except Exception as exc:  # noqa: BLE001
                        if not retriable(exc):
                            raise
                        self._wait_for_kafka(slot, exc, batch)   # Kafka went away: wait, replay
                        if slot.state == "failed":
                            return ("failed", slot.error, "KafkaTimeout")
                        running = False
                slot.spool.put(batch, ranges)
            except Exception as exc:  # noqa: BLE001 - the engine reports it (Spark retries)
                return ("failed", one_line(exc), type(exc).__name__)
            backlog = len(slot.spool.batches())
            self.publish(ev.BatchSpooled(task=str(t), instance=self.instance, batch=batch,
                                         records=range_records(ranges), backlog=backlog,
                                         generation=self.generation))
            if running and not slot.draining:
                threading.Thread(target=self._drain, args=(slot,), daemon=True).start()
            return ("spooled", backlog)

    def pause_replicas(self, paused: bool) -> list:
        """Stop (or resume) tailing in every replica of this instance: their stores stay open and
        their lag grows, so a promotion has something to replay (for teaching and tests)."""
        with self._lock:
            reps = dict(self.replicas)
        for _t, (_role, sb) in reps.items():
            if paused:
                sb.stop()
            else:
                sb.start()
        self.paused = paused
        return [str(t) for t in reps]

    paused = False

    # -- observation -------------------------------------------------------------------------
    def status(self) -> dict:
        with self._lock:
            slots = dict(self.slots)
            reps = dict(self.replicas)
        tasks = {}
        for t, s in slots.items():
            row = {"role": "active", "state": s.state, "source": s.source, "error": s.error,
                   "backlog": len(s.spool.batches()), "to_replay": s.to_replay,
                   "waiting_since": s.wait_since, "aborted": s.aborted, "kind": s.kind}
            st = s.stream
            if st is not None:
                try:
                    row["last_batch"] = st.last_batch
                    row["positions"] = st.positions()
                except Exception:  # noqa: BLE001 - closing meanwhile
                    pass
            tasks[str(t)] = row
        replicas = {}
        for t, (role, sb) in reps.items():
            try:
                pos = sb.positions()
            except Exception:  # noqa: BLE001
                pos = {}
            replicas[str(t)] = {"role": role, "positions": pos, "waiting_since": sb.waiting_since,
                                "error": None if sb.error is None else one_line(sb.error)}
        return {"instance": self.instance, "incarnation": self.incarnation, "pid": os.getpid(),
                "generation": self.generation, "tasks": tasks, "replicas": replicas,
                "replicas_paused": self.paused, "aborted": self.aborted, "at": time.time()}

    def stop(self) -> None:
        """Close every task and replica (a graceful shutdown)."""
        self._stopping.set()
        with self._lock:
            slots = list(self.slots.values())
            self.slots.clear()
            for slot in slots:
                slot.revoked = True
        for slot in slots:
            self._close_slot(slot, "stopped")
        with self._lock:
            for t in list(self.replicas):
                self._stop_replica(t, "stopped")
        if self._k is not None:
            self._k.close()
