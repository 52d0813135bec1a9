"""One broker connection: a socket (TLS when configured), kafka-python's protocol framing and
correlation (``kafka.protocol.parser.KafkaProtocol``), API version negotiation and SASL
authentication. Requests may be pipelined: :meth:`Connection.send` returns a correlation id and
:meth:`Connection.recv` claims that answer, keeping others that arrive first for their callers.

Negotiation is what real clients do: ApiVersions v3 first; a broker that does not know v3 answers
UNSUPPORTED_VERSION in v0 framing (as Kafka does), and the connection is made again and asks v0 (a
broker that closes instead is not asked again: a TLS listener does so, and a broker without
ApiVersions at all is older than statekit can use). Every request then goes out at the highest version both sides have
(:meth:`Connection.version`, over the table of :mod:`statekit.kafka.versions`); an API the broker
does not offer is refused before anything is sent (:class:`~statekit.kafka.errors.UnsupportedApi`)."""
from __future__ import annotations

import logging
import select
import socket
import ssl
import struct

from kafka.errors import KafkaError as _KafkaPythonError
from kafka.protocol.metadata import ApiVersionsRequest
from kafka.protocol.parser import KafkaProtocol
from kafka.protocol.sasl import SaslAuthenticateRequest, SaslHandshakeRequest

from .config import Security
from .errors import HINT as _HINT, BrokerUnreachable, KafkaError, KafkaUnavailable, UnsupportedApi
from .response_classes import pin_response_classes
from .tls_errors import closed_before_answer, handshake_failed, looks_like_tls
from .versions import SPOKEN, api_name

_UNSUPPORTED_VERSION = 35


def _not_the_fallback(record: logging.LogRecord) -> bool:
    """kafka-python logs an error when it cannot decode an answer; the v0-framed answer of a broker
    that does not know ApiVersions v3 is expected, and handled (see the module docstring)."""
    msg = record.getMessage()
    return not ("ApiVersionsResponse" in msg and "Unable to decode" in msg)


logging.getLogger("kafka.protocol.parser").addFilter(_not_the_fallback)

# what kafka-python raises for bytes it cannot read as the answer it waits for
_UNREADABLE = (_KafkaPythonError, ValueError, struct.error, EOFError)


__all__ = ["Connection"]


class Connection:
    def __init__(self, host: str, port: int, timeout: float, client_id: str,
                 security: Security | None = None, *, api_versions: int = 3, authenticate: bool = True):
        """``api_versions``: the ApiVersions version asked first (3; 0 on the connection made again
        for a broker that refused 3). ``authenticate``: SASL when ``security`` has a mechanism."""
        self.addr = f"{host}:{port}"
        self.timeout = timeout
        try:
            self.sock = socket.create_connection((host, port), timeout=timeout)
        except OSError as e:
            raise KafkaUnavailable(f"cannot reach Kafka at {self.addr}: {_HINT} ({e.strerror or e})")
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
                if isinstance(e, socket.timeout):   # a broker that stopped answering: retry
                    raise KafkaUnavailable(str(handshake_failed(e, self.addr, host))) from None
                raise handshake_failed(e, self.addr, host) from None
        self.security = security
        self.answered = False  # a first answer came: a close from now on is not about TLS settings
        self.proto = KafkaProtocol(client_id=client_id, receive_message_max_bytes=256 << 20)
        self.ready: dict = {}  # correlation id -> decoded response not yet claimed
        self.versions: dict[int, tuple[int, int]] = {}
        self.features: set[str] = set()
        self.sasl = security is not None and security.mechanism is not None
        if not self._negotiate(api_versions):
            # the broker refused ApiVersions v3 (UNSUPPORTED_VERSION, in v0 framing): what is left
            # on this socket cannot be trusted, so ask v0 on a new connection and carry on with it
            self.close()
            again = Connection(host, port, timeout, client_id, security, api_versions=0,
                               authenticate=False)
            vars(self).update(vars(again))
        if self.sasl and authenticate:
            self._authenticate(security)

    def _negotiate(self, version: int) -> bool:
        """Ask the broker for its API versions. False when it answered ``version`` > 0 with
        UNSUPPORTED_VERSION (the caller asks v0 on a new connection); any other failure raises, in
        one line."""
        if version >= 3:
            req = ApiVersionsRequest(version=version, client_software_name="statekit",
                                     client_software_version="1")
        else:
            req = ApiVersionsRequest(version=version)
        try:
            resp = self.request(req)
        except BrokerUnreachable:
            raise  # no answer at all: asking again would not help (a TLS mismatch, a dead port)
        except _UNREADABLE as e:  # kafka-python could not decode the answer
            self.close()
            if version == 0:
                raise KafkaError(f"the broker at {self.addr} answered ApiVersions v0 with bytes "
                                 f"statekit cannot read ({e}): is it a Kafka broker?") from None
            return False  # a v0-framed UNSUPPORTED_VERSION read as v{version}
        if resp.error_code == _UNSUPPORTED_VERSION and version > 0:
            self.close()
            return False
        if resp.error_code:
            self.close()
            raise KafkaError(f"the broker at {self.addr} refused ApiVersions v{version} "
                             f"(error code {resp.error_code}): is it a Kafka broker?")
        for k in resp.api_keys:
            self.versions[k.api_key] = (k.min_version, k.max_version)
        for f in getattr(resp, "supported_features", None) or []:
            self.features.add(f.name)
        return True

    def _authenticate(self, security: Security) -> None:
        """SaslHandshake v1 + SaslAuthenticate, with kafka-python's SASL mechanisms."""
        from kafka.net.sasl import get_sasl_mechanism

        try:
            hv = self.version(SaslHandshakeRequest)
            v = self.version(SaslAuthenticateRequest)
        except UnsupportedApi:
            self.close()
            raise
        resp = self.request(SaslHandshakeRequest(version=hv, mechanism=security.mechanism))
        if resp.error_code:
            self.close()
            raise KafkaError(f"the broker at {self.addr} does not accept SASL mechanism {security.mechanism} "
                             f"(it offers {', '.join(resp.mechanisms or []) or 'none'}): set sasl.mechanism")
        mech = get_sasl_mechanism(security.mechanism)(
            host=self.addr.rsplit(":", 1)[0], sasl_mechanism=security.mechanism,
            sasl_plain_username=security.username, sasl_plain_password=security.password)
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

    def offers(self, cls, lo: int | None = None) -> bool:
        """Does the broker offer this API at a version statekit speaks (at least ``lo``)?"""
        try:
            self.version(cls, lo)
        except UnsupportedApi:
            return False
        return True

    def version(self, cls, lo: int | None = None, hi: int | None = None, todo: str | None = None) -> int:
        """The highest version of ``cls``'s API that both statekit (``lo``..``hi``, by default the
        range of :data:`statekit.kafka.versions.SPOKEN`) and the broker speak. Raises
        :class:`UnsupportedApi` (one line: the API, the broker, ``todo`` or the table's advice)
        when there is none; nothing is sent."""
        api = SPOKEN[cls.API_KEY]
        lo = api.lo if lo is None else lo
        hi = min(api.hi if hi is None else hi, cls.max_version)
        name = api_name(cls)
        todo = todo or api.without
        rng = self.versions.get(cls.API_KEY)
        if rng is None:
            raise UnsupportedApi(f"the broker at {self.addr} does not offer {name}: {todo}", name, self.addr)
        v = min(hi, rng[1])
        if v < max(lo, rng[0]):
            raise UnsupportedApi(f"the broker at {self.addr} offers {name} v{rng[0]}-{rng[1]}, statekit "
                                 f"speaks v{lo}-{hi}: {todo}", name, self.addr)
        return v

    def send(self, req) -> int:
        """Queue and write one request; returns its correlation id (for :meth:`recv`)."""
        cid = self.proto.send_request(req)
        data = self.proto.send_bytes()
        try:
            self.sock.sendall(data)
        except OSError as e:
            self.close()
            raise KafkaUnavailable(f"lost the connection to Kafka at {self.addr}: {e}; {_HINT}")
        return cid

    def recv(self, cid: int):
        """The response to request ``cid`` (others that arrive first are kept for their callers,
        so a pipelined Fetch and an interleaved ListOffsets on one connection do not mix up)."""
        while cid not in self.ready:
            try:
                data = self.sock.recv(4 << 20)
            except socket.timeout:
                self.close()
                raise KafkaUnavailable(f"Kafka at {self.addr} did not answer within "
                                        f"{self.timeout:.0f}s; is the broker alive? ({_HINT})")
            except OSError as e:
                self.close()
                if not self.answered:   # (a TLS hint; still a broker that is away, worth retrying)
                    raise KafkaUnavailable(closed_before_answer(self.addr, self.security, e)) from None
                raise KafkaUnavailable(f"lost the connection to Kafka at {self.addr}: {e}")
            if not data or (not self.answered and looks_like_tls(data)):
                self.close()
                if data:   # a TLS answer to a plaintext request: a setting to change, not an outage
                    raise BrokerUnreachable(closed_before_answer(self.addr, self.security, tls_answer=True))
                if not self.answered:
                    raise KafkaUnavailable(closed_before_answer(self.addr, self.security))
                raise KafkaUnavailable(f"Kafka at {self.addr} closed the connection; {_HINT}")
            try:
                answers = self.proto.receive_bytes(data)
            except _UNREADABLE:
                raise
            except Exception as e:  # noqa: BLE001 - not about the bytes: this connection is lost
                self.close()
                if isinstance(e, ReferenceError):
                    pin_response_classes()
                raise KafkaUnavailable(f"lost the connection to Kafka at {self.addr} while reading "
                                       f"its answer ({type(e).__name__}: {e})") from None
            for rcid, resp in answers:
                self.ready[rcid] = resp
                self.answered = True
        return self.ready.pop(cid)

    def request(self, req):
        return self.recv(self.send(req))

    def usable(self) -> bool:
        """Still open at both ends? A broker that restarted (or a proxy that dropped it) closed
        this connection while it sat idle: a request on it would fail where a new connection
        succeeds (Kafka's clients reconnect the same way). An EOF waiting to be read says so, and
        closes it; an answer waiting (a pipelined Fetch) does not."""
        if self.sock.fileno() < 0:
            return False
        if isinstance(self.sock, ssl.SSLSocket):
            return True
        try:
            if not select.select([self.sock], [], [], 0)[0] or self.sock.recv(1, socket.MSG_PEEK):
                return True
        except (OSError, ValueError):
            pass
        self.close()
        return False

    def shutdown(self):
        """Wake a thread blocked on this connection (its read sees the end of the stream)."""
        try:
            self.sock.shutdown(socket.SHUT_RDWR)
        except (OSError, ValueError):
            pass

    def close(self):
        try:
            self.sock.close()
        except OSError:
            pass


