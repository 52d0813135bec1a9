"""An instance: one process that owns a state directory (its "disk") and runs tasks.

    python -m statekit.worker.instance --control DIR --instance 1 --incarnation 2 --state-dir DIR

Kafka Streams runs an application as several instances, each a process with its own local state;
statekit starts them as child processes of the App (``statekit.runtime.supervisor``), so that
killing one is real: its RocksDB handles, record caches and unsent changelog records die with it,
and only it dies. The engines hand each task's micro-batches to the instance that owns the task
(``statekit.worker.exchange``); the App's coordinator tells instances what they own
(``assign``), asks how they are doing (``status``) and stops them (``stop``) over the same
authenticated connection (``statekit.worker.protocol``).

On start the process writes ``control/instances/<i>.json`` (pid, port, incarnation) once it listens.
It exits when the process that started it (the App's) goes away (``statekit.lifeline``), so a
notebook kernel that dies leaves no instance behind.

``--spare``: start, import everything a task needs (Python, Kafka, RocksDB, Arrow: most of an
instance's start-up time), then wait on stdin for one JSON line naming the instance to become
(``{"control", "instance", "incarnation", "state_dir", "log"}``). The supervisor keeps one spare
ready, so a revived or added instance is serving within milliseconds.
"""
from __future__ import annotations

import argparse
import json
import logging
import os
import pickle
import sys
import threading
import time

from statekit import lifeline
from statekit.contracts import ControlDir

log = logging.getLogger("statekit.worker")


def _write_json(path: str, body: dict) -> None:
    tmp = f"{path}.{os.getpid()}.tmp"
    with open(tmp, "w") as f:
        json.dump(body, f)
    os.replace(tmp, path)


class InstanceServer:
    def __init__(self, control_dir: str, instance: int, incarnation: int, state_dir: str):
        from statekit.event_bus import EventPublisher, NullPublisher
        from statekit.worker.protocol import listen, read_authkey
        from statekit.worker.host import TaskHost

        self.control = ControlDir(control_dir)
        self.instance = int(instance)
        with open(self.control.runspec, "rb") as f:
            self.spec = pickle.load(f)
        key = read_authkey(self.control.authkey)
        base = {"instance": self.instance}
        self.pub = (EventPublisher(self.spec.bootstrap, self.spec.application, base)
                    if self.spec.events else NullPublisher())
        os.makedirs(state_dir, exist_ok=True)
        self.host = TaskHost(self.spec, self.instance, state_dir, self.pub.publish, incarnation)
        self.key = key
        self.listener = listen(key)
        self.port = self.listener.getsockname()[1]
        self.incarnation = incarnation
        self._done = threading.Event()

    def serve(self) -> None:
        _write_json(self.control.instance_file(self.instance),
                    {"instance": self.instance, "pid": os.getpid(), "port": self.port,
                     "incarnation": self.incarnation, "started_at": time.time()})
        threading.Thread(target=self._accept_loop, name="statekit-accept", daemon=True).start()
        self._done.wait()

    def _accept_loop(self) -> None:
        from statekit.worker.protocol import accept

        while not self._done.is_set():
            try:
                handshake = accept(self.listener, self.key)
            except OSError as exc:
                log.info("accept failed: %s", exc)
                continue
            threading.Thread(target=self._serve_conn, args=(handshake,), daemon=True).start()

    def _serve_conn(self, handshake) -> None:
        try:
            conn = handshake()
        except Exception as exc:  # noqa: BLE001 - a client that failed (or never did) authentication
            log.info("refused a connection: %s", exc)
            return
        try:
            while True:
                try:
                    msg = pickle.loads(conn.recv_bytes())
                except (EOFError, OSError):
                    return
                reply = self._handle(msg)
                conn.send_bytes(pickle.dumps(reply, protocol=pickle.HIGHEST_PROTOCOL))
                if msg[0] == "stop":
                    self._done.set()
                    return
        finally:
            conn.close()

    def _handle(self, msg: tuple):
        op = msg[0]
        try:
            if op == "batch":
                _, task, batch, generation, ranges = msg
                return self.host.batch(task, batch, generation, ranges)
            if op == "assign":
                _, generation, mine, options = msg
                return ("ok", self.host.assign(generation, mine, options))
            if op == "status":
                return ("ok", self.host.status())
            if op == "pause_replicas":
                return ("ok", self.host.pause_replicas(bool(msg[1])))
            if op == "stop":
                self.host.stop()
                return ("ok",)
            if op == "calibrate":
                _, topic, partition, settle = msg
                return ("ok",) + tuple(self.host.calibrate(topic, int(partition), float(settle)))
            if op == "ping":
                return ("ok", os.getpid())
            return ("error", f"unknown call {op!r}")
        except Exception as exc:  # noqa: BLE001 - answer with one line, keep serving
            log.exception("%s failed", op)
            return ("error", f"{type(exc).__name__}: {' '.join(str(exc).split())[:300]}")


def warm_imports() -> None:
    """What the first micro-batch of a task would otherwise pay for (py-spy found the operators,
    the bulk aggregation and numpy.ma, which `np.unique` imports on its first call, still being
    imported inside a build's first batch)."""
    import numpy
    import numpy.ma  # noqa: F401

    import statekit.kafka  # noqa: F401
    import statekit.partition  # noqa: F401
    import statekit.state  # noqa: F401
    import statekit.stores.rocksdb  # noqa: F401
    import statekit.topology.bulk  # noqa: F401
    import statekit.topology.ops  # noqa: F401
    import statekit.topology.plan  # noqa: F401
    import statekit.topology.task  # noqa: F401
    import statekit.worker.batch_input  # noqa: F401
    import statekit.worker.host  # noqa: F401
    import statekit.worker.output  # noqa: F401
    from statekit.topology.ops import (aggregate, fk_join, session, sliding,  # noqa: F401
                                       stream_join, suppress, table_join)


def _become(line: str) -> argparse.Namespace:
    """A spare's identity, sent by the supervisor; stdout and stderr go to the instance's log."""
    who = json.loads(line)
    for k in [k for k in os.environ if k.startswith("STATEKIT_")]:
        del os.environ[k]
    os.environ.update(who.get("env") or {})
    fd = os.open(who["log"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    return argparse.Namespace(control=who["control"], instance=int(who["instance"]),
                              incarnation=int(who["incarnation"]), state_dir=who["state_dir"])


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m statekit.worker.instance")
    ap.add_argument("--spare", action="store_true")
    ap.add_argument("--control")
    ap.add_argument("--instance", type=int)
    ap.add_argument("--incarnation", type=int, default=1)
    ap.add_argument("--state-dir")
    args = ap.parse_args(argv)
    lifeline.watch_parent()   # a notebook kernel that dies leaves no instance behind
    warm_imports()
    if args.spare:
        line = sys.stdin.readline()
        if not line.strip():
            return 0   # the pool closed: nothing to become
        args = _become(line)
    logging.basicConfig(level=logging.WARNING, format="%(asctime)s %(name)s %(message)s")
    server = InstanceServer(args.control, args.instance, args.incarnation, args.state_dir)
    server.serve()
    os._exit(0)  # daemon threads (replicas, connections) end with the process


if __name__ == "__main__":
    sys.exit(main())
