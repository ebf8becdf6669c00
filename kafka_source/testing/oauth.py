"""A local OAuth token endpoint for tests: the client-credentials grant, as an identity provider
(Keycloak, Okta, Azure AD) answers it.

:class:`TokenEndpoint` serves ``POST /token`` on loopback in a thread. It checks HTTP Basic
client authentication (RFC 6749 2.3.1: id and secret URL-encoded, then base64) against its
``clients``, refuses others with ``401 invalid_client`` as identity providers do, and issues
*unsigned* JWTs (``{"alg":"none"}``) for the client id as ``sub``: a Kafka listener with the
default OAUTHBEARER validator (``OAuthBearerUnsecuredValidatorCallbackHandler``, no
``sasl.server.callback.handler.class``) accepts them, so real brokers check the tokens end to
end without a signing key. With ``certfile`` it serves HTTPS. ``fail_next(n, status)`` makes the next ``n`` requests fail (a 5xx:
an outage the client should ride out); :attr:`requests` records what each request sent.
"""

from __future__ import annotations

import base64
import json
import ssl
import threading
import time
import urllib.parse
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode("ascii")


def unsigned_jwt(claims: dict) -> str:
    header = _b64url(json.dumps({"alg": "none"}).encode())
    return f"{header}.{_b64url(json.dumps(claims).encode())}."


class TokenEndpoint:
    """``clients``: client id -> secret. ``lifetime_s``: the tokens' lifetime (``exp``)."""

    def __init__(self, clients: dict[str, str], *, lifetime_s: float = 3600,
                 expires_in: bool = True, certfile: str | None = None):
        self.clients = dict(clients)
        self.lifetime_s = lifetime_s
        self.expires_in = expires_in
        self.requests: list[dict] = []
        self.issued: list[str] = []
        self._failures: list[int] = []
        self._lock = threading.Lock()
        endpoint = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server's name
                length = int(self.headers.get("Content-Length") or 0)
                body = urllib.parse.parse_qs(self.rfile.read(length).decode())
                status, answer = endpoint._answer(dict(self.headers), body)
                data = json.dumps(answer).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *args):  # quiet
                pass

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.scheme = "http"
        if certfile:  # HTTPS with this key and certificate chain (one PEM file)
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(certfile)
            self._server.socket = context.wrap_socket(self._server.socket, server_side=True)
            self.scheme = "https"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True,
                                        name="token-endpoint")
        self._thread.start()

    @property
    def url(self) -> str:
        return f"{self.scheme}://127.0.0.1:{self._server.server_address[1]}/token"

    def fail_next(self, n: int, status: int = 503) -> None:
        with self._lock:
            self._failures.extend([status] * n)

    def _answer(self, headers: dict, body: dict) -> tuple[int, dict]:
        with self._lock:
            record = {"headers": headers, "body": body, "at": time.time()}
            self.requests.append(record)
            if self._failures:
                return self._failures.pop(0), {"error": "temporarily_unavailable"}
        auth = headers.get("Authorization", "")
        try:
            pair = base64.b64decode(auth.split(" ", 1)[1]).decode() if auth.startswith(
                "Basic ") else ""
        except (ValueError, IndexError):
            pair = ""
        client_id, _, secret = pair.partition(":")
        client_id, secret = urllib.parse.unquote(client_id), urllib.parse.unquote(secret)
        record["client_id"] = client_id
        if body.get("grant_type") != ["client_credentials"]:
            return 400, {"error": "unsupported_grant_type"}
        if client_id not in self.clients or self.clients[client_id] != secret:
            return 401, {"error": "invalid_client",
                         "error_description": "Invalid client or Invalid client credentials"}
        # NumericDates in whole seconds, as identity providers issue them: a token lives up to
        # a second less than lifetime_s, and a broker's session on it ends on a whole second;
        # each token has its own id (jti), as from most providers
        now = int(time.time())
        claims = {"sub": client_id, "iat": now, "exp": now + int(self.lifetime_s),
                  "jti": uuid.uuid4().hex}
        if body.get("scope"):
            claims["scope"] = body["scope"][0]
        token = unsigned_jwt(claims)
        with self._lock:
            self.issued.append(token)
        answer = {"access_token": token, "token_type": "Bearer"}
        if self.expires_in:
            answer["expires_in"] = int(self.lifetime_s)
        return 200, answer

    def close(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def __enter__(self) -> "TokenEndpoint":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
