"""The server's wire: one JSON message a line over a Unix socket, with the caller's standard streams passed
along as file descriptors."""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Sequence
from typing import Any


def send(sock: socket.socket, message: dict[str, Any], fds: Sequence[int] = ()) -> None:
    data = (json.dumps(message) + "\n").encode()
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.sendall(data)


def reply(sock: socket.socket) -> dict[str, Any] | None:
    """The server's one-line answer (None: the connection closed first)."""
    buf = b""
    while not buf.endswith(b"\n"):
        chunk = sock.recv(4096)
        if not chunk:
            return None
        buf += chunk
    answer = json.loads(buf)
    return answer if isinstance(answer, dict) else None


def ask(
    path: os.PathLike[str] | str, message: dict[str, Any], timeout: float = 10.0
) -> dict[str, Any] | None:
    """Send ``message`` to the server at ``path`` and return its answer (None: no server answers there)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(timeout)
            sock.connect(str(path))
            send(sock, message)
            return reply(sock)
    except (OSError, ValueError):
        return None
