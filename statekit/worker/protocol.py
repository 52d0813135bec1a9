"""How the engines and the App talk to instance processes, and the shape of a task's micro-batch.

Transport: ``multiprocessing.connection`` over TCP on 127.0.0.1, authenticated with the secret in
``control/authkey`` (HMAC challenge; the file is 0600), so another user of a shared machine cannot
drive an instance. A message is a pickled tuple; the first element names the call:

    ("batch", task, batch_id, generation, records_ipc)   engine -> instance
        -> ("done", outputs_count) | ("spooled", backlog) | ("not_owner", generation)
           | ("failed", one_line, kind)
    ("assign", generation, assignment_dict, options)     App -> instance
        -> ("ok", {task: how it will open})
    ("status",)                                          App -> instance
        -> ("ok", {...}) (see TaskHost.status)
    ("pause_replicas", paused)                           App -> instance
        -> ("ok", [task])
    ("stop",)                                            App -> instance: close every task, exit
        -> ("ok",)

A micro-batch of one task travels as Arrow IPC bytes of a table with the columns of BATCH_SCHEMA, in
processing order (timestamp, source, partition, offset, sequence): the Spark engine hands its shuffle
partition over as it is, without building Python objects.
"""
from __future__ import annotations

import os
import pickle
import secrets
from typing import Optional

BATCH_FIELDS = (("route", "int32"), ("src_partition", "int32"), ("offset", "int64"),
                ("timestamp", "int64"), ("key", "binary"), ("value", "binary"))


def batch_schema():
    import pyarrow as pa

    return pa.schema([(n, getattr(pa, t)()) for n, t in BATCH_FIELDS])


def table_to_ipc(table) -> bytes:
    """An Arrow table (at least the BATCH_FIELDS columns) as IPC stream bytes."""
    import pyarrow as pa

    table = table.select([n for n, _ in BATCH_FIELDS])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


def records_to_ipc(records) -> bytes:
    """``[(route, src_partition, offset, timestamp, key, value)]`` as IPC stream bytes."""
    import pyarrow as pa

    cols = list(zip(*records)) if records else [[] for _ in BATCH_FIELDS]
    schema = batch_schema()
    arrays = [pa.array(list(c), f.type) for c, f in zip(cols, schema)]
    return table_to_ipc(pa.Table.from_arrays(arrays, schema=schema))


def ipc_to_records(data: bytes) -> list:
    """IPC stream bytes back to ``[(route, src_partition, offset, timestamp, key, value)]``."""
    import pyarrow as pa

    table = pa.ipc.open_stream(pa.py_buffer(data)).read_all()
    if table.num_rows == 0:
        return []
    return list(zip(*(table.column(n).to_pandas().tolist() for n, _ in BATCH_FIELDS)))


def ipc_count(data: bytes) -> int:
    import pyarrow as pa

    return pa.ipc.open_stream(pa.py_buffer(data)).read_all().num_rows


# -- the secret ----------------------------------------------------------------------------------

def ensure_authkey(path: str) -> bytes:
    """The control directory's secret, created (0600) if missing."""
    try:
        with open(path, "rb") as f:
            key = f.read()
        if key:
            return key
    except FileNotFoundError:
        pass
    key = secrets.token_bytes(32)
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key)
    os.replace(tmp, path)
    return key


def read_authkey(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


# -- calls ---------------------------------------------------------------------------------------

class InstanceUnreachable(ConnectionError):
    """The instance did not answer (it is dead, or not listening yet)."""


def connect(port: int, authkey: bytes, timeout: float = 10.0):
    """A connection to the instance listening on 127.0.0.1:port."""
    import socket
    from multiprocessing.connection import Client

    old = socket.getdefaulttimeout()
    socket.setdefaulttimeout(timeout)
    try:
        return Client(("127.0.0.1", int(port)), authkey=authkey)
    except (OSError, EOFError) as exc:
        raise InstanceUnreachable(f"instance on port {port}: {exc}") from None
    finally:
        socket.setdefaulttimeout(old)


def call(conn, *msg, timeout: Optional[float] = None):
    """Send one message and wait for its answer (``InstanceUnreachable`` when the peer dies)."""
    try:
        conn.send_bytes(pickle.dumps(msg, protocol=pickle.HIGHEST_PROTOCOL))
        if timeout is not None and not conn.poll(timeout):
            raise InstanceUnreachable(f"no answer to {msg[0]} within {timeout:.0f}s")
        return pickle.loads(conn.recv_bytes())
    except (EOFError, OSError) as exc:
        raise InstanceUnreachable(f"the instance went away during {msg[0]}: {exc}") from None
