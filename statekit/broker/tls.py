"""TLS for the embedded broker (`start(..., tls=True)`, `statekit broker start --tls`): its
certificates, the server's SSL context, and one line for each handshake that fails.

The listener speaks TLS only (SSL, or SASL_SSL with `--auth`): nothing, not even a SASL
password, crosses it in clear. `--mtls` also requires a client certificate signed by the broker's
CA (Kafka's `ssl.client.auth=required`).

Certificates live in `DIR/tls/`, PEM files, private keys mode 0600 from the first byte:
- `ca.pem` is what clients trust (`ssl.ca.location`); `server.pem` / `server.key` the broker's
  certificate; `client.pem` / `client.key` statekit's own client certificate (for `--mtls`).
- With `ca.key` there (statekit made the CA, the first time `--tls` was used on DIR), statekit keeps
  the rest fresh at each start: a server certificate that is missing, not signed by that CA, within
  30 days of expiry or without one of the broker's names (127.0.0.1, localhost, the host it binds
  or advertises, this machine's names when it binds every address) is issued again, and so is the
  client certificate. Clients that trust `ca.pem` never notice.
- Without `ca.key` the files are the user's own (a certificate from their organisation's CA):
  statekit uses them as they are and says at start when the server certificate has expired or
  does not name the broker's address.

The handshake runs on the broker's event loop like every other read (asyncio's TLS transport:
a memory BIO, SSLWantRead/SSLWantWrite turned into waiting for the socket), so a slow or silent
TLS client costs its own connection only, and is dropped after HANDSHAKE_TIMEOUT_S.
"""
from __future__ import annotations

import datetime
import ipaddress
import os
import socket
import ssl
from dataclasses import dataclass

from .auth import write_private

TLS_DIR = "tls"
CA_CERT, CA_KEY = "ca.pem", "ca.key"
SERVER_CERT, SERVER_KEY = "server.pem", "server.key"
CLIENT_CERT, CLIENT_KEY = "client.pem", "client.key"
HANDSHAKE_TIMEOUT_S = 10.0
CA_DAYS = 3650
LEAF_DAYS = 365
RENEW_BEFORE = datetime.timedelta(days=30)
CLIENT_NAME = "statekit-client"
WILDCARD_HOSTS = ("", "0.0.0.0", "::")


class TlsError(Exception):
    """A one-line reason the broker cannot set up its TLS listener."""


def should_tls() -> bool:
    """Should `%statekit up` (and the App's embedded broker) listen with TLS? Only when
    STATEKIT_BROKER_TLS=1: the embedded broker listens on 127.0.0.1, where other users of a shared
    host cannot read the traffic (that takes root, who can read the credentials file anyway), and
    statekit's clients authenticate with SCRAM, which never sends the password."""
    return os.environ.get("STATEKIT_BROKER_TLS", "").strip().lower() in ("1", "true", "yes", "on")


def broker_names(host: str, advertised_host: str) -> list[str]:
    """The names a client may use to reach the broker: what its certificate must list."""
    names = ["127.0.0.1", "localhost"]
    for h in (host, advertised_host):
        if h and h not in WILDCARD_HOSTS:
            names.append(h)
    if host in WILDCARD_HOSTS:
        names += [socket.gethostname(), socket.getfqdn()]
    out: list[str] = []
    for n in names:
        n = n.strip().lower()
        if n and n not in out:
            out.append(n)
    return out


@dataclass(frozen=True)
class TlsFiles:
    """The PEM files of a broker directory's TLS listener (see the module docstring)."""

    dir: str

    def path(self, name: str) -> str:
        return os.path.join(self.dir, name)

    @property
    def ca(self) -> str:
        return self.path(CA_CERT)

    @property
    def managed(self) -> bool:
        """statekit holds the CA's key: it issues and renews the certificates itself."""
        return os.path.exists(self.path(CA_KEY))

    def client_settings(self, client_cert: bool) -> dict:
        """The ssl.* client settings (Kafka's names) that reach this listener."""
        out = {"ssl.ca.location": self.ca, "ssl.endpoint.identification.algorithm": "https"}
        if client_cert:
            out["ssl.certificate.location"] = self.path(CLIENT_CERT)
            out["ssl.key.location"] = self.path(CLIENT_KEY)
        return out


def ensure_files(data_dir: str, names: list[str]) -> TlsFiles:
    """DIR/tls with a CA, a server certificate for `names` and a client certificate: made or
    renewed when statekit manages them, checked when they are the user's. Raises TlsError."""
    files = TlsFiles(os.path.join(data_dir, TLS_DIR))
    try:
        os.makedirs(files.dir, mode=0o700, exist_ok=True)
        if not files.managed and not any(os.path.exists(files.path(n)) for n in (CA_CERT, SERVER_CERT, SERVER_KEY)):
            _new_ca(files)
        if files.managed:
            _renew(files, names)
    except OSError as e:
        raise TlsError(f"cannot write the TLS files in {files.dir} ({e.strerror}): pass a writable --dir") from None
    for n in (CA_CERT, SERVER_CERT, SERVER_KEY):
        if not os.path.exists(files.path(n)):
            raise TlsError(f"{files.path(n)} is missing: put your own {CA_CERT}, {SERVER_CERT} and {SERVER_KEY} "
                           f"there, or empty {files.dir} and statekit makes a CA and certificates")
    return files


def certificate_problem(files: TlsFiles, advertised_host: str) -> str | None:
    """Why clients will refuse the server certificate (expired, or not for the address the broker
    advertises), or None."""
    try:
        cert = _load_cert(files.path(SERVER_CERT))
    except (OSError, ValueError) as e:
        return f"cannot read {files.path(SERVER_CERT)} ({e})"
    now = datetime.datetime.now(datetime.timezone.utc)
    if cert.not_valid_after_utc <= now:
        return f"the server certificate {files.path(SERVER_CERT)} expired on {cert.not_valid_after_utc:%Y-%m-%d}"
    if cert.not_valid_before_utc > now:
        return f"the server certificate {files.path(SERVER_CERT)} is valid only from {cert.not_valid_before_utc:%Y-%m-%d}"
    if advertised_host.lower() not in _cert_names(cert):
        return (f"the server certificate {files.path(SERVER_CERT)} does not name {advertised_host}, the "
                f"address the broker advertises (it names {', '.join(_cert_names(cert)) or 'nothing'})")
    return None


def server_context(files: TlsFiles, require_client_cert: bool) -> ssl.SSLContext:
    """TLS 1.2 or newer with the broker's certificate; with `require_client_cert`, clients must
    show a certificate that `ca.pem` signed. Raises TlsError."""
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    try:
        ctx.load_cert_chain(files.path(SERVER_CERT), files.path(SERVER_KEY))
        if require_client_cert:
            ctx.verify_mode = ssl.CERT_REQUIRED
            ctx.load_verify_locations(files.ca)
    except (OSError, ssl.SSLError) as e:
        raise TlsError(f"cannot load the broker's TLS files in {files.dir} ({e}): the key must match "
                       f"{SERVER_CERT}; empty {files.dir} and statekit makes new ones") from None
    return ctx


# ---------------------------------------------------------------------------------------------
# one line for a handshake that failed
_PLAINTEXT = {"WRONG_VERSION_NUMBER", "HTTP_REQUEST", "HTTPS_PROXY_REQUEST", "UNKNOWN_PROTOCOL",
              "RECORD_LAYER_FAILURE", "PACKET_LENGTH_TOO_LONG", "UNSUPPORTED_PROTOCOL"}


@dataclass(frozen=True)
class TlsListener:
    """What `Broker` needs to serve TLS: the context, and how to explain a failed handshake."""

    context: ssl.SSLContext
    files: TlsFiles
    names: tuple
    require_client_cert: bool
    handshake_timeout: float = HANDSHAKE_TIMEOUT_S

    def explain(self, exc: BaseException) -> str | None:
        """One line saying why a client's handshake failed and what the client should change;
        None for a client that left without sending a byte (a port probe)."""
        reason = getattr(exc, "reason", None) or ""
        ca = self.files.ca
        if isinstance(exc, TimeoutError) or "taking longer" in str(exc):  # asyncio's handshake timeout
            return f"it did not finish the TLS handshake within {self.handshake_timeout:.0f} s"
        if reason in _PLAINTEXT:
            return ("it spoke plaintext to this TLS listener: the client needs security.protocol=SSL "
                    "(SASL_SSL with SASL) and ssl.ca.location=" + ca)
        if reason == "TLSV1_ALERT_UNKNOWN_CA":
            return f"the client does not trust the broker's certificate (unknown CA): give it ssl.ca.location={ca}"
        if reason == "SSLV3_ALERT_CERTIFICATE_EXPIRED":
            fix = ("restart the broker: it renews its certificate" if self.files.managed else
                   f"replace {self.files.path(SERVER_CERT)}")
            return f"the client refused the broker's certificate as expired: {fix}"
        if reason in ("SSLV3_ALERT_BAD_CERTIFICATE", "SSLV3_ALERT_CERTIFICATE_UNKNOWN"):
            return (f"the client refused the broker's certificate (most often: the host name it connects to "
                    f"is not one the certificate names, {', '.join(self.names)}): connect by one of those "
                    f"names, with ssl.ca.location={ca}")
        if reason == "PEER_DID_NOT_RETURN_A_CERTIFICATE":
            return (f"it sent no client certificate and this broker requires one (--mtls): give the client "
                    f"ssl.certificate.location and ssl.key.location (statekit's: "
                    f"{self.files.path(CLIENT_CERT)}, {self.files.path(CLIENT_KEY)})")
        if reason == "CERTIFICATE_VERIFY_FAILED":
            why = getattr(exc, "verify_message", "") or "not verified"
            return f"its client certificate was refused ({why}): it must be signed by {ca}"
        if isinstance(exc, ssl.SSLError):
            return f"the TLS handshake failed ({reason or exc})"
        if isinstance(exc, (ConnectionError, EOFError)) or "Connection lost" in str(exc):
            return None  # closed before or during the handshake without a word: a port probe
        return f"the TLS handshake failed ({type(exc).__name__}: {exc})"


def listener(files: TlsFiles, names: list[str], require_client_cert: bool) -> TlsListener:
    return TlsListener(server_context(files, require_client_cert), files, tuple(names), require_client_cert)


# ---------------------------------------------------------------------------------------------
# certificates (the `cryptography` package)
def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.timezone.utc)


def _load_cert(path: str):
    from cryptography import x509

    with open(path, "rb") as f:
        return x509.load_pem_x509_certificate(f.read())


def _load_key(path: str):
    from cryptography.hazmat.primitives import serialization

    with open(path, "rb") as f:
        return serialization.load_pem_private_key(f.read(), password=None)


def _cert_names(cert) -> list[str]:
    from cryptography import x509

    try:
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound:
        return []
    return [n.lower() for n in san.get_values_for_type(x509.DNSName)] + \
        [str(a) for a in san.get_values_for_type(x509.IPAddress)]


def _write_key(path: str, key) -> None:
    from cryptography.hazmat.primitives import serialization

    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption())
    write_private(path, pem.decode())


def _write_cert(path: str, cert) -> None:
    from cryptography.hazmat.primitives import serialization

    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    os.replace(tmp, path)


def _new_key():
    from cryptography.hazmat.primitives.asymmetric import ec

    return ec.generate_private_key(ec.SECP256R1())


def _new_ca(files: TlsFiles) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import NameOID

    key = _new_key()
    name = x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "statekit"),
                      x509.NameAttribute(NameOID.COMMON_NAME, f"statekit broker CA ({socket.gethostname()})")])
    now = _now()
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=CA_DAYS))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False,
                                         data_encipherment=False, key_agreement=False,
                                         encipher_only=False, decipher_only=False), critical=True)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .sign(key, hashes.SHA256()))
    _write_key(files.path(CA_KEY), key)  # the key first: a CA certificate without it is not ours
    _write_cert(files.path(CA_CERT), cert)
    for n in (SERVER_CERT, SERVER_KEY, CLIENT_CERT, CLIENT_KEY):
        try:
            os.unlink(files.path(n))
        except FileNotFoundError:
            pass


def _fresh(path: str, ca_cert, names: list[str] | None) -> bool:
    """A certificate ca_cert signed, valid for RENEW_BEFORE more at least, naming `names`."""
    try:
        cert = _load_cert(path)
        cert.verify_directly_issued_by(ca_cert)
    except Exception:  # noqa: BLE001 - unreadable, or a signature that does not verify: issue again
        return False
    if cert.not_valid_after_utc - RENEW_BEFORE < _now() or cert.not_valid_before_utc > _now():
        return False
    return names is None or set(names) <= set(_cert_names(cert))


def _renew(files: TlsFiles, names: list[str]) -> None:
    ca_cert = _load_cert(files.ca)
    ca_key = _load_key(files.path(CA_KEY))
    if ca_cert.not_valid_after_utc - RENEW_BEFORE < _now():
        _new_ca(files)  # clients must be given the new ca.pem: a ten-year CA rarely gets here
        ca_cert, ca_key = _load_cert(files.ca), _load_key(files.path(CA_KEY))
    if not (_fresh(files.path(SERVER_CERT), ca_cert, names) and os.path.exists(files.path(SERVER_KEY))):
        _issue(files, SERVER_CERT, SERVER_KEY, ca_cert, ca_key, names, server=True)
    if not (_fresh(files.path(CLIENT_CERT), ca_cert, None) and os.path.exists(files.path(CLIENT_KEY))):
        _issue(files, CLIENT_CERT, CLIENT_KEY, ca_cert, ca_key, [CLIENT_NAME], server=False)


def _issue(files: TlsFiles, cert_name: str, key_name: str, ca_cert, ca_key, names: list[str], server: bool) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    key = _new_key()
    alt = []
    for n in names:
        try:
            alt.append(x509.IPAddress(ipaddress.ip_address(n)))
        except ValueError:
            alt.append(x509.DNSName(n))
    now = _now()
    ski = ca_cert.extensions.get_extension_for_class(x509.SubjectKeyIdentifier).value
    cert = (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.ORGANIZATION_NAME, "statekit"),
                                     x509.NameAttribute(NameOID.COMMON_NAME, names[0])]))
            .issuer_name(ca_cert.subject).public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=LEAF_DAYS))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_encipherment=False, key_cert_sign=False,
                                         crl_sign=False, content_commitment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False),
                           critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH if server
                                                  else ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False)
            .add_extension(x509.SubjectAlternativeName(alt), critical=False)
            .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_subject_key_identifier(ski), critical=False)
            .sign(ca_key, hashes.SHA256()))
    _write_key(files.path(key_name), key)
    _write_cert(files.path(cert_name), cert)
