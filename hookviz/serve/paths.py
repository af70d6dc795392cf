"""Where a user's server listens, and whether a socket there can be trusted.

The socket is ``$XDG_RUNTIME_DIR/hookviz/server.sock`` (a per-user folder the system empties at logout),
else ``$XDG_CACHE_HOME/hookviz/server.sock`` (``~/.cache``). Its folder is created with mode 0700 and must
be owned by the user and closed to everyone else; the socket itself is 0600. ``HOOKVIZ_SERVER=PATH`` names
another socket, ``HOOKVIZ_SERVER=none`` turns the server off for a command. No TCP: nothing listens beyond
this machine's user."""

from __future__ import annotations

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

    Raises:
        PermissionError: the folder exists but is not the user's own or is open to others.
    """
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    st = os.lstat(path)
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid():
        raise PermissionError(f"{path}: not a folder of this user's; choose another with --socket")
    if st.st_mode & 0o077:
        os.chmod(path, 0o700)  # ours: close it
    return path


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
