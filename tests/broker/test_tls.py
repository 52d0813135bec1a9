"""The embedded broker's TLS listener (`tls=True`, `mtls=True`): generated certificates, SASL_SSL
and SSL end to end with kafka-python, confluent-kafka (librdkafka), kcat and statekit's own client
(produce, consume, transactions), mutual TLS accepted and refused, and bad certificates (untrusted,
expired, wrong host, plaintext at the TLS port, TLS at a plaintext port) answered with one line on
each side while the broker keeps serving others."""
from __future__ import annotations

import datetime
import json
import os
import shutil
import socket
import ssl
import stat
import subprocess
import threading
import time

import pytest
import trustme
from kafka import KafkaConsumer, KafkaProducer, TopicPartition

from _broker_util import Reach
from waiting import wait_until

ck = pytest.importorskip("confluent_kafka")
from confluent_kafka.admin import AdminClient  # noqa: E402


def _start(tmp, name, **kw):
    from statekit import broker as broker_mod

    return broker_mod.start(dir=str(tmp / name), port=0, **kw)


@pytest.fixture(scope="module")
def sasl_ssl(tmp_path_factory):
    h = _start(tmp_path_factory.mktemp("tls"), "sasl-ssl", auth=True, tls=True)
    try:
        yield h
    finally:
        h.stop()


@pytest.fixture(scope="module")
def mutual(tmp_path_factory):
    h = _start(tmp_path_factory.mktemp("mtls"), "mtls", mtls=True)
    try:
        yield h
    finally:
        h.stop()


class BrokerLog:
    """The lines a broker logs from now on."""

    def __init__(self, handle):
        self.path = os.path.join(handle.dir, "broker.log")
        self.start = os.path.getsize(self.path)

    def lines(self, needle: str) -> list[str]:
        with open(self.path, errors="replace") as f:
            f.seek(self.start)
            return [ln for ln in f.read().splitlines() if needle in ln]

    def one(self, needle: str) -> str:
        """The single line with `needle`, once it is there (one failed connection: one line)."""
        found = wait_until(lambda: self.lines(needle), 10, f"the broker's line with {needle!r}")
        time.sleep(0.2)  # the point: no second line follows for the same connection
        found = self.lines(needle)
        assert len(found) == 1, found
        return found[0]


def _one_line(err) -> str:
    s = str(err)
    assert s and "\n" not in s and "Traceback" not in s, s
    return s


def _kafka(bootstrap, cfg=None, timeout=10):
    from statekit.kafka import Kafka

    return Kafka(bootstrap, kafka_config=cfg, timeout=timeout)


def _consume(reach, topic, n, isolation="read_uncommitted"):
    c = KafkaConsumer(bootstrap_servers=reach.bootstrap, auto_offset_reset="earliest", enable_auto_commit=False,
                      isolation_level=isolation, **reach.kafka_python())
    got = []
    try:
        c.assign([TopicPartition(topic, 0)])
        deadline = time.monotonic() + 30
        while len(got) < n and time.monotonic() < deadline:
            for recs in c.poll(200).values():
                got.extend((r.offset, r.key, r.value) for r in recs)
    finally:
        c.close()
    return got


# ---------------------------------------------------------------------------------------------
def test_certificates_and_client_settings_are_generated_private(sasl_ssl):
    from cryptography import x509

    d, tls_dir = sasl_ssl.dir, os.path.join(sasl_ssl.dir, "tls")
    assert stat.S_IMODE(os.stat(tls_dir).st_mode) == 0o700
    for name in ("ca.key", "server.key", "client.key", "../credentials.json", "../client.properties"):
        assert stat.S_IMODE(os.stat(os.path.join(tls_dir, name)).st_mode) == 0o600, name
    creds = sasl_ssl.credentials
    assert creds == {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-256", "sasl.username": "statekit",
                     "sasl.password": creds["sasl.password"], "ssl.ca.location": os.path.join(tls_dir, "ca.pem"),
                     "ssl.endpoint.identification.algorithm": "https"}
    with open(os.path.join(d, "client.properties")) as f:
        props = dict(ln.split("=", 1) for ln in f.read().splitlines())
    assert props["security.protocol"] == "SASL_SSL" and props["ssl.ca.location"] == creds["ssl.ca.location"]
    assert props["sasl.mechanisms"] == "SCRAM-SHA-256"
    with open(os.path.join(d, "broker.json")) as f:
        info = json.load(f)
    assert (info["auth"], info["tls"], info["mtls"]) == (True, True, False)
    with open(os.path.join(tls_dir, "server.pem"), "rb") as f:
        cert = x509.load_pem_x509_certificate(f.read())
    with open(os.path.join(tls_dir, "ca.pem"), "rb") as f:
        ca = x509.load_pem_x509_certificate(f.read())
    cert.verify_directly_issued_by(ca)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert {str(a) for a in san.get_values_for_type(x509.IPAddress)} == {"127.0.0.1"}
    assert san.get_values_for_type(x509.DNSName) == ["localhost"]


def test_statekit_kafka_python_and_librdkafka_over_sasl_ssl(sasl_ssl):
    reach = Reach(sasl_ssl)
    k = _kafka(sasl_ssl.bootstrap)  # finds SASL_SSL, the CA and the password by itself
    k.ensure_topic("tls-mixed", 1)
    assert k.send("tls-mixed", 0, [(b"s0", b"v"), (b"s1", b"v")]) == 1
    p = KafkaProducer(bootstrap_servers=sasl_ssl.bootstrap, **reach.kafka_python())
    try:
        assert [p.send("tls-mixed", key=b"kp%d" % i, value=b"v", partition=0).get(20).offset for i in range(2)] == [2, 3]
    finally:
        p.close()
    cp = ck.Producer(reach.librdkafka())
    for i in range(2):
        cp.produce("tls-mixed", key=b"ck%d" % i, value=b"v", partition=0)
    assert cp.flush(30) == 0
    want = [(0, b"s0"), (1, b"s1"), (2, b"kp0"), (3, b"kp1"), (4, b"ck0"), (5, b"ck1")]
    assert [(o, key) for o, key, _ in _consume(reach, "tls-mixed", 6)] == want
    cc = ck.Consumer({**reach.librdkafka(), "group.id": "tls-g", "enable.auto.commit": False})
    got = []
    try:
        cc.assign([ck.TopicPartition("tls-mixed", 0, 0)])
        deadline = time.monotonic() + 30
        while len(got) < 6 and time.monotonic() < deadline:
            m = cc.poll(0.5)
            if m is not None and m.error() is None:
                got.append((m.offset(), m.key()))
    finally:
        cc.close()
    assert got == want
    assert [(o, bytes(key)) for ch in k.read("tls-mixed", 0) for o, _, key, _, _ in ch] == want
    # the metadata's advertised listener is the TLS one; a client that dials localhost follows it
    md = AdminClient({**reach.librdkafka(), "bootstrap.servers": sasl_ssl.bootstrap.replace(
        "127.0.0.1", "localhost")}).list_topics(timeout=20)
    assert [(b.id, b.host, b.port) for b in md.brokers.values()] == [(0, "127.0.0.1", sasl_ssl.port)]
    assert _kafka(sasl_ssl.bootstrap.replace("127.0.0.1", "localhost")).topics()["tls-mixed"] == 1
    k.close()


def test_transactions_over_sasl_ssl(sasl_ssl):
    reach = Reach(sasl_ssl)
    k = _kafka(sasl_ssl.bootstrap)
    k.ensure_topic("tls-txn", 1)
    p = ck.Producer({**reach.librdkafka(), "transactional.id": "tls-ck-1"})
    p.init_transactions(30)
    p.begin_transaction()
    p.produce("tls-txn", key=b"c1", value=b"v", partition=0)
    p.commit_transaction(30)
    p.begin_transaction()
    p.produce("tls-txn", key=b"aborted", value=b"v", partition=0)
    p.flush(30)
    p.abort_transaction(30)
    txp = k.transactional_producer("tls-sk-1", timeout_ms=60000)
    txp.begin()
    txp.send_many([("tls-txn", 0, [(b"s1", b"v"), (b"s2", b"v")])])
    txp.commit()
    txp.close()
    kp = KafkaProducer(bootstrap_servers=sasl_ssl.bootstrap, transactional_id="tls-kp-1", **reach.kafka_python())
    try:
        kp.init_transactions()
        kp.begin_transaction()
        kp.send("tls-txn", key=b"kp1", value=b"v", partition=0)
        kp.commit_transaction()
    finally:
        kp.close()
    # records at 0, a marker at 1, the aborted record at 2 and its marker at 3, then 4, 5 and a
    # marker, 7 and a marker
    committed = [(o, key) for o, key, _ in _consume(reach, "tls-txn", 4, "read_committed")]
    assert committed == [(0, b"c1"), (4, b"s1"), (5, b"s2"), (7, b"kp1")]
    assert [(o, bytes(key)) for ch in k.read("tls-txn", 0, isolation="read_committed") for o, _, key, _, _ in ch] \
        == committed
    assert k.end_offsets("tls-txn", isolation="read_committed") == {0: 9}
    k.close()


def test_kcat_with_the_generated_properties(sasl_ssl):
    kcat = shutil.which("kcat")
    if kcat is None:
        pytest.skip("kcat is not installed (apt-get install kcat)")
    props = os.path.join(sasl_ssl.dir, "client.properties")
    _kafka(sasl_ssl.bootstrap).ensure_topic("tls-kcat", 1)
    r = subprocess.run([kcat, "-F", props, "-b", sasl_ssl.bootstrap, "-P", "-t", "tls-kcat", "-K:", "-p", "0"],
                       input="a:1\nb:2\n", capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    r = subprocess.run([kcat, "-F", props, "-b", sasl_ssl.bootstrap, "-C", "-t", "tls-kcat", "-e", "-o", "beginning",
                        "-f", "%o %k %s\n"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["0 a 1", "1 b 2"]
    assert [(o, bytes(key)) for ch in _kafka(sasl_ssl.bootstrap).read("tls-kcat", 0) for o, _, key, _, _ in ch] == \
        [(0, b"a"), (1, b"b")]


# ---------------------------------------------------------------------------------------------
# bad certificates, wrong ports: one line on each side, and the broker serves the others
def test_an_untrusted_certificate_and_a_plaintext_client(sasl_ssl, tmp_path, capfd):
    other = trustme.CA()
    other.cert_pem.write_to_path(str(tmp_path / "other-ca.pem"))
    log = BrokerLog(sasl_ssl)
    good = _kafka(sasl_ssl.bootstrap)  # connected before, serving after
    with pytest.raises(Exception) as e:
        _kafka(sasl_ssl.bootstrap, {**sasl_ssl.credentials, "ssl.ca.location": str(tmp_path / "other-ca.pem")})
    assert "not signed by a CA this client trusts" in _one_line(e.value) and "ssl.ca.location" in str(e.value)
    line = log.one("does not trust the broker's certificate")
    assert f"ssl.ca.location={sasl_ssl.dir}/tls/ca.pem" in line
    with pytest.raises(Exception) as e:
        _kafka(sasl_ssl.bootstrap, {"security.protocol": "PLAINTEXT"})
    msg = _one_line(e.value)
    assert "closed the connection before answering" in msg and "security.protocol=SSL" in msg
    assert "security.protocol=SSL" in log.one("spoke plaintext to this TLS listener")
    # librdkafka says it in its own words, naming the setting; the broker logs its line again
    capfd.readouterr()
    ac = AdminClient({"bootstrap.servers": sasl_ssl.bootstrap, "security.protocol": "SSL",
                      "ssl.ca.location": str(tmp_path / "other-ca.pem")})
    with pytest.raises(ck.KafkaException):
        ac.list_topics(timeout=3)
    assert "verify that ssl.ca.location is correctly configured" in capfd.readouterr().err
    assert len(log.lines("does not trust the broker's certificate")) >= 2
    good.ensure_topic("tls-still", 1)
    assert good.send("tls-still", 0, [(b"k", b"v")]) == 0
    good.close()


def test_a_tls_client_at_a_plaintext_listener(broker, tmp_path):
    log = BrokerLog(broker)
    with pytest.raises(Exception) as e:
        _kafka(broker.bootstrap, {"security.protocol": "SSL"})
    msg = _one_line(e.value)
    assert "broke off the TLS handshake" in msg and "security.protocol=PLAINTEXT" in msg
    assert "--tls" in log.one("began a TLS handshake on this plaintext listener")
    assert _kafka(broker.bootstrap).topics() == {}


def _own_certificates(d, leaf):
    """DIR/tls with certificates of the user's own CA (no ca.key: statekit leaves them alone)."""
    tls_dir = os.path.join(d, "tls")
    os.makedirs(tls_dir)
    ca, cert = leaf
    ca.cert_pem.write_to_path(os.path.join(tls_dir, "ca.pem"))
    cert.cert_chain_pems[0].write_to_path(os.path.join(tls_dir, "server.pem"))
    cert.private_key_pem.write_to_path(os.path.join(tls_dir, "server.key"))


@pytest.mark.parametrize("case", ["expired", "wrong-host"])
def test_expired_and_wrong_host_certificates(tmp_path, case):
    ca = trustme.CA()
    if case == "expired":
        now = datetime.datetime.now(datetime.timezone.utc)
        leaf = ca.issue_cert("127.0.0.1", "localhost", not_before=now - datetime.timedelta(days=60),
                             not_after=now - datetime.timedelta(days=1))
    else:
        leaf = ca.issue_cert("kafka.example.org")
    d = str(tmp_path / "own")
    _own_certificates(d, (ca, leaf))
    with open(os.path.join(d, "tls", "server.pem"), "rb") as f:
        before = f.read()
    from statekit import broker as broker_mod

    h = broker_mod.start(dir=d, port=0, tls=True)
    try:
        with open(os.path.join(d, "tls", "server.pem"), "rb") as f:
            assert f.read() == before  # the user's own certificate is used as it is
        with open(os.path.join(d, "broker.log")) as f:
            start_log = f.read()
        log = BrokerLog(h)
        with pytest.raises(Exception) as e:
            _kafka(h.bootstrap)
        msg = _one_line(e.value)
        if case == "expired":
            assert "expired on" in start_log and "clients will refuse it" in start_log
            assert "presented an expired certificate" in msg
            assert f"replace {d}/tls/server.pem" in log.one("refused the broker's certificate as expired")
        else:
            assert "does not name 127.0.0.1" in start_log
            assert "is not valid for '127.0.0.1'" in msg and "ssl.endpoint.identification.algorithm=" in msg
            assert "127.0.0.1, localhost" in log.one("refused the broker's certificate (most often: the host name")
            # what the message says to do works: without the host name check the client connects
            k = _kafka(h.bootstrap, {**h.credentials, "ssl.endpoint.identification.algorithm": ""})
            k.ensure_topic("own", 1)
            assert k.topics() == {"own": 1}
            k.close()
    finally:
        h.stop()


# ---------------------------------------------------------------------------------------------
# mutual TLS
def test_mutual_tls_accepts_client_certificates(mutual):
    reach = Reach(mutual)
    assert mutual.credentials["security.protocol"] == "SSL"
    assert mutual.credentials["ssl.certificate.location"] == os.path.join(mutual.dir, "tls", "client.pem")
    k = _kafka(mutual.bootstrap)  # statekit's client shows statekit's client certificate by itself
    k.ensure_topic("mtls", 1)
    k.send("mtls", 0, [(b"s", b"v")])
    p = KafkaProducer(bootstrap_servers=mutual.bootstrap, **reach.kafka_python())
    try:
        assert p.send("mtls", key=b"kp", value=b"v", partition=0).get(20).offset == 1
    finally:
        p.close()
    cp = ck.Producer(reach.librdkafka())
    cp.produce("mtls", key=b"ck", value=b"v", partition=0)
    assert cp.flush(30) == 0
    assert [(o, key) for o, key, _ in _consume(reach, "mtls", 3)] == [(0, b"s"), (1, b"kp"), (2, b"ck")]
    kcat = shutil.which("kcat")
    if kcat is not None:  # the generated properties carry the client certificate
        r = subprocess.run([kcat, "-F", os.path.join(mutual.dir, "client.properties"), "-b", mutual.bootstrap, "-C",
                            "-t", "mtls", "-e", "-o", "beginning", "-f", "%o %k\n"], capture_output=True, text=True,
                           timeout=60)
        assert r.returncode == 0, r.stderr
        assert r.stdout.splitlines() == ["0 s", "1 kp", "2 ck"]
    k.close()


def test_mutual_tls_refuses_clients_without_a_trusted_certificate(mutual, tmp_path):
    ca_only = {"security.protocol": "SSL", "ssl.ca.location": mutual.credentials["ssl.ca.location"]}
    log = BrokerLog(mutual)
    with pytest.raises(Exception) as e:
        _kafka(mutual.bootstrap, ca_only)
    msg = _one_line(e.value)
    assert "if it requires client certificates" in msg and "ssl.certificate.location" in msg
    assert f"{mutual.dir}/tls/client.pem" in log.one("sent no client certificate and this broker requires one")
    stranger = trustme.CA().issue_cert("stranger")
    stranger.cert_chain_pems[0].write_to_path(str(tmp_path / "c.pem"))
    stranger.private_key_pem.write_to_path(str(tmp_path / "c.key"))
    with pytest.raises(Exception) as e:
        _kafka(mutual.bootstrap, {**ca_only, "ssl.certificate.location": str(tmp_path / "c.pem"),
                                  "ssl.key.location": str(tmp_path / "c.key")})
    assert "may not trust this client's certificate" in _one_line(e.value)
    assert f"must be signed by {mutual.dir}/tls/ca.pem" in log.one("its client certificate was refused")
    assert _kafka(mutual.bootstrap).topics()  # the others are still served


# ---------------------------------------------------------------------------------------------
def test_slow_and_silent_tls_clients_do_not_stall_the_others(mutual):
    """Connections that never finish their handshake (silent, or half a ClientHello) cost their
    own connection only, and are dropped after the handshake timeout."""
    from statekit.broker.tls import HANDSHAKE_TIMEOUT_S

    log = BrokerLog(mutual)
    host, port = mutual.bootstrap.rsplit(":", 1)
    hello = _client_hello(mutual)
    stalled = []
    t0 = time.monotonic()
    for i in range(20):
        s = socket.create_connection((host, int(port)), timeout=30)
        if i % 2:
            s.sendall(hello[:len(hello) // 2])
        stalled.append(s)
    k = _kafka(mutual.bootstrap)
    k.ensure_topic("tls-busy", 1)
    for i in range(20):  # new TLS connections and requests go through meanwhile
        assert _kafka(mutual.bootstrap).send("tls-busy", 0, [(b"k%d" % i, b"v")]) == i
    assert time.monotonic() - t0 < HANDSHAKE_TIMEOUT_S
    def closed(s):
        try:
            return s.recv(1) == b""
        except OSError:
            return True

    for s in stalled:
        assert closed(s)
        s.close()
    assert time.monotonic() - t0 < HANDSHAKE_TIMEOUT_S + 15
    wait_until(lambda: len(log.lines("did not finish the TLS handshake")) == 20, 10, "twenty timeout lines")
    assert sum(len(ch) for ch in k.read("tls-busy", 0)) == 20
    k.close()


def _client_hello(handle) -> bytes:
    """The bytes a TLS client sends first (its ClientHello), captured from a memory BIO."""
    ctx = ssl.create_default_context(cafile=handle.credentials["ssl.ca.location"])
    incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
    obj = ctx.wrap_bio(incoming, outgoing, server_hostname="127.0.0.1")
    with pytest.raises(ssl.SSLWantReadError):
        obj.do_handshake()
    return outgoing.read()


# ---------------------------------------------------------------------------------------------
def test_generated_certificates_are_renewed_and_own_ones_are_left_alone(tmp_path, monkeypatch):
    from cryptography import x509

    from statekit.broker import tls

    d = str(tmp_path / "b")
    names = ["127.0.0.1", "localhost"]

    def read(name):
        with open(os.path.join(d, "tls", name), "rb") as f:
            return f.read()

    def sans():
        cert = x509.load_pem_x509_certificate(read("server.pem"))
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        return sorted(san.get_values_for_type(x509.DNSName) + [str(a) for a in san.get_values_for_type(x509.IPAddress)])

    files = tls.ensure_files(d, names)
    assert files.managed and sans() == ["127.0.0.1", "localhost"]
    ca, server, client = read("ca.pem"), read("server.pem"), read("client.pem")
    tls.ensure_files(d, names)  # fresh: nothing is written again
    assert (read("ca.pem"), read("server.pem"), read("client.pem")) == (ca, server, client)
    tls.ensure_files(d, names + ["kafka.lan"])  # a name the certificate lacks: issued again, same CA
    assert read("ca.pem") == ca and read("server.pem") != server and sans() == ["127.0.0.1", "kafka.lan", "localhost"]
    monkeypatch.setattr(tls, "LEAF_DAYS", 10)
    tls.ensure_files(d, names)  # (fewer names: still fresh, kept)
    assert sans() == ["127.0.0.1", "kafka.lan", "localhost"]
    os.unlink(os.path.join(d, "tls", "client.pem"))
    tls.ensure_files(d, names)  # a missing client certificate is issued (for ten days, here)
    monkeypatch.setattr(tls, "LEAF_DAYS", 365)
    short = read("client.pem")
    tls.ensure_files(d, names)  # within 30 days of its end: renewed
    assert read("client.pem") != short and read("ca.pem") == ca
    for key in ("ca.key", "server.key", "client.key"):
        assert stat.S_IMODE(os.stat(os.path.join(d, "tls", key)).st_mode) == 0o600
    # a server certificate of another CA, where statekit holds the CA's key: issued again
    other = trustme.CA().issue_cert("127.0.0.1")
    other.cert_chain_pems[0].write_to_path(os.path.join(d, "tls", "server.pem"))
    tls.ensure_files(d, names)
    x509.load_pem_x509_certificate(read("server.pem")).verify_directly_issued_by(x509.load_pem_x509_certificate(ca))
    # without ca.key the files are the user's own: never rewritten, their problems said
    os.unlink(os.path.join(d, "tls", "ca.key"))
    kept = read("server.pem")
    files = tls.ensure_files(d, ["127.0.0.1", "kafka.example.org"])
    assert not files.managed and read("server.pem") == kept
    assert tls.certificate_problem(files, "kafka.example.org").startswith(
        f"the server certificate {d}/tls/server.pem does not name kafka.example.org")
    assert tls.certificate_problem(files, "127.0.0.1") is None
    os.unlink(os.path.join(d, "tls", "server.key"))
    with pytest.raises(tls.TlsError, match="server.key is missing: put your own"):
        tls.ensure_files(d, names)


def test_cli_start_with_tls(tmp_path):
    import sys

    d = str(tmp_path / "cli")
    cli = [sys.executable, "-m", "statekit.cli", "broker"]
    r = subprocess.run(cli + ["start", "--dir", d, "--port", "0", "--tls", "--auth"], capture_output=True, text=True,
                       timeout=60)
    try:
        assert r.returncode == 0, r.stderr
        assert f"TLS and SASL required; client settings in {d}/client.properties" in r.stderr
        st = subprocess.run(cli + ["status", "--dir", d], capture_output=True, text=True, timeout=60)
        assert st.returncode == 0 and r.stdout.strip() in st.stdout and "TLS and SASL required" in st.stdout
        with open(os.path.join(d, "broker.log")) as f:
            text = f.read()
        assert "(SASL_SSL)" in text
        assert "closing connection" not in text  # status's port probe (connect, close) is not a bad client
        assert _kafka(r.stdout.strip()).topics() == {}
    finally:
        subprocess.run(cli + ["stop", "--dir", d], timeout=60)


def test_client_lines_for_what_the_brokers_here_do_not_do(tmp_path):
    """A TLS answer to a plaintext request (a Kafka whose TLS port sends an alert), and certificate
    checks the brokers above do not trip (not yet valid, another verify error), each in one line."""
    from statekit.kafka.tls_errors import handshake_failed

    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen()

    def answer_with_an_alert():
        c, _ = srv.accept()
        c.recv(1024)
        c.sendall(b"\x15\x03\x03\x00\x02\x02\x46")  # TLS alert: protocol_version
        time.sleep(0.5)
        c.close()

    t = threading.Thread(target=answer_with_an_alert, daemon=True)
    t.start()
    with pytest.raises(Exception) as e:
        _kafka(f"127.0.0.1:{srv.getsockname()[1]}", {"security.protocol": "PLAINTEXT"}, timeout=5)
    assert "answered in TLS, set security.protocol=SSL" in _one_line(e.value)
    t.join(5)
    srv.close()
    for code, why, want in ((9, "certificate is not yet valid", "check this machine's clock"),
                            (50, "application verification failure", "was refused (application verification "
                                                                      "failure): check ssl.ca.location")):
        exc = ssl.SSLCertVerificationError(1, why)
        exc.verify_code, exc.verify_message = code, why
        assert want in _one_line(handshake_failed(exc, "k:9093", "k"))
    assert "did not finish the TLS handshake in time" in _one_line(
        handshake_failed(socket.timeout("timed out"), "k:9093", "k"))
