"""Where an application keeps its files.

    <state_dir>/
      instance-<i>/task-<t>/      one task's RocksDB + .checkpoint, on instance i's "disk"
                                  (the active task's, or a standby replica's: the same directory,
                                  so promoting a standby hands its store to the active task as is)
      spark-checkpoint/           the engine's checkpoint (offsets, commits): shared by all instances,
                                  like the consumer group offsets in Kafka; never lost with a disk
      control/                    crash directives (crash.json), assignment.json, restart history
"""
from __future__ import annotations

import json
import os
import re
import shutil
from typing import Optional

__all__ = ["Layout", "default_state_dir"]

_TASK_RE = re.compile(r"^task-(\d+)$")
_INST_RE = re.compile(r"^instance-(\d+)$")


def default_state_dir(app_name: str) -> str:
    home = os.environ.get("STATEKIT_HOME") or os.path.join(os.path.expanduser("~"), ".statekit")
    return os.path.join(home, "apps", app_name)


class Layout:
    def __init__(self, state_dir: str):
        self.root = os.path.abspath(os.path.expanduser(state_dir))

    # -- paths
    def instance_dir(self, instance: int) -> str:
        return os.path.join(self.root, f"instance-{int(instance)}")

    def task_dir(self, instance: int, task: int) -> str:
        return os.path.join(self.instance_dir(instance), f"task-{int(task)}")

    @property
    def checkpoint_dir(self) -> str:
        return os.path.join(self.root, "spark-checkpoint")

    @property
    def control_dir(self) -> str:
        return os.path.join(self.root, "control")

    @property
    def assignment_file(self) -> str:
        return os.path.join(self.control_dir, "assignment.json")

    def ensure(self, instances: int) -> None:
        os.makedirs(self.control_dir, exist_ok=True)
        for i in range(instances):
            os.makedirs(self.instance_dir(i), exist_ok=True)

    # -- what is on each disk
    def instances_on_disk(self) -> list[int]:
        try:
            names = os.listdir(self.root)
        except FileNotFoundError:
            return []
        return sorted(int(m.group(1)) for m in map(_INST_RE.match, names) if m)

    def tasks_on_disk(self, instance: int) -> list[int]:
        """Tasks with a local state copy on this instance (a RocksDB directory or a checkpoint)."""
        try:
            names = os.listdir(self.instance_dir(instance))
        except FileNotFoundError:
            return []
        out = []
        for name in names:
            m = _TASK_RE.match(name)
            if m and has_state(os.path.join(self.instance_dir(instance), name)):
                out.append(int(m.group(1)))
        return sorted(out)

    def wipe_instance(self, instance: int) -> list[str]:
        """Disk loss: delete everything of one instance; returns the deleted task directories."""
        d = self.instance_dir(instance)
        gone = []
        if os.path.isdir(d):
            gone = [os.path.join(d, n) for n in sorted(os.listdir(d))]
            shutil.rmtree(d, ignore_errors=True)
        os.makedirs(d, exist_ok=True)
        return gone

    # -- persisted assignment
    def save_assignment(self, body: dict) -> None:
        os.makedirs(self.control_dir, exist_ok=True)
        tmp = self.assignment_file + ".tmp"
        with open(tmp, "w") as f:
            json.dump(body, f)
        os.replace(tmp, self.assignment_file)

    def load_assignment(self) -> Optional[dict]:
        try:
            with open(self.assignment_file) as f:
                return json.load(f)
        except (FileNotFoundError, ValueError):
            return None


def has_state(task_dir: str) -> bool:
    """A task directory holds state when it has a checkpoint file or any RocksDB files."""
    try:
        names = os.listdir(task_dir)
    except (FileNotFoundError, NotADirectoryError):
        return False
    if ".checkpoint" in names or "CURRENT" in names:
        return True
    for n in names:  # a nested db directory (e.g. task_dir/rocksdb/CURRENT)
        p = os.path.join(task_dir, n)
        if os.path.isdir(p) and os.path.exists(os.path.join(p, "CURRENT")):
            return True
    return False
