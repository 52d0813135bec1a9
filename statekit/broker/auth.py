"""SASL authentication for the embedded broker, for shared hosts (a JupyterHub for a workshop):
without it, any local user can reach a participant's broker on localhost and delete their topics.

`start(..., auth=True)` / `statekit broker start --auth` make the broker demand SASL (PLAIN or
SCRAM-SHA-256, Kafka's SaslHandshake v1 + SaslAuthenticate, or raw tokens after a v0 handshake)
before any request other than ApiVersions. The password is generated once; at each start the
client settings that reach the broker (with `--tls`, the ssl.* ones of `tls.py` too) are written
into `DIR/credentials.json`, readable by the user only (0600), in the client property names
librdkafka and statekit.kafka use; `DIR/client.properties` holds the same for tools (`kcat -F`).
statekit's own clients find them from the bootstrap address (see `statekit.broker.credentials_for`).
"""
from __future__ import annotations

import base64
import hashlib
import hmac
import json
import os
import secrets

CREDENTIALS_FILE = "credentials.json"
PROPERTIES_FILE = "client.properties"
MECHANISMS = ("PLAIN", "SCRAM-SHA-256")
SCRAM_ITERATIONS = 4096
USERNAME = "statekit"


def should_auth() -> bool:
    """Should `%statekit up` start its broker with authentication? Yes under JupyterHub (other
    users share the host) or when STATEKIT_BROKER_AUTH=1."""
    flag = os.environ.get("STATEKIT_BROKER_AUTH", "").strip().lower()
    if flag in ("1", "true", "yes", "on"):
        return True
    if flag in ("0", "false", "no", "off"):
        return False
    return bool(os.environ.get("JUPYTERHUB_USER") or os.environ.get("JUPYTERHUB_API_TOKEN"))


def write_private(path: str, text: str) -> None:
    """Created 0600 from the first byte (never readable by others, not even briefly)."""
    tmp = f"{path}.tmp{os.getpid()}"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600)
    try:
        os.fchmod(fd, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise
    os.replace(tmp, path)


def write_client_settings(data_dir: str, sasl: bool, ssl_settings: dict | None = None) -> dict:
    """The client settings that reach the broker as it starts now, into `DIR/credentials.json`
    and `DIR/client.properties` (0600): `security.protocol` (SASL_PLAINTEXT, SSL or SASL_SSL), the
    SASL credentials (the password generated the first time, kept after), and the ssl.* settings
    of a TLS listener. Returns them."""
    protocol = ("SASL_" if sasl else "") + ("SSL" if ssl_settings else "PLAINTEXT")
    settings = {"security.protocol": protocol}
    if sasl:
        old = _read_json(os.path.join(data_dir, CREDENTIALS_FILE)) or {}
        password = old.get("sasl.password") if old.get("sasl.username") == USERNAME else None
        settings.update({"sasl.mechanism": "SCRAM-SHA-256", "sasl.username": USERNAME,
                         "sasl.password": password or secrets.token_urlsafe(24)})
    settings.update(ssl_settings or {})
    os.makedirs(data_dir, exist_ok=True)
    write_private(os.path.join(data_dir, CREDENTIALS_FILE), json.dumps(settings, indent=1) + "\n")
    props = "".join(f"{k}={v}\n" for k, v in settings.items())
    # librdkafka spells the mechanism key with an s
    props = props.replace("sasl.mechanism=", "sasl.mechanisms=")
    write_private(os.path.join(data_dir, PROPERTIES_FILE), props)
    return settings


def _read_json(path: str):
    try:
        st = os.stat(path)
        with open(path) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return None
    if st.st_mode & 0o077:
        os.chmod(path, 0o600)  # someone loosened it: close it again
    return doc if isinstance(doc, dict) else None


def read_credentials(data_dir: str) -> dict | None:
    """The client settings in DIR/credentials.json (see write_client_settings), or None."""
    creds = _read_json(os.path.join(data_dir, CREDENTIALS_FILE))
    if creds is None or not creds.get("security.protocol"):
        return None
    if creds["security.protocol"].startswith("SASL") and not (creds.get("sasl.username") and creds.get("sasl.password")):
        return None
    return creds


# ---------------------------------------------------------------------------------------------
# server side
class ScramCredential:
    """What a SCRAM server keeps of a password (RFC 5802): salt, iterations, StoredKey, ServerKey."""

    def __init__(self, password: str, salt: bytes | None = None, iterations: int = SCRAM_ITERATIONS):
        self.salt = salt or secrets.token_bytes(16)
        self.iterations = iterations
        salted = hashlib.pbkdf2_hmac("sha256", password.encode("utf-8"), self.salt, iterations)
        client_key = hmac.new(salted, b"Client Key", hashlib.sha256).digest()
        self.stored_key = hashlib.sha256(client_key).digest()
        self.server_key = hmac.new(salted, b"Server Key", hashlib.sha256).digest()


class AuthFailed(Exception):
    """SASL_AUTHENTICATION_FAILED with this message (Kafka's wording)."""


class Users:
    """The accounts the broker accepts: {username: password} (PLAIN) and their SCRAM credentials."""

    def __init__(self, users: dict[str, str], mechanisms=MECHANISMS):
        self.passwords = dict(users)
        self.scram = {u: ScramCredential(p) for u, p in users.items()}
        self.mechanisms = list(mechanisms)

    def session(self) -> "SaslSession":
        return SaslSession(self)


class SaslSession:
    """The SASL exchange of one connection: `handshake(mechanism)`, then `step(token)` until done."""

    def __init__(self, users: Users):
        self.users = users
        self.mechanism: str | None = None
        self.done = False
        self.principal: str | None = None
        self._scram: dict | None = None

    def handshake(self, mechanism: str) -> bool:
        if mechanism not in self.users.mechanisms:
            return False
        self.mechanism = mechanism
        return True

    def step(self, token: bytes) -> bytes:
        """The server's answer to one client token; sets `done` when authenticated. Raises
        AuthFailed."""
        if self.mechanism == "PLAIN":
            return self._plain(bytes(token))
        if self.mechanism == "SCRAM-SHA-256":
            return self._scram_step(bytes(token))
        raise AuthFailed("Unexpected SASL request before a SaslHandshake")

    def _plain(self, token: bytes) -> bytes:
        parts = token.split(b"\0")
        if len(parts) != 3:
            raise AuthFailed("Invalid SASL/PLAIN response: expected 3 tokens")
        authzid, user, password = (p.decode("utf-8", "replace") for p in parts)
        expected = self.users.passwords.get(user)
        if expected is None or not hmac.compare_digest(expected.encode(), password.encode()):
            raise AuthFailed("Authentication failed: Invalid username or password")
        if authzid and authzid != user:
            raise AuthFailed("Authentication failed: Client requested an authorization id that is different from username")
        self.principal, self.done = user, True
        return b""

    def _scram_step(self, token: bytes) -> bytes:
        fail = AuthFailed("Authentication failed during authentication due to invalid credentials with "
                          "SASL mechanism SCRAM-SHA-256")
        text = token.decode("utf-8", "replace")
        if self._scram is None:
            try:
                gs2_cb, authzid, bare = text.split(",", 2)
            except ValueError:
                raise fail from None
            if gs2_cb not in ("n", "y") or not bare.startswith("n="):
                raise fail
            attrs = dict(a.split("=", 1) for a in bare.split(",") if "=" in a)
            user = attrs.get("n", "").replace("=2C", ",").replace("=3D", "=")
            cnonce = attrs.get("r", "")
            cred = self.users.scram.get(user)
            if not cnonce or cred is None:
                raise fail
            nonce = cnonce + secrets.token_urlsafe(18)
            first = f"r={nonce},s={base64.b64encode(cred.salt).decode()},i={cred.iterations}"
            self._scram = {"user": user, "cred": cred, "nonce": nonce, "bare": bare, "first": first,
                           "gs2": f"{gs2_cb},{authzid},"}
            return first.encode()
        st = self._scram
        if "," not in text or ",p=" not in text:
            raise fail
        without_proof, proof_b64 = text.rsplit(",p=", 1)
        attrs = dict(a.split("=", 1) for a in without_proof.split(",") if "=" in a)
        # RFC 5802 wants the exact nonce; librdkafka before 2.6.1 sends its client nonce once more
        # in front, which Kafka 3.x accepts (endsWith) and so do we: kcat on many hosts is older
        if not attrs.get("r", "").endswith(st["nonce"]):
            raise fail
        if attrs.get("c") != base64.b64encode(st["gs2"].encode()).decode():
            raise fail
        try:
            proof = base64.b64decode(proof_b64, validate=True)
        except ValueError:
            raise fail from None
        auth_message = f"{st['bare']},{st['first']},{without_proof}".encode()
        cred = st["cred"]
        signature = hmac.new(cred.stored_key, auth_message, hashlib.sha256).digest()
        if len(proof) != len(signature):
            raise fail
        client_key = bytes(a ^ b for a, b in zip(proof, signature))
        if not hmac.compare_digest(hashlib.sha256(client_key).digest(), cred.stored_key):
            raise fail
        server_sig = hmac.new(cred.server_key, auth_message, hashlib.sha256).digest()
        self.principal, self.done = st["user"], True
        return f"v={base64.b64encode(server_sig).decode()}".encode()
