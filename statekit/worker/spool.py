"""A task's spool: micro-batches it received while it could not process them.

Spark runs the tasks of a micro-batch together, and the next micro-batch starts only when all of
them finished. So a task that is restoring, moving to another instance, or whose instance just died
would hold every other task back. Instead its micro-batch is written here
(``control/spool/<task>/<batch>.arrow``, the records as Arrow IPC) and the micro-batch goes on; the
task's owner processes the spool in batch order as soon as it can, before any newer batch. The
survivors of a crash keep committing meanwhile, which is what Kafka Streams' instances do.

The control directory is not any instance's disk: a spooled batch survives the death, and the disk
loss, of the instance that was to process it. A batch id the task has already applied is skipped,
so a batch spooled by an engine whose call to a dying instance went unanswered is never applied
twice.
"""
from __future__ import annotations

import os
import re

_NAME = re.compile(r"^(\d+)\.arrow$")


class Spool:
    def __init__(self, directory: str):
        self.dir = directory

    def put(self, batch: int, records_ipc: bytes) -> None:
        """Write one batch atomically (a reader never sees half a file)."""
        os.makedirs(self.dir, exist_ok=True)
        path = os.path.join(self.dir, f"{int(batch)}.arrow")
        tmp = f"{path}.{os.getpid()}.tmp"
        with open(tmp, "wb") as f:
            f.write(records_ipc)
        os.replace(tmp, path)

    def batches(self) -> list[int]:
        """Spooled batch ids, oldest first."""
        try:
            names = os.listdir(self.dir)
        except FileNotFoundError:
            return []
        return sorted(int(m.group(1)) for m in map(_NAME.match, names) if m)

    def __len__(self) -> int:
        return len(self.batches())

    def read(self, batch: int) -> bytes:
        with open(os.path.join(self.dir, f"{int(batch)}.arrow"), "rb") as f:
            return f.read()

    def remove(self, batch: int) -> None:
        try:
            os.unlink(os.path.join(self.dir, f"{int(batch)}.arrow"))
        except FileNotFoundError:
            pass


def backlog(spool_root: str) -> dict:
    """``{task: [batch ids]}`` of every non-empty spool under ``control/spool``."""
    out = {}
    try:
        names = os.listdir(spool_root)
    except FileNotFoundError:
        return out
    for name in names:
        b = Spool(os.path.join(spool_root, name)).batches()
        if b:
            out[name] = b
    return out
