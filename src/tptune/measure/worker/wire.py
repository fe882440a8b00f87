"""The worker socket's framing: one JSON document per line, both ways."""
from __future__ import annotations

import json
import socket
import weakref

# Bytes read past a line's end, kept for the next recv_json on the same socket: rank 0 answers a request
# with two lines ("accepted", then the result), which a fast case delivers in one read.
_PENDING: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def recv_json(conn: socket.socket):
    """The next JSON line from ``conn``, or None when the peer closed without sending one."""
    buf = _PENDING.pop(conn, b"")
    while b"\n" not in buf:
        chunk = conn.recv(1 << 20)
        if not chunk:
            break
        buf += chunk
    line, _, rest = buf.partition(b"\n")
    if rest:
        _PENDING[conn] = rest
    return json.loads(line) if line.strip() else None


def send_json(conn: socket.socket, obj) -> None:
    conn.sendall(json.dumps(obj).encode() + b"\n")
