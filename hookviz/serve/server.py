"""The server behind ``hookviz serve``: import torch once, keep the models asked for warm, fork a child per
request.

One thread, one loop (:mod:`selectors`): the listening socket, each waiting client's connection (a cancel or
a hang-up interrupts its child) and the children's exits (``SIGCHLD`` through a wake-up pipe). A request is
run by a forked child, which inherits the imported modules and the warm models, takes the client's stdin,
stdout and stderr as its own, its working directory and environment, runs the command as ``hookviz`` would,
and exits with the command's code; the loop sends that code to the client. A failing or crashing request
ends its child only.

The parent never computes with more than one thread: a process whose OpenMP pool has run cannot use it again
after a fork (the child hangs), so the parent runs torch single-threaded and each child sets its own count.
A child tells the parent which models it loaded (a pipe); the parent loads them in the loop, between
requests, so that later children find them warm, and drops the least recently used past ``max_memory``
bytes."""

from __future__ import annotations

import contextlib
import importlib
import io
import json
import os
import pickle
import selectors
import signal
import socket
import sys
import time
from collections import OrderedDict
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from hookviz.serve.paths import claim, identity, private_dir

#: What a client's environment may not change in a child: the server's own state.
_KEEP = ("HOOKVIZ_SERVER",)
#: Signals held back while a child is forked (see :meth:`Server._fork`).
_HELD = {signal.SIGINT, signal.SIGTERM}


class Host(Protocol):
    """What the server serves: the command line it runs in its children and the models it keeps warm for them
    (:class:`hookviz.cli.serve.CliHost`). The server itself knows sockets, forks and a memory budget only."""

    def prepare(self) -> None:
        """In the server, before it listens: import what a command would, build what every child reuses."""

    def run(self, argv: list[str]) -> int:
        """In a child: run ``hookviz argv`` and return its exit code."""

    def used(self) -> list[Any]:
        """In a child, after :meth:`run`: what it loaded (picklable), for :meth:`warm`."""

    def warm(self, used: Any) -> tuple[Any, int] | None:
        """In the server: load what a child used (unless kept already) and keep it for the next children; its
        key and bytes (None: not to be kept)."""

    def drop(self, key: Any) -> None:
        """In the server: forget a model kept warm."""

    def describe(self, key: Any) -> str:
        """A kept model, as the log and ``--status`` name it."""


@dataclass
class _Child:
    conn: socket.socket
    report: int  # the read end of the pipe the child names its models on
    started: float


@dataclass
class Server:
    """A server listening at ``path`` (a Unix socket in a folder only the user can open)."""

    path: Path
    host: Host
    #: Seconds without a request after which the server exits (0: never).
    idle_timeout: float = 900.0
    #: Bytes of warm models kept (parameters and buffers); the least recently used go first.
    max_memory: int = 4 * 2**30
    #: Children running at once; more requests wait in the socket's queue.
    max_children: int = max(2, os.cpu_count() or 2)
    log: io.TextIOBase | None = None
    #: Called once the socket listens (a client connecting from then on is served).
    on_listen: Callable[[], None] | None = None
    children: dict[int, _Child] = field(default_factory=dict)
    #: The models kept warm, least recently used first: key -> bytes.
    warm: OrderedDict[Any, int] = field(default_factory=OrderedDict)
    served: int = 0
    _stopping: bool = False
    _threads: int = 1
    _started: float = field(default_factory=time.time)
    _own_fds: list[int] = field(default_factory=list)

    # -- start and stop ---------------------------------------------------------------------------------

    def serve(self) -> None:
        """Listen until stopped or idle; the socket is removed on the way out."""
        import torch

        self._threads = torch.get_num_threads()
        torch.set_num_threads(1)  # see the module's notes: the children get the real count
        self.host.prepare()
        private_dir(self.path.parent)
        claim(self.path)
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        old = os.umask(0o177)
        try:
            listener.bind(str(self.path))  # created 0600
        finally:
            os.umask(old)
        bound = identity(self.path)
        listener.listen(64)
        listener.setblocking(False)
        wake_r, wake_w = os.pipe()
        os.set_blocking(wake_w, False)
        os.set_blocking(wake_r, False)
        signal.set_wakeup_fd(wake_w)
        signal.signal(signal.SIGCHLD, lambda *_: None)
        signal.signal(signal.SIGTERM, lambda *_: self.stop())
        self.selector = selectors.DefaultSelector()
        # What a child must not keep open: the server's own descriptors.
        self._own_fds = [listener.fileno(), wake_r, wake_w, self.selector.fileno()]
        self.selector.register(listener, selectors.EVENT_READ, "accept")
        self.selector.register(wake_r, selectors.EVENT_READ, "wake")
        self._say(f"listening on {self.path} (pid {os.getpid()})")
        if self.on_listen is not None:
            self.on_listen()
        last = time.monotonic()
        try:
            while not (self._stopping and not self.children):
                idle = self.idle_timeout and not self.children and time.monotonic() - last > self.idle_timeout
                if idle:
                    self._say(f"idle for {self.idle_timeout:g} s: exiting")
                    break
                for key, _ in self.selector.select(timeout=1.0):
                    if key.data == "accept":
                        if len(self.children) < self.max_children and not self._stopping:
                            self._accept(listener)
                            last = time.monotonic()
                    elif key.data == "wake":
                        with contextlib.suppress(BlockingIOError):
                            os.read(wake_r, 512)
                    else:
                        self._client_spoke(key.data)
                self._reap()
                if self.children:
                    last = time.monotonic()
        finally:
            signal.set_wakeup_fd(-1)
            for pid in list(self.children):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
            listener.close()
            if bound is not None and identity(self.path) == bound:  # ours still: never another's file
                with contextlib.suppress(FileNotFoundError):
                    self.path.unlink()

    def stop(self) -> None:
        """Finish the requests running, take no more, exit."""
        self._stopping = True

    def _say(self, text: str) -> None:
        if self.log is not None:
            print(f"{time.strftime('%H:%M:%S')} hookviz serve: {text}", file=self.log, flush=True)

    # -- requests -----------------------------------------------------------------------------------------

    def _accept(self, listener: socket.socket) -> None:
        try:
            conn, _ = listener.accept()
        except BlockingIOError:
            return
        conn.setblocking(True)
        conn.settimeout(10.0)
        fds: list[int] = []
        try:
            if not _same_user(conn):
                raise PermissionError("a client of another user")
            data, fds, _, _ = socket.recv_fds(conn, 1 << 20, 3)
            while not data.endswith(b"\n"):
                more = conn.recv(1 << 20)
                if not more:
                    raise ConnectionError("the request was cut short")
                data += more
            request = json.loads(data)
        except (OSError, ValueError) as exc:
            self._say(f"refused a request: {exc}")
            for fd in fds:
                os.close(fd)
            conn.close()
            return
        op = request.get("op")
        if op == "status":
            self._answer(conn, self.status())
        elif op == "stop":
            self._answer(conn, {"stopping": True, "pid": os.getpid()})
            self.stop()
        elif op == "run" and len(fds) == 3:
            self._fork(conn, request, fds)
        else:
            self._answer(conn, {"error": f"unknown request {op!r}"})
        for fd in fds:
            os.close(fd)

    def _answer(self, conn: socket.socket, message: dict[str, Any]) -> None:
        with contextlib.suppress(OSError):
            conn.sendall((json.dumps(message) + "\n").encode())
        conn.close()

    def status(self) -> dict[str, Any]:
        return {
            "pid": os.getpid(),
            "socket": str(self.path),
            "uptime_s": round(time.time() - self._started, 1),
            "served": self.served,
            "running": len(self.children),
            "models": [self.host.describe(k) for k in self.warm],
            "warm_bytes": sum(self.warm.values()),
            "max_memory": self.max_memory,
            "idle_timeout_s": self.idle_timeout,
        }

    def _fork(self, conn: socket.socket, request: dict[str, Any], fds: list[int]) -> None:
        report_r, report_w = os.pipe()
        # A Ctrl-C or stop that reaches the child before it has its own handlers would run the server's in
        # it (its loop's cleanup: the socket unlinked, exit 0 for a cancelled request): held back over the
        # fork, and delivered to the child once it is a command's process.
        mask = signal.pthread_sigmask(signal.SIG_BLOCK, _HELD)
        try:
            pid = os.fork()
        except BaseException:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
            raise
        if pid == 0:  # the child: never returns
            try:
                others = [c.conn.fileno() for c in self.children.values()] + [
                    c.report for c in self.children.values()
                ]
                close = [report_r, conn.fileno(), *self._own_fds, *others]
                _child(self.host, request, fds, report_w, self._threads, close, mask)
            finally:
                os._exit(70)
        signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        os.close(report_w)
        os.set_blocking(report_r, False)  # read once the child has exited; a grandchild may hold it open
        self.served += 1
        self.children[pid] = _Child(conn, report_r, time.monotonic())
        conn.setblocking(False)
        self.selector.register(conn, selectors.EVENT_READ, pid)

    def _client_spoke(self, pid: int) -> None:
        """A waiting client sent a cancel or hung up: interrupt its child (it exits as on Ctrl-C)."""
        child = self.children.get(pid)
        if child is None:
            return
        with contextlib.suppress(OSError):
            data = child.conn.recv(4096)
            if data and b"cancel" not in data:
                return
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGINT)
        with contextlib.suppress(KeyError, ValueError):
            self.selector.unregister(child.conn)

    def _reap(self) -> None:
        while self.children:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                return
            if pid == 0:
                return
            child = self.children.pop(pid, None)
            if child is None:
                continue
            code = os.waitstatus_to_exitcode(status)
            code = 128 - code if code < 0 else code  # killed by a signal: as a shell reports it
            used = _read_report(child.report)
            with contextlib.suppress(KeyError, ValueError):
                self.selector.unregister(child.conn)
            child.conn.setblocking(True)
            self._answer(child.conn, {"exit": code})
            self._say(f"request of pid {pid} exited {code} after {time.monotonic() - child.started:.2f} s")
            for options in used:
                self._keep_warm(options)

    # -- warm models ----------------------------------------------------------------------------------------

    def _keep_warm(self, used: Any) -> None:
        """Keep what a child used warm for the next children (the least recently used dropped past
        ``max_memory``)."""
        try:
            kept = self.host.warm(used)
        except Exception as exc:  # a model that failed in the child fails here too: nothing to keep
            self._say(f"not kept warm: {exc}")
            return
        if kept is None:
            return
        key, size = kept
        new = key not in self.warm
        self.warm[key] = size
        self.warm.move_to_end(key)
        if not new:
            return
        while sum(self.warm.values()) > self.max_memory and len(self.warm) > 1:
            old, _ = self.warm.popitem(last=False)
            self.host.drop(old)
            self._say(f"dropped {self.host.describe(old)} (over the memory budget)")
        self._say(f"keeping {self.host.describe(key)} warm ({size / 2**20:.0f} MB)")


def _same_user(conn: socket.socket) -> bool:
    """Whether the peer of ``conn`` runs as this user (Linux ``SO_PEERCRED``; elsewhere the folder's mode
    keeps others out)."""
    peercred = getattr(socket, "SO_PEERCRED", None)
    if peercred is None:
        return True
    import struct

    creds = conn.getsockopt(socket.SOL_SOCKET, peercred, struct.calcsize("3i"))
    _, uid, _ = struct.unpack("3i", creds)
    return bool(uid == os.getuid())


def _read_report(fd: int) -> list[Any]:
    data = b""
    with contextlib.suppress(OSError):  # BlockingIOError: nothing more now
        while chunk := os.read(fd, 65536):
            data += chunk
    os.close(fd)
    try:
        used = pickle.loads(data) if data else []
    except Exception:
        return []
    return used if isinstance(used, list) else []


def _die_with_parent() -> None:
    """Interrupt this child when the server dies (Linux ``PR_SET_PDEATHSIG``): its client then runs the
    command itself, and must not race a child still writing the same files."""
    with contextlib.suppress(Exception):
        import ctypes

        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGINT)  # PR_SET_PDEATHSIG
    if os.getppid() == 1:  # the server died before the line above
        raise KeyboardInterrupt


def _client_path(request: dict[str, Any]) -> None:
    """Find modules where the client would (``--model pkg.mod:FN`` from its ``PYTHONPATH`` or folder, not the
    server's): its ``sys.path`` when it runs this Python; otherwise the server's with its own ``PYTHONPATH``
    entries swapped for the client's."""
    path = request.get("path")
    if isinstance(path, list) and request.get("prefix") == sys.prefix:
        sys.path[:] = [str(p) for p in path]
    else:
        ours = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
        theirs = [p for p in dict(request.get("env") or {}).get("PYTHONPATH", "").split(os.pathsep) if p]
        sys.path[:] = theirs + [p for p in sys.path if p not in ours or p in theirs]
    importlib.invalidate_caches()


def _child(
    host: Host,
    request: dict[str, Any],
    fds: list[int],
    report: int,
    threads: int,
    close: list[int],
    mask: set[int | signal.Signals] | None = None,
) -> None:
    """Run one request in this forked child and exit with its code. ``mask``: the signal mask to restore
    once the child's own handlers are set (a Ctrl-C held back over the fork arrives then)."""
    code = 70
    try:
        signal.set_wakeup_fd(-1)
        for sig in (signal.SIGCHLD, signal.SIGTERM):
            signal.signal(sig, signal.SIG_DFL)
        signal.signal(signal.SIGINT, signal.default_int_handler)
        if mask is not None:
            signal.pthread_sigmask(signal.SIG_SETMASK, mask)
        # A command's process takes Ctrl-C and stop whatever mask the server was started with (a process that
        # launched it may block them in its threads): a cancelled request must stop.
        signal.pthread_sigmask(signal.SIG_UNBLOCK, _HELD)
        _die_with_parent()
        for fd in close:
            with contextlib.suppress(OSError):
                os.close(fd)
        for target, fd in enumerate(fds):
            os.dup2(fd, target)
        sys.stdin = io.TextIOWrapper(
            io.FileIO(0, "r", closefd=False), encoding="utf-8", errors="surrogateescape"
        )
        for target, name in ((1, "stdout"), (2, "stderr")):
            raw = io.FileIO(target, "w", closefd=False)
            stream = io.TextIOWrapper(raw, encoding="utf-8", errors="backslashreplace", write_through=True)
            setattr(sys, name, stream)
        os.chdir(request["cwd"])
        env = {k: str(v) for k, v in dict(request.get("env") or {}).items()}
        for k in _KEEP:
            env.pop(k, None)
        _client_path(request)  # before the environment is the client's: the server's PYTHONPATH is read
        os.environ.clear()
        os.environ.update(env)
        import torch

        want = env.get("OMP_NUM_THREADS", "")
        torch.set_num_threads(int(want) if want.isdigit() and int(want) > 0 else threads)
        sys.argv = ["hookviz", *request["argv"]]
        try:
            code = host.run(list(request["argv"]))
        except KeyboardInterrupt:
            code = 130
        with contextlib.suppress(Exception):
            os.write(report, pickle.dumps(host.used()))
    except KeyboardInterrupt:  # before the command started: cancelled all the same
        code = 130
    except BaseException as exc:  # the child must not return into the server's loop
        with contextlib.suppress(Exception):
            os.write(2, f"hookviz: error: internal error in the server's child: {exc!r}\n".encode())
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)
