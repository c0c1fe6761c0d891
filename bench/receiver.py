"""A webhook receiver for the event delivery rows: records each delivery, answers 204.

Run as its own process (`python bench/receiver.py`); it prints its port on the first line of
stdout and serves on 127.0.0.1 until SIGTERM. For every POST it records the `webhook-id`
header and the receive time (`time.time()`, taken once the whole body has been read);
`GET /records` answers `{"records": [[webhook-id, receive time], ...]}` in arrival order,
every try included (a redelivery appears twice: the bench keeps the first); `GET /count`,
`{"count": n}`, how many there are (a cheap look while the bench waits).
It does not check signatures: it stands for a receiver's transport, not its work. A POST to
`/delay/<ms>` is answered that much later (a slow receiver, bench/neighbour.py).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

RECORDS: list[tuple[str, float]] = []
LOCK = threading.Lock()


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as the target
    disable_nagle_algorithm = True  # see bench/target.py

    def log_message(self, *args) -> None:
        pass

    def do_POST(self) -> None:
        length = int(self.headers.get("Content-Length") or 0)
        if length:
            self.rfile.read(length)
        received = time.time()
        with LOCK:
            RECORDS.append((self.headers.get("webhook-id") or "", received))
        if self.path.startswith("/delay/"):
            time.sleep(min(60_000, int(self.path.rsplit("/", 1)[1])) / 1000)
        self.send_response(204)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def do_GET(self) -> None:
        if self.path not in ("/records", "/count"):
            self.send_error(404)
            return
        with LOCK:
            body = json.dumps({"records": RECORDS} if self.path == "/records" else {"count": len(RECORDS)}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


class Server(ThreadingHTTPServer):
    daemon_threads = True
    request_queue_size = 512  # see bench/target.py


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
