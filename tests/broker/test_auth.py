"""SASL on the embedded broker (`auth=True`): generated private credentials, kafka-python,
confluent-kafka and kcat with PLAIN and SCRAM-SHA-256, statekit's own client picking the
credentials up, and clients without (or with wrong) credentials refused."""
from __future__ import annotations

import json
import os
import shutil
import stat
import subprocess
import sys
import time

import pytest
from kafka import KafkaAdminClient, KafkaConsumer, KafkaProducer, TopicPartition
from kafka.protocol.metadata import ApiVersionsRequest, ApiVersionsResponse, MetadataRequest, MetadataResponse

from _broker_util import Raw

ck = pytest.importorskip("confluent_kafka")


@pytest.fixture(scope="module")
def auth_broker(tmp_path_factory):
    from statekit import broker as broker_mod

    h = broker_mod.start(dir=str(tmp_path_factory.mktemp("auth") / "b"), port=0, auth=True)
    try:
        yield h
    finally:
        h.stop()


def _kp_config(creds, mechanism):
    return dict(security_protocol="SASL_PLAINTEXT", sasl_mechanism=mechanism,
                sasl_plain_username=creds["sasl.username"], sasl_plain_password=creds["sasl.password"])


def test_credentials_are_generated_private(auth_broker):
    d = auth_broker.dir
    for name in ("credentials.json", "client.properties"):
        assert stat.S_IMODE(os.stat(os.path.join(d, name)).st_mode) == 0o600
    with open(os.path.join(d, "credentials.json")) as f:
        creds = json.load(f)
    assert creds == auth_broker.credentials
    assert creds["security.protocol"] == "SASL_PLAINTEXT" and creds["sasl.mechanism"] == "SCRAM-SHA-256"
    assert len(creds["sasl.password"]) >= 24
    with open(os.path.join(d, "broker.json")) as f:
        assert json.load(f)["auth"] is True


@pytest.mark.parametrize("mechanism", ["PLAIN", "SCRAM-SHA-256"])
def test_kafka_python_and_confluent_authenticate(auth_broker, mechanism):
    from statekit.kafka import Kafka

    creds = auth_broker.credentials
    topic = f"auth-{mechanism.lower()}"
    k = Kafka(auth_broker.bootstrap)  # statekit's client: credentials found from the bootstrap
    k.ensure_topic(topic, 1)
    p = KafkaProducer(bootstrap_servers=auth_broker.bootstrap, **_kp_config(creds, mechanism))
    try:
        assert [p.send(topic, key=b"kp%d" % i, value=b"v", partition=0).get(10).offset for i in range(3)] == [0, 1, 2]
    finally:
        p.close()
    cp = ck.Producer({"bootstrap.servers": auth_broker.bootstrap, "security.protocol": "SASL_PLAINTEXT",
                      "sasl.mechanisms": mechanism, "sasl.username": creds["sasl.username"],
                      "sasl.password": creds["sasl.password"]})
    for i in range(2):
        cp.produce(topic, key=b"ck%d" % i, value=b"v", partition=0)
    assert cp.flush(20) == 0
    c = KafkaConsumer(bootstrap_servers=auth_broker.bootstrap, auto_offset_reset="earliest",
                      enable_auto_commit=False, **_kp_config(creds, mechanism))
    try:
        tp = TopicPartition(topic, 0)
        c.assign([tp])
        got = []
        deadline = time.monotonic() + 20
        while len(got) < 5 and time.monotonic() < deadline:
            for recs in c.poll(200).values():
                got.extend((r.offset, r.key) for r in recs)
    finally:
        c.close()
    assert got == [(0, b"kp0"), (1, b"kp1"), (2, b"kp2"), (3, b"ck0"), (4, b"ck1")]
    assert [(o, bytes(key)) for ch in k.read(topic, 0) for o, _, key, _, _ in ch] == got
    k.close()


def test_kcat_authenticates_with_the_generated_properties(auth_broker):
    kcat = shutil.which("kcat")
    if kcat is None:
        pytest.skip("kcat is not installed (apt-get install kcat)")
    from statekit.kafka import Kafka

    k = Kafka(auth_broker.bootstrap)
    k.ensure_topic("auth-kcat", 1)
    k.send("auth-kcat", 0, [(b"a", b"1"), (b"b", b"2")])
    k.close()
    props = os.path.join(auth_broker.dir, "client.properties")
    r = subprocess.run([kcat, "-F", props, "-b", auth_broker.bootstrap, "-C", "-t", "auth-kcat", "-e",
                        "-o", "beginning", "-f", "%o %k %s\n"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["0 a 1", "1 b 2"]
    creds = auth_broker.credentials
    r = subprocess.run([kcat, "-b", auth_broker.bootstrap, "-X", "security.protocol=SASL_PLAINTEXT",
                        "-X", "sasl.mechanisms=PLAIN", "-X", f"sasl.username={creds['sasl.username']}",
                        "-X", f"sasl.password={creds['sasl.password']}", "-C", "-t", "auth-kcat", "-e",
                        "-o", "beginning", "-f", "%o %k\n"], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.splitlines() == ["0 a", "1 b"]
    r = subprocess.run([kcat, "-b", auth_broker.bootstrap, "-m", "3", "-L"], capture_output=True, text=True,
                       timeout=60)
    assert r.returncode != 0  # no credentials: no metadata


def test_clients_without_credentials_are_refused(auth_broker):
    from statekit.kafka import Kafka, KafkaError

    k = Kafka(auth_broker.bootstrap)
    k.ensure_topic("auth-keep", 1)
    # raw: ApiVersions is answered before authentication, anything else is refused and closed
    with Raw(auth_broker.bootstrap) as raw:
        resp = raw.call(ApiVersionsRequest(version=3, client_software_name="t", client_software_version="1"),
                        ApiVersionsResponse)
        versions = {v.api_key: (v.min_version, v.max_version) for v in resp.api_keys}
        assert versions[17] == (0, 1) and versions[36] == (0, 2)
        resp = raw.call(MetadataRequest(version=9, topics=[MetadataRequest.MetadataRequestTopic(name="auth-keep")],
                                        allow_auto_topic_creation=False, include_topic_authorized_operations=False),
                        MetadataResponse)
        assert [(t.name, t.error_code) for t in resp.topics] == [("auth-keep", 58)] and resp.brokers == []
        assert raw.closed_by_peer()
    with Raw(auth_broker.bootstrap) as raw:
        resp = raw.call(MetadataRequest(version=9, topics=None, allow_auto_topic_creation=False,
                                        include_topic_authorized_operations=False), MetadataResponse)
        assert (resp.brokers, resp.topics) == ([], [])
        assert raw.closed_by_peer()
    with pytest.raises(KafkaError, match="requires SASL authentication"):
        Kafka(auth_broker.bootstrap, kafka_config={"security.protocol": "PLAINTEXT"}).topics()
    with pytest.raises(KafkaError, match="refused the SASL credentials"):
        Kafka(auth_broker.bootstrap, kafka_config={
            "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "SCRAM-SHA-256",
            "sasl.username": "statekit", "sasl.password": "not-the-password"})
    with pytest.raises(KafkaError, match="refused the SASL credentials"):
        Kafka(auth_broker.bootstrap, kafka_config={
            "security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
            "sasl.username": "someone", "sasl.password": auth_broker.credentials["sasl.password"]})
    from kafka.errors import KafkaTimeoutError

    with pytest.raises(KafkaTimeoutError, match="Unable to bootstrap"):
        a = KafkaAdminClient(bootstrap_servers=auth_broker.bootstrap, bootstrap_timeout_ms=3000)
        a.delete_topics(["auth-keep"])
    from confluent_kafka.admin import AdminClient

    with pytest.raises(ck.KafkaException):
        AdminClient({"bootstrap.servers": auth_broker.bootstrap}).list_topics(timeout=3)
    assert k.topics() == {**k.topics(), "auth-keep": 1}
    k.close()


def test_another_process_of_the_user_finds_the_credentials(auth_broker):
    code = ("import sys; from statekit.kafka import Kafka; k = Kafka(sys.argv[1]); "
            "k.ensure_topic('auth-other', 2); print(k.topics()['auth-other'])")
    r = subprocess.run([sys.executable, "-c", code, auth_broker.bootstrap], capture_output=True, text=True,
                       timeout=60, env={**os.environ, "STATEKIT_HOME": "/nonexistent-statekit-home"})
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "2"


def test_should_auth(monkeypatch):
    from statekit.broker import should_auth

    for k in ("JUPYTERHUB_USER", "JUPYTERHUB_API_TOKEN", "STATEKIT_BROKER_AUTH"):
        monkeypatch.delenv(k, raising=False)
    assert should_auth() is False
    monkeypatch.setenv("JUPYTERHUB_USER", "ada")
    assert should_auth() is True
    monkeypatch.setenv("STATEKIT_BROKER_AUTH", "0")
    assert should_auth() is False
    monkeypatch.delenv("JUPYTERHUB_USER")
    monkeypatch.setenv("JUPYTERHUB_API_TOKEN", "t")
    monkeypatch.setenv("STATEKIT_BROKER_AUTH", "1")
    assert should_auth() is True
    monkeypatch.delenv("JUPYTERHUB_API_TOKEN")
    assert should_auth() is True


def test_cli_start_with_auth(tmp_path):
    d = str(tmp_path / "cli")
    r = subprocess.run([sys.executable, "-m", "statekit.cli", "broker", "start", "--dir", d, "--port", "0", "--auth"],
                       capture_output=True, text=True, timeout=60)
    try:
        assert r.returncode == 0, r.stderr
        assert "client.properties" in r.stderr
        bootstrap = r.stdout.strip()
        st = subprocess.run([sys.executable, "-m", "statekit.cli", "broker", "status", "--dir", d],
                            capture_output=True, text=True, timeout=60)
        assert st.returncode == 0 and bootstrap in st.stdout and "SASL required" in st.stdout
        with Raw(bootstrap) as raw:
            resp = raw.call(MetadataRequest(version=9, topics=[MetadataRequest.MetadataRequestTopic(name="x")],
                                            allow_auto_topic_creation=False, include_topic_authorized_operations=False),
                            MetadataResponse)
            assert [t.error_code for t in resp.topics] == [58]
    finally:
        subprocess.run([sys.executable, "-m", "statekit.cli", "broker", "stop", "--dir", d], timeout=60)


def test_handshake_v0_raw_tokens_and_garbage_before_auth(auth_broker):
    import struct

    from kafka.protocol.sasl import SaslHandshakeRequest, SaslHandshakeResponse

    creds = auth_broker.credentials
    with Raw(auth_broker.bootstrap) as raw:
        resp = raw.call(SaslHandshakeRequest(version=0, mechanism="PLAIN"), SaslHandshakeResponse)
        assert resp.error_code == 0 and resp.mechanisms == ["PLAIN", "SCRAM-SHA-256"]
        token = b"\0" + creds["sasl.username"].encode() + b"\0" + creds["sasl.password"].encode()
        raw.send_bytes(struct.pack(">i", len(token)) + token)  # KIP-43: a bare token after v0
        assert raw.recv_frame() == b""
        resp = raw.call(MetadataRequest(version=9, topics=None, allow_auto_topic_creation=False,
                                        include_topic_authorized_operations=False), MetadataResponse)
        assert [b.node_id for b in resp.brokers] == [0]
    with Raw(auth_broker.bootstrap) as raw:  # a wrong bare token: closed without an answer
        raw.call(SaslHandshakeRequest(version=0, mechanism="PLAIN"), SaslHandshakeResponse)
        raw.send_bytes(struct.pack(">i", 9) + b"\0x\0wrong!")
        assert raw.closed_by_peer()
    with Raw(auth_broker.bootstrap) as raw:  # an unknown mechanism
        resp = raw.call(SaslHandshakeRequest(version=1, mechanism="GSSAPI"), SaslHandshakeResponse)
        assert resp.error_code == 33
        assert raw.closed_by_peer()
    with Raw(auth_broker.bootstrap) as raw:  # garbage where a SaslHandshake should be
        raw.send_bytes(struct.pack(">ihhi", 10, 17, 1, 7) + b"\xff\xff")
        assert raw.closed_by_peer()
    with Raw(auth_broker.bootstrap) as raw:  # nothing big before authentication
        raw.send_bytes(struct.pack(">i", 90 << 20) + b"\0" * 1000)
        assert raw.closed_by_peer()
    with Raw(auth_broker.bootstrap) as raw:
        assert raw.call(ApiVersionsRequest(version=0), ApiVersionsResponse).error_code == 0
