""":class:`Monitor` as a Lightning callback: the maps, statistics and gradient norms of a probe batch every N
training steps, logged through the trainer's logger (TensorBoard or W&B; beside a CSV logger's files, a
TensorBoard log of their own), and the first module to turn non-finite.

A LightningModule need not define ``forward`` (many call ``self.model`` in ``training_step``): the callback
then watches the submodule that owns ``layer``, or the one child that holds the parameters, or ``module=``.
When there is none to run, it says so once and the training goes on, as with its other failures.

Example:
    >>> trainer = lightning.Trainer(callbacks=[hookviz.lightning.Monitor(probe=x_val[:4], every=50)])
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from torch import Tensor, nn

from hookviz.errors import UsageError
from hookviz.training import monitor


class Monitor(Callback):
    """A :class:`hookviz.training.monitor.Monitor` for a Lightning module; the arguments are the same, less
    the model and the writer (the trainer's logger's, unless ``log`` names a tracker run of its own).

    The model watched is the LightningModule being fitted when it defines ``forward``; otherwise its
    submodule that owns ``layer`` (``layer="net.layer4"``: ``net``), or the one child that holds
    parameters. ``module=`` names it instead (``"net"``, a dotted path inside the LightningModule); ``layer``,
    ``features`` and ``stats`` may be named from the LightningModule (``"net.layer4"``) or from that
    module (``"layer4"``); logged names are that module's own. A module that cannot be watched is said
    once (a ``RuntimeWarning``) and the training goes on unwatched.
    """

    def __init__(
        self,
        probe: Tensor,
        *,
        layer: str | None = None,
        methods: Sequence[str] = ("gradcam",),
        labels: Tensor | None = None,
        features: Sequence[str] = (),
        stats: Sequence[str] | None = None,
        every: int = 100,
        images: np.ndarray | None = None,
        watch: bool = True,
        module: str | None = None,
        log: str | None = None,
    ) -> None:
        super().__init__()
        self.probe, self.every, self.watch, self.module = probe, every, watch, module
        #: A tracker run of the monitor's own (``"mlflow[:URI]"``, ``"wandb[:PROJECT]"``) instead of the
        #: trainer's logger.
        self.tracker = log
        self.options: dict[str, Any] = {
            "layer": layer, "methods": methods, "labels": labels, "features": features, "stats": stats,
            "images": images,
        }  # fmt: skip
        self.monitor: monitor.Monitor | None = None
        #: The first module that turned non-finite, and the step (None while every value is finite).
        self.first_nonfinite: monitor.Nonfinite | None = None
        #: Why nothing is watched, when the monitor could not start (None while it runs).
        self.not_started: str | None = None

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        try:
            name, model = _watched_module(pl_module, self.module, self.options["layer"])
            writer, log_dir = (None, None) if self.tracker else _writer(trainer)
            labels = self.options["labels"]
            options = {
                **self.options,
                "labels": labels.to(pl_module.device) if labels is not None else None,
                "layer": _inside(self.options["layer"], name),
                "features": [_inside(f, name) for f in self.options["features"]],
                "stats": [_inside(s, name) for s in self.options["stats"]] if self.options["stats"] else None,
            }
            self.monitor = monitor.Monitor(
                model,
                self.probe.to(pl_module.device),
                **options,
                every=self.every,
                writer=writer,
                log_dir=log_dir,
                watch=self.watch,
                log=self.tracker,
            )
        except Exception as exc:  # a monitor never stops the training it watches
            self.monitor = None
            self.not_started = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            warnings.warn(
                f"hookviz.lightning.Monitor: not watching {type(pl_module).__name__} ({self.not_started}); "
                "the training goes on (module= names the submodule to watch)",
                RuntimeWarning,
                stacklevel=2,
            )

    def on_train_batch_end(
        self, trainer: Trainer, pl_module: LightningModule, outputs: Any, batch: Any, batch_idx: int
    ) -> None:
        if self.monitor is None:
            return
        # Lightning may have turned gradients off around the hook: the monitor's own pass needs them.
        with torch.inference_mode(False), torch.enable_grad():
            self.monitor.step(trainer.global_step - 1)  # the optimizer steps taken, counting from 0
        self.first_nonfinite = self.monitor.first_nonfinite

    def teardown(self, trainer: Trainer, pl_module: LightningModule, stage: str) -> None:
        if self.monitor is not None:
            self.monitor.close()
            self.monitor = None


def _watched_module(
    pl_module: LightningModule, module: str | None, layer: str | None
) -> tuple[str, nn.Module]:
    """The module to watch and its dotted name inside ``pl_module`` ("" for ``pl_module`` itself): ``module``
    when named; ``pl_module`` when it defines ``forward``; else the child owning ``layer``, or the one child
    holding parameters.

    Raises:
        UsageError: ``module`` names no submodule, or there is no module to watch.
    """
    modules = dict(pl_module.named_modules())
    if module is not None:
        if module not in modules:
            raise UsageError(f"module={module!r} is not a submodule of {type(pl_module).__name__}")
        return module, modules[module]
    if type(pl_module).forward is not LightningModule.forward:
        return "", pl_module
    children = dict(pl_module.named_children())
    if layer is not None and layer.split(".")[0] in children and layer not in children:
        head = layer.split(".")[0]
        return head, children[head]
    holding = [n for n, c in children.items() if any(True for _ in c.parameters())]
    if len(holding) == 1:
        return holding[0], children[holding[0]]
    why = f"its children {', '.join(holding)} all hold parameters" if holding else "no child holds parameters"
    name = type(pl_module).__name__
    raise UsageError(f"{name} defines no forward and {why}: name the one to watch with module=")


def _inside(name: str | None, module: str) -> str | None:
    """A layer named from the LightningModule, as named inside the watched ``module`` (unchanged when it is
    named from the module already)."""
    if name is None or not module:
        return name
    return name[len(module) + 1 :] if name.startswith(module + ".") else name


def _writer(trainer: Trainer) -> tuple[Any, Path | None]:
    """The trainer's logger's writer (a TensorBoard ``SummaryWriter`` or a W&B run), or a TensorBoard folder
    beside another logger's files (or in the trainer's root folder)."""
    logger = trainer.logger
    experiment = getattr(logger, "experiment", None) if logger is not None else None
    # The CSV logger's writer takes no images: a TensorBoard folder beside its files instead.
    usable = experiment is not None and (hasattr(experiment, "add_scalar") or hasattr(experiment, "log"))
    if usable and type(experiment).__name__ != "_ExperimentWriter":
        return experiment, None
    base = Path(getattr(logger, "log_dir", None) or trainer.default_root_dir)
    return None, base / "hookviz"
