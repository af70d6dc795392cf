"""``hookviz.widget``: the explorer inside a notebook (JupyterLab, VS Code, Colab), on anywidget.

The widget is the explorer's session and routes with the kernel's comm in place of HTTP: the front end
(``widget.js``) asks ``/api/...`` paths as the explorer's page does, and each is answered by the explorer's
own :class:`hookviz.explore.server.Handler` routes (the same parameter checks, the same PNGs ``hookviz
gradcam`` writes). No server, no port, no URL outside the notebook.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from hookviz.errors import SetupError, UsageError
from hookviz.explore.server import Handler
from hookviz.explore.session import Session
from hookviz.models.loaded import LoadedModel
from hookviz.models.sources import WEIGHTS_DEFAULT
from hookviz.tasks.api import load_model

try:
    import anywidget
    import traitlets

    HAVE_ANYWIDGET = True
except ImportError:  # the message widget() gives says what to install
    HAVE_ANYWIDGET = False

__all__ = ["widget"]

HERE = Path(__file__).parent


class _Host:
    """What the explorer's routes read of their server: the session, and the views' order."""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.count = threading.Lock()
        self.latest = 0


class _Call(Handler):
    """One of the front end's requests, answered by the explorer's routes without a socket."""

    def __init__(self, host: _Host) -> None:  # no request to parse: the path comes from the comm
        self.server = host  # type: ignore[assignment]
        self.command = "GET"
        self.answer: tuple[int, str, bytes, dict[str, str]] = (500, "text/plain", b"", {})

    def _send(self, status: int, body: bytes, kind: str, extra: dict[str, str] | None = None) -> None:
        self.answer = (int(status), kind, body, extra or {})


def answer(host: _Host, path: str) -> tuple[dict[str, Any], list[bytes]]:
    """The message and buffers answering the front end's ``path`` (JSON in the message, a PNG in a buffer)."""
    parts = urlsplit(path)
    if not parts.path.startswith("/api/"):
        return {"status": 404, "error": f"{parts.path}: the widget answers /api/ paths only"}, []
    call = _Call(host)
    call._answer(parts.path, parse_qs(parts.query))
    status, kind, body, extra = call.answer
    if kind == "application/json":
        data = json.loads(body)
        message = {"status": status, "json": data}
        if status >= 400:
            message["error"] = data.get("error", "") if isinstance(data, dict) else str(data)
        return message, []
    return {"status": status, "kind": kind, "headers": extra}, [body]


def _kernel() -> bool:
    try:
        from IPython import get_ipython
    except ImportError:
        return False
    shell = get_ipython()
    return shell is not None and getattr(shell, "kernel", None) is not None


if HAVE_ANYWIDGET:

    class ExploreWidget(anywidget.AnyWidget):
        """The explorer in a notebook cell: photo, layer, method and class pickers over the map."""

        _esm = HERE / "widget.js"
        _css = HERE / "widget.css"
        #: The model's name and weights, as the pickers' heading shows them.
        title = traitlets.Unicode("").tag(sync=True)

        def __init__(self, session: Session, **kwargs: Any) -> None:
            super().__init__(**kwargs)
            self.session = session
            self._host = _Host(session)
            self.title = f"{session.loaded.name} · {session.describe()['weights']}"
            self.on_msg(self._on_message)

        def _on_message(self, _widget: Any, content: Any, _buffers: Any) -> None:
            if not isinstance(content, dict):
                return  # not a request of the front end's: nothing to answer it by
            if not isinstance(content.get("path"), str):
                self.send({"id": content.get("id"), "status": 400, "error": "a request names a path"})
                return
            try:
                message, buffers = answer(self._host, str(content["path"]))
            except Exception as exc:  # a widget never raises into the kernel's comm loop
                message, buffers = {"status": 500, "error": f"{type(exc).__name__}: {exc}"}, []
            self.send({"id": content.get("id"), **message}, buffers=buffers)

        def close(self) -> None:
            """Close the widget and its session (its dropped photos, its model thread)."""
            self.session.close()
            super().close()


def widget(
    inputs: str | Path | list[str | Path],
    model: Any = "efficientnet_lite0",
    *,
    weights: str | None = None,
    device: str = "cpu",
    **options: Any,
) -> Any:
    """The explorer as a notebook widget: pick a photo, a layer, a method and a class; the map is the PNG
    ``hookviz gradcam`` writes for them, computed by the kernel.

    Args:
        inputs: photos, folders or globs (as ``hookviz explore`` takes them).
        model: a model name or spec (``resnet18``, ``timm:NAME``, ``net.py:make``), or a loaded model
            (:func:`hookviz.load_model`'s).
        weights, device, options: as :func:`hookviz.load_model` takes them (when ``model`` is a name).

    Raises:
        SetupError: anywidget is not installed (``pip install 'hookviz[notebook]'``).
        UsageError: no notebook kernel runs this (from a shell, ``hookviz explore`` serves the same views).

    Examples:
        >>> import hookviz
        >>> hookviz.widget("sample_images/", model="efficientnet_lite0")  # the last line of a cell
    """
    if not HAVE_ANYWIDGET:
        raise SetupError("hookviz.widget needs anywidget: pip install 'hookviz[notebook]'")
    if not _kernel():
        raise UsageError(
            "hookviz.widget needs a notebook kernel (JupyterLab, VS Code, Colab); from a shell, "
            "hookviz explore PHOTOS serves the same views in the browser"
        )
    if isinstance(model, LoadedModel):
        loaded = model
    else:
        loaded = load_model(model, weights or WEIGHTS_DEFAULT, device=device, **options)
    specs = [str(p) for p in (inputs if isinstance(inputs, list) else [inputs])]
    return ExploreWidget(Session(loaded, specs, model_words=model_words(loaded, weights, options)))


def model_words(loaded: LoadedModel, weights: str | None, options: dict[str, Any]) -> list[str]:
    """The command-line words that load the same model (the caption's ``hookviz gradcam`` line draws the
    same map): the name, the weights and every option given that the command line takes."""
    words = ["--model", loaded.name, "--weights", weights or loaded.weights.split(" ")[0]]
    flags = {"input_size": "--input-size", "resize": "--resize", "labels": "--labels", "head": "--head",
             "task": "--task", "weights_key": "--weights-key", "output": "--output"}  # fmt: skip
    for key, value in options.items():
        if key in ("mean", "std") and value is not None:
            words += [f"--{key}", ",".join(str(v) for v in value)]
        elif key in flags and value is not None:
            given = ",".join(map(str, value)) if isinstance(value, list | tuple) else str(value)
            words += [flags[key], given]
        elif key == "negate" and value:
            words.append("--negate")
    return words
