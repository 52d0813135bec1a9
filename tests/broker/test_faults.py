"""Outages on purpose (statekit.broker.pause / restart) and what the client does about them: a
paused broker answers nothing for the seconds asked and then everything queued; a restarted one
comes back on the same directory and port with its data, and a client's idle connections, closed
by the old broker, are replaced without a failed request; ``advertised.listeners`` sends clients to
a proxy in front of the broker."""
from __future__ import annotations

import socket
import threading
import time

import pytest

from statekit import broker as broker_mod
from statekit.errors import KafkaUnavailable, StatekitError
from statekit.kafka import Kafka


def test_a_pause_stalls_every_request_then_answers_them_all(broker):
    k = Kafka(broker.bootstrap, timeout=30)
    try:
        k.ensure_topic("paused", 1)
        k.send("paused", 0, [(b"k", b"before")])
        r = broker_mod.pause(broker, 2.0)
        assert r["until"] - r["since"] == pytest.approx(2.0)
        t0 = time.monotonic()
        k.send("paused", 0, [(b"k", b"during")])      # waits in the socket, answered after
        waited = time.monotonic() - t0
        assert 1.0 < waited < 20, waited
        # a new connection is accepted by the kernel and answered once the pause ends too
        assert [r[3] for c in Kafka(broker.bootstrap).read("paused", 0, 0, 2) for r in c.records] == \
            [b"before", b"during"]
    finally:
        k.close()


def test_a_pause_mid_transaction_waits_for_a_transactions_records(broker):
    k = Kafka(broker.bootstrap, timeout=30)
    try:
        k.ensure_topic("txn", 1)
        r = broker_mod.pause(broker, 1.5, mid_transaction=True)
        assert r["armed"] and r["since"] is None
        t0 = time.monotonic()
        k.send("txn", 0, [(b"k", b"plain")])          # not a transaction: answered at once
        assert time.monotonic() - t0 < 1.0
        txp = k.transactional_producer("stalled-1")
        txp.begin()
        t0 = time.monotonic()
        txp.send_many([("txn", 0, [(b"k", b"in a transaction")])])   # its records: the stall
        assert time.monotonic() - t0 > 1.0
        txp.commit()
        txp.close()
    finally:
        k.close()


def test_a_request_that_outlives_the_timeout_fails_as_kafka_unavailable(broker):
    k = Kafka(broker.bootstrap, timeout=0.5)
    try:
        k.ensure_topic("slow", 1)
        broker_mod.pause(broker, 2.0)
        with pytest.raises(KafkaUnavailable) as info:
            k.send("slow", 0, [(b"k", b"v")])
        assert "did not answer within" in str(info.value)
    finally:
        k.close()


def test_pause_refuses_a_bad_length_and_a_missing_broker(tmp_path):
    with pytest.raises(StatekitError, match="at most 3600"):
        broker_mod.pause(str(tmp_path), 0)
    with pytest.raises(StatekitError, match="no broker is running"):
        broker_mod.pause(str(tmp_path / "none"), 1)
    with pytest.raises(StatekitError, match="no statekit broker known at 127.0.0.1:1"):
        broker_mod.pause("127.0.0.1:1", 1)


def test_restart_keeps_the_port_the_data_and_the_configs_and_clients_reconnect(tmp_path):
    h = broker_mod.start(dir=str(tmp_path / "b"), port=0, configs={"log.flush.interval.ms": "700"})
    k = Kafka(h.bootstrap)
    try:
        k.ensure_topic("kept", 2)
        k.send("kept", 1, [(b"a", b"1"), (b"b", b"2")])
        old_pid = h.pid
        h = broker_mod.restart(h.bootstrap, down=0.3)       # found by its address
        assert h.pid != old_pid and h.bootstrap == k.bootstrap
        with open(f"/proc/{h.pid}/cmdline") as f:
            assert "log.flush.interval.ms=700" in f.read().split("\0")
        # the client's pooled connection was closed by the killed broker: replaced, not failed
        assert k.send("kept", 1, [(b"c", b"3")]) == 2
        assert k.end_offsets("kept") == {0: 0, 1: 3}
    finally:
        k.close()
        h.stop()


def test_advertised_listeners_send_clients_through_a_proxy(tmp_path):
    """Metadata names the advertised address, so every connection of the client goes there."""
    seen = []
    lsock = socket.socket()
    lsock.bind(("127.0.0.1", 0))
    lsock.listen(8)
    port = lsock.getsockname()[1]
    h = broker_mod.start(dir=str(tmp_path / "b"), port=0,
                         configs={"advertised.listeners": f"PLAINTEXT://127.0.0.1:{port}"})
    up = int(h.bootstrap.rsplit(":", 1)[1])

    def relay(a, b):
        try:
            while True:
                d = a.recv(65536)
                if not d:
                    break
                b.sendall(d)
        except OSError:
            pass
        for s in (a, b):
            try:
                s.close()
            except OSError:
                pass

    def serve():
        while True:
            try:
                c, _ = lsock.accept()
            except OSError:
                return
            seen.append(c)
            u = socket.create_connection(("127.0.0.1", up))
            threading.Thread(target=relay, args=(c, u), daemon=True).start()
            threading.Thread(target=relay, args=(u, c), daemon=True).start()

    threading.Thread(target=serve, daemon=True).start()
    try:
        k = Kafka(f"127.0.0.1:{port}")
        k.ensure_topic("via", 1)
        k.send("via", 0, [(b"k", b"v")])
        assert k._brokers == {0: ("127.0.0.1", port)}
        assert k.end_offsets("via") == {0: 1} and len(seen) >= 1
        k.close()
        with pytest.raises(StatekitError, match="PLAINTEXT://HOST:PORT"):
            broker_mod.start(dir=str(tmp_path / "c"), configs={"advertised.listeners": "nope"})
    finally:
        lsock.close()
        h.stop()


def test_a_long_poll_that_outlives_its_timeout_is_kafka_unavailable_too(broker):
    """(The long poll sets its own socket timeout and puts it back: not on a closed socket.)"""
    k = Kafka(broker.bootstrap, timeout=0.5)
    try:
        k.ensure_topic("lp", 1)
        broker_mod.pause(broker, 2.5)
        with pytest.raises(KafkaUnavailable):
            k.wait_for_data({("lp", 0): 0}, 200)
    finally:
        k.close()


def test_a_restart_keeps_the_lifeline_and_the_cli_restarts_a_broker_that_outlives_it(tmp_path):
    """A broker tied to this process comes back tied to it; `statekit broker restart` (a process
    that ends at once) starts one apart, or it would die with the CLI."""
    import subprocess
    import sys

    from statekit.broker.process import running_info

    d = str(tmp_path / "b")
    h = broker_mod.start(dir=d, port=0)
    try:
        assert h.tied
        h = broker_mod.restart(h, down=0)
        assert h.tied and running_info(d)["tied"]
        r = subprocess.run([sys.executable, "-m", "statekit.cli", "broker", "restart", "--dir", d],
                           capture_output=True, text=True, timeout=120)
        assert r.returncode == 0, r.stderr
        info = running_info(d)
        assert info is not None and not info["tied"] and info["pid"] != h.pid
        time.sleep(0.5)    # the CLI is gone: the broker it started is not
        with Kafka(h.bootstrap, timeout=10) as k:
            k.ensure_topic("alive", 1)
    finally:
        broker_mod.stop(d)      # the CLI's (or, had it failed, the tied one)
        if h._proc is not None:
            h._proc.poll()      # the one the CLI killed: reaped
