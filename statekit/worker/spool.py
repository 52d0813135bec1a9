"""A task's spool: micro-batches it received while it could not process them.

Spark runs the tasks of a micro-batch together, and the next micro-batch starts only when all of
them finished. So a task that is restoring, moving to another instance, or whose instance just died
would hold every other task back. Instead its micro-batch is written here and the micro-batch goes
on; the task's owner processes the spool in batch order as soon as it can, before any newer batch.
The survivors of a crash keep committing meanwhile, which is what Kafka Streams' instances do.

A micro-batch reaches a task in fragments, one per input split
(``control/spool/<task>/<batch>.<split>.<splits>.arrow``, Arrow IPC, see ``worker.protocol``): a
fragment waits here until the batch's others arrive too; a batch is ready when all are there.

The control directory is not any instance's disk: a spooled batch survives the death, and the disk
loss, of the instance that was to process it. A batch id the task has already applied is skipped,
so a batch spooled by an engine whose call to a dying instance went unanswered is never applied
twice.
"""
from __future__ import annotations

import os
import re
import threading

_NAME = re.compile(r"^(\d+)\.(\d+)\.(\d+)\.arrow$")


class Spool:
    def __init__(self, directory: str):
        self.dir = directory

    def _name(self, batch: int, split: int, splits: int) -> str:
        return os.path.join(self.dir, f"{int(batch)}.{int(split)}.{int(splits)}.arrow")

    def put(self, batch: int, fragment_ipc: bytes, split: int = 0, splits: int = 1) -> None:
        """Write one fragment atomically (a reader never sees half a file)."""
        os.makedirs(self.dir, exist_ok=True)
        path = self._name(batch, split, splits)
        tmp = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"
        with open(tmp, "wb") as f:
            f.write(fragment_ipc)
        os.replace(tmp, path)

    def _files(self) -> list:
        try:
            names = os.listdir(self.dir)
        except FileNotFoundError:
            return []
        return [(int(m.group(1)), int(m.group(2)), int(m.group(3)), n)
                for m, n in ((_NAME.match(n), n) for n in names) if m]

    def batches(self) -> list[int]:
        """Batch ids with at least one fragment here, oldest first."""
        return sorted({b for b, _s, _n, _f in self._files()})

    def __len__(self) -> int:
        return len(self.batches())

    def complete(self, batch: int) -> bool:
        """Are all of the batch's fragments here?"""
        frags = [(s, n) for b, s, n, _f in self._files() if b == batch]
        return bool(frags) and len({s for s, _n in frags}) == frags[0][1]

    def fragments(self, batch: int) -> list[bytes]:
        out = []
        for b, _s, _n, name in sorted(self._files()):
            if b == batch:
                with open(os.path.join(self.dir, name), "rb") as f:
                    out.append(f.read())
        return out

    def remove(self, batch: int) -> None:
        for b, _s, _n, name in self._files():
            if b == batch:
                try:
                    os.unlink(os.path.join(self.dir, name))
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
