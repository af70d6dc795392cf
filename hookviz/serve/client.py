"""The ``hookviz`` entry point: a command goes to the user's running server when there is one, else runs
here.

The request is one JSON line (the arguments, the working directory, the environment) sent with this
process's stdin, stdout and stderr themselves (``SCM_RIGHTS``): the server's child writes to the same
terminal, pipe or file this process would have, so progress bars, ``--json`` records and exit codes are the
command's own. Ctrl-C here cancels the request (the child is interrupted as a command run here would be). No
torch and no typer are imported on this path: the point is to start fast."""

from __future__ import annotations

import os
import socket
import sys

from hookviz.serve.paths import server_socket, trusted
from hookviz.serve.wire import reply, send
from hookviz.startup import hold_collector

#: The commands never handed to a server: the server's own, and those that need no model.
LOCAL = ("serve", "--help", "-h", "--version", "--install-completion", "--show-completion")
EXIT_INTERRUPTED = 130


def run_on_server(argv: list[str]) -> int | None:
    """Run ``hookviz argv`` on the user's server: its exit code, or None when no server took it (then the
    caller runs the command itself). ``--no-server`` (removed from ``argv``) and ``HOOKVIZ_SERVER=none``
    opt out."""
    if "--no-server" in argv:
        argv.remove("--no-server")
        return None
    if not argv or argv[0] in LOCAL or any(a in ("--help", "-h") for a in argv):
        return None
    path = server_socket()
    if path is None or not trusted(path):
        return None
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(str(path))
    except OSError:  # a socket left by a server that is gone
        sock.close()
        return None
    try:
        request = {
            "op": "run",
            "argv": argv,
            "cwd": os.getcwd(),
            "env": dict(os.environ),
            "pid": os.getpid(),
            "path": sys.path,  # where this process finds modules (PYTHONPATH, its folder): the child's too
            "prefix": sys.prefix,
        }
        send(sock, request, _std_fds())
        try:
            answer = reply(sock)
        except KeyboardInterrupt:  # cancel this request only; the child stops as a command run here would
            try:
                sock.sendall(b'{"op": "cancel"}\n')
                sock.settimeout(10.0)
                answer = reply(sock)
            except (OSError, ValueError, KeyboardInterrupt):
                answer = None
            return int(answer["exit"]) if answer and "exit" in answer else EXIT_INTERRUPTED
    except (OSError, ValueError):
        answer = None
    finally:
        sock.close()
    if answer is None or "exit" not in answer:
        print("hookviz: note: the server went away during the command; running it here", file=sys.stderr)
        return None
    return int(answer["exit"])


def _std_fds() -> list[int]:
    """This process's stdin, stdout and stderr (``/dev/null`` for one that is closed)."""
    fds = []
    for fd in (0, 1, 2):
        try:
            os.fstat(fd)
            fds.append(fd)
        except OSError:
            fds.append(os.open(os.devnull, os.O_RDWR))
    return fds


def main() -> None:
    """Console-script entry point: the server when one runs, else the command here."""
    hold_collector()
    argv = sys.argv[1:]
    code = run_on_server(argv)
    if code is not None:
        sys.exit(code)
    sys.argv[1:] = argv  # --no-server taken out
    from hookviz.cli import main as run_here

    run_here()
