"""kafka-python's clients import only when asked for (``statekit.kafka_import``): a statekit process
that speaks Kafka through statekit's client never imports them, and a user's own kafka-python code in
the same process still finds the whole package."""
from __future__ import annotations

import json
import os
import subprocess
import sys

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(code: str) -> dict:
    out = subprocess.run([sys.executable, "-c", f"import sys; sys.path.insert(0, {ROOT!r})\n" + code],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return json.loads(out.stdout.strip().splitlines()[-1])


def test_statekits_client_imports_kafkas_protocol_without_its_clients():
    said = _run("""
import json, sys
from statekit.kafka import Kafka
import kafka.errors
print(json.dumps({"clients": sorted(m for m in ("kafka.admin", "kafka.consumer.group", "kafka.producer.kafka",
                                                "kafka.net") if m in sys.modules),
                  "protocol": "kafka.protocol.consumer" in sys.modules}))
""")
    assert said == {"clients": [], "protocol": True}


def test_a_users_kafka_python_code_finds_the_whole_package_after_statekit():
    said = _run("""
import json, sys
import statekit.kafka
import kafka
from kafka import KafkaConsumer, KafkaProducer
from kafka.admin import KafkaAdminClient
try:
    kafka.no_such_name
    missing = None
except AttributeError as e:
    missing = str(e)
print(json.dumps({"consumer": KafkaConsumer.__module__, "producer": kafka.KafkaProducer is KafkaProducer,
                  "admin": kafka.KafkaAdminClient is KafkaAdminClient, "version": kafka.__version__,
                  "all": "KafkaConsumer" in kafka.__all__, "missing": missing}))
""")
    from importlib.metadata import version

    assert said == {"consumer": "kafka.consumer.group", "producer": True, "admin": True,
                    "version": version("kafka-python"), "all": True,
                    "missing": "module 'kafka' has no attribute 'no_such_name'"}


def test_a_kafka_imported_before_statekit_is_left_as_it_is():
    said = _run("""
import json, sys
import kafka
first = kafka
import statekit.kafka
print(json.dumps({"same": sys.modules["kafka"] is first, "clients": "kafka.admin" in sys.modules}))
""")
    assert said == {"same": True, "clients": True}
