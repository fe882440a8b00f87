"""The worker socket's framing: two JSON lines that arrive in one read are two messages (a fast case's
"accepted" and its result did, and the client failed with 'Extra data')."""
import socket
import threading

from tptune.measure.worker.wire import recv_json, send_json


def test_two_lines_in_one_read_are_two_messages_and_eof_is_none():
    a, b = socket.socketpair()
    with a, b:
        a.sendall(b'{"accepted": "qkv-tp2-none"}\n{"ranks": [1, 2]}\n')
        assert recv_json(b) == {"accepted": "qkv-tp2-none"}
        assert recv_json(b) == {"ranks": [1, 2]}
        t = threading.Thread(target=send_json, args=(a, {"big": "x" * (3 << 20)}))   # longer than one recv
        t.start()
        assert len(recv_json(b)["big"]) == 3 << 20
        t.join()
        a.shutdown(socket.SHUT_WR)
        assert recv_json(b) is None
