"""The benchmark's HTTP target: small JSON answers, HTTP/1.1 keep-alive, 127.0.0.1 only;
`/delay/<ms>` answers after that many milliseconds (a slow target, bench/neighbour.py).

Run as its own process (`python bench/target.py`); it prints its port on the first line of
stdout and serves until SIGTERM.
"""

from __future__ import annotations

import argparse
import signal
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

BODY = b'{"ok":true,"service":"bench-target"}'


def delay_ms(path: str) -> None:
    """Sleep as `/delay/<ms>` asks (at most a minute)."""
    if path.startswith("/delay/"):
        time.sleep(min(60_000, int(path.rsplit("/", 1)[1])) / 1000)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive: clients reuse their connections
    # Headers and body go out in two writes; with Nagle on, the second waits for the client's
    # delayed ACK (~40 ms a response).
    disable_nagle_algorithm = True

    def log_message(self, *args) -> None:
        pass

    def _answer(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        delay_ms(self.path)
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(BODY)))
        self.end_headers()
        self.wfile.write(BODY)

    do_GET = do_POST = do_PUT = do_PATCH = do_DELETE = _answer


class Server(ThreadingHTTPServer):
    daemon_threads = True
    # The default backlog of 5 drops SYNs when dozens of workers connect at once.
    request_queue_size = 512


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=0)
    args = parser.parse_args()
    server = Server(("127.0.0.1", args.port), Handler)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    print(server.server_address[1], flush=True)
    try:
        server.serve_forever(poll_interval=0.5)
    finally:
        server.server_close()


if __name__ == "__main__":
    main()
