"""What hookviz holds while it works on someone else's model, so that the model is left as found: one lock per
model (:func:`model_lock`), every module's mode and every parameter's ``requires_grad`` and ``.grad``
(:func:`preserved`), every hook handle (:class:`HookGroup`), the caller's grad mode
(:func:`autograd_enabled`), and the eager module behind a ``torch.compile``d one (:func:`unwrap_compiled`).

:mod:`hookviz.core.hooks` (capture) and :mod:`hookviz.core.trace` (traced shapes) build on these.
"""

from __future__ import annotations

import threading
import warnings
import weakref
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from typing_extensions import Self

import torch
from torch import Tensor, nn

from hookviz.errors import UsageError

_LOCKS: weakref.WeakKeyDictionary[nn.Module, threading.RLock] = weakref.WeakKeyDictionary()
_LOCKS_GUARD = threading.Lock()


def model_lock(model: nn.Module) -> threading.RLock:
    """The one re-entrant lock of ``model``: hooks are per module, not per thread, so two threads explaining
    one model would see each other's hooks fire (a false "runs more than once"). hookviz holds it while
    its hooks are on a model and while it runs a model it explains; other threads wait."""
    with _LOCKS_GUARD:
        lock = _LOCKS.get(model)
        if lock is None:
            lock = _LOCKS[model] = threading.RLock()
        return lock


@contextmanager
def serialised(model: nn.Module) -> Iterator[None]:
    """Hold :func:`model_lock` for the block."""
    with model_lock(model):
        yield


@contextmanager
def preserved(model: nn.Module, *, buffers: bool = False) -> Iterator[nn.Module]:
    """Leave ``model`` exactly as found: per-module mode, ``requires_grad`` and ``.grad`` of every parameter,
    and with ``buffers`` the values of every buffer (a training-mode forward updates BatchNorm's running
    statistics and ``num_batches_tracked``).

    Examples:
        >>> with preserved(model):
        ...     model.eval()
        ...     model(x)
    """
    modes = [(m, m.training) for m in model.modules()]
    params = [(p, p.requires_grad, p.grad) for p in model.parameters()]
    saved = [(b, b.detach().clone()) for b in model.buffers()] if buffers else []
    try:
        yield model
    finally:
        with torch.no_grad():
            for b, value in saved:
                b.copy_(value)
        for m, training in modes:
            m.training = training
        for p, requires_grad, grad in params:
            if p.requires_grad != requires_grad:
                p.requires_grad_(requires_grad)
            if p.grad is not grad:
                p.grad = grad


class HookGroup:
    """Owns hook handles: ``add`` keeps one, ``remove()`` takes them all off (last first); a context
    manager that removes on exit. The one way hookviz holds a ``RemovableHandle``."""

    def __init__(self, handles: list[Any] | None = None) -> None:
        self._handles: list[Any] = list(handles or [])

    def add(self, handle: Any) -> Any:
        """Keep ``handle`` (what ``register_*_hook`` returned) to remove later; returns it."""
        self._handles.append(handle)
        return handle

    def __len__(self) -> int:
        return len(self._handles)

    def remove(self) -> None:
        while self._handles:
            self._handles.pop().remove()

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()


@contextmanager
def autograd_enabled(x: Tensor) -> Iterator[Tensor]:
    """Gradients on inside, whatever the caller's mode (``no_grad``, ``inference_mode``); restored after.

    Users wrap inference in ``torch.no_grad()`` or ``torch.inference_mode()`` out of habit; a call that
    needs gradients turns them back on for itself. An input made under inference mode is cloned into
    an ordinary tensor (autograd cannot record inference tensors). A model whose own parameters or
    buffers were made under inference mode cannot be differentiated at all: that is a clear error.

    Raises:
        UsageError: the model's tensors are inference tensors.
    """

    try:
        with torch.inference_mode(False), torch.enable_grad():
            yield x.clone() if x.is_inference() else x
    except RuntimeError as exc:
        if "Inference tensors" not in str(exc):
            raise
        raise UsageError(
            "the model's parameters or buffers were made under torch.inference_mode(), so autograd cannot "
            "use them; create or load the model outside inference mode (torch.no_grad() is fine)"
        ) from None


def unwrap_compiled(model: nn.Module) -> nn.Module:
    """The original module of a ``torch.compile``d model (hooks do not run inside a compiled graph).

    Says so once, as a warning (the CLI shows it as one line); any other module is returned as is.
    """
    original = getattr(model, "_orig_mod", None)
    if isinstance(original, nn.Module) and type(model).__name__ == "OptimizedModule":
        warnings.warn(
            f"{type(original).__name__} is torch.compile'd; hookviz runs its original eager module, "
            "since Python hooks do not run inside a compiled graph",
            UserWarning,
            stacklevel=3,
        )
        return original
    return model
