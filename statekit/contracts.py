"""Names every part of statekit agrees on: topics, task ids, directories, ``STATEKIT_HOME``.

One module, so that the worker side (tasks in instance processes), the control side (the App's
coordinator) and the tools (dashboard, CLI, tests) cannot drift apart on how a thing is called.

Topics (the Kafka Streams spellings)::

    <app>-<store>-changelog      a store's changelog, one partition per task of its sub-topology
    <app>-<name>-repartition     records re-keyed between two sub-topologies
    <app>-events                 every event of the application (statekit.events), one partition

A topology compiled without an application name calls them by their name inside the topology
(``<store>-changelog``, ``<name>-repartition``: Kafka Streams' topology description does the same).
Nothing outside this module spells these suffixes (``tests/test_contracts.py`` checks).

Task ids are Kafka Streams' ``<subtopology>_<partition>`` (``0_3``): the partition is the changelog
(and shuffle) partition the task owns.

The embedded broker's data directory is ``$STATEKIT_HOME/broker`` by default.

Directories under an application's state dir (``$STATEKIT_HOME/apps/<app>`` by default)::

    instance-<i>/<app>/<task>/   one task's RocksDB + .checkpoint + .lock on instance i's "disk"
                                 (the active copy, or a standby/warmup replica: the same directory,
                                 so a promotion hands the store over as it is)
    spark-checkpoint/<sub>/      the engine's checkpoint of sub-topology <sub>'s query
    control/                     shared by the App and its instances (never lost with a disk):
      assignment.json            the current assignment, one generation per rebalance
      instances/<i>.json         a live instance's pid, port and incarnation
      authkey                    the secret instances and routers authenticate with (0600)
      runspec.pkl                what an instance process needs to run tasks
      crash.json                 a pending crash directive
      restore-hold.json          restores held for a learner (statekit.worker.hold)
      spool/<task>/<batch>.arrow micro-batches a task received while it could not process them
      output/<task>/<batch>.bin  the memory sink: each task's outputs of each batch
    deployment                   placement "executors": a random id in the executors' state paths
    query-replicas/<app>/<task>/ placement "executors": the driver's query replica of a task
    executors/<deployment>/<app>/<task>/  placement "executors" on a local master: the tasks' state
                                 (on a cluster it is on each executor's disk: engine.spark.executors)
"""
from __future__ import annotations

import os
import re
import shutil
from typing import NamedTuple

__all__ = [
    "TaskId", "statekit_home", "default_broker_dir", "changelog_topic", "changelog_name",
    "repartition_topic", "repartition_name", "events_topic", "CHANGELOG_SUFFIX",
    "REPARTITION_SUFFIX", "EVENTS_SUFFIX", "task_dir", "Layout", "ControlDir",
    "default_state_dir", "has_state",
]

CHANGELOG_SUFFIX = "-changelog"
REPARTITION_SUFFIX = "-repartition"
EVENTS_SUFFIX = "-events"


def statekit_home() -> str:
    """``$STATEKIT_HOME``, else ``~/.statekit``: where the embedded broker and app state live.
    The one reader of ``STATEKIT_HOME``."""
    return os.environ.get("STATEKIT_HOME") or os.path.join(os.path.expanduser("~"), ".statekit")


def default_broker_dir() -> str:
    """The embedded broker's data directory when none is given: ``$STATEKIT_HOME/broker``."""
    return os.path.join(statekit_home(), "broker")


def changelog_name(store: str) -> str:
    """A store's changelog as the topology calls it, without the application: ``<store>-changelog``."""
    return store + CHANGELOG_SUFFIX


def changelog_topic(application: str, store: str) -> str:
    """A store's changelog topic: ``<application>-<store>-changelog``."""
    return f"{application}-{changelog_name(store)}"


def repartition_name(name: str) -> str:
    """A repartition topic as the topology calls it, without the application: ``<name>-repartition``."""
    return name + REPARTITION_SUFFIX


def repartition_topic(application: str, name: str) -> str:
    """Records re-keyed between two sub-topologies: ``<application>-<name>-repartition``."""
    return f"{application}-{repartition_name(name)}"


def events_topic(application: str) -> str:
    """Every event of an application: ``<application>-events``."""
    return application + EVENTS_SUFFIX


_TASK_RE = re.compile(r"^(\d+)_(\d+)$")


class TaskId(NamedTuple):
    """A task: one partition of one sub-topology."""

    subtopology: int
    partition: int

    def __str__(self) -> str:
        return f"{self.subtopology}_{self.partition}"

    @classmethod
    def parse(cls, s) -> "TaskId":
        """``"0_3"``, a ``TaskId``, a ``(sub, partition)`` pair, or a bare partition (sub-topology 0)."""
        if isinstance(s, TaskId):
            return s
        if isinstance(s, (tuple, list)) and len(s) == 2:
            return cls(int(s[0]), int(s[1]))
        if isinstance(s, int):
            return cls(0, s)
        m = _TASK_RE.match(str(s))
        if m:
            return cls(int(m.group(1)), int(m.group(2)))
        if str(s).isdigit():
            return cls(0, int(s))
        raise ValueError(f"not a task id: {s!r} (tasks are named <subtopology>_<partition>, e.g. 0_3)")


def task_dir(state_dir: str, application: str, task) -> str:
    """A task's directory under one instance's state dir (``task`` a TaskId, or a partition)."""
    return os.path.join(state_dir, application, str(task))


def default_state_dir(app_name: str) -> str:
    return os.path.join(statekit_home(), "apps", app_name)


_INST_RE = re.compile(r"^instance-(\d+)$")


class Layout:
    """The files of one application (see the module docstring)."""

    def __init__(self, state_dir: str, app: str):
        self.root = os.path.abspath(os.path.expanduser(state_dir))
        self.app = app

    # -- instance disks
    def instance_dir(self, instance: int) -> str:
        return os.path.join(self.root, f"instance-{int(instance)}")

    def tasks_root(self, instance: int) -> str:
        return os.path.join(self.instance_dir(instance), self.app)

    def task_dir(self, instance: int, task) -> str:
        return task_dir(self.instance_dir(instance), self.app, TaskId.parse(task))

    def instances_on_disk(self) -> list[int]:
        try:
            names = os.listdir(self.root)
        except FileNotFoundError:
            return []
        return sorted(int(m.group(1)) for m in map(_INST_RE.match, names) if m)

    def tasks_on_disk(self, instance: int) -> list[TaskId]:
        """Tasks with a local state copy on this instance (a RocksDB directory or a checkpoint)."""
        root = self.tasks_root(instance)
        try:
            names = os.listdir(root)
        except FileNotFoundError:
            return []
        out = []
        for name in names:
            m = _TASK_RE.match(name)
            if m and has_state(os.path.join(root, name)):
                out.append(TaskId(int(m.group(1)), int(m.group(2))))
        return sorted(out)

    def wipe_instance(self, instance: int) -> list[str]:
        """Disk loss: delete everything of one instance; returns the deleted task directories."""
        d = self.instance_dir(instance)
        gone = []
        if os.path.isdir(d):
            r = self.tasks_root(instance)
            gone = [os.path.join(r, n) for n in sorted(os.listdir(r))] if os.path.isdir(r) else []
            shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d, exist_ok=True)
        return gone

    # -- the engine's checkpoints
    @property
    def checkpoint_root(self) -> str:
        return os.path.join(self.root, "spark-checkpoint")

    def checkpoint_dir(self, subtopology: int = 0) -> str:
        return os.path.join(self.checkpoint_root, str(int(subtopology)))

    # -- control files
    @property
    def control_dir(self) -> str:
        return os.path.join(self.root, "control")

    @property
    def control(self) -> "ControlDir":
        return ControlDir(self.control_dir)


class ControlDir:
    """The paths of the control directory, for the App and the worker side alike."""

    def __init__(self, path: str):
        self.path = path

    def ensure(self) -> "ControlDir":
        for d in (self.path, os.path.join(self.path, "instances")):
            os.makedirs(d, exist_ok=True)
        return self

    @property
    def assignment(self) -> str:
        return os.path.join(self.path, "assignment.json")

    def instance_file(self, instance: int) -> str:
        return os.path.join(self.path, "instances", f"{int(instance)}.json")

    @property
    def authkey(self) -> str:
        return os.path.join(self.path, "authkey")

    @property
    def runspec(self) -> str:
        return os.path.join(self.path, "runspec.pkl")

    @property
    def crash(self) -> str:
        return os.path.join(self.path, "crash.json")

    def spool_dir(self, task) -> str:
        return os.path.join(self.path, "spool", str(task))

    def output_dir(self, task=None) -> str:
        base = os.path.join(self.path, "output")
        return base if task is None else os.path.join(base, str(task))


def has_state(task_directory: str) -> bool:
    """A task directory holds state when it has a checkpoint file or any RocksDB files."""
    try:
        names = os.listdir(task_directory)
    except (FileNotFoundError, NotADirectoryError):
        return False
    if ".checkpoint" in names or "CURRENT" in names:
        return True
    for n in names:  # a nested db directory (e.g. task_dir/rocksdb/CURRENT)
        p = os.path.join(task_directory, n)
        if os.path.isdir(p) and os.path.exists(os.path.join(p, "CURRENT")):
            return True
    return False
