"""A real HTTP remote cache for the tests and the fan-out bench: Debian's nginx with WebDAV PUT on a
loopback port, serving Bazel's layout (/ac/<key>, /cas/<sha256>) from a folder. Optional bearer
token (401 without it), a body-size cap (413 when a PUT is larger: a "full" server) or a redirect of
every request elsewhere. Its access log records every request's method, path, status and bytes in
and out, so a benchmark can count traffic. Recorder: a plain HTTP server on 127.0.0.2 (another
loopback address, another "host") that records every request it gets, headers included: where a
redirect would have taken the client's credentials."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

LOG_FORMAT = "$request_method $uri $status $request_length $bytes_sent"


def available() -> str | None:
    """The nginx binary, or None."""
    return shutil.which("nginx") or next(
        (p for p in ("/usr/sbin/nginx",) if os.path.exists(p)), None
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """nginx serving `root` at http://127.0.0.1:<port>/ until stop(); with `redirect_to` (a URL
    without a path) every request is answered 302 to the same path there instead."""

    def __init__(
        self,
        folder: Path,
        token: str | None = None,
        max_body: str = "0",
        redirect_to: str | None = None,
    ):
        self.folder, self.port = Path(folder), free_port()
        self.root = self.folder / "root"
        for sub in ("root/ac", "root/cas", "tmp"):
            (self.folder / sub).mkdir(parents=True, exist_ok=True)
        os.chmod(self.folder, 0o777)
        for sub in ("root", "root/ac", "root/cas", "tmp"):
            os.chmod(self.folder / sub, 0o777)   # nginx's workers may run as another user
        guard = f'if ($http_authorization != "Bearer {token}") {{ return 401; }}' if token else ""
        if redirect_to:
            guard += f"\n            return 302 {redirect_to}$request_uri;"
        user = "user root;" if os.geteuid() == 0 else ""
        tmp = self.folder / "tmp"
        (self.folder / "nginx.conf").write_text(f"""{user}
worker_processes 2;
daemon off;
pid {self.folder}/nginx.pid;
error_log {self.folder}/error.log warn;
events {{ worker_connections 256; }}
http {{
    log_format cache '{LOG_FORMAT}';
    access_log {self.folder}/access.log cache;
    client_body_temp_path {tmp}/body;
    proxy_temp_path {tmp}/proxy;
    fastcgi_temp_path {tmp}/fastcgi;
    uwsgi_temp_path {tmp}/uwsgi;
    scgi_temp_path {tmp}/scgi;
    server {{
        listen 127.0.0.1:{self.port};
        root {self.root};
        client_max_body_size {max_body};
        location / {{
            {guard}
            dav_methods PUT DELETE;
            create_full_put_path on;
            dav_access user:rw group:r all:r;
        }}
    }}
}}
""")
        self.process = subprocess.Popen(
            [available(), "-c", str(self.folder / "nginx.conf"), "-p", str(self.folder)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                break
            except OSError:
                if self.process.poll() is not None:
                    raise RuntimeError(f"nginx exited: {self.process.stderr.read().decode()}")
                time.sleep(0.05)
        else:
            raise RuntimeError("nginx did not listen within 10 s")
        self.url = f"http://127.0.0.1:{self.port}/"

    def requests(
        self, at_least: int = 0, wait: float = 10.0
    ) -> list[tuple[str, str, int, int, int]]:
        """Every request so far, in order, from the access log: (method, path, status, bytes in,
        bytes out). nginx logs a request when it has ended, a moment after the client has its
        answer: with `at_least`, wait up to `wait` seconds for that many."""
        log = self.folder / "access.log"
        deadline = time.monotonic() + wait
        while True:
            found = []
            for line in (log.read_text().splitlines() if log.exists() else []):
                method, path, status, bytes_in, bytes_out = line.split()
                found.append((method, path, int(status), int(bytes_in), int(bytes_out)))
            if len(found) >= at_least or time.monotonic() > deadline:
                return found
            time.sleep(0.05)

    def traffic(self) -> dict:
        """Requests and bytes by method, from the access log: {"GET": {"requests",
        "hits", "bytes_out"}, ...}."""
        found: dict = {}
        for method, _, status, bytes_in, bytes_out in self.requests():
            m = found.setdefault(method, {"requests": 0, "ok": 0, "bytes_in": 0, "bytes_out": 0})
            m["requests"] += 1
            m["ok"] += 200 <= status < 300
            m["bytes_in"] += bytes_in
            m["bytes_out"] += bytes_out
        return found

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGQUIT)
            try:
                self.process.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


class Silent:
    """A server that accepts connections and never answers (a hung proxy): every
    request times out."""

    def __init__(self):
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.held, self.url = [], f"http://127.0.0.1:{self.sock.getsockname()[1]}/"
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self):
        while True:
            try:
                self.held.append(self.sock.accept()[0])
            except OSError:
                return

    def close(self):
        self.sock.close()


class Recorder:
    """http://127.0.0.2:<port>/ until stop(): records (method, path, headers) of every request and
    answers 200 with `size` zero bytes, announced in a Content-Length header if `length`, else ended
    by closing the connection. `sent` counts the body bytes it got out before the client hung up (a
    client that stops reading stops it)."""

    def __init__(self, size: int = 16, length: bool = True):
        self.seen: list[tuple[str, str, dict]] = []
        self.sent = 0
        self.done = threading.Event()   # set when an answer ended (whole, or cut by the client)
        recorder = self

        class Handler(BaseHTTPRequestHandler):
            def answer(self):
                recorder.seen.append((self.command, self.path, dict(self.headers)))
                body = int(self.headers.get("Content-Length") or 0)
                # a PUT's body (bounded: nothing here stores it)
                self.rfile.read(min(body, 1 << 20))
                self.send_response(200)
                if length:
                    self.send_header("Content-Length", str(size))
                self.end_headers()
                left = size if self.command != "HEAD" else 0
                try:
                    while left:
                        written = self.wfile.write(bytes(min(1 << 16, left)))
                        left, recorder.sent = left - written, recorder.sent + written
                except OSError:   # the client hung up: what it did not want
                    pass
                finally:
                    recorder.done.set()

            do_GET = do_HEAD = do_PUT = do_DELETE = answer

            def log_message(self, *args):   # quiet: the test reads `seen`
                pass

        # HTTP/1.0: one request per connection
        self.http = ThreadingHTTPServer(("127.0.0.2", 0), Handler)
        self.url = f"http://127.0.0.2:{self.http.server_address[1]}/"
        self.thread = threading.Thread(target=self.http.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        self.http.shutdown()
        self.http.server_close()
        self.thread.join(timeout=10)
