"""A Hugging Face hub stand-in on loopback: enough of the REST API and the
resolve endpoint (HEAD, Range GET) for search, listing and downloads, plus
switches for what real servers do wrong: drop the connection part-way through
a file, redirect to a CDN on another origin (as the hub does for LFS files),
git-style ETags (non-LFS files), and broken answers to a resume."""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class FakeHub:
    def __init__(self, repos: dict[str, dict[str, Path]]) -> None:
        self.repos = repos  # repo_id -> {filename: local path}
        self.drop_after: dict[str, int] = {}  # filename -> bytes to send before hanging up (once)
        self.range_requests: list[tuple[str, str]] = []
        self.corrupt: set[str] = set()  # filenames whose advertised sha256 is wrong
        self.bytes_served: dict[str, int] = {}
        self.token: str | None = None  # when set, files need "Authorization: Bearer <token>"
        self.slow_chunk_s = 0.0  # > 0: send 64 KiB at a time with this pause between
        self.requests: list[tuple[str, str, dict[str, str]]] = []  # (method, path, headers) of every request
        self.redirect_to: str | None = None  # a CDN's base URL: file requests get a 302 there, as LFS files do
        self.git_etag: set[str] = set()  # filenames served like non-LFS files: a git blob sha1 as ETag
        self.resume_from: dict[str, int] = {}  # filename -> offset a Range answer starts at, whatever was asked
        self.ignore_range: set[str] = set()  # filenames whose Range requests get 200 and the whole file
        self.advertised_size: dict[str, int] = {}  # filename -> size HEAD claims (X-Linked-Size), wrongly
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> FakeHub:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()

    def sha256(self, filename: str, path: Path) -> str:
        if filename in self.corrupt:
            return "0" * 64
        return hashlib.sha256(path.read_bytes()).hexdigest()

    def etag(self, filename: str, data: bytes, path: Path) -> str:
        """The sha256 for LFS files; for ``git_etag`` files the git blob sha1, which says nothing of the bytes'
        sha256 (the hub's ETag for small non-LFS files)."""
        if filename in self.git_etag:
            return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()
        return self.sha256(filename, path)

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def _json(self, data: object) -> None:
                body = json.dumps(data).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self) -> None:  # noqa: N802
                self._serve(head=False)

            def do_HEAD(self) -> None:  # noqa: N802
                self._serve(head=True)

            def _serve(self, head: bool) -> None:
                hub.requests.append((self.command, self.path, dict(self.headers.items())))
                url = urlparse(self.path)
                path = unquote(url.path)
                if path == "/api/models":
                    query = parse_qs(url.query).get("search", [""])[0].lower()
                    return self._json([{"id": r, "modelId": r, "downloads": 10, "likes": 1, "tags": ["gguf"]}
                                       for r in hub.repos if query in r.lower()])
                m = re.match(r"^/api/models/([^/]+/[^/]+)(?:/revision/[^/]+)?$", path)
                if m and m.group(1) in hub.repos:
                    files = hub.repos[m.group(1)]
                    return self._json({
                        "id": m.group(1), "modelId": m.group(1), "sha": COMMIT,
                        "siblings": [{"rfilename": n, "size": p.stat().st_size,
                                      "lfs": {"sha256": hub.sha256(n, p), "size": p.stat().st_size,
                                              "pointerSize": 134}}
                                     for n, p in files.items()],
                    })
                m = re.match(r"^/([^/]+/[^/]+)/resolve/[^/]+/(.+)$", path)
                if not m or m.group(1) not in hub.repos or m.group(2) not in hub.repos[m.group(1)]:
                    self.send_response(404)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                name, file = m.group(2), hub.repos[m.group(1)][m.group(2)]
                if hub.token and self.headers.get("Authorization") != f"Bearer {hub.token}":
                    self.send_response(401)
                    self.send_header("X-Error-Code", "GatedRepo")
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                data = file.read_bytes()
                if hub.redirect_to:
                    return self._redirect(name, data, file)
                start = 0
                rng = self.headers.get("Range")
                if rng and name in hub.ignore_range:
                    rng = None
                if rng:
                    start = int(re.match(r"bytes=(\d+)-", rng).group(1))
                    hub.range_requests.append((name, rng))
                sent_from = hub.resume_from.get(name, start) if rng else 0
                body = data[sent_from:sent_from + len(data) - start]  # as many bytes as asked for, maybe not those
                self.send_response(206 if rng else 200)
                self.send_header("ETag", f'"{hub.etag(name, data, file)}"')
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("Content-Length", str(len(body)))
                if name in hub.advertised_size and head:
                    self.send_header("X-Linked-Size", str(hub.advertised_size[name]))
                if rng:
                    self.send_header("Content-Range", f"bytes {sent_from}-{sent_from + len(body) - 1}/{len(data)}")
                self.end_headers()
                if head:
                    return
                cut = hub.drop_after.pop(name, None)
                if cut is not None:
                    self._send(name, body[:cut])
                    self.connection.shutdown(2)  # hang up mid-file, like a killed download
                    return
                self._send(name, body)

            def _redirect(self, name: str, data: bytes, file: Path) -> None:
                """What the hub answers for an LFS file: 302 to a signed CDN URL, the file's facts in headers."""
                self.send_response(302)
                self.send_header("Location", hub.redirect_to.rstrip("/") + self.path)
                self.send_header("X-Linked-Size", str(hub.advertised_size.get(name, len(data))))
                self.send_header("X-Linked-Etag", f'"{hub.etag(name, data, file)}"')
                self.send_header("ETag", '"0123456789abcdef0123456789abcdef01234567"')  # the pointer's, not the file's
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def _send(self, name: str, body: bytes) -> None:
                step = 64 << 10 if hub.slow_chunk_s else len(body) or 1
                try:
                    for i in range(0, len(body), step):
                        # counted before sending, so the count is complete when the client has the bytes
                        hub.bytes_served[name] = hub.bytes_served.get(name, 0) + len(body[i:i + step])
                        self.wfile.write(body[i:i + step])
                        self.wfile.flush()
                        if hub.slow_chunk_s:
                            time.sleep(hub.slow_chunk_s)
                except (BrokenPipeError, ConnectionResetError):
                    pass  # the client went away (a cancel)

        return Handler
