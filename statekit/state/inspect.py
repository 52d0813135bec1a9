"""Read a task's stores while another process writes them: a RocksDB secondary instance (read only).

    with inspect_task(state_dir, "wordcount", 3) as t:
        t.store_names, t.meta(), t.checkpoint()
        dict(t.items("counts"))          # raw bytes of the last commit
        t.to_pandas("counts")            # decoded with the serdes recorded at commit
        t.refresh()                      # catch up with the writer's later commits

The writer's lock is not taken: inspection never blocks processing. What it sees is always a whole
commit (RocksDB only ever holds whole commits).
"""
from __future__ import annotations

import os

from statekit.errors import StatekitError
from statekit.state import checkpoint as ckpt
from statekit.state.restore import meta_key
from statekit.state.task import task_dir_for


class TaskInspector:
    def __init__(self, task_dir: str):
        from statekit.stores import open_readonly

        if not os.path.isdir(os.path.join(task_dir, "rocksdb")):
            raise StatekitError(f"no task state in {task_dir}: has the task run (and committed) yet?")
        self.task_dir = task_dir
        self._ro = open_readonly(task_dir)

    @property
    def store_names(self) -> list:
        return list(self._ro.store_names)

    def refresh(self) -> "TaskInspector":
        self._ro.refresh()
        return self

    def meta(self) -> dict:
        return self._ro.read_meta()

    def last_batch(self) -> int:
        return int(self.meta().get("batch", -1))

    def changelog_offsets(self) -> dict:
        m = self.meta()
        return {n: m[meta_key(n)]["offset"] for n in self.store_names if meta_key(n) in m}

    def checkpoint(self) -> dict | None:
        cp = ckpt.read(self.task_dir, warn=lambda _m: None)
        return None if cp is None else {n: c.__dict__ for n, c in cp.items()}

    def items(self, store: str):
        return self._ro.items(store)

    def get(self, store: str, key: bytes):
        return self._ro.get(store, key)

    def to_pandas(self, store: str, limit: int | None = None):
        return self._ro.to_pandas(store, limit=limit)

    def close(self) -> None:
        if self._ro is not None:
            self._ro.close()
            self._ro = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


def inspect_task(state_dir: str, application: str, task_id) -> TaskInspector:
    return TaskInspector(task_dir_for(state_dir, application, task_id))
