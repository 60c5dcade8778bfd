"""The wire format of ggml's RPC protocol, as much as a fake RPC server needs.

A command is one byte, then its payload size (u64, little-endian), then the
payload; a reply is its size (u64) then the payload. Used by the RPC
deadline tests and the chaos campaign's lying and trickling servers.
"""

from __future__ import annotations

import socket
import struct

HELLO = bytes([7, 0, 0, 0]) + bytes(24)  # version 7.0.0 and zero transport caps


def reply(payload: bytes) -> bytes:
    return struct.pack("<Q", len(payload)) + payload


def read_command(conn: socket.socket) -> int:
    """Read one command and its payload; return the command byte."""
    head = b""
    while len(head) < 9:
        chunk = conn.recv(9 - len(head))
        if not chunk:
            raise ConnectionError
        head += chunk
    cmd, size = struct.unpack("<BQ", head)
    while size:
        size -= len(conn.recv(min(size, 65536)))
    return cmd
