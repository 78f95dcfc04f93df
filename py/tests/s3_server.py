"""A real S3 server on 127.0.0.1 for the object-storage tests (moto's), and
a proxy in front of it that injects what a long run meets: throttling
(503 SlowDown), bodies cut mid-stream, a server that stops answering, and
an object replaced between two reads."""

from __future__ import annotations

import http.client
import socket
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

KEYS = {"aws_access_key_id": "test", "aws_secret_access_key": "test", "aws_region": "us-east-1"}


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Moto:
    """moto's S3 server in a subprocess, stopped by :meth:`stop`."""

    def __init__(self) -> None:
        self.port = _free_port()
        self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(self.port)],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.time() + 60
        while True:
            try:
                socket.create_connection(("127.0.0.1", self.port), 0.2).close()
                break
            except OSError:
                if time.time() > deadline or self.proc.poll() is not None:
                    raise RuntimeError("moto's S3 server did not start") from None
                time.sleep(0.1)
        self.endpoint = f"http://127.0.0.1:{self.port}"

    def client(self) -> Any:
        """A signed client (boto3, which moto brings) of the server."""
        import boto3

        return boto3.client("s3", endpoint_url=self.endpoint, aws_access_key_id=KEYS["aws_access_key_id"],
                            aws_secret_access_key=KEYS["aws_secret_access_key"], region_name=KEYS["aws_region"])

    def bucket(self, name: str) -> str:
        self.client().create_bucket(Bucket=name)
        return name

    def put(self, path: str, body: bytes) -> None:
        """Writes ``body`` at ``path`` (``/bucket/key``)."""
        bucket, key = path.lstrip("/").split("/", 1)
        self.client().put_object(Bucket=bucket, Key=key, Body=body)

    def options(self, endpoint: str | None = None, **extra: Any) -> dict[str, str]:
        return {"aws_endpoint": endpoint or self.endpoint, **KEYS, **{k: str(v) for k, v in extra.items()}}

    def stop(self) -> None:
        self.proc.kill()
        self.proc.wait()


class Faults(ThreadingHTTPServer):
    """A proxy to ``upstream`` that misbehaves as told:

    - ``throttle_every = n``: every n-th request gets 503 SlowDown;
    - ``cut_every = n``: every n-th GET sends half its body and closes;
    - ``hang = True``: requests get no answer (until ``hang`` is unset);
    - ``replace = (path, bytes)``: the first GET of ``path`` (a bucket
      path) first replaces the object upstream;
    - ``tokens[token] = t``: a request signed with session token ``token``
      after time ``t`` gets 400 ExpiredToken, as AWS answers (moto checks
      no signatures or tokens, so expiry is enforced here).
    """

    daemon_threads = True

    def __init__(self, upstream: Moto) -> None:
        self.upstream = upstream
        self.throttle_every = 0
        self.cut_every = 0
        self.hang = False
        self.replace: tuple[str, bytes] | None = None
        self.tokens: dict[str, float] = {}
        self.seen = self.throttled = self.cut = self.gets = self.expired = 0
        #: ``(method, path and query, body bytes sent)`` of every request answered.
        self.log: list[tuple[str, str, int]] = []
        self.lock = threading.Lock()
        super().__init__(("127.0.0.1", 0), _Handler)
        self.endpoint = f"http://127.0.0.1:{self.server_address[1]}"
        threading.Thread(target=self.serve_forever, daemon=True).start()

    def stop(self) -> None:
        self.hang = False
        self.shutdown()
        self.server_close()


class _Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a: Any) -> None:
        pass

    def _error(self, status: int, code: str, message: str) -> None:
        """An S3 error answer."""
        msg = f"<Error><Code>{code}</Code><Message>{message}</Message></Error>".encode()
        self.send_response(status)
        self.send_header("Content-Length", str(len(msg)))
        self.end_headers()
        self.wfile.write(msg)

    def _any(self) -> None:
        srv: Faults = self.server  # type: ignore[assignment]
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        with srv.lock:
            srv.seen += 1
            n = srv.seen
            if self.command == "GET":
                srv.gets += 1
            g = srv.gets
        while srv.hang:
            time.sleep(0.05)
        if srv.throttle_every and n % srv.throttle_every == 0:
            with srv.lock:
                srv.throttled += 1
            return self._error(503, "SlowDown", "Please reduce your request rate.")
        token = self.headers.get("X-Amz-Security-Token")
        if token in srv.tokens and time.time() > srv.tokens[token]:
            with srv.lock:
                srv.expired += 1
            return self._error(400, "ExpiredToken", "The provided token has expired.")
        path = self.path.split("?")[0]
        if self.command == "GET" and srv.replace and srv.replace[0] == path:
            srv.upstream.put(path, srv.replace[1])
            srv.replace = None
        c = http.client.HTTPConnection("127.0.0.1", srv.upstream.port, timeout=60)
        # The Host header goes as it came: a SigV4 signature covers it.
        headers = {k: v for k, v in self.headers.items() if k.lower() != "connection"}
        c.request(self.command, self.path, body=body or None, headers=headers)
        r = c.getresponse()
        data = r.read()
        cut = self.command == "GET" and srv.cut_every and g % srv.cut_every == 0 and len(data) > 1 and r.status < 300
        self.send_response(r.status)
        for k, v in r.getheaders():
            if k.lower() not in ("content-length", "connection", "transfer-encoding", "date", "server"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        if cut:
            self.send_header("Connection", "close")
        self.end_headers()
        if cut:
            with srv.lock:
                srv.cut += 1
            self.wfile.write(data[: len(data) // 2])
            self.wfile.flush()
            self.close_connection = True
            self.connection.shutdown(socket.SHUT_RDWR)
            return
        if self.command != "HEAD":
            self.wfile.write(data)
        with srv.lock:
            srv.log.append((self.command, self.path, len(data) if self.command != "HEAD" else 0))

    do_GET = do_PUT = do_POST = do_DELETE = do_HEAD = _any
