"""A Hugging Face hub stand-in on loopback: enough of the REST API and the
resolve endpoint (HEAD, Range GET) for search, listing and downloads, plus
a switch to drop the connection part-way through a file."""

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
                start = 0
                rng = self.headers.get("Range")
                if rng:
                    start = int(re.match(r"bytes=(\d+)-", rng).group(1))
                    hub.range_requests.append((name, rng))
                self.send_response(206 if rng else 200)
                self.send_header("ETag", f'"{hub.sha256(name, file)}"')
                self.send_header("X-Repo-Commit", COMMIT)
                self.send_header("Accept-Ranges", "bytes")
                self.send_header("Content-Length", str(len(data) - start))
                if rng:
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                self.end_headers()
                if head:
                    return
                body = data[start:]
                cut = hub.drop_after.pop(name, None)
                if cut is not None:
                    self._send(name, body[:cut])
                    self.connection.shutdown(2)  # hang up mid-file, like a killed download
                    return
                self._send(name, body)

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
