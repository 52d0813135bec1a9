"""statekit's embedded Kafka-compatible broker.

It speaks the Kafka protocol (kafka-python's `kafka.protocol` schemas), so kafka-python,
confluent-kafka/librdkafka and kcat work against it, and keeps file-backed partition logs with
segments, an offset index, retention and a log cleaner for compacted topics. See
docs/ARCHITECTURE.md for the contract; each module's docstring says how its part works
(server.py: connections; handlers.py: the APIs; log.py: files and durability; cleaner.py:
compaction; transactions.py: the transaction coordinator; auth.py: SASL and credentials;
tls.py: the TLS listener's certificates;
process.py: the child process, `DIR/broker.json` and finding a broker's credentials).
"""
from __future__ import annotations

import json
import os
import signal
import time
import uuid

from statekit.errors import BrokerUnreachable, StatekitError

from .auth import should_auth
from .faults import pause, restart
from .process import BrokerHandle, credentials_for, default_dir, running_info, start, stop
from .tls import should_tls

__all__ = ["start", "stop", "status", "BrokerHandle", "log_stats", "request_clean", "default_dir",
           "should_auth", "should_tls", "credentials_for", "pause", "restart"]


def status(dir: str | None = None) -> dict | None:
    """broker.json of the broker running on dir, or None."""
    return running_info(os.path.abspath(dir or default_dir()))


def _read_stats(data_dir: str) -> dict | None:
    try:
        with open(os.path.join(data_dir, "stats.json")) as f:
            return json.load(f)
    except (OSError, ValueError):
        return None


def log_stats(dir: str | None = None, topic: str | None = None) -> list[dict]:
    """One dict per partition (topic, partition, log_start_offset, high_watermark, segments, bytes,
    records, dirty_ratio, cleaner_runs, records_removed, last_cleaned_at), from DIR/stats.json,
    which the broker rewrites within a second of a change and after each cleaner pass."""
    data_dir = os.path.abspath(dir or default_dir())
    doc = _read_stats(data_dir)
    if doc is None:
        if not os.path.isdir(data_dir):
            raise StatekitError(f"no broker directory at {data_dir}: start one with `statekit broker start --dir {data_dir}`")
        return []
    parts = [p for p in doc.get("partitions", []) if topic is None or p.get("topic") == topic]
    return sorted(parts, key=lambda p: (p["topic"], p["partition"]))


def request_clean(dir: str | None = None, timeout: float = 60.0) -> list[dict]:
    """Ask the running broker for a log cleaner pass now; wait for it; return fresh log_stats."""
    data_dir = os.path.abspath(dir or default_dir())
    info = running_info(data_dir)
    if info is None:
        raise BrokerUnreachable(f"no broker is running on {data_dir}: start it with `statekit broker start --dir {data_dir}`")
    token = uuid.uuid4().hex
    path = os.path.join(data_dir, "clean-request")
    with open(path + ".tmp", "w") as f:
        f.write(token)
    os.replace(path + ".tmp", path)
    try:   # wake its cleaner now (else it reads the request at its next pass)
        os.kill(int(info["pid"]), signal.SIGUSR1)
    except (OSError, ValueError, AttributeError):
        pass
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        doc = _read_stats(data_dir)
        if doc and doc.get("clean_token") == token:
            return log_stats(data_dir)
        time.sleep(0.05)
    raise BrokerUnreachable(f"the broker on {data_dir} did not finish a cleaner pass within {timeout:.0f}s; see {data_dir}/broker.log")
