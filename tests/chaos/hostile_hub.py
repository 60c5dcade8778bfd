"""A hostile stand-in for the Hugging Face hub on loopback, for the chaos run.

It answers the resolve endpoint (HEAD for metadata, GET with Range) for one
repository, and each file can misbehave: a resume answered with a 206 whose
body starts at byte 0, a Content-Range that names other bytes or none, a body
cut short, a stall, a slow trickle, a redirect to a second host (a CDN) that
records whether the token came along, a redirect loop, server errors, a size
or sha256 that lies. tests/fake_hub.py is the well-behaved hub; this one is not.
"""

from __future__ import annotations

import hashlib
import re
import threading
import time
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import unquote, urlparse

COMMIT = "0123456789abcdef0123456789abcdef01234567"
REPO = "chaos/files"


@dataclass
class HostileFile:
    data: bytes
    mode: str = "normal"
    etag: str = "sha256"  # sha256 (an LFS file) | git (a 40-hex git blob id: nothing to verify against)
    cut_at: int = 0  # "truncated": bytes of the body sent before hanging up
    size_lie: int = 0  # added to the size the metadata states
    slow_s: float = 0.0  # pause between 32 KiB chunks
    announce: str | None = None  # a sha256 to announce instead of the data's

    def sha256(self) -> str:
        return self.announce or hashlib.sha256(self.data).hexdigest()

    def git_etag(self) -> str:
        return hashlib.sha1(b"blob %d\0" % len(self.data) + self.data).hexdigest()


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # clients hang up on purpose here


class ServerThread:
    def __init__(self, handler: type[BaseHTTPRequestHandler], host: str = "127.0.0.1") -> None:
        self.server = _QuietServer((host, 0), handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def url(self) -> str:
        host, port = self.server.server_address[:2]
        return f"http://{host}:{port}"

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


class HostileHub:
    """The hub on 127.0.0.1 and a "CDN" on 127.0.0.2 (another host: a token must not travel there)."""

    def __init__(self, token: str | None = None) -> None:
        self.files: dict[str, HostileFile] = {}
        self.token = token
        self.cdn_auth: list[str | None] = []  # the Authorization header of each request the CDN got
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Range)
        self.stop = threading.Event()
        self.hub = ServerThread(self._handler(cdn=False))
        self.cdn = ServerThread(self._handler(cdn=True), host="127.0.0.2")

    @property
    def url(self) -> str:
        return self.hub.url

    def close(self) -> None:
        self.stop.set()
        self.hub.close()
        self.cdn.close()

    def _handler(self, cdn: bool) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:  # noqa: N802
                self._serve(head=False)

            def do_HEAD(self) -> None:  # noqa: N802
                self._serve(head=True)

            def _empty(self, status: int, headers: dict[str, str] | None = None) -> None:
                self.send_response(status)
                for k, v in (headers or {}).items():
                    self.send_header(k, v)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def _serve(self, head: bool) -> None:
                path = unquote(urlparse(self.path).path)
                hub.requests.append((self.command, path, self.headers.get("Range")))
                m = re.match(r"^/(?:cdn/)?([^/]+/[^/]+)/resolve/[^/]+/(.+)$", path)
                if not m or m.group(1) != REPO or m.group(2) not in hub.files:
                    return self._empty(404, {"X-Error-Code": "EntryNotFound"})
                name, f = m.group(2), hub.files[m.group(2)]
                if cdn:
                    hub.cdn_auth.append(self.headers.get("Authorization"))
                elif hub.token and self.headers.get("Authorization") != f"Bearer {hub.token}":
                    return self._empty(401, {"X-Error-Code": "GatedRepo"})
                etag = f'"{f.sha256()}"' if f.etag == "sha256" else f'"{f.git_etag()}"'
                size = len(f.data) + f.size_lie
                if not cdn and f.mode == "redirect-cdn":
                    return self._empty(302, {
                        "Location": f"{hub.cdn.url}/cdn/{REPO}/resolve/main/{name}?X-Amz-Signature=chaos",
                        "X-Linked-Etag": etag, "X-Linked-Size": str(size), "X-Repo-Commit": COMMIT, "ETag": etag})
                if f.mode == "redirect-loop":
                    return self._empty(302, {"Location": self.path, "X-Repo-Commit": COMMIT})
                if head:
                    self.send_response(200)
                    self.send_header("ETag", etag)
                    self.send_header("X-Repo-Commit", COMMIT)
                    self.send_header("Accept-Ranges", "bytes")
                    self.send_header("Content-Length", str(size))
                    self.end_headers()
                    return
                if f.mode == "error-500":
                    return self._empty(500)
                self._body(f, self.headers.get("Range"))

            def _body(self, f: HostileFile, rng: str | None) -> None:
                total = len(f.data)
                start = int(re.match(r"bytes=(\d+)-", rng).group(1)) if rng else 0
                status, body_from, content_range = (206, start, f"bytes {start}-{total - 1}/{total}") if rng \
                    else (200, 0, None)
                body_to = total
                if rng and f.mode.startswith("206-from-zero-short"):  # the length asked for, from byte 0
                    body_from, body_to = 0, total - start
                    content_range = f"bytes {start}-{total - 1}/{total}" if f.mode.endswith("lying") \
                        else f"bytes 0-{total - start - 1}/{total}"
                elif rng and f.mode == "206-from-zero":  # honest about it: "bytes 0-…"
                    body_from, content_range = 0, f"bytes 0-{total - 1}/{total}"
                elif rng and f.mode == "206-from-zero-lying":  # says it starts where asked; it does not
                    body_from = 0
                elif rng and f.mode == "range-elsewhere":  # honest, but not what was asked
                    body_from = min(start + 1000, total - 1)
                    content_range = f"bytes {body_from}-{total - 1}/{total}"
                elif rng and f.mode == "range-missing":
                    content_range = None
                elif rng and f.mode == "range-wrong-total":
                    content_range = f"bytes {start}-{total - 1}/{total * 2}"
                elif rng and f.mode == "range-garbage":
                    content_range = "bytes lots-of-them"
                elif rng and f.mode == "ignore-range":
                    status, body_from, content_range = 200, 0, None
                body = f.data[body_from:body_to]
                length = len(body)
                if f.mode == "long-body":
                    body += b"\0" * 4096
                    length = len(body)
                self.send_response(status)
                self.send_header("Content-Length", "abc" if f.mode == "garbage-length" else str(length))
                if content_range:
                    self.send_header("Content-Range", content_range)
                self.end_headers()
                if f.mode == "stall-headers":
                    hub.stop.wait(120)
                    return
                if f.mode == "truncated":
                    body = body[:f.cut_at]
                try:
                    step = 32 << 10
                    for i in range(0, len(body), step):
                        if f.mode == "stall" and i >= len(body) // 2:
                            hub.stop.wait(120)
                            return
                        self.wfile.write(body[i:i + step])
                        if f.slow_s:
                            time.sleep(f.slow_s)
                    self.wfile.flush()
                except (BrokenPipeError, ConnectionResetError):
                    return
                if f.mode == "truncated":
                    self.close_connection = True

        return Handler


def hub_for(files: dict[str, HostileFile], token: str | None = None) -> Any:
    hub = HostileHub(token)
    hub.files.update(files)
    return hub
