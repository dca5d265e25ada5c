"""A fault-injecting HTTP proxy on 127.0.0.1 in front of the S3 API server, as real stores misbehave.

Every request is either forwarded to the server unchanged or meets one fault: a 503 SlowDown, a
429, a 500 (answered by the proxy, the server never sees the request), a connection reset before the
request is forwarded, a reset after the server handled it (the response is lost: a create landed but
its writer does not know), a body cut short (headers promise the whole object, half of it is sent),
or a delay. Which fault a request meets is a function of the seed, the request line and how many
times that same request line was seen before, so it does not depend on how threads interleave; at
most ``max_in_a_row`` consecutive faults hit one request line, so a client that retries gets through.
Request lines are taken with the bucket (path-style: the first path segment) and a multipart
upload's id replaced by fixed tokens, as both are random per run: one seed meets the same faults in
every run (one proxy serves one bucket, as in the tests and benchmarks).

``python tests/remote/fault_proxy.py UPSTREAM_PORT PORT SEED RATES_JSON`` runs one as a process
(the benchmarks do); tests start it in their own process with ``FaultProxy(...).start()``.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import re
import socket
import struct
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

FAULTS = ("slow_down", "too_many", "internal", "forbidden", "reset_before", "reset_after", "short_body", "delay")
_ANSWERED = {
    "slow_down": (503, "SlowDown", "Please reduce your request rate."),
    "too_many": (429, "TooManyRequests", "Too many requests."),  # an S3-compatible store's throttling
    "internal": (500, "InternalError", "We encountered an internal error. Please try again."),
    "forbidden": (403, "AccessDenied", "Access Denied"),
}
_HOP_BY_HOP = {
    "connection",
    "keep-alive",
    "transfer-encoding",
    "proxy-connection",
    "te",
    "trailer",
    "upgrade",
    "expect",
}
CHUNK = 1 << 20
_BUCKET = re.compile(r"^/[^/?]+")  # path-style addressing: the bucket is the path's first segment
_UPLOAD_ID = re.compile(r"(?<=[?&]uploadId=)[^&]*")


def schedule_key(target: str) -> str:
    """The request target as the fault schedule sees it: the bucket and any upload id are fixed tokens.

    Tests use a fresh, randomly named bucket each, and the server chooses upload ids; hashing them
    would make the faults a seed gives differ from run to run.
    """
    return _UPLOAD_ID.sub("UPLOAD", _BUCKET.sub("/BUCKET", target, count=1))


class FaultProxy:
    """The proxy: ``rates`` maps fault names (FAULTS) to the share of requests that meet them."""

    def __init__(
        self,
        upstream_port: int,
        rates: dict[str, float],
        seed: int = 0,
        port: int = 0,
        delay_s: float = 0.05,
        max_in_a_row: int = 2,
        applies: Callable[[str, str], bool] | None = None,
    ) -> None:
        unknown = set(rates) - set(FAULTS)
        if unknown:
            raise ValueError(f"unknown faults {sorted(unknown)}; known: {FAULTS}")
        self.upstream_port = upstream_port
        self.rates = dict(rates)
        self.seed = seed
        self.delay_s = delay_s
        self.max_in_a_row = max_in_a_row
        self.applies = applies  # (method, path) -> whether faults may hit this request; None: all
        self.delivered: Counter[tuple[str, str]] = Counter()  # responses relayed whole with a 2xx status
        self.down = False  # an outage: connections open already are reset at their next request (see `stop`)
        self.injected: Counter[str] = Counter()  # faults met, by name (a short body only cuts a GET's)
        self.cut_short: list[str] = []  # paths of the bodies cut short, in order
        self.forwarded = 0
        self.answered: list[tuple[str, str, int, str, int]] = []  # (method, path, status, Range header, body bytes)
        self.serial = threading.Lock()  # held through the requests ``exclusive`` names, one at a time
        self._seen: Counter[str] = Counter()
        self._in_a_row: Counter[str] = Counter()
        self._lock = threading.Lock()
        self._server = _QuietServer(("127.0.0.1", port), _handler_for(self))
        self._server.daemon_threads = True
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._server.server_address[1])

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> FaultProxy:
        self._thread = threading.Thread(target=self._server.serve_forever, name="fault-proxy", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def outage(self) -> None:
        """Refuse new connections and reset the ones open (a client's pool keeps some) until `restart`."""
        self.down = True
        self.stop()

    def restart(self) -> None:
        """Listen again on the same port after an outage."""
        self._server = _QuietServer(("127.0.0.1", self.port), _handler_for(self))
        self._server.daemon_threads = True
        self.down = False
        self.start()

    def exclusive(self, method: str, target: str) -> bool:
        """Whether this request is handled alone (checked, forwarded and answered under ``serial``)."""
        return False

    def refusal(self, method: str, target: str, body: bytes) -> tuple[int, str, bytes] | None:
        """(status, content type, body) the proxy answers instead of the server; None: handled as usual."""
        return None

    def record(self, method: str, target: str, status: int, byte_range: str, size: int) -> None:
        with self._lock:
            self.answered.append((method, target, status, byte_range, size))

    def choose(self, method: str, target: str) -> str | None:
        """The fault this request meets (None: forwarded as it is)."""
        if self.applies is not None and not self.applies(method, target):
            return None
        line = f"{method} {schedule_key(target)}"
        with self._lock:
            occurrence = self._seen[line]
            self._seen[line] += 1
            if self._in_a_row[line] >= self.max_in_a_row:
                self._in_a_row[line] = 0
                return None
            digest = hashlib.sha256(f"{self.seed}\0{line}\0{occurrence}".encode()).digest()
            draw = int.from_bytes(digest[:8], "big") / 2**64
            fault = None
            for name in FAULTS:
                rate = self.rates.get(name, 0.0)
                if draw < rate:
                    fault = name
                    break
                draw -= rate
            if fault == "short_body" and method != "GET":
                fault = "reset_after"  # nothing to cut short: the response is lost instead
            if fault is None:
                self._in_a_row[line] = 0
            else:
                self._in_a_row[line] += 1
                self.injected[fault] += 1
            return fault


class _QuietServer(ThreadingHTTPServer):
    """A client that hangs up before its answer is sent (gcsfs reading the start of an object does) is no error."""

    def handle_error(self, request: Any, client_address: Any) -> None:
        if not isinstance(sys.exc_info()[1], ConnectionError):
            super().handle_error(request, client_address)


def _handler_for(proxy: FaultProxy) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # headers and body go as written: no 40 ms wait for a delayed ACK
        upstream: http.client.HTTPConnection | None = None

        def log_message(self, format: str, *args: Any) -> None:  # the server's own log is enough
            pass

        def _body(self) -> bytes:
            if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
                parts = []
                while size := int(self.rfile.readline().split(b";")[0].strip() or b"0", 16):
                    parts.append(self.rfile.read(size))
                    self.rfile.readline()
                while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                    pass  # trailers
                return b"".join(parts)
            return self.rfile.read(int(self.headers.get("Content-Length") or 0))

        def _asked_range(self) -> str:
            """The range of the object asked for (the Azure SDK names it ``x-ms-range``)."""
            return self.headers.get("Range") or self.headers.get("x-ms-range", "")

        def _reset(self) -> None:
            """Close the connection with a TCP reset, as a dropped connection looks to the client."""
            self.close_connection = True
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()

        def _answer(self, fault: str) -> None:
            status, code, message = _ANSWERED[fault]
            body = (
                f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{message}</Message>'
                f"<Resource>{self.path}</Resource><RequestId>fault-proxy</RequestId></Error>"
            ).encode()
            self._send(status, "application/xml", body)

        def _send(self, status: int, content_type: str, body: bytes) -> None:
            self.send_response(status)
            self.send_header("Content-Type", content_type)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)
            proxy.record(
                self.command,
                self.path,
                status,
                self._asked_range(),
                len(body),
            )

        def _forward(self, body: bytes) -> http.client.HTTPResponse:
            if self.upstream is None:
                self.upstream = http.client.HTTPConnection("127.0.0.1", proxy.upstream_port, timeout=120)
                self.upstream.connect()
                self.upstream.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            headers = {
                name: value
                for name, value in self.headers.items()
                if name.lower() not in _HOP_BY_HOP and name.lower() != "content-length"
            }
            if body or self.headers.get("Content-Length") is not None:
                headers["Content-Length"] = str(len(body))  # a chunked body is forwarded whole
            for attempt in range(2):  # the kept-alive upstream connection may have been closed meanwhile
                try:
                    self.upstream.putrequest(self.command, self.path, skip_host=True, skip_accept_encoding=True)
                    for name, value in headers.items():
                        self.upstream.putheader(name, value)
                    self.upstream.endheaders(body)
                    return self.upstream.getresponse()
                except (http.client.HTTPException, OSError):
                    self.upstream.close()
                    if attempt:
                        raise
            raise AssertionError("unreachable")

        def _relay(self, response: http.client.HTTPResponse, cut_short: bool) -> None:
            length = response.getheader("Content-Length")
            has_body = self.command != "HEAD" and response.status not in (204, 304)
            data = b"" if length is not None or not has_body else response.read()
            size = len(data) if length is None else int(length)
            if cut_short:
                with proxy._lock:
                    if size == 0 or not has_body:  # nothing to cut: the answer goes whole, no fault met
                        cut_short = False
                        proxy.injected["short_body"] -= 1
                    else:
                        proxy.cut_short.append(self.path)
            self.send_response_only(response.status, response.reason)
            for name, value in response.getheaders():
                if name.lower() not in _HOP_BY_HOP and name.lower() != "content-length":
                    self.send_header(name, value)
            self.send_header("Content-Length", str(size))
            self.end_headers()
            if not has_body or size == 0:
                response.read()  # to its end (nothing): else the kept-alive connection cannot take the next request
            if not has_body:
                proxy.record(
                    self.command,
                    self.path,
                    response.status,
                    self._asked_range(),
                    0,
                )
                if response.status < 300:
                    with proxy._lock:
                        proxy.delivered[(self.command, self.path)] += 1
                return
            limit = size // 2 if cut_short else size
            proxy.record(
                self.command,
                self.path,
                response.status,
                self._asked_range(),
                limit,
            )
            sent = 0
            if data:
                self.wfile.write(data[:limit])
                sent = min(limit, len(data))
            while sent < limit and (chunk := response.read(min(CHUNK, limit - sent))):
                self.wfile.write(chunk)
                sent += len(chunk)
            if cut_short:
                response.read()  # drain, so the upstream connection can be reused
                self.wfile.flush()
                self._reset()
            elif response.status < 300:
                with proxy._lock:
                    proxy.delivered[(self.command, self.path)] += 1

        def _handle(self) -> None:
            body = self._body()
            if proxy.down:
                self._reset()
                return
            if proxy.exclusive(self.command, self.path):
                with proxy.serial:
                    self._handle_body(body)
            else:
                self._handle_body(body)

        def _handle_body(self, body: bytes) -> None:
            refused = proxy.refusal(self.command, self.path, body)
            if refused is not None:
                self._send(*refused)
                return
            fault = proxy.choose(self.command, self.path)
            if fault in _ANSWERED:
                self._answer(fault)
                return
            if fault == "reset_before":
                self._reset()
                return
            if fault == "delay":
                time.sleep(proxy.delay_s)
            response = self._forward(body)
            with proxy._lock:
                proxy.forwarded += 1
            if fault == "reset_after":
                response.read()
                self._reset()
                return
            self._relay(response, cut_short=fault == "short_body")

        do_GET = do_PUT = do_POST = do_HEAD = do_DELETE = _handle

        def finish(self) -> None:
            try:
                super().finish()
            except (OSError, ValueError):
                pass  # the connection was reset on purpose
            if self.upstream is not None:
                self.upstream.close()

    return Handler


def main(upstream_port: str, port: str, seed: str, rates: str) -> None:
    proxy = FaultProxy(int(upstream_port), json.loads(rates), seed=int(seed), port=int(port))
    print(proxy.endpoint, flush=True)
    proxy._server.serve_forever()


if __name__ == "__main__":
    main(*sys.argv[1:])
