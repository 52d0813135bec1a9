"""Why a connection to Kafka failed around TLS, in one line that names the setting to change.

A TLS failure shows up in two places: the handshake (the broker's certificate refused here: an
untrusted CA, an expired certificate, a host name it does not list; or a broker that does not
speak TLS on that port), and the first answer that never comes (a plaintext client at a TLS
listener, or a broker that wants a client certificate: with TLS 1.3 it says so only after the
client thinks the handshake is done)."""
from __future__ import annotations

import socket
import ssl

from .config import Security
from .errors import KafkaError

__all__ = ["handshake_failed", "closed_before_answer", "looks_like_tls"]

_CA_HINT = ("set ssl.ca.location to the CA that signed it (statekit's broker: DIR/tls/ca.pem, named in "
            "DIR/client.properties)")
# OpenSSL's X509_V_ERR codes
_UNTRUSTED = {2, 18, 19, 20, 21, 27}
_EXPIRED, _NOT_YET_VALID = 10, 9
_HOST_MISMATCH = {62, 64}


def handshake_failed(exc: BaseException, addr: str, host: str) -> KafkaError:
    """The error for a TLS handshake with ``addr`` (dialled as ``host``) that raised ``exc``."""
    if isinstance(exc, ssl.SSLCertVerificationError):
        code = getattr(exc, "verify_code", None)
        why = getattr(exc, "verify_message", "") or str(exc)
        if code in _UNTRUSTED:
            msg = f"the certificate of Kafka at {addr} is not signed by a CA this client trusts ({why}): {_CA_HINT}"
        elif code == _EXPIRED:
            msg = (f"Kafka at {addr} presented an expired certificate: the broker must renew it (statekit's "
                   f"broker renews its own when it starts); or this machine's clock is wrong")
        elif code == _NOT_YET_VALID:
            msg = f"Kafka at {addr} presented a certificate that is not valid yet: check this machine's clock"
        elif code in _HOST_MISMATCH:
            msg = (f"the certificate of Kafka at {addr} is not valid for {host!r}: connect by a name the "
                   f"certificate lists, or set ssl.endpoint.identification.algorithm= (empty) to skip the "
                   f"host name check")
        else:
            msg = f"the certificate of Kafka at {addr} was refused ({why}): check ssl.ca.location"
        return KafkaError(msg)
    reason = getattr(exc, "reason", None)
    if isinstance(exc, socket.timeout):
        return KafkaError(f"Kafka at {addr} did not finish the TLS handshake in time: it may not speak TLS on this "
                          f"port (then set security.protocol=PLAINTEXT, SASL_PLAINTEXT with SASL), or it is "
                          f"overloaded")
    if isinstance(exc, (ConnectionError, ssl.SSLEOFError)) or reason == "UNEXPECTED_EOF_WHILE_READING":
        return KafkaError(f"Kafka at {addr} broke off the TLS handshake ({reason or exc}): it may not speak TLS "
                          f"on this port: set security.protocol=PLAINTEXT (SASL_PLAINTEXT with SASL), or see "
                          f"the broker's log")
    if reason and "CERTIFICATE_REQUIRED" in reason:
        return KafkaError(f"Kafka at {addr} requires a client certificate: set ssl.certificate.location "
                          f"and ssl.key.location")
    if reason and ("UNKNOWN_CA" in reason or "BAD_CERTIFICATE" in reason):
        return KafkaError(f"Kafka at {addr} refused this client's certificate ({reason}): it must be signed "
                          f"by a CA the broker trusts (ssl.certificate.location, ssl.key.location)")
    return KafkaError(f"the TLS handshake with Kafka at {addr} failed ({reason or exc}): check "
                      f"security.protocol and the ssl.* settings")


def closed_before_answer(addr: str, security: Security | None, exc: BaseException | None = None,
                         tls_answer: bool = False) -> str:
    """The message for a new connection that ended before the broker's first answer (or whose
    first answer was TLS, ``tls_answer``, to a plaintext request)."""
    reason = getattr(exc, "reason", None) or ""
    if security is None or security.ssl_context is None:
        what = "answered in TLS" if tls_answer else "closed the connection before answering: if it listens with TLS"
        return (f"Kafka at {addr} {what}, set security.protocol=SSL (SASL_SSL with SASL) and ssl.ca.location"
                f"{'' if tls_answer else '; otherwise see the broker log'}")
    if "CERTIFICATE_REQUIRED" in reason or not security.client_cert:
        return (f"Kafka at {addr} closed the connection after the TLS handshake: if it requires client "
                f"certificates (ssl.client.auth=required), set ssl.certificate.location and ssl.key.location")
    return (f"Kafka at {addr} closed the connection after the TLS handshake{f' ({reason})' if reason else ''}: "
            f"it may not trust this client's certificate ({security.client_cert}): it must be signed by a "
            f"CA the broker trusts")


def looks_like_tls(data: bytes) -> bool:
    """The first bytes of an answer are a TLS record (an alert or a handshake), not a Kafka frame."""
    return len(data) >= 2 and data[0] in (0x15, 0x16) and data[1] == 0x03
