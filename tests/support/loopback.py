"""The threaded HTTP server under the tests' targets and receivers (tests/support/targets.py,
tests/support/flaky.py, tests/delivery/receivers.py), on a free 127.0.0.1 port.

It answers as a production server would, so that a figure measured against it is the agent's:
- TCP_NODELAY on each connection: http.server writes a response's headers and body apart, and
  with Nagle's algorithm the body waited for the client's delayed ACK, 40 ms a response;
- an accept queue of 256, not socketserver's 5: a burst of calls or deliveries overflowed it,
  and a dropped SYN is sent again after a second;
- a client that went away before its answer (a worker stopped at the end of a test, a timeout
  the test set) is no error: socketserver would print its traceback."""

from __future__ import annotations

import socket
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class LoopbackServer(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 256

    def get_request(self) -> tuple[socket.socket, object]:
        connection, address = super().get_request()
        connection.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return connection, address

    def handle_error(self, request, client_address) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):  # BrokenPipe, ConnectionReset, ...
            super().handle_error(request, client_address)


@contextmanager
def serving(
    handler: type[BaseHTTPRequestHandler], server_class: type[LoopbackServer] = LoopbackServer
) -> Iterator[int]:
    """Serve `handler` on a free 127.0.0.1 port for the duration of the block; yields the port."""
    httpd = server_class(("127.0.0.1", 0), handler)
    # Polled every 50 ms, not 0.5 s: shutdown() waits for the poll, at the end of every test.
    thread = threading.Thread(target=httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True)
    thread.start()
    try:
        yield httpd.server_address[1]
    finally:
        httpd.shutdown()
        httpd.server_close()
