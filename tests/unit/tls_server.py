"""A loopback TLS server for unit tests: real handshakes without a Kafka broker.

It accepts connections until stopped, performs the TLS handshake with its certificate (and, with
``client_ca``, requires a client certificate signed by that CA), answers ``b"ok"`` and closes.
``connections`` counts the TCP connections it accepted, ``handshakes`` the ones that completed.

With ``garble_rejection`` it speaks TLS 1.2 and rejects a client certificate as Kafka 2.2 on Java
17 was measured to: its first handshake flight again, 16 KB of zeros, then Java's alert
(bad_certificate without a certificate, certificate_unknown for one it does not trust).
"""

from __future__ import annotations

import os
import socket
import ssl
import tempfile
import threading

from kafka_source.testing.certs import CertificateAuthority, Identity


class TlsServer:
    def __init__(self, identity: Identity, *, client_ca: CertificateAuthority | None = None,
                 garble_rejection: bool = False):
        self._dir = tempfile.mkdtemp(prefix="pykafka-tls-server-")
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(identity.write_pem(os.path.join(self._dir, "server.pem")))
        if client_ca is not None:
            ctx.verify_mode = ssl.CERT_REQUIRED
            ctx.load_verify_locations(cadata=client_ca.pem().decode())
        if garble_rejection:
            ctx.maximum_version = ssl.TLSVersion.TLSv1_2
        self._garble = garble_rejection
        self._ctx = ctx
        self._sock = socket.create_server(("127.0.0.1", 0))
        self._sock.settimeout(0.2)
        self.port = self._sock.getsockname()[1]
        self.address = f"127.0.0.1:{self.port}"
        self.connections = 0
        self.handshakes = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except (socket.timeout, OSError):
                continue
            self.connections += 1
            conn.settimeout(5)
            if self._garble:
                self._garbled_handshake(conn)
                continue
            try:
                with self._ctx.wrap_socket(conn, server_side=True) as tls:
                    self.handshakes += 1
                    tls.sendall(b"ok")
            except (ssl.SSLError, OSError):
                conn.close()

    def _garbled_handshake(self, conn: socket.socket) -> None:
        incoming, outgoing = ssl.MemoryBIO(), ssl.MemoryBIO()
        tls = self._ctx.wrap_bio(incoming, outgoing, server_side=True)
        first_flight = b""
        try:
            while True:
                data = conn.recv(65536)
                if not data:
                    return
                incoming.write(data)
                try:
                    tls.do_handshake()
                    self.handshakes += 1
                    conn.sendall(outgoing.read())
                    return
                except ssl.SSLWantReadError:
                    flight = outgoing.read()
                    first_flight = first_flight or flight
                    conn.sendall(flight)
                except ssl.SSLError as exc:  # the client's certificate is rejected
                    alert = 42 if "NO_CERTIFICATE" in exc.reason or "NOT_RETURN" in exc.reason \
                        else 46
                    conn.sendall(first_flight + bytes(16_000) + bytes([0x15, 3, 3, 0, 2, 2, alert]))
                    return
        except OSError:
            pass
        finally:
            conn.close()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        self._sock.close()
        for name in os.listdir(self._dir):
            os.remove(os.path.join(self._dir, name))
        os.rmdir(self._dir)

    def __enter__(self) -> "TlsServer":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()


def handshake(ctx: ssl.SSLContext, port: int, server_hostname: str = "localhost") -> bytes:
    """Connect with ``ctx``, complete the handshake and read the server's answer."""
    with socket.create_connection(("127.0.0.1", port), timeout=5) as raw:
        with ctx.wrap_socket(raw, server_hostname=server_hostname) as tls:
            return tls.recv(2)
