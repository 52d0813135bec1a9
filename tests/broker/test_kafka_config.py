"""statekit.kafka's security settings for real clusters: STATEKIT_KAFKA_CONFIG and kafka_config=;
the client never starts a broker (statekit.bootstrap does, for the App and the CLI)."""
from __future__ import annotations

import json
import ssl

import pytest

from statekit.bootstrap import resolve_bootstrap
from statekit.errors import BrokerUnreachable, StatekitError
from statekit.kafka import Kafka, load_kafka_config
from statekit.kafka.config import configured_bootstrap, security_of as _security


@pytest.fixture(autouse=True)
def clean_env(monkeypatch):
    for k in ("STATEKIT_KAFKA_CONFIG", "STATEKIT_BOOTSTRAP"):
        monkeypatch.delenv(k, raising=False)


def test_json_text_properties_file_and_json_file(monkeypatch, tmp_path):
    monkeypatch.setenv("STATEKIT_KAFKA_CONFIG", json.dumps({"security.protocol": "SASL_SSL",
                                                            "sasl.mechanism": "SCRAM-SHA-512",
                                                            "sasl.username": "u", "sasl.password": "p"}))
    assert load_kafka_config() == {"security.protocol": "SASL_SSL", "sasl.mechanism": "SCRAM-SHA-512",
                                   "sasl.username": "u", "sasl.password": "p"}
    props = tmp_path / "client.properties"
    props.write_text("# a comment\nbootstrap.servers=k1:9093,k2:9093\nsecurity.protocol = SASL_PLAINTEXT\n"
                     "sasl.mechanisms=PLAIN\nsasl.jaas.config=org.apache.kafka.common.security.plain."
                     "PlainLoginModule required username=\"alice\" password=\"s3=cret\";\nacks=all\n")
    monkeypatch.setenv("STATEKIT_KAFKA_CONFIG", str(props))
    cfg = load_kafka_config()
    assert cfg["bootstrap.servers"] == "k1:9093,k2:9093" and cfg["acks"] == "all"
    sec = _security(cfg)
    assert (sec.protocol, sec.mechanism, sec.username, sec.password, sec.ssl_context) == (
        "SASL_PLAINTEXT", "PLAIN", "alice", "s3=cret", None)
    assert resolve_bootstrap() == "k1:9093,k2:9093"
    monkeypatch.setenv("STATEKIT_BOOTSTRAP", "elsewhere:9092")
    assert resolve_bootstrap() == "elsewhere:9092"  # the explicit variable wins
    j = tmp_path / "c.json"
    j.write_text(json.dumps({"security.protocol": "SSL", "ssl.endpoint.identification.algorithm": ""}))
    cfg = load_kafka_config(str(j))  # kafka_config= overrides the environment's
    assert cfg["security.protocol"] == "SSL"
    sec = _security(cfg)
    assert isinstance(sec.ssl_context, ssl.SSLContext) and sec.check_hostname is False
    assert load_kafka_config({"security.protocol": "PLAINTEXT"})["security.protocol"] == "PLAINTEXT"


def test_bad_settings_are_one_line_errors(monkeypatch, tmp_path):
    with pytest.raises(StatekitError, match="unknown Kafka client setting 'sasl.usernme'"):
        load_kafka_config({"sasl.usernme": "x"})
    with pytest.raises(StatekitError, match="security.protocol must be one of"):
        load_kafka_config({"security.protocol": "KERBEROS"})
    with pytest.raises(StatekitError, match="needs sasl.username and sasl.password"):
        load_kafka_config({"security.protocol": "SASL_PLAINTEXT"})
    with pytest.raises(StatekitError, match="sasl.mechanism must be one of"):
        load_kafka_config({"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "GSSAPI",
                           "sasl.username": "u", "sasl.password": "p"})
    with pytest.raises(StatekitError, match="PEM files only"):
        load_kafka_config({"security.protocol": "SSL", "ssl.truststore.type": "JKS"})
    with pytest.raises(StatekitError, match="cannot load the TLS files"):
        load_kafka_config({"security.protocol": "SSL", "ssl.ca.location": str(tmp_path / "missing.pem")})
    monkeypatch.setenv("STATEKIT_KAFKA_CONFIG", "{not json")
    with pytest.raises(StatekitError, match="STATEKIT_KAFKA_CONFIG is not valid JSON"):
        load_kafka_config()
    monkeypatch.setenv("STATEKIT_KAFKA_CONFIG", str(tmp_path / "nope.properties"))
    with pytest.raises(StatekitError, match="cannot read"):
        load_kafka_config()


def test_an_explicit_security_config_is_used_against_a_plain_broker(shared_broker):
    # PLAINTEXT spelled out: the same as nothing; SASL against a broker without it: a clear error
    k = Kafka(shared_broker.bootstrap, kafka_config={"security.protocol": "PLAINTEXT", "client.id": "cfg-test"})
    assert k.client_id == "cfg-test"
    k.ensure_topic("cfg-plain", 1)
    k.close()
    with pytest.raises(StatekitError, match="does not offer SaslHandshake: it has no SASL authentication"):
        Kafka(shared_broker.bootstrap, kafka_config={"security.protocol": "SASL_PLAINTEXT", "sasl.mechanism": "PLAIN",
                                                     "sasl.username": "u", "sasl.password": "p"})


def test_the_client_does_not_start_a_broker(monkeypatch, tmp_path):
    """Kafka() without an address fails in one line; only statekit.bootstrap starts the embedded
    broker, and the client package imports statekit.broker for nothing but credentials and the
    read-only log figures (statekit.kafka.log_figures)."""
    import os
    import re

    monkeypatch.setenv("STATEKIT_HOME", str(tmp_path / "home"))
    assert configured_bootstrap() is None
    with pytest.raises(BrokerUnreachable, match="no Kafka to connect to") as e:
        Kafka()
    assert "\n" not in str(e.value)
    assert not os.path.exists(tmp_path / "home")
    pkg = os.path.join(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))),
                       "statekit", "kafka")
    for name in os.listdir(pkg):
        if name.endswith(".py"):
            text = open(os.path.join(pkg, name)).read()
            for m in re.finditer(r"from statekit(?:\.broker| import broker)[^\n#]*", text):
                imported = m.group(0).strip()
                assert imported in ("from statekit.broker import credentials_for",
                                    "from statekit.broker import log_stats",
                                    "from statekit.broker import default_dir, status"), (name, imported)
