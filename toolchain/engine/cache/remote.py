"""The artifact cache on a server speaking Bazel's HTTP remote-cache protocol: GET/PUT /ac/<key> for
entries, GET/HEAD/PUT /cas/<sha256> for blobs (bazel-remote, nginx with WebDAV PUT, BuildGrid's HTTP
front). Same keys, entries and rules as the folder (cache.Store); only where things live differs.

A server that is slow, down, full or wrong never fails a build: every request has a time-out
(QNN_CACHE_TIMEOUT, seconds, default 5); the first one that fails is one warning line, and the
server is then left alone for QNN_CACHE_RETRY seconds (default 300) by every step of the build
(a marker file beside the state DB), so a dead server costs one time-out per worker process, not
one per step.

Credentials come from the environment (read once, with every other setting: toolchain/options.py,
handed over as store.Settings), never from a record or a log: QNN_CACHE_TOKEN (a bearer token), or
QNN_CACHE_USER and QNN_CACHE_PASSWORD (basic auth; a user:password@ in the URL works too and is
stripped from every message). https:// URLs are verified against the system's CAs, or QNN_CACHE_CA
(a PEM file). A redirect is never followed (it would take the credentials to another host, or from
https to http): a 3xx answer counts as a failed server. No answer fills the disk or the memory: a
blob is read up to the size its entry records (an entry records at most QNN_CACHE_MAX_BLOB bytes per
output), an entry up to store.MAX_ENTRY bytes. QNN_CACHE_UPLOAD=0 (or `doit cache_upload=0`) makes a
read-only client: no PUT, no DELETE."""
from __future__ import annotations

import base64
import hashlib
import json
import os
import socket
import tempfile
import threading
import time
import urllib.parse
from pathlib import Path
from typing import Any

from toolchain.engine import paths
from toolchain.engine.cache.store import MAX_ENTRY, Settings, Store, Unreachable, bounded, warn
from toolchain.engine.files import MODE

DOWN = f"{paths.BUILD}/.cache-down.json"   # {"url", "until"}: the server failed; skipped until then
BLOCK = 1 << 20
_LOCK = threading.Lock()


class HttpStore(Store):
    """A remote cache at `url` (http:// or https://, any path prefix)."""

    def __init__(self, url: str, settings: Settings = Settings()):
        parts = urllib.parse.urlsplit(url)
        netloc = (parts.hostname or "") + (f":{parts.port}" if parts.port else "")
        self.base = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path.rstrip("/"), "", ""))
        self.name = self.base   # what messages say: no credentials
        self.headers = _auth(parts, settings)
        self.timeout, self.retry, self.ca = settings.timeout, settings.retry, settings.ca
        self.https = parts.scheme == "https"
        # False: a read-only client (the base's save() stores nothing then)
        self.upload = settings.upload
        self.max_blob = settings.max_blob
        self.sign_key, self.trust = settings.sign_key, settings.trust
        self.refused: frozenset[str] = frozenset()
        self.digest: str | None = None
        self._opener: Any = None   # built by the first request: refuses redirects, verifies TLS
        self.bad: set[str] = set()   # blobs that failed their hash on restore: rewritten on save

    # the server's path of an entry (the folder's entry() is a file)
    def entry_url(self, key: str) -> str:
        return f"/ac/{key}"

    def blob_url(self, digest: str) -> str:
        return f"/cas/{digest}"

    # ---- the protocol
    def read_entry(self, key: str) -> bytes | None:
        with self._request("GET", self.entry_url(key)) as answer:
            return None if answer is None else bounded(answer.read(MAX_ENTRY + 1), f"entry {key}")

    def write_entry(self, key: str, data: bytes) -> None:
        self._put(self.entry_url(key), data, len(data))

    def drop_entry(self, key: str) -> None:
        """DELETE the entry where the server allows it (nginx's WebDAV); elsewhere
        (bazel-remote) the correct entry written after the recompute replaces it. A read-only
        client never evicts."""
        if not self.upload:
            return
        try:
            with self._request("DELETE", self.entry_url(key), quiet=True):
                pass
        except Unreachable:
            pass

    def has_blob(self, digest: str) -> bool:
        if digest in self.bad:
            return False
        with self._request("HEAD", self.blob_url(digest)) as answer:
            return answer is not None

    def fetch_blob(self, digest: str, out: str, size: int) -> str:
        """The blob streamed into a temp file beside `out`, its sha256 checked (the caller renames
        it). At most `size` bytes (what its entry records) are written and size + 1 read: a longer
        answer is cut off there, one whose Content-Length says more is refused before its body is
        read; a shorter one is refused too."""
        dst = Path(out)
        dst.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{dst.name}.", suffix=".tmp", dir=dst.parent)
        try:
            hasher, left = hashlib.sha256(), size + 1
            with os.fdopen(fd, "wb") as f, self._request("GET", self.blob_url(digest)) as answer:
                if answer is None:
                    raise ValueError(f"blob {digest} is not on the server")
                announced = answer.headers.get("Content-Length", "")
                if announced.isdigit() and int(announced) > size:
                    raise ValueError(
                        f"blob {digest}: the server sends {announced} bytes, larger than the "
                        f"{size} "
                        "bytes its entry records: cut off"
                    )
                while block := answer.read(min(BLOCK, left)):
                    left -= len(block)
                    # the byte past the recorded size: not written, nothing more read
                    if left == 0:
                        raise ValueError(
                            f"blob {digest} is larger than the {size} bytes its entry records: cut "
                            "off"
                        )
                    hasher.update(block)
                    f.write(block)
            if left != 1:
                raise ValueError(
                    f"blob {digest} has {size + 1 - left} bytes, its entry records {size}"
                )
            if hasher.hexdigest() != digest:
                self.bad.add(digest)
                raise ValueError(f"blob {digest} has sha256 {hasher.hexdigest()}")
            os.chmod(tmp, MODE)
        except BaseException:
            os.unlink(tmp)
            raise
        return tmp

    def put_blob(self, digest: str, src: str) -> None:
        with open(src, "rb") as f:
            self._put(self.blob_url(digest), f, os.path.getsize(src))
        self.bad.discard(digest)

    # ---- requests, time-outs, the down marker
    def _put(self, path: str, body, size: int) -> None:
        with self._request(
            "PUT",
            path,
            body,
            {"Content-Length": str(size), "Content-Type": "application/octet-stream"},
        ) as answer:
            if answer is None:
                raise Unreachable(f"{self.name}: PUT {path}: HTTP 404")

    def _request(
        self, method: str, path: str, body=None, headers: dict | None = None, quiet: bool = False
    ):
        """The answer (a context manager), or None for 404; Unreachable for anything else
        that went wrong."""
        # here, not at the top: a build without a server never loads urllib's client or ssl
        import ssl
        import urllib.error
        import urllib.request
        if _down(self.name):
            raise Skipped(self.name)
        if self._opener is None:
            context = ssl.create_default_context(cafile=self.ca) if self.https else None
            self._opener = urllib.request.build_opener(_no_redirect_handler(),
                                                       urllib.request.HTTPSHandler(context=context))
        request = urllib.request.Request(self.base + path, data=body, method=method,
                                         headers={**self.headers, **(headers or {})})
        try:
            return self._opener.open(request, timeout=self.timeout)
        except urllib.error.HTTPError as err:
            err.close()
            if err.code == 404:
                return _Nothing()
            problem = self._refused(method, path, err)
        except (
            urllib.error.URLError,
            socket.timeout,
            ConnectionError,
            ssl.SSLError,
            OSError,
        ) as err:
            problem = f"{self.name}: {method} {path}: {getattr(err, 'reason', err)}"
        if quiet:
            raise Unreachable(problem)
        with _LOCK:   # two steps failing at once (doit -n 2 runs them in threads) say it once
            if _down(self.name):
                raise Skipped(self.name)
            _mark_down(self.name, problem, self.retry)
        raise Unreachable(
            f"{problem}; the server is left alone for {self.retry:.0f} s (cache_retry)"
        )

    def _refused(self, method: str, path: str, err) -> str:
        """What an HTTP error answer says, in one line: the status, and for a redirect where
        it pointed to."""
        problem = f"{self.name}: {method} {path}: HTTP {err.code} {err.reason}"
        location = err.headers.get("Location") if err.headers else None
        if 300 <= err.code < 400 and location:
            target = _host(self.base + path, location)
            problem = (
                f"{self.name}: {method} {path}: redirected (HTTP {err.code}) to {target}, not "
                "followed "
                "(credentials go to the configured server only)"
            )
        # bazel-remote's ActionResult check
        if err.code == 400 and method == "PUT" and path.startswith("/ac/"):
            problem += (" (bazel-remote: start it with --disable_http_ac_validation; an entry is "
                        "JSON, not REAPI)")
        return problem


def _no_redirect_handler():
    """urllib's redirect handler, refusing: the 3xx surfaces as an HTTPError. Followed, it would
    send the Authorization header to whatever host the Location names, https or not."""
    import urllib.request  # here: a build without a server never loads urllib's client

    class NoRedirect(urllib.request.HTTPRedirectHandler):
        def redirect_request(self, req, fp, code, msg, headers, newurl):
            return None

    return NoRedirect()


def _host(url: str, location: str) -> str:
    """host[:port] a Location points to (relative to `url`), never its user:password."""
    try:
        target = urllib.parse.urlsplit(urllib.parse.urljoin(url, location))
        return (target.hostname or "?") + (f":{target.port}" if target.port else "")
    except ValueError:
        return "an unreadable Location"


class Skipped(Unreachable):
    """The server failed earlier in this build: not asked again (and not said again)."""


class _Nothing:
    """The answer to a 404, usable in a with block like a real one."""

    def __enter__(self):
        return None

    def __exit__(self, *exc):
        return False


def _auth(parts, settings: Settings) -> dict:
    if settings.token:
        return {"Authorization": f"Bearer {settings.token}"}
    user = urllib.parse.unquote(parts.username or "") or settings.user
    password = urllib.parse.unquote(parts.password or "") or settings.password or ""
    if user:
        return {
            "Authorization": "Basic " + base64.b64encode(f"{user}:{password}".encode()).decode()
        }
    return {}


def _down(name: str) -> bool:
    try:
        with open(DOWN) as f:
            marker = json.load(f)
    except (OSError, ValueError):
        return False
    return marker.get("url") == name and marker.get("until", 0) > time.time()


def _mark_down(name: str, problem: str, retry: float) -> None:
    """Leave the server alone for a while, in every step of this build (a file: steps run
    in several processes)."""
    if not os.path.isdir(paths.BUILD):
        return
    tmp = f"{DOWN}.{os.getpid()}.tmp"
    try:
        with open(tmp, "w") as f:
            json.dump({"url": name, "until": time.time() + retry, "problem": problem}, f)
        os.replace(tmp, DOWN)
    except OSError as err:
        warn(f"could not write {DOWN} ({err})")
