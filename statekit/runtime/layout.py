"""Where an application keeps its files.

    <state_dir>/
      instance-<i>/<app>/<t>/     one task's RocksDB (rocksdb/) + .checkpoint + .lock, on instance
                                  i's "disk" (statekit.state.task.task_dir_for(instance dir, app, t))
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

_TASK_RE = re.compile(r"^(\d+)$")
_INST_RE = re.compile(r"^instance-(\d+)$")


def default_state_dir(app_name: str) -> str:
    home = os.environ.get("STATEKIT_HOME") or os.path.join(os.path.expanduser("~"), ".statekit")
    return os.path.join(home, "apps", app_name)


class Layout:
    def __init__(self, state_dir: str, app: str):
        self.root = os.path.abspath(os.path.expanduser(state_dir))
        self.app = app

    # -- paths
    def instance_dir(self, instance: int) -> str:
        return os.path.join(self.root, f"instance-{int(instance)}")

    def tasks_root(self, instance: int) -> str:
        return os.path.join(self.instance_dir(instance), self.app)

    def task_dir(self, instance: int, task: int) -> str:
        # the same rule as statekit.state.task.task_dir_for(state_dir, application, task)
        return os.path.join(self.instance_dir(instance), self.app, str(int(task)))

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
        root = self.tasks_root(instance)
        try:
            names = os.listdir(root)
        except FileNotFoundError:
            return []
        out = []
        for name in names:
            m = _TASK_RE.match(name)
            if m and has_state(os.path.join(root, name)):
                out.append(int(m.group(1)))
        return sorted(out)

    def wait_unlocked(self, instance: int, timeout: float = 15.0) -> list[str]:
        """Wait until no process holds a task of this instance open (``TaskState`` keeps an
        ``flock`` on ``<task_dir>/.lock``; the kernel drops it when the holder dies). Returns the
        task directories still locked when the time ran out."""
        import fcntl
        import time

        root = self.tasks_root(instance)
        deadline = time.monotonic() + timeout
        try:
            names = [n for n in os.listdir(root) if _TASK_RE.match(n)]
        except FileNotFoundError:
            return []
        busy = []
        for n in names:
            lock = os.path.join(root, n, ".lock")
            while True:
                try:
                    fd = os.open(lock, os.O_RDWR)
                except FileNotFoundError:
                    break
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    fcntl.flock(fd, fcntl.LOCK_UN)
                    break
                except OSError:
                    if time.monotonic() > deadline:
                        busy.append(os.path.join(root, n))
                        break
                    time.sleep(0.05)
                finally:
                    os.close(fd)
        return busy

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
