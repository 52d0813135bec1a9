"""The task checkpoint file: ``<task_dir>/.checkpoint``.

JSON ``{"version": 1, "stores": {name: {"changelog_offset": int, "batch": int}}}``: for every store,
the changelog position of the last commit that reached RocksDB (the offset right after its commit
marker, or the broker's last stable offset past it: ``statekit.state.task``), and that commit's
input batch id. Written atomically (temp file, fsync, rename, fsync of the directory), after
the RocksDB commit (step 4 of the commit protocol). It is a fast cross-check of RocksDB's own meta,
as Kafka Streams' ``.checkpoint`` is: a missing or corrupt file is never fatal — it is reported in
one line and treated as "no checkpoint" (the RocksDB meta, or the log start, takes over).
"""
from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass

log = logging.getLogger("statekit.state")

VERSION = 1
FILENAME = ".checkpoint"


@dataclass(frozen=True)
class StoreCheckpoint:
    changelog_offset: int
    batch: int


def path_for(task_dir: str) -> str:
    return os.path.join(task_dir, FILENAME)


def _fsync_dir(d: str) -> None:
    try:
        fd = os.open(d, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def write(task_dir: str, stores: dict[str, StoreCheckpoint | dict]) -> None:
    """Write the checkpoint atomically: temp file, fsync, rename over, fsync the directory."""
    body = {"version": VERSION, "stores": {}}
    for name, cp in sorted(stores.items()):
        if isinstance(cp, StoreCheckpoint):
            cp = {"changelog_offset": cp.changelog_offset, "batch": cp.batch}
        body["stores"][name] = {"changelog_offset": int(cp["changelog_offset"]), "batch": int(cp["batch"])}
    final = path_for(task_dir)
    tmp = final + ".tmp"
    data = json.dumps(body, sort_keys=True).encode()
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.replace(tmp, final)
    _fsync_dir(task_dir)


def read(task_dir: str, warn=None) -> dict[str, StoreCheckpoint] | None:
    """The checkpoint, or None when there is none or it cannot be trusted (then ``warn`` — default:
    the ``statekit.state`` logger — gets one line saying so)."""
    warn = warn or log.warning
    p = path_for(task_dir)
    try:
        with open(p, "rb") as f:
            raw = f.read()
    except FileNotFoundError:
        return None
    except OSError as e:
        warn(f"checkpoint {p} unreadable ({e.strerror}); treating it as missing")
        return None
    try:
        body = json.loads(raw.decode("utf-8"))
        if not isinstance(body, dict) or body.get("version") != VERSION:
            raise ValueError(f"unknown version {body.get('version') if isinstance(body, dict) else None!r}")
        out = {}
        for name, cp in body["stores"].items():
            off, b = cp["changelog_offset"], cp["batch"]
            if not isinstance(off, int) or not isinstance(b, int) or isinstance(off, bool) or off < 0:
                raise ValueError(f"bad entry for store {name!r}")
            out[name] = StoreCheckpoint(off, b)
        return out
    except (ValueError, KeyError, TypeError, AttributeError, UnicodeDecodeError) as e:
        warn(f"checkpoint {p} is corrupt ({type(e).__name__}: {str(e)[:80]}); ignoring it and "
             f"restoring from the RocksDB meta or the changelog start")
        return None


def remove(task_dir: str) -> None:
    """Delete the checkpoint (restoration does this before it writes RocksDB: a crash mid-restore
    then leaves RocksDB's own meta as the one record of progress)."""
    try:
        os.unlink(path_for(task_dir))
        _fsync_dir(task_dir)
    except FileNotFoundError:
        pass
