"""The event contract: every event an application publishes, as typed records.

Instances (the worker side) and the App's coordinator (the control side) publish these to
``<app>-events`` (``statekit.event_bus``); ``App.events()`` returns them, the dashboard reads their
fields. One place says what each field means, so no reader has to guess a column name or a unit.

Units: ``ts`` is epoch seconds (float) when the event happened; ``*_ms`` are milliseconds and
``seconds`` seconds (floats); ``*_rps`` are records per second; offsets are Kafka offsets; ``lag`` and
``to_replay`` count changelog records (data and commit markers). ``task`` is a task id
(``"0_3"``: sub-topology 0, partition 3), ``instance`` an instance number. ``generation`` is the
rebalance generation the publisher acted under (None when not known).

Restore ``source`` values: ``checkpoint`` (local state, replaying from its checkpoint), ``standby``
(a promoted standby replica), ``warmup`` (a promoted warmup replica), ``scratch`` (no usable local
state: the whole changelog), ``none`` (nothing to replay).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import ClassVar, Optional

__all__ = ["Event", "EVENT_TYPES", "from_dict"] + [
    "StateChanged", "InstanceStarted", "InstanceDied", "InstanceLeft", "Rebalance", "ReplicaStarted",
    "ReplicaStopped", "WarmupCaughtUp", "StandbyPromoted", "RestoreQueued", "TaskOpened",
    "RestoreStarted", "RestoreProgress", "RestoreEnded", "TaskClosed", "BatchSpooled",
    "BatchSkipped", "Committed", "Crashed", "TaskFailed", "TaskWaiting", "TaskResumed",
    "KafkaUnavailable", "KafkaAvailable",
]

EVENT_TYPES: dict[str, type] = {}


def _register(cls):
    EVENT_TYPES[cls.type] = cls
    return cls


@dataclass
class Event:
    """Fields every event has."""

    type: ClassVar[str] = "event"
    app: str = ""
    ts: float = 0.0                       # epoch seconds
    pid: int = 0                          # the publishing process
    generation: Optional[int] = None      # rebalance generation the publisher acted under
    offset: Optional[int] = None          # position in <app>-events (set when read)
    extra: dict = field(default_factory=dict)  # fields of a newer publisher this reader does not know

    def to_dict(self) -> dict:
        d = {"type": self.type}
        for f in dataclasses.fields(self):
            if f.name == "extra":
                continue
            d[f.name] = getattr(self, f.name)
        d.update(self.extra)
        return d

    def get(self, name: str, default=None):
        """Dict-style access (``ev.get("task")``), for code that handles several event types."""
        if hasattr(self, name):
            return getattr(self, name)
        return self.extra.get(name, default)


def from_dict(d: dict) -> Event:
    """The typed event of a published dict (an unknown type becomes a plain ``Event``)."""
    cls = EVENT_TYPES.get(d.get("type"), Event)
    names = {f.name for f in dataclasses.fields(cls)}
    kw = {k: v for k, v in d.items() if k in names and k != "extra"}
    ev = cls(**kw)
    ev.extra = {k: v for k, v in d.items() if k not in names and k != "type"}
    if cls is Event:
        ev.extra["type"] = d.get("type")
    return ev


# -- the application ------------------------------------------------------------------------------

@_register
@dataclass
class StateChanged(Event):
    """The application's lifecycle state changed (Kafka Streams' KafkaStreams.State)."""

    type: ClassVar[str] = "state"
    state: str = ""        # CREATED | RESTORING | REBALANCING | RUNNING | WAITING | PENDING_SHUTDOWN |
    #                        NOT_RUNNING | ERROR
    old: str = ""
    reason: str = ""       # one line; for ERROR, the error


# -- membership ----------------------------------------------------------------------------------

@_register
@dataclass
class InstanceStarted(Event):
    """An instance process is up and serving (joined, or revived)."""

    type: ClassVar[str] = "instance_started"
    instance: int = -1
    incarnation: int = 0   # 1 for its first process, +1 at every revive
    instance_pid: int = 0
    disk: str = "new"      # new | kept (its old state directory) | wiped (revived without its disk)
    reason: str = "start"  # start | add | revive | restart


@_register
@dataclass
class InstanceDied(Event):
    """An instance process ended without being asked to (a kill, a crash directive, an exit)."""

    type: ClassVar[str] = "instance_died"
    instance: int = -1
    incarnation: int = 0
    cause: str = "kill"        # kill | crash | exit
    mode: str = "process"      # process | disk-loss (its state directory was deleted)
    point: Optional[str] = None  # the crash point, for a crash directive
    exit_code: Optional[int] = None
    tasks: list = field(default_factory=list)     # active tasks it held
    deleted: int = 0           # task directories deleted (disk-loss)


@_register
@dataclass
class InstanceLeft(Event):
    """An instance left gracefully (remove_instance / scale down) after its tasks moved."""

    type: ClassVar[str] = "instance_left"
    instance: int = -1


@_register
@dataclass
class Rebalance(Event):
    """A new assignment took effect. ``moves`` lists only tasks whose active instance changed."""

    type: ClassVar[str] = "rebalance"
    reason: str = ""           # what triggered it, one line
    live: list = field(default_factory=list)            # live instances
    active: dict = field(default_factory=dict)          # task -> instance
    standbys: dict = field(default_factory=dict)        # task -> [instance]
    warmups: dict = field(default_factory=dict)         # task -> [instance]
    moves: list = field(default_factory=list)           # [{task, from, to, reason}]
    probing: bool = False      # a probing rebalance will follow (warmups are catching up)


@_register
@dataclass
class ReplicaStarted(Event):
    """A standby or warmup replica started tailing its task's changelogs on an instance."""

    type: ClassVar[str] = "replica_started"
    task: str = ""
    instance: int = -1
    role: str = "standby"      # standby | warmup
    lag: Optional[int] = None


@_register
@dataclass
class ReplicaStopped(Event):
    type: ClassVar[str] = "replica_stopped"
    task: str = ""
    instance: int = -1
    role: str = "standby"
    reason: str = ""


@_register
@dataclass
class WarmupCaughtUp(Event):
    """A warmup replica came within ``acceptable_recovery_lag``: its task moves at this rebalance."""

    type: ClassVar[str] = "warmup_caught_up"
    task: str = ""
    instance: int = -1
    lag: int = 0
    acceptable_lag: int = 0


@_register
@dataclass
class StandbyPromoted(Event):
    """A standby (or warmup) replica became the active copy: the task replays only ``lag``."""

    type: ClassVar[str] = "standby_promoted"
    task: str = ""
    instance: int = -1
    role: str = "standby"      # standby | warmup
    lag: Optional[int] = None


# -- tasks: opening and restoring ----------------------------------------------------------------

@_register
@dataclass
class RestoreQueued(Event):
    """An instance was given a task and will open it; ``to_replay`` is known before it starts:
    the changelog offsets its restore will read, per store in ``stores`` (``{store: [start,
    end]}``; the task's internal store is not counted), so its lag is known while it waits."""

    type: ClassVar[str] = "restore_queued"
    task: str = ""
    instance: int = -1
    source: str = "scratch"
    to_replay: Optional[int] = None
    stores: dict = field(default_factory=dict)   # store -> [start offset, end offset]


@_register
@dataclass
class RestoreStarted(Event):
    type: ClassVar[str] = "restore_start"
    task: str = ""
    instance: int = -1
    store: str = ""
    source: str = "scratch"
    start_offset: int = 0
    end_offset: int = 0
    to_replay: int = 0
    throttle_rps: Optional[float] = None   # a teaching throttle (restore_rate), None = full speed


@_register
@dataclass
class RestoreProgress(Event):
    """A restore's progress, a few times a second."""

    type: ClassVar[str] = "restore_batch"
    task: str = ""
    instance: int = -1
    store: str = ""
    offset: int = 0
    restored: int = 0          # records read so far
    remaining: int = 0
    rate_rps: float = 0.0
    held: bool = False         # stopped here until App.release_restores() (App.hold_restores)


@_register
@dataclass
class RestoreEnded(Event):
    type: ClassVar[str] = "restore_end"
    task: str = ""
    instance: int = -1
    store: str = ""
    source: str = "scratch"
    start_offset: int = 0
    end_offset: int = 0
    restored: int = 0          # changelog records read (data + markers)
    applied: int = 0           # records written to the store
    seconds: float = 0.0
    rate_rps: float = 0.0
    dropped_uncommitted: int = 0
    throttle_rps: Optional[float] = None


@_register
@dataclass
class TaskOpened(Event):
    """A task is open and ready to process on an instance (after its restore, if any)."""

    type: ClassVar[str] = "task_opened"
    task: str = ""
    instance: int = -1
    source: str = "none"
    last_batch: int = -1       # the last input batch its state has applied
    restored: int = 0          # changelog records replayed to open it
    open_ms: float = 0.0       # from the assignment to ready
    notices: list = field(default_factory=list)   # one-line warnings of the state layer


@_register
@dataclass
class TaskClosed(Event):
    type: ClassVar[str] = "task_closed"
    task: str = ""
    instance: int = -1
    reason: str = "revoked"    # revoked | stopped


# -- tasks: processing ---------------------------------------------------------------------------

@_register
@dataclass
class BatchSpooled(Event):
    """A micro-batch reached a task that could not process it yet (restoring, moving, its instance
    dead): it waits in the control directory and is processed, in order, as soon as it can be."""

    type: ClassVar[str] = "batch_spooled"
    task: str = ""
    instance: Optional[int] = None   # the owner that spooled it (None: the engine did, no owner alive)
    batch: int = -1
    records: int = 0
    backlog: int = 0                 # batches waiting for this task, this one included


@_register
@dataclass
class BatchSkipped(Event):
    """A batch the task had already applied (a replay after a crash): nothing is done twice."""

    type: ClassVar[str] = "batch_skipped"
    task: str = ""
    instance: int = -1
    batch: int = -1
    last_batch: int = -1


@_register
@dataclass
class Committed(Event):
    """A task committed a micro-batch (changelog records and markers acked, RocksDB written)."""

    type: ClassVar[str] = "commit"
    task: str = ""
    instance: int = -1
    batch: int = -1
    records: int = 0                 # input records processed
    outputs: int = 0                 # output records
    changelog: dict = field(default_factory=dict)   # store -> changelog records sent
    offsets: dict = field(default_factory=dict)     # store -> changelog position after the commit
    commit_ms: float = 0.0           # the commit: changelog and outputs sent, RocksDB, checkpoint
    process_ms: float = 0.0          # the records through the task's steps (read_ms included)
    read_ms: float = 0.0             # the batch's offset ranges read from Kafka and decoded
    cache: dict = field(default_factory=dict)       # store -> record cache stats
    rows: dict = field(default_factory=dict)        # store -> key count (exact for kv stores)
    stream_time: int = -1
    dropped_late: int = 0
    skipped_null: int = 0
    from_spool: bool = False         # a batch that waited in the spool


@_register
@dataclass
class Crashed(Event):
    """A worker claimed a crash directive and is about to SIGKILL its own process."""

    type: ClassVar[str] = "crash"
    instance: int = -1
    task: Optional[str] = None
    point: str = ""
    mode: str = "process"
    directive: str = ""
    batch: Optional[int] = None
    records: Optional[int] = None


@_register
@dataclass
class TaskFailed(Event):
    """A task could not process a batch (a user function raised, a record would not serialize):
    the batch is rolled back and the application goes to ERROR with this one line."""

    type: ClassVar[str] = "task_failed"
    task: str = ""
    instance: int = -1
    batch: int = -1
    error: str = ""
    kind: str = "ProcessorError"


# -- Kafka away --------------------------------------------------------------------------------
# Published while Kafka is away, these reach <app>-events once it is back (the publisher keeps
# them in order meanwhile); the App's own state says the same at once (WAITING, App.waiting).

@_register
@dataclass
class TaskWaiting(Event):
    """Kafka went away under a task (a connection refused, reset or unanswered): its state was
    closed without committing and it will reopen with backoff; ``batch`` (when one was running)
    waits in the spool and replays. It fails after ``task_timeout`` seconds of this."""

    type: ClassVar[str] = "task_waiting"
    task: str = ""
    instance: int = -1
    batch: int = -1            # the batch that could not commit (-1: the task was opening)
    error: str = ""            # what the client saw, one line
    since: float = 0.0         # epoch seconds the task began waiting
    aborted: int = 0           # transactions aborted so far: one whose records were sent, no EndTxn


@_register
@dataclass
class TaskResumed(Event):
    """A task that waited for Kafka is open again: its reopen aborted the transaction in flight
    (counted in ``aborted``) or found it committed (``committed_in_doubt``: an EndTxn whose answer
    was lost), and the waiting batches replay from the spool."""

    type: ClassVar[str] = "task_resumed"
    task: str = ""
    instance: int = -1
    waited_s: float = 0.0
    attempts: int = 0          # reopen attempts
    aborted: int = 0           # transactions this wait aborted
    last_batch: int = -1       # the last batch its restored state has applied
    committed_in_doubt: bool = False


@_register
@dataclass
class KafkaUnavailable(Event):
    """The App lost Kafka: its probe went unanswered, or a task began waiting. The App is WAITING."""

    type: ClassVar[str] = "kafka_unavailable"
    bootstrap: str = ""
    since: float = 0.0         # epoch seconds of the last answer Kafka gave
    error: str = ""


@_register
@dataclass
class KafkaAvailable(Event):
    """Kafka answers again and no task waits any more: the App is back to RUNNING (or RESTORING
    while tasks replay what waited)."""

    type: ClassVar[str] = "kafka_available"
    bootstrap: str = ""
    since: float = 0.0         # when the outage began (epoch seconds)
    seconds: float = 0.0       # how long it lasted
    aborted: int = 0           # transactions aborted because of it
    tasks_waited: list = field(default_factory=list)   # tasks that waited
