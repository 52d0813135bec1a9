"""The registry's lifecycle, mirroring the broker's: a child process, DIR/registry.json while it
runs, reuse of a running one (not owned), `statekit registry start|status|stop`, basic auth; and its
durability: a restart keeps every schema, id and version, and a torn last line is cut off."""
from __future__ import annotations

import json
import os
import subprocess
import sys

import httpx
import pytest
from confluent_kafka.schema_registry import Schema, SchemaRegistryClient

from statekit import registry as registry_mod


def _schema(i: int) -> Schema:
    return Schema(json.dumps({"type": "record", "name": f"R{i}", "fields": [{"name": "a", "type": "int"}]}), "AVRO")


def test_a_restart_keeps_every_id_version_and_level(tmp_path):
    d = str(tmp_path / "reg")
    h = registry_mod.start(dir=d)
    try:
        c = SchemaRegistryClient({"url": h.url})
        ids = {f"s{i}": c.register_schema(f"s{i}", _schema(i)) for i in range(5)}
        ids["shared"] = c.register_schema("shared", _schema(2))  # an existing schema: an existing id
        c.register_schema("s0", Schema(json.dumps({"type": "record", "name": "R0", "fields": [
            {"name": "a", "type": "int"}, {"name": "b", "type": "int", "default": 0}]}), "AVRO"))
        c.delete_version("s1", 1)
        c.set_compatibility("s3", "NONE")
        before = {s: [(v.version, v.schema_id) for v in (c.get_version(s, n) for n in c.get_versions(s))]
                  for s in c.get_subjects()}
        h.kill()  # a crash: no goodbye
    finally:
        h.stop()
    assert registry_mod.status(d) is None
    h2 = registry_mod.start(dir=d)
    try:
        c2 = SchemaRegistryClient({"url": h2.url})
        after = {s: [(v.version, v.schema_id) for v in (c2.get_version(s, n) for n in c2.get_versions(s))]
                 for s in c2.get_subjects()}
        assert after == before and ids["shared"] == ids["s2"]
        assert "s1" not in after and c2.get_schema(ids["s1"]).schema_str  # soft-deleted, still read by id
        assert c2.get_compatibility("s3") == "NONE"
        # ids keep counting past the highest ever given
        assert c2.register_schema("new", _schema(99)) == max(v for vs in before.values() for _, v in vs) + 1
    finally:
        h2.stop()


def test_a_torn_last_line_is_cut_off(tmp_path):
    d = str(tmp_path / "reg")
    with registry_mod.start(dir=d) as h:
        SchemaRegistryClient({"url": h.url}).register_schema("t", _schema(1))
    path = os.path.join(d, "_schemas.jsonl")
    with open(path, "a") as f:
        f.write('{"op":"schema","subject":"t","vers')  # a crash mid-write: never answered
    with registry_mod.start(dir=d) as h:
        c = SchemaRegistryClient({"url": h.url})
        assert c.get_versions("t") == [1]
        c.register_schema("t2", _schema(2))
    with open(path) as f:
        assert [json.loads(line)["subject"] for line in f] == ["t", "t2"]


def test_reuse_is_not_ownership(tmp_path):
    d = str(tmp_path / "reg")
    h = registry_mod.start(dir=d)
    try:
        info = json.load(open(os.path.join(d, "registry.json")))
        assert info["url"] == h.url and info["pid"] == h.pid and h.owned
        other = registry_mod.start(dir=d)
        assert (other.url, other.owned) == (h.url, False)
        other.stop()  # not its to stop
        assert registry_mod.status(d)["pid"] == h.pid
    finally:
        h.stop()
    assert registry_mod.status(d) is None and not os.path.exists(os.path.join(d, "registry.json"))
    assert registry_mod.client_config(d) is None


def test_basic_auth(tmp_path):
    with registry_mod.start(dir=str(tmp_path / "reg"), auth=True) as h:
        assert httpx.get(f"{h.url}/subjects").status_code == 401
        assert httpx.get(f"{h.url}/subjects", auth=("statekit", "wrong")).status_code == 401
        assert SchemaRegistryClient(h.client_config).register_schema("a", _schema(1)) == 1
        # another process finds it, credentials included, without starting anything
        assert registry_mod.client_config(h.dir) == h.client_config
        assert SchemaRegistryClient(registry_mod.client_config(h.dir)).get_subjects() == ["a"]
        user, password = h.credentials.split(":", 1)
        assert httpx.get(f"{h.url}/subjects", auth=(user, password)).json() == ["a"]
        assert oct(os.stat(os.path.join(h.dir, "registry-credentials.json")).st_mode & 0o777) == "0o600"


def _cli(*args):
    return subprocess.run([sys.executable, "-m", "statekit.cli", "registry", *args], capture_output=True, text=True,
                          timeout=60)


def test_cli(tmp_path):
    d = str(tmp_path / "cli")
    r = _cli("start", "--dir", d, "--port", "0")
    try:
        assert r.returncode == 0, r.stderr
        url = r.stdout.strip()
        assert url.startswith("http://127.0.0.1:") and httpx.get(url + "/subjects").json() == []
        again = _cli("start", "--dir", d, "--port", "0")
        assert again.stdout.strip() == url and "reusing" in again.stderr
        st = _cli("status", "--dir", d)
        assert st.returncode == 0 and url in st.stdout
        # the port is taken: one clear line
        taken = _cli("start", "--dir", str(tmp_path / "other"), "--port", url.rsplit(":", 1)[1])
        assert taken.returncode == 1 and "already in use" in taken.stderr
        assert taken.stderr.strip().count("\n") == 0
    finally:
        sp = _cli("stop", "--dir", d)
    assert sp.returncode == 0 and "stopped" in sp.stdout
    assert registry_mod.status(d) is None


def test_tls_serves_https_with_the_broker_s_certificate_and_refuses_what_does_not_trust_it(tmp_path):
    """`start(tls=True)` serves HTTPS with the certificate of the broker's TLS listener in DIR/tls
    (made there when missing); its client_config names the CA, and confluent-kafka's client works with
    it; a client that does not trust the CA, or speaks plain HTTP, is refused, and a silent TLS client
    holds no one else up."""
    import base64
    import socket
    import ssl
    import urllib.error
    import urllib.request

    d = str(tmp_path / "reg")
    h = registry_mod.start(dir=d, tls=True, auth=True)
    silent = socket.create_connection((h.host, h.port))  # connects and never says hello
    try:
        assert h.url.startswith("https://") and h.tls and h.ca == os.path.join(d, "tls", "ca.pem")
        conf = registry_mod.client_config(d)
        assert conf["ssl.ca.location"] == h.ca and conf["url"] == h.url
        c = SchemaRegistryClient(conf)
        sid = c.register_schema("s-value", _schema(1))
        assert json.loads(c.get_schema(sid).schema_str) == json.loads(_schema(1).schema_str)
        with pytest.raises(Exception) as untrusted:   # the system's CAs do not know ours
            SchemaRegistryClient({"url": h.url, "basic.auth.user.info": h.credentials}).get_subjects()
        assert "certificate verify failed" in str(untrusted.value).lower() or "ssl" in str(untrusted.value).lower()
        with pytest.raises(OSError) as plain_http:     # plain HTTP at the HTTPS port: no answer
            urllib.request.urlopen(h.url.replace("https:", "http:") + "/subjects", timeout=5).read()
        assert not isinstance(plain_http.value, urllib.error.HTTPError)
        assert c.get_subjects() == ["s-value"]         # still serving, the silent client aside
        req = urllib.request.Request(h.url + "/schemas/types", headers={
            "Authorization": "Basic " + base64.b64encode(h.credentials.encode()).decode()})
        with urllib.request.urlopen(req, timeout=5, context=ssl.create_default_context(cafile=h.ca)) as r:
            assert sorted(json.loads(r.read())) == ["AVRO", "JSON", "PROTOBUF"]
        # a second start on the directory reuses it; asking for TLS of a plain one is refused
        assert not registry_mod.start(dir=d, tls=True).owned
    finally:
        silent.close()
        h.stop()
    plain = registry_mod.start(dir=str(tmp_path / "plain"))
    try:
        with pytest.raises(Exception, match="serves plain HTTP"):
            registry_mod.start(dir=str(tmp_path / "plain"), tls=True)
    finally:
        plain.stop()
    log = open(os.path.join(d, "registry.log")).read()
    assert "TLS handshake with 127.0.0.1" in log
