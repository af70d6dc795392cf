""":class:`Monitor` as a Lightning callback: the maps, statistics and gradient norms of a probe batch every N
training steps, logged through the trainer's logger (TensorBoard or W&B; beside a CSV logger's files, a
TensorBoard log of their own), and the first module to turn non-finite.

Example:
    >>> trainer = lightning.Trainer(callbacks=[hookviz.lightning.Monitor(probe=x_val[:4], every=50)])
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch
from lightning.pytorch import Callback, LightningModule, Trainer
from torch import Tensor

from hookviz.training import monitor


class Monitor(Callback):
    """A :class:`hookviz.training.monitor.Monitor` for a Lightning module; the arguments are the same, less
    the model (the module being fitted) and the writer (the trainer's logger's)."""

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
    ) -> None:
        super().__init__()
        self.probe, self.every, self.watch = probe, every, watch
        self.options: dict[str, Any] = {
            "layer": layer, "methods": methods, "labels": labels, "features": features, "stats": stats,
            "images": images,
        }  # fmt: skip
        self.monitor: monitor.Monitor | None = None
        #: The first module that turned non-finite, and the step (None while every value is finite).
        self.first_nonfinite: monitor.Nonfinite | None = None

    def on_fit_start(self, trainer: Trainer, pl_module: LightningModule) -> None:
        if not trainer.is_global_zero:
            return
        writer, log_dir = _writer(trainer)
        labels = self.options["labels"]
        self.monitor = monitor.Monitor(
            pl_module,
            self.probe.to(pl_module.device),
            **{**self.options, "labels": labels.to(pl_module.device) if labels is not None else None},
            every=self.every,
            writer=writer,
            log_dir=log_dir,
            watch=self.watch,
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
