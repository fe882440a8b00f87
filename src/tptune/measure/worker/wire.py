"""The worker socket's framing: one JSON document per line, both ways."""
from __future__ import annotations

import json
import socket


def recv_json(conn: socket.socket):
    """The next JSON line from ``conn``, or None when the peer closed without sending one."""
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = conn.recv(1 << 20)
        if not chunk:
            break
        buf += chunk
    return json.loads(buf) if buf.strip() else None


def send_json(conn: socket.socket, obj) -> None:
    conn.sendall(json.dumps(obj).encode() + b"\n")
