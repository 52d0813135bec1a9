"""The memory sink: each task's outputs of each micro-batch, as files in the control directory.

``control/output/<task>/<batch>.bin`` holds the outputs (topic, key bytes, value bytes) a task
produced for one batch, written atomically before the batch commits. A batch replayed after a crash
produces the same outputs and rewrites the same file, so the sink holds every batch's outputs
exactly once, whichever instance processed it, inline or from a spool. ``read_outputs`` gathers
them for ``App.output()``.
"""
from __future__ import annotations

import os
import re
import struct

_H = struct.Struct(">H")
_I = struct.Struct(">i")
_NAME = re.compile(r"^(\d+)\.bin$")


def encode(outputs) -> bytes:
    """``[(topic, key_bytes|None, value_bytes|None)]`` -> bytes."""
    parts = []
    for topic, k, v in outputs:
        tb = topic.encode("utf-8")
        parts.append(_H.pack(len(tb)))
        parts.append(tb)
        for b in (k, v):
            if b is None:
                parts.append(_I.pack(-1))
            else:
                parts.append(_I.pack(len(b)))
                parts.append(bytes(b))
    return b"".join(parts)


def decode(data: bytes) -> list:
    out, pos, n = [], 0, len(data)
    mv = memoryview(data)
    while pos < n:
        (tl,) = _H.unpack_from(data, pos)
        pos += 2
        topic = bytes(mv[pos:pos + tl]).decode("utf-8")
        pos += tl
        kv = []
        for _ in (0, 1):
            (ln,) = _I.unpack_from(data, pos)
            pos += 4
            if ln < 0:
                kv.append(None)
            else:
                kv.append(bytes(mv[pos:pos + ln]))
                pos += ln
        out.append((topic, kv[0], kv[1]))
    return out


def write_outputs(directory: str, batch: int, outputs) -> None:
    os.makedirs(directory, exist_ok=True)
    path = os.path.join(directory, f"{int(batch)}.bin")
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "wb") as f:
        f.write(encode(outputs))
    os.replace(tmp, path)


def read_outputs(root: str) -> list:
    """``[(batch, task, topic, key, value)]`` of every task under ``control/output``, ordered by
    batch then task."""
    rows = []
    try:
        tasks = sorted(os.listdir(root))
    except FileNotFoundError:
        return rows
    for task in tasks:
        d = os.path.join(root, task)
        try:
            names = os.listdir(d)
        except (FileNotFoundError, NotADirectoryError):
            continue
        for name in names:
            m = _NAME.match(name)
            if not m:
                continue
            with open(os.path.join(d, name), "rb") as f:
                for topic, k, v in decode(f.read()):
                    rows.append((int(m.group(1)), task, topic, k, v))
    rows.sort(key=lambda r: (r[0], r[1]))
    return rows
