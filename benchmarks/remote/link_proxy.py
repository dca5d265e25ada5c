"""An HTTP proxy on 127.0.0.1 that gives the object store a network link: latency per request, shared bandwidth.

``python link_proxy.py UPSTREAM_PORT PORT LATENCY_MS MEGABYTES_PER_S`` forwards every request to the S3
server on UPSTREAM_PORT after LATENCY_MS, and sends response bodies no faster than MEGABYTES_PER_S
(10^6 bytes) in all, however many connections share the link: each chunk waits for its turn on the link.
"""

from __future__ import annotations

import http.client
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CHUNK = 64 << 10
_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "proxy-connection", "te", "trailer", "upgrade"}


class Link:
    """The shared link: a chunk of n bytes occupies it for n / bandwidth seconds, one chunk after another."""

    def __init__(self, bytes_per_second: float) -> None:
        self.bytes_per_second = bytes_per_second
        self._free_at = 0.0
        self._lock = threading.Lock()

    def send(self, size: int) -> None:
        with self._lock:
            start = max(time.monotonic(), self._free_at)
            self._free_at = start + size / self.bytes_per_second
            done = self._free_at
        time.sleep(max(0.0, done - time.monotonic()))


def handler_for(upstream: int, latency: float, link: Link) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            return

        def _handle(self) -> None:
            length = int(self.headers.get("Content-Length") or 0)
            body = self.rfile.read(length) if length else None
            time.sleep(latency)
            connection = http.client.HTTPConnection("127.0.0.1", upstream, timeout=300)
            headers = {key: value for key, value in self.headers.items() if key.lower() not in _HOP_BY_HOP}
            connection.request(self.command, self.path, body=body, headers=headers)
            response = connection.getresponse()
            self.send_response_only(response.status, response.reason)
            for key, value in response.getheaders():
                if key.lower() not in _HOP_BY_HOP:
                    self.send_header(key, value)
            data = response.read()
            if "content-length" not in {key.lower() for key, _ in response.getheaders()}:
                self.send_header("Content-Length", str(len(data)))
            self.end_headers()
            if self.command != "HEAD":
                for at in range(0, len(data), CHUNK):
                    link.send(len(data[at : at + CHUNK]))
                    self.wfile.write(data[at : at + CHUNK])
            connection.close()

        do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _handle

    return Handler


def main(upstream: str, port: str, latency_ms: str, megabytes_per_second: str) -> None:
    link = Link(float(megabytes_per_second) * 1e6)
    server = ThreadingHTTPServer(("127.0.0.1", int(port)), handler_for(int(upstream), float(latency_ms) / 1000, link))
    server.daemon_threads = True
    server.serve_forever()


if __name__ == "__main__":
    main(*sys.argv[1:5])
