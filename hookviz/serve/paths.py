"""Where a user's server listens, and whether a socket there can be trusted.

The socket is ``$XDG_RUNTIME_DIR/hookviz/server.sock`` (a per-user folder the system empties at logout),
else ``$XDG_CACHE_HOME/hookviz/server.sock`` (``~/.cache``). Its folder is created with mode 0700 and must
be owned by the user and closed to everyone else (one that exists is never changed); the socket is 0600.
``HOOKVIZ_SERVER=PATH`` names another socket, ``HOOKVIZ_SERVER=none`` turns the server off for a command. No
TCP: nothing listens beyond this machine's user."""

from __future__ import annotations

import contextlib
import os
import stat
from collections.abc import Mapping
from pathlib import Path

SOCKET_NAME = "server.sock"
OFF = ("none", "off", "0", "no", "false")


def socket_dir(env: Mapping[str, str] = os.environ) -> Path:
    """The folder of the user's default socket."""
    runtime = env.get("XDG_RUNTIME_DIR")
    if runtime and os.path.isdir(runtime):
        return Path(runtime) / "hookviz"
    cache = env.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(cache) / "hookviz"


def server_socket(env: Mapping[str, str] = os.environ) -> Path | None:
    """The socket a command should use (None: the server is turned off)."""
    named = env.get("HOOKVIZ_SERVER")
    if named is not None and named.strip().lower() in OFF:
        return None
    return Path(named) if named else socket_dir(env) / SOCKET_NAME


def private_dir(path: Path) -> Path:
    """``path`` created (mode 0700) if missing, and checked: a folder, the user's, closed to group and others.

    A folder that exists is never changed (a team folder keeps its mode, setgid and sticky bits): one open to
    others is refused.

    Raises:
        PermissionError: the folder exists but is not the user's own or is open to others.
    """
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise PermissionError(f"{path}: not a folder of this user's; choose another with --socket")
    if st.st_mode & 0o077:
        raise PermissionError(
            f"{path} is open to others (mode {stat.S_IMODE(st.st_mode):o}) and hookviz changes no folder it "
            "did not create: put the socket in a folder only you can open (mkdir -m 700 DIR; --socket "
            "DIR/server.sock)"
        )
    return path


def claim(sock: Path) -> None:
    """Make way for a socket at ``sock``: a stale socket of this user's is removed, anything else refused.

    Raises:
        PermissionError: something other than this user's socket is there (a file, a folder, a link).
    """
    try:
        st = os.lstat(sock)
    except FileNotFoundError:
        return
    if not (stat.S_ISSOCK(st.st_mode) and st.st_uid == os.getuid()):
        raise PermissionError(
            f"{sock} exists and is not a socket of yours: hookviz replaces nothing else; name another "
            "--socket"
        )
    with contextlib.suppress(FileNotFoundError):
        sock.unlink()  # a socket left by a server that died (a live one answered the caller's check)


def identity(sock: Path) -> tuple[int, int] | None:
    """The (device, inode) of the socket at ``sock``, None when there is none."""
    try:
        st = os.lstat(sock)
    except OSError:
        return None
    return (st.st_dev, st.st_ino) if stat.S_ISSOCK(st.st_mode) else None


def trusted(sock: Path) -> bool:
    """Whether ``sock`` is a socket of this user's in a folder only this user can open."""
    try:
        st, parent = os.lstat(sock), os.lstat(sock.parent)
    except OSError:
        return False
    uid = os.getuid()
    return (
        stat.S_ISSOCK(st.st_mode)
        and st.st_uid == uid
        and parent.st_uid == uid
        and not parent.st_mode & 0o077
        and not st.st_mode & 0o077
    )
