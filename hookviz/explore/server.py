"""The explorer's HTTP side: the standard library's threading server on 127.0.0.1, a random token on
every API request (``?token=`` or ``Authorization: Bearer``; never a cookie, which a browser would send to
every server on 127.0.0.1 whatever its port), the ``Host`` header checked (no DNS rebinding), and nothing
served but the page (static: it keeps the token its address holds in its own origin) and the JSON API over
the session's own inputs.

API (every answer JSON unless said; ``input`` is an index or a name as ``/api/inputs`` lists it):
``/api/inputs``, ``/api/layers``, ``/api/methods``, ``/api/predict?input=&k=``, ``/api/thumb?input=`` (PNG),
``/api/map?input=&layer=&method=&target=&alpha=&colormap=&relu=&format=png|npy|json`` (the PNG and ``.npy``
``hookviz gradcam --save-raw`` writes; ``json``: the record and the command that writes the same PNG),
``/api/trust?`` (the map's view parameters: its deletion and insertion AUC against a random map's),
``/api/channels?input=&layer=`` (the layer's channels, the most active first), ``/api/channel?input=&layer=
&channel=`` (one channel's map over the photo, PNG), ``/api/visualize?layer=&channel=&steps=`` (its feature
visualisation, PNG), ``/api/best?layer=&channel=`` and ``/api/sheet?...`` (its best photos in the
``--channels-run`` folder, and their sheet), ``/api/photo?input=`` (the photo a detector's boxes are measured
on, PNG). A map's view also takes ``box`` (a detector's, from 1), ``frame`` and ``axis`` (a video's frame,
a volume's slice), only from a session where they mean something. Each endpoint takes its own parameters
(:data:`hookviz.explore.params.TAKES`): any other is a 400 naming it and them; a missing resource is a 404.
"""

from __future__ import annotations

import errno
import ipaddress
import json
import re
import secrets
import shlex
import socket
import threading
from collections.abc import Callable, Iterable
from http import HTTPStatus
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from importlib import resources
from typing import Any
from urllib.parse import parse_qs, unquote, urlsplit

from hookviz.errors import HookvizError, UsageError, first_line
from hookviz.explore import features, params
from hookviz.explore.looks import Gone, NotFound
from hookviz.explore.params import Query
from hookviz.explore.session import MAX_UPLOAD, Session
from hookviz.explore.view import Made, View
from hookviz.explore.words import VlmSession
from hookviz.io.outputs import finite
from hookviz.render import COLORMAPS

#: A ``Host`` header: a name or an IPv4 address, or an IPv6 one in brackets, and a port.
_HOST = re.compile(r"(?:\[([0-9A-Fa-f:.]+)\]|([A-Za-z0-9._-]+))(?::\d{1,5})?")


class Explorer(ThreadingHTTPServer):
    """The server of one :class:`Session`; ``url`` is the first address to open (it holds the token)."""

    daemon_threads = True

    def __init__(
        self,
        session: Session | VlmSession,
        host: str = "127.0.0.1",
        port: int = 0,
        token: str | None = None,
        allow_hosts: Iterable[str] = (),
    ):
        """Listen on ``host:port`` (0: a free port). A request's ``Host`` must be an IP address,
        ``localhost``, ``host``, one of ``allow_hosts`` or, listening on every address (``0.0.0.0``, ``::``),
        this machine's name: a page elsewhere reaches the server by DNS rebinding only through a name of its
        own.

        Raises:
            UsageError: the port is in use or not allowed, or the address is not this machine's.
        """
        self.address_family = _family(host)
        try:
            super().__init__((host, port), Handler)
        except OSError as exc:
            raise _unbound(exc, host, port) from None
        self.session, self.token = session, token or secrets.token_urlsafe(24)
        self.latest = 0  # the newest view asked for: an older one still waiting is not made
        self.count = threading.Lock()
        bound = self.server_address[1]
        everywhere = host in ("0.0.0.0", "::", "")
        shown = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(host, host)
        self.names = {"localhost", host.lower(), *(h.lower() for h in allow_hosts)}
        if everywhere:  # what other machines call this one
            self.names |= {socket.gethostname().lower(), socket.getfqdn().lower()}
        self.url = f"http://{_netloc(shown, bound)}/?token={self.token}"

    def serves(self, host: str) -> bool:
        """Whether a request's ``Host`` header names this server (any port: a forwarded one too)."""
        found = _HOST.fullmatch(host)
        if found is None:
            return False
        name = (found[1] or found[2]).lower()
        if name in self.names:
            return True
        try:
            ipaddress.ip_address(name)  # an address is no name a page elsewhere could point here
        except ValueError:
            return False
        return True


def check_address(host: str, port: int) -> None:
    """Raise the error :class:`Explorer` would raise on ``host:port``, before a model takes its time to load.

    Raises:
        UsageError: the port is in use or not allowed, or the address is not this machine's.
    """
    with socket.socket(_family(host), socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # as the server binds
        try:
            probe.bind((host, port))
        except OSError as exc:
            raise _unbound(exc, host, port) from None


def _family(host: str) -> socket.AddressFamily:
    return socket.AF_INET6 if ":" in host else socket.AF_INET


def _netloc(host: str, port: int) -> str:
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _unbound(exc: OSError, host: str, port: int) -> UsageError:
    """The one line for an address the server cannot listen on, naming the fix."""
    why = exc.strerror or first_line(exc)
    if exc.errno == errno.EADDRINUSE:
        return UsageError(f"--port {port}: in use on {host} (another server listens there); give another "
                          "port, or --port 0 for a free one")  # fmt: skip
    if exc.errno == errno.EACCES:
        return UsageError(f"--port {port}: not allowed here ({why}; ports under 1024 need root); "
                          "give one from 1024 up, or --port 0 for a free one")  # fmt: skip
    return UsageError(f"--host {host}: cannot listen there ({why}); give one of this machine's "
                      "addresses: 127.0.0.1 (this machine only) or 0.0.0.0 (every network)")  # fmt: skip


class Handler(BaseHTTPRequestHandler):
    server: Explorer
    protocol_version = "HTTP/1.1"
    # Headers and body go out in separate writes: without this, Nagle's algorithm holds the body back for the
    # client's delayed acknowledgement (40 ms a view on Linux).
    disable_nagle_algorithm = True

    def log_message(self, format: str, *args: Any) -> None:
        return

    # -- answers --------------------------------------------------------------------------------------------
    def _send(self, status: int, body: bytes, kind: str, extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        headers = {"Content-Type": kind, "Content-Length": str(len(body)), "Cache-Control": "no-store",
                   "X-Content-Type-Options": "nosniff", "Referrer-Policy": "no-referrer",
                   **(extra or {})}  # fmt: skip
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def _json(self, data: Any, status: int = 200) -> None:
        self._send(status, json.dumps(finite(data), allow_nan=False).encode(), "application/json")

    def _error(self, status: int, text: str) -> None:
        self._json({"error": text}, status)

    def send_error(self, code: int, message: str | None = None, explain: str | None = None) -> None:
        """The standard library's own refusals (a request line over 64 KiB: 414; too many or too long headers:
        431; a method not served: 501) in the API's one-line JSON, not its HTML page; connection closed."""
        self.close_connection = True
        short = self.responses.get(code, ("error", ""))[0]
        text = " ".join(f"{message or short}{f': {explain}' if explain else ''}".split())  # one line
        if code == HTTPStatus.REQUEST_URI_TOO_LONG:
            text = "the address is over 65,536 characters; shorten the query"
        self._send(code, json.dumps({"error": text}).encode(), "application/json", {"Connection": "close"})

    # -- who may ask --------------------------------------------------------------------------------------
    def _header_token(self) -> str | None:
        scheme, _, value = self.headers.get("Authorization", "").strip().partition(" ")
        return value.strip() if scheme.lower() == "bearer" else None  # the scheme in any case (RFC 9110)

    def _allowed(self, query: dict[str, list[str]], page: bool = False) -> bool:
        for name in ("Host", "Authorization"):  # which one would be meant: refused, never the first taken
            if (times := len(self.headers.get_all(name) or [])) > 1:
                self._error(HTTPStatus.BAD_REQUEST, f"{name} header given {times} times; give it once")
                return False
        if not self.server.serves(self.headers.get("Host", "")):
            self._error(HTTPStatus.FORBIDDEN, "this server answers only its own address (Host header)")
            return False
        if len(query.get("token", [])) > 1:  # which one would be the secret: refused, its values never said
            self._error(HTTPStatus.BAD_REQUEST, f"token given {len(query['token'])} times; give it once")
            return False
        header, asked = self._header_token(), query.get("token", [None])[0]
        if header is not None and asked is not None and header != asked:  # whichever is right: refused
            self._error(HTTPStatus.BAD_REQUEST, "the query's token and Authorization's differ; give one")
            return False
        if page:  # the page holds no secret; a permalink (no token in it) opens it
            return True
        given = asked if asked is not None else header
        if given is None or not secrets.compare_digest(given, self.server.token):
            self._error(HTTPStatus.FORBIDDEN, "open the address hookviz explore printed (it holds the token)")
            return False
        return True

    def do_POST(self) -> None:
        """``/api/upload``: a photo dropped onto the page (its bytes; its name in ``X-Filename``)."""
        parts = urlsplit(self.path)
        query = parse_qs(parts.query)
        size = self._length()
        if size is None:
            return
        # The body is read before any answer, a refusal too: left unread, it would be parsed as the next
        # request on the kept-alive connection, or reset the connection under the answer. One over the limit
        # is not read, and its connection closes after the answer.
        data = self.rfile.read(size) if 0 < size <= MAX_UPLOAD else b""
        self.close_connection = self.close_connection or size > MAX_UPLOAD
        if not self._allowed(query):
            return
        if parts.path != "/api/upload":
            self._error(
                HTTPStatus.NOT_FOUND, f"{parts.path}: nothing to post here (photos go to /api/upload)"
            )
            return
        if self.headers.get("X-Hookviz") != "1":  # a form posted by a page elsewhere cannot set a header
            self._error(
                HTTPStatus.FORBIDDEN,
                "an upload needs the header X-Hookviz: 1 (the explorer's page "
                "sends it; a form from another site cannot, which guards against cross-site requests)",
            )
            return
        if size > MAX_UPLOAD:
            self._error(HTTPStatus.REQUEST_ENTITY_TOO_LARGE, f"{size:,} bytes: {MAX_UPLOAD:,} at most")
            return
        try:
            index = self.server.session.add(unquote(self.headers.get("X-Filename") or "photo"), data)
        except HookvizError as exc:
            self._error(HTTPStatus.BAD_REQUEST, str(exc))
            return
        self._json(self.server.session.inputs()[index])

    def _length(self) -> int | None:
        """The body's length (``Content-Length``); None, answered 400 or 411 and the connection closed, when
        it is not a whole number of bytes in ASCII digits or the body comes in chunks: it cannot be read."""
        given = self.headers.get("Content-Length")
        chunked = "Transfer-Encoding" in self.headers
        if (given is None and not chunked) or (given is not None and given.isascii() and given.isdigit()):
            return int(given or 0)
        self.close_connection = True
        if given is None:
            self._error(HTTPStatus.LENGTH_REQUIRED, "send the photo with a Content-Length, not in chunks")
        else:
            self._error(HTTPStatus.BAD_REQUEST, f"Content-Length {given!r}: a whole number of bytes")
        return None

    def do_HEAD(self) -> None:
        self.do_GET()

    def do_GET(self) -> None:
        parts = urlsplit(self.path)
        query = parse_qs(parts.query)
        if not self._allowed(query, page=parts.path == "/"):
            return
        self._answer(parts.path, query)

    def _answer(self, path: str, query: dict[str, list[str]]) -> None:
        """The route's answer, or its error's (the explorer's page and ``hookviz.widget`` ask alike)."""
        try:
            self._route(path, query)
        except Gone as exc:
            self._error(HTTPStatus.GONE, str(exc))
        except NotFound as exc:
            self._error(HTTPStatus.NOT_FOUND, str(exc))
        except (HookvizError, ValueError) as exc:
            self._error(HTTPStatus.BAD_REQUEST, str(exc))

    # -- what is served -----------------------------------------------------------------------------------
    def _route(self, path: str, query: dict[str, list[str]]) -> None:
        s = self.server.session
        png = "image/png"
        answers: dict[str, Callable[[Query], None]] = {
            "/": lambda q: self._page(),
            "/api/inputs": lambda q: self._json(s.inputs()),
            "/api/layers": lambda q: self._json(s.layers(self._input(q) if "input" in q.one else None)),
            "/api/methods": lambda q: self._json(s.methods()),
            "/api/model": lambda q: self._json(s.describe()),
            "/api/predict": lambda q: self._json(s.predict(self._input(q), q.whole("k", 5, 1, 1000))),
            "/api/thumb": lambda q: self._send(200, s.thumbnail(self._input(q)), png),
            "/api/photo": lambda q: self._send(200, s.photo(self._input(q)), png),
            "/api/map": self._map,
            "/api/trust": lambda q: self._json(s.trust(self._view(q))),
            "/api/channels": lambda q: self._json(s.channel_list(self._input(q), q.text("layer"))),
            "/api/channel": lambda q: self._send(
                200,
                s.channel_png(self._input(q), q.text("layer"), q.whole("channel", 0, 0), self._alpha(q)),
                png,
            ),
            "/api/visualize": lambda q: self._send(
                200,
                s.visualise(q.text("layer"), q.whole("channel", 0, 0), q.whole("steps", 128, 1, 2048)),
                png,
            ),
            "/api/best": lambda q: self._json(s.best(q.text("layer"), q.whole("channel", 0, 0))),
            "/api/sheet": lambda q: self._send(200, s.sheet(q.text("layer"), q.whole("channel", 0, 0)), png),
            **features.routes(s, self._json, self._send, self._input),
        }
        answer = answers.get(path)
        if answer is None:
            raise NotFound(f"{path}: nothing here")
        if path == "/":  # the page reads its own address's parameters
            return answer(Query({}))
        model, task, kind = "the model", "vision-language", "photo"
        if isinstance(s, Session):
            model, task, kind = s.loaded.name, s.loaded.task_name, s.kind.name
        takes, why = params.meaningful(path, task, kind, model)
        answer(Query(query, takes, path, why))

    def _page(self) -> None:
        page = resources.files("hookviz.explore").joinpath("page.html").read_bytes()
        framed = {"Content-Security-Policy": "frame-ancestors 'none'"}  # no page elsewhere wraps it
        self._send(200, page, "text/html; charset=utf-8", framed)

    def _input(self, q: Query) -> int:
        """The input asked for, by index (ASCII digits) or by name as listed; anything else is not found."""
        given = q.text("input", "0")
        names = {item["name"]: item["index"] for item in self.server.session.inputs()}
        if given in names:
            return int(names[given])
        if given.isdigit() and given.isascii() and int(given) < len(names):
            return int(given)
        if given.isdigit() and not given.isascii():  # digits of another script: int() would read them
            raise params.BadParameter(f"input={given!r}: an index in ASCII digits (0 to {len(names) - 1})")
        raise NotFound(f"input={given!r} is not one of this session's inputs: an index from 0 to "
                       f"{len(names) - 1} or a name as /api/inputs lists them")  # fmt: skip

    @staticmethod
    def _alpha(q: Query) -> float:
        return q.number("alpha", 0.5, 0.0, 1.0)

    def _view(self, q: Query) -> View:
        names = [m["name"] for m in self.server.session.methods()]
        view = View(
            input=self._input(q), layer=q.text("layer"), method=params.method(q, names),
            target=params.target(q), box=q.whole("box", 1, 0, what=" (1: the best box; 0: all boxes)"),
            frame=q.whole("frame", -1, -1, what=" (-1: all frames or slices)"), axis=q.whole("axis", 2, 0, 2),
            alpha=self._alpha(q), colormap=q.choice("colormap", "jet", COLORMAPS), relu=q.flag("relu", True),
        )  # fmt: skip
        return view

    def _map(self, q: Query) -> None:
        fmt = q.choice("format", "png", ("png", "npy", "json"))
        view = self._view(q)
        with self.server.count:
            self.server.latest += 1
            mine = self.server.latest
        # The page's views supersede each other (a dragged slider never queues work); a script's do not.
        wanted = (lambda: mine == self.server.latest) if q.flag("supersede", False) else None
        session = self.server.session
        made = session.view(view, wanted, draw=fmt != "npy")
        if made is None:
            self._send(HTTPStatus.NO_CONTENT, b"", "text/plain")
        elif fmt == "png":
            # The page scales the picture to its pane and shows the caption under it beside the map.
            size = made.picture_of(view) if isinstance(made, Made) else None
            picture = {"X-Hookviz-Picture": f"{size[0]}x{size[1]}"} if size else {}
            self._send(200, made.png_of(view), "image/png", picture)
        elif fmt == "npy":
            self._send(200, made.npy_of(view), "application/octet-stream")
        else:
            note = session.note(view.input)
            self._json({"record": made.record_of(view), "command": shlex.join(session.command(view))}
                       | ({"note": note} if note else {}))  # fmt: skip
