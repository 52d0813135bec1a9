"""The REST API of Confluent's Schema Registry over HTTP/1.1, on the standard library's threading
HTTP server (one thread per connection; the store takes one lock per request, so requests are
answered as if one at a time).

What a client sees: JSON answers with the content type ``application/vnd.schemaregistry.v1+json``;
request bodies accepted as ``application/vnd.schemaregistry.v1+json``,
``application/vnd.schemaregistry+json``, ``application/json`` or ``application/octet-stream`` (no
content type counts as the last), anything else 415; an ``Accept`` that allows none of them 406;
malformed JSON 400; an unknown path 404 and a known path with the wrong method 405, each with
``{"error_code", "message"}`` as Confluent answers. Query flags take ``true``/``false`` in any case
(confluent-kafka sends ``normalize=False``). With ``users``, every request needs HTTP basic auth.

Paths: ``/subjects[...]``, ``/schemas[...]``, ``/config[/S]``, ``/compatibility/subjects/S/versions[/V]``,
``/mode[/S]`` (always READWRITE), ``/contexts``, ``/`` (see docs/ARCHITECTURE.md for the list)."""
from __future__ import annotations

import base64
import hmac
import json
import logging
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlsplit

from . import errors as E
from .formats import TYPES
from .store import SchemaStore

log = logging.getLogger("statekit.registry")

CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"
_BODY_TYPES = ("application/vnd.schemaregistry.v1+json", "application/vnd.schemaregistry+json",
               "application/json", "application/octet-stream")
MAX_BODY = 16 << 20


class Raw(str):
    """An answer sent as it is (``/schema`` endpoints return the schema text, not a JSON string)."""


def _flag(query: dict, *names: str) -> bool:
    for name in names:
        if name in query:
            return query[name][-1].strip().lower() in ("true", "1", "yes")
    return False


def _arg(query: dict, name: str, default=None):
    return query[name][-1] if name in query else default


def _page(items: list, query: dict) -> list:
    """Confluent's offset/limit paging (limit -1 or absent: everything)."""
    try:
        offset = max(0, int(_arg(query, "offset", 0)))
        limit = int(_arg(query, "limit", -1))
    except ValueError:
        raise E.RestError(400, 400, "offset and limit must be integers") from None
    return items[offset:] if limit < 0 else items[offset:offset + limit]


def route(store: SchemaStore, method: str, parts: list[str], query: dict, body):
    """(status, answer) for one request; ``body()`` reads and parses the request's JSON."""
    n = len(parts)
    if n == 0:
        return _only(method, "GET") or {}
    head = parts[0]
    if head == "subjects":
        return _subjects(store, method, parts, query, body)
    if head == "schemas":
        if n == 1:
            _only(method, "GET")
            return _page(store.list_schemas(_arg(query, "subjectPrefix", ""), _flag(query, "deleted"),
                                            _flag(query, "latestOnly")), query)
        if parts[1:] == ["types"]:
            _only(method, "GET")
            return list(TYPES)
        if n >= 3 and parts[1] == "ids" and n <= 4:
            _only(method, "GET")
            sid = parts[2]
            if n == 3:
                return store.get_schema(sid)
            if parts[3] == "schema":
                return Raw(store.get_schema(sid)["schema"])
            if parts[3] == "subjects":
                return _page(store.schema_subjects(sid, _flag(query, "deleted")), query)
            if parts[3] == "versions":
                return _page(store.schema_versions(sid, _flag(query, "deleted")), query)
        raise E.not_found_url()
    if head == "config" and n <= 2:
        subject = parts[1] if n == 2 else None
        if method == "GET":
            return store.get_config(subject, _flag(query, "defaultToGlobal"))
        if method == "PUT":
            return store.set_config(subject, body())
        if method == "DELETE":
            return store.delete_config(subject)
        raise E.method_not_allowed()
    if head == "compatibility" and n in (4, 5) and parts[1] == "subjects" and parts[3] == "versions":
        _only(method, "POST")
        return store.test_compatibility(parts[2], parts[4] if n == 5 else None, body(),
                                        _flag(query, "verbose"), _flag(query, "normalize"))
    if head == "mode" and n <= 2:
        return _mode(method, parts[1] if n == 2 else None, body)
    if head == "contexts" and n == 1:
        _only(method, "GET")
        return ["."]
    raise E.not_found_url()


def _only(method: str, allowed: str):
    if method != allowed:
        raise E.method_not_allowed()
    return None


def _subjects(store: SchemaStore, method: str, parts: list[str], query: dict, body):
    n = len(parts)
    if n == 1:
        _only(method, "GET")
        prefix = _arg(query, "subjectPrefix", _arg(query, "subject", ""))
        return _page(store.list_subjects(prefix, _flag(query, "deleted"), _flag(query, "deletedOnly", "deleted_only")),
                     query)
    subject = parts[1]
    if n == 2:
        if method == "POST":
            return store.lookup(subject, body(), _flag(query, "normalize"), _flag(query, "deleted"))
        if method == "DELETE":
            return store.delete_subject(subject, _flag(query, "permanent"))
        raise E.method_not_allowed()
    if parts[2] != "versions" or n > 5:
        raise E.not_found_url()
    if n == 3:
        if method == "GET":
            return _page(store.list_versions(subject, _flag(query, "deleted"),
                                             _flag(query, "deletedOnly", "deleted_only")), query)
        if method == "POST":
            return store.register(subject, body(), _flag(query, "normalize"))
        raise E.method_not_allowed()
    version = parts[3]
    if n == 4:
        if method == "GET":
            return store.get_version(subject, version, _flag(query, "deleted"))
        if method == "DELETE":
            return store.delete_version(subject, version, _flag(query, "permanent"))
        raise E.method_not_allowed()
    _only(method, "GET")
    if parts[4] == "schema":
        return Raw(store.get_version(subject, version, _flag(query, "deleted"))["schema"])
    if parts[4] == "referencedby":
        return store.referenced_by(subject, version)
    raise E.not_found_url()


def _mode(method: str, subject: str | None, body):
    if method == "GET":
        if subject is not None:
            raise E.subject_level_mode_not_configured(subject)
        return {"mode": "READWRITE"}
    if method == "PUT":
        req = body()
        mode = req.get("mode") if isinstance(req, dict) else None
        if not isinstance(mode, str) or mode.upper() != "READWRITE":
            raise E.invalid_mode(mode)
        return {"mode": "READWRITE"}
    if method == "DELETE" and subject is not None:
        raise E.subject_level_mode_not_configured(subject)
    raise E.method_not_allowed()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = "statekit-registry"
    timeout = 300  # an idle kept-alive connection's thread ends after this

    def log_message(self, fmt, *args):  # the access log is noise in registry.log
        log.debug("%s " + fmt, self.address_string(), *args)

    def _send(self, status: int, payload, headers=()) -> None:
        data = (payload if isinstance(payload, Raw) else json.dumps(payload, ensure_ascii=False)).encode()
        self.send_response(status)
        self.send_header("Content-Type", CONTENT_TYPE)
        self.send_header("Content-Length", str(len(data)))
        for k, v in headers:
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _authorized(self) -> bool:
        users = self.server.users
        if not users:
            return True
        auth = self.headers.get("Authorization", "")
        if not auth.lower().startswith("basic "):
            return False
        try:
            user, _, password = base64.b64decode(auth[6:].strip()).decode().partition(":")
        except (ValueError, UnicodeDecodeError):
            return False
        want = users.get(user)
        return want is not None and hmac.compare_digest(want.encode(), password.encode())

    def _length(self) -> int:
        try:
            return max(0, int(self.headers.get("Content-Length") or 0))
        except ValueError:
            self.close_connection = True
            raise E.bad_request("Content-Length is not a number") from None

    def _body(self):
        length = self._length()
        if length > MAX_BODY:
            raise E.RestError(413, 413, f"The request body is larger than {MAX_BODY >> 20} MiB")
        raw = self.rfile.read(length) if length > 0 else b""
        self._read = True
        ctype = (self.headers.get("Content-Type") or "application/octet-stream").split(";")[0].strip().lower()
        if ctype not in _BODY_TYPES:
            raise E.unsupported_media_type()
        try:
            return json.loads(raw.decode("utf-8")) if raw.strip() else None
        except (ValueError, UnicodeDecodeError) as e:
            raise E.bad_request(f"Malformed JSON in the request body: {e}") from None

    def _handle(self) -> None:
        self._read = False
        try:
            if not self._authorized():
                self._drain()
                self._send(401, {"error_code": 401, "message": "Unauthorized"},
                           [("WWW-Authenticate", 'Basic realm="statekit-registry"')])
                return
            accept = self.headers.get("Accept")
            if accept and not any(t in accept for t in _BODY_TYPES[:3] + ("*/*", "application/*")):
                raise E.not_acceptable()
            url = urlsplit(self.path)
            parts = [unquote(p) for p in url.path.split("/") if p]
            query = parse_qs(url.query, keep_blank_values=True)
            answer = route(self.server.store, self.command, parts, query, self._body)
            self._drain()
            self._send(200, answer)
        except E.RestError as e:
            self._drain()
            self._send(e.status, e.body())
        except Exception as e:  # a bug, not the client's fault: say so, keep serving
            log.exception("error answering %s %s", self.command, self.path)
            self._drain()
            self._send(500, {"error_code": 50001, "message": f"Internal error: {type(e).__name__}: {e}"})

    def _drain(self) -> None:
        """Read a body the route did not need, so the next request on the connection starts clean."""
        if not self._read:
            self._read = True
            try:
                length = self._length()
            except E.RestError:
                return
            if 0 < length <= MAX_BODY:
                self.rfile.read(length)
            elif length > MAX_BODY:
                self.close_connection = True

    do_GET = do_POST = do_PUT = do_DELETE = _handle


class RegistryServer(ThreadingHTTPServer):
    """With ``ssl_context`` it serves HTTPS: each accepted connection is wrapped and its handshake
    runs in that connection's own thread, bounded by ``HANDSHAKE_TIMEOUT_S`` (a slow or silent
    client holds its own thread, never the accept loop); a failed handshake is one log line."""

    daemon_threads = True
    HANDSHAKE_TIMEOUT_S = 10.0

    def __init__(self, store: SchemaStore, host: str, port: int, users: dict | None = None,
                 ssl_context=None):
        self.store, self.users = store, users or {}
        self.ssl_context = ssl_context
        self.stopping = False    # stop_serving() began: a connection now is its own wake-up
        super().__init__((host, port), _Handler)

    def stop_serving(self) -> None:
        """End ``serve_forever`` now. ``shutdown()`` returns once the serving loop looks at its
        flag, which it does between polls (every few seconds: an idle registry wakes rarely); a
        connection of our own wakes the loop at once."""
        self.stopping = True
        t = threading.Thread(target=self.shutdown, daemon=True)
        t.start()
        while t.is_alive():
            try:
                socket.create_connection(self.server_address[:2], timeout=1.0).close()
            except OSError:
                pass
            t.join(0.05)

    def finish_request(self, request, client_address):
        if self.stopping:
            return
        if self.ssl_context is not None:
            import ssl

            request.settimeout(self.HANDSHAKE_TIMEOUT_S)
            try:
                request = self.ssl_context.wrap_socket(request, server_side=True)
            except (ssl.SSLError, OSError) as e:
                log.warning("TLS handshake with %s:%s failed (%s): the client must use https:// "
                            "and trust the registry's CA (ssl.ca.location)", client_address[0],
                            client_address[1], getattr(e, "reason", None) or e)
                return
        super().finish_request(request, client_address)
