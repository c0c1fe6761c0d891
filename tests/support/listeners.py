"""Raw-socket servers on loopback for the egress and hostile-target tests.

A `Listener` accepts connections on one loopback address, records every connection and
every byte it receives, and answers with a scripted behaviour (a plain 200, a redirect, a
header drip, a flood of headers, silence, ...). It counts *connections*, not requests, so
"zero" means not even a TCP handshake reached it. Most behaviours answer one request per
connection; `keep_alive` answers many, and can drop a request the way a server closing an
idle connection does.
"""

from __future__ import annotations

import socket
import threading
import time
import zlib
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

Behaviour = Callable[[socket.socket, bytes, "Listener"], None]


def read_head(conn: socket.socket, limit: int = 65536) -> bytes:
    """Read until the end of the request head (or EOF / limit)."""
    data = b""
    conn.settimeout(5)
    try:
        while b"\r\n\r\n" not in data and len(data) < limit:
            chunk = conn.recv(4096)
            if not chunk:
                break
            data += chunk
            if data[:1] == b"\x16":  # a TLS ClientHello: not HTTP, no head to wait for
                break
    except OSError:
        pass
    return data


def parse_head(head: bytes) -> tuple[str, dict[str, str]]:
    """(request line, headers as sent) of a request head; a repeated name keeps its last value."""
    lines = head.split(b"\r\n\r\n", 1)[0].decode("latin-1").split("\r\n")
    headers = {}
    for line in lines[1:]:
        name, _, value = line.partition(":")
        headers[name] = value.strip()
    return lines[0], headers


def _read_body(conn: socket.socket, head: bytes) -> None:
    """Read the rest of the body the head announces (Content-Length), so that the next read
    starts at the next request."""
    _, headers = parse_head(head)
    length = int(next((v for k, v in headers.items() if k.lower() == "content-length"), "0"))
    have = len(head) - (head.find(b"\r\n\r\n") + 4)
    while have < length:
        chunk = conn.recv(65536)
        if not chunk:
            return
        have += len(chunk)


@dataclass
class Listener:
    host: str
    behaviour: Behaviour
    port: int = 0
    connections: int = 0
    received: list[bytes] = field(default_factory=list)
    # Requests read and left unanswered (the connection closed instead): `keep_alive`.
    dropped: int = 0
    sni: list[str | None] = field(default_factory=list)
    stopped: threading.Event = field(default_factory=threading.Event)
    lock: threading.Lock = field(default_factory=threading.Lock)
    _sock: socket.socket | None = None
    _open: list[socket.socket] = field(default_factory=list)

    @property
    def authority(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"{host}:{self.port}"

    def url(self, path: str = "/") -> str:
        return f"http://{self.authority}{path}"

    def requests_text(self) -> str:
        with self.lock:
            return b"".join(self.received).decode("latin-1")

    def request_lines(self) -> list[str]:
        """The first line of every request received, in order."""
        with self.lock:
            return [parse_head(head)[0] for head in self.received]

    def headers_received(self) -> list[dict[str, str]]:
        with self.lock:
            return [parse_head(head)[1] for head in self.received]

    def start(self) -> Listener:
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((self.host, self.port))
        sock.listen(64)
        sock.settimeout(0.2)
        self._sock = sock
        self.port = sock.getsockname()[1]
        threading.Thread(target=self._accept_loop, daemon=True).start()
        return self

    def _accept_loop(self) -> None:
        while not self.stopped.is_set():
            try:
                conn, _ = self._sock.accept()  # type: ignore[union-attr]
            except (TimeoutError, OSError):
                continue
            with self.lock:
                self.connections += 1
                self._open.append(conn)
            threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            head = read_head(conn)
            with self.lock:
                self.received.append(head)
            self.behaviour(conn, head, self)
        except OSError:
            pass
        finally:
            try:
                conn.close()
            except OSError:
                pass

    def stop(self) -> None:
        self.stopped.set()
        if self._sock is not None:
            self._sock.close()
        with self.lock:
            for conn in self._open:
                try:
                    conn.close()
                except OSError:
                    pass


@contextmanager
def listening(host: str, behaviour: Behaviour, port: int = 0) -> Iterator[Listener]:
    listener = Listener(host=host, behaviour=behaviour, port=port).start()
    try:
        yield listener
    finally:
        listener.stop()


# --- Behaviours ---------------------------------------------------------------------------


def respond(status: str = "200 OK", body: bytes = b"ok", headers: list[tuple[str, str]] | None = None) -> Behaviour:
    def behaviour(conn: socket.socket, head: bytes, listener: Listener) -> None:
        lines = [f"HTTP/1.1 {status}", f"Content-Length: {len(body)}", "Connection: close"]
        lines += [f"{k}: {v}" for k, v in headers or []]
        conn.sendall(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)

    return behaviour


def redirect_to(location: str) -> Behaviour:
    return respond("302 Found", b"", [("Location", location)])


def silent(conn: socket.socket, head: bytes, listener: Listener) -> None:
    """Accept, read the request, never answer (until the test ends)."""
    listener.stopped.wait(30)


def header_drip(interval: float = 0.05) -> Behaviour:
    """A status line, then one header byte at a time, forever."""

    def behaviour(conn: socket.socket, head: bytes, listener: Listener) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nX-Drip: ")
        while not listener.stopped.is_set():
            conn.sendall(b"a")
            time.sleep(interval)

    return behaviour


def many_headers(count: int) -> Behaviour:
    def behaviour(conn: socket.socket, head: bytes, listener: Listener) -> None:
        lines = ["HTTP/1.1 200 OK", "Content-Length: 2", "Connection: close"]
        lines += [f"X-H{i}: v" for i in range(count)]
        conn.sendall(("\r\n".join(lines) + "\r\n\r\nok").encode())

    return behaviour


def big_headers(count: int, size: int) -> Behaviour:
    def behaviour(conn: socket.socket, head: bytes, listener: Listener) -> None:
        conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n")
        for i in range(count):
            conn.sendall(f"X-Big{i}: ".encode() + b"b" * size + b"\r\n")
        conn.sendall(b"\r\nok")

    return behaviour


def continue_flood(conn: socket.socket, head: bytes, listener: Listener) -> None:
    """Interim `100 Continue` responses, forever: never a final response."""
    while not listener.stopped.is_set():
        conn.sendall(b"HTTP/1.1 100 Continue\r\n\r\n")
        time.sleep(0.001)


def endless_body(conn: socket.socket, head: bytes, listener: Listener) -> None:
    """A chunked body that never ends, sent as fast as the client reads."""
    conn.sendall(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
    chunk = b"x" * 65536
    frame = f"{len(chunk):x}\r\n".encode() + chunk + b"\r\n"
    while not listener.stopped.is_set():
        conn.sendall(frame)


def _gzip_frames() -> tuple[bytes, bytes]:
    """The head of a gzip stream of zeros and a block that continues it; the block decodes
    to 1 MiB of zeros after any run of zeros, so it can be repeated forever (about 1000:1).
    Built once at import, so a test measuring memory does not see the server build it."""
    compressor = zlib.compressobj(9, zlib.DEFLATED, 31)
    zeros = b"\0" * (1024 * 1024)
    first = compressor.compress(zeros) + compressor.flush(zlib.Z_SYNC_FLUSH)
    block = compressor.compress(zeros) + compressor.flush(zlib.Z_SYNC_FLUSH)
    return first, block


_GZIP_FIRST, _GZIP_BLOCK = _gzip_frames()


def endless_gzip(conn: socket.socket, head: bytes, listener: Listener) -> None:
    """A gzip stream of zeros that never ends, chunked."""
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Encoding: gzip\r\nTransfer-Encoding: chunked\r\n\r\n")
    conn.sendall(f"{len(_GZIP_FIRST):x}\r\n".encode() + _GZIP_FIRST + b"\r\n")
    frame = f"{len(_GZIP_BLOCK):x}\r\n".encode() + _GZIP_BLOCK + b"\r\n"
    while not listener.stopped.is_set():
        conn.sendall(frame)


def body_drip(conn: socket.socket, head: bytes, listener: Listener) -> None:
    conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 100000\r\n\r\n")
    while not listener.stopped.is_set():
        conn.sendall(b"x")
        time.sleep(0.05)


def keep_alive(*, drop_after_idle: float) -> Behaviour:
    """Answer every request of a connection and keep it open; but a request arriving after the
    connection sat idle more than `drop_after_idle` seconds is read and dropped, the connection
    closed without an answer: a server's keep-alive timer firing just as the request lands
    (gunicorn's does at 2 s), made deterministic. 0 drops every second request."""

    def behaviour(conn: socket.socket, head: bytes, listener: Listener) -> None:
        while head:
            _read_body(conn, head)
            conn.sendall(b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
            answered = time.monotonic()
            head = read_head(conn)
            if not head:
                return
            with listener.lock:
                listener.received.append(head)
                if time.monotonic() - answered > drop_after_idle:
                    listener.dropped += 1
                    return

    return behaviour


def reset(conn: socket.socket, head: bytes, listener: Listener) -> None:
    """Abort the connection with a TCP RST."""
    conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, b"\x01\x00\x00\x00\x00\x00\x00\x00")


def close_quietly(conn: socket.socket, head: bytes, listener: Listener) -> None:
    """Read the request and close without a word."""


def garbage(conn: socket.socket, head: bytes, listener: Listener) -> None:
    conn.sendall(b"hello, this is not HTTP\r\n\r\n")


def free_port(host: str = "127.0.0.1") -> int:
    """A port nothing listens on (bound, then released)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as sock:
        sock.bind((host, 0))
        return sock.getsockname()[1]
