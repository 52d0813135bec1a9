"""One broker connection: a socket (TLS when configured), kafka-python's protocol framing and
correlation (``kafka.protocol.parser.KafkaProtocol``), API version negotiation and SASL
authentication. Requests may be pipelined: :meth:`Connection.send` returns a correlation id and
:meth:`Connection.recv` claims that answer, keeping others that arrive first for their callers."""
from __future__ import annotations

import socket
import ssl

from kafka.protocol.metadata import ApiVersionsRequest
from kafka.protocol.parser import KafkaProtocol
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest

from .config import Security
from .errors import HINT as _HINT, BrokerUnreachable, KafkaError
from .tls_errors import closed_before_answer, handshake_failed, looks_like_tls

__all__ = ["Connection"]


class Connection:
    def __init__(self, host: str, port: int, timeout: float, client_id: str,
                 security: Security | None = None):
        self.addr = f"{host}:{port}"
        self.timeout = timeout
        try:
            self.sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as e:
            raise BrokerUnreachable(f"cannot reach Kafka at {self.addr}: {_HINT} ({e.strerror or e})")
        self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        try:
            self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        except OSError:
            pass
        if security is not None and security.ssl_context is not None:
            try:
                self.sock = security.ssl_context.wrap_socket(self.sock, server_hostname=host)
            except (ssl.SSLError, OSError) as e:
                self.close()
                raise handshake_failed(e, self.addr, host) from None
        self.security = security
        self.answered = False  # a first answer came: a close from now on is not about TLS settings
        self.proto = KafkaProtocol(client_id=client_id, receive_message_max_bytes=256 << 20)
        self.ready: dict = {}  # correlation id -> decoded response not yet claimed
        self.versions: dict[int, tuple[int, int]] = {}
        self.features: set[str] = set()
        self.sasl = security is not None and security.mechanism is not None
        self._negotiate()
        if self.sasl:
            self._authenticate(security)

    def _negotiate(self):
        try:
            resp = self.request(ApiVersionsRequest(version=3, client_software_name="statekit",
                                                   client_software_version="1"))
            if resp.error_code:
                raise ValueError("ApiVersions v3 refused")
        except BrokerUnreachable:
            raise
        except Exception:  # noqa: BLE001 - an older broker: ask in v0, else assume the lowest versions
            try:
                resp = self.request(ApiVersionsRequest(version=0))
            except BrokerUnreachable:
                raise
            except Exception:  # noqa: BLE001
                return
        for k in resp.api_keys:
            self.versions[k.api_key] = (k.min_version, k.max_version)
        for f in getattr(resp, "supported_features", None) or []:
            self.features.add(f.name)

    def _authenticate(self, security: Security) -> None:
        """SaslHandshake v1 + SaslAuthenticate, with kafka-python's SASL mechanisms."""
        from kafka.net.sasl import get_sasl_mechanism

        if SaslAuthenticateRequest.API_KEY not in self.versions:
            self.close()
            raise KafkaError(f"the broker at {self.addr} does not offer SASL authentication: check "
                             f"security.protocol (it may want PLAINTEXT or SSL)")
        resp = self.request(SaslHandshakeRequest(version=1, mechanism=security.mechanism))
        if resp.error_code:
            self.close()
            raise KafkaError(f"the broker at {self.addr} does not accept SASL mechanism {security.mechanism} "
                             f"(it offers {', '.join(resp.mechanisms or []) or 'none'}): set sasl.mechanism")
        mech = get_sasl_mechanism(security.mechanism)(
            host=self.addr.rsplit(":", 1)[0], sasl_mechanism=security.mechanism,
            sasl_plain_username=security.username, sasl_plain_password=security.password)
        v = self.version(SaslAuthenticateRequest, 0, 1)
        while not mech.is_done():
            resp = self.request(SaslAuthenticateRequest(version=v, auth_bytes=mech.auth_bytes()))
            if resp.error_code:
                self.close()
                raise KafkaError(f"the broker at {self.addr} refused the SASL credentials of "
                                 f"{security.username!r} ({resp.error_message or 'SASL_AUTHENTICATION_FAILED'}): "
                                 f"check sasl.username and sasl.password")
            try:
                mech.receive(resp.auth_bytes)
            except Exception as e:  # noqa: BLE001 - e.g. a SCRAM server signature that does not verify
                self.close()
                raise KafkaError(f"SASL {security.mechanism} with {self.addr} failed: {e}") from None
        if not mech.is_authenticated():
            self.close()
            raise KafkaError(f"SASL {security.mechanism} with {self.addr} did not authenticate "
                             f"{security.username!r}: check the credentials")

    def version(self, cls, lo: int, hi: int) -> int:
        rng = self.versions.get(cls.API_KEY)
        if rng is None:
            return lo
        v = min(hi, rng[1], cls.max_version)
        if v < max(lo, rng[0]):
            raise KafkaError(f"the broker at {self.addr} supports {cls.__name__} "
                             f"v{rng[0]}-{rng[1]}; statekit needs v{lo}-{hi}")
        return v

    def send(self, req) -> int:
        """Queue and write one request; returns its correlation id (for :meth:`recv`)."""
        cid = self.proto.send_request(req)
        data = self.proto.send_bytes()
        try:
            self.sock.sendall(data)
        except OSError as e:
            self.close()
            raise BrokerUnreachable(f"lost the connection to Kafka at {self.addr}: {e}; {_HINT}")
        return cid

    def recv(self, cid: int):
        """The response to request ``cid`` (others that arrive first are kept for their callers,
        so a pipelined Fetch and an interleaved ListOffsets on one connection do not mix up)."""
        while cid not in self.ready:
            try:
                data = self.sock.recv(4 << 20)
            except socket.timeout:
                self.close()
                raise BrokerUnreachable(f"Kafka at {self.addr} did not answer within "
                                        f"{self.timeout:.0f}s; is the broker alive? ({_HINT})")
            except OSError as e:
                self.close()
                if not self.answered:
                    raise BrokerUnreachable(closed_before_answer(self.addr, self.security, e)) from None
                raise BrokerUnreachable(f"lost the connection to Kafka at {self.addr}: {e}")
            if not data or (not self.answered and looks_like_tls(data)):
                self.close()
                if not self.answered:
                    raise BrokerUnreachable(closed_before_answer(self.addr, self.security, tls_answer=bool(data)))
                raise BrokerUnreachable(f"Kafka at {self.addr} closed the connection; {_HINT}")
            for rcid, resp in self.proto.receive_bytes(data):
                self.ready[rcid] = resp
                self.answered = True
        return self.ready.pop(cid)

    def request(self, req):
        return self.recv(self.send(req))

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


