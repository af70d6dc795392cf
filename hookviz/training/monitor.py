"""Watching a model train: every N steps the maps of a fixed probe batch, feature-map grids, per-layer
activation statistics and gradient norms, logged to TensorBoard (or a W&B run); and, every step, the first
module whose output or gradient turns non-finite.

It never changes training: its own passes run in eval mode on the probe batch with the model's modes,
buffers, ``requires_grad`` and ``.grad`` restored, under a forked random state (no draw from the training's
generators); between logging steps only cheap owned hooks run, which read each module's output and gradient
and write nothing.

Example:
    >>> monitor = Monitor(model, probe=x_val[:4], every=100, log_dir="runs/exp1")
    >>> for step, (x, y) in enumerate(loader):
    ...     loss = F.cross_entropy(model(x), y); loss.backward(); opt.step(); opt.zero_grad()
    ...     monitor.step(step)
    >>> monitor.close()
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from hookviz.core.arrays import to_numpy
from hookviz.core.hooks import preserved, traced
from hookviz.core.layers import default_cam_layer
from hookviz.engine.explain import explain
from hookviz.engine.features import feature_maps
from hookviz.errors import SetupError, UsageError
from hookviz.io import trackers
from hookviz.io.images import Box
from hookviz.render import enlarge_small, feature_grid, normalize, overlay
from hookviz.training.gradients import gradient_flow
from hookviz.training.watch import Watch

#: Activations whose function has a bound: the bound a unit saturates at.
_BOUNDS: dict[type[nn.Module], float] = {nn.Sigmoid: 1.0, nn.Tanh: 1.0, nn.Hardtanh: 1.0, nn.ReLU6: 6.0}
#: A unit is saturated within this share of its bound.
_SATURATED = 0.99


@dataclass(frozen=True)
class Nonfinite:
    """The first module whose output (forward) or gradient (backward) held NaN or inf, and the step."""

    module: str
    where: str  # "output" or "gradient"
    step: int


class _Sink:
    """A TensorBoard ``SummaryWriter``, a W&B run or an MLflow run, behind one small interface."""

    def __init__(self, writer: Any, tracking_uri: str | None = None) -> None:
        self.writer = writer
        info = getattr(writer, "info", None)
        #: An MLflow run (``mlflow.start_run()``'s, or a ``Run``): logged through a client, by its id.
        self.mlflow_run: str | None = getattr(info, "run_id", None)
        self.wandb = self.mlflow_run is None and hasattr(writer, "log") and not hasattr(writer, "add_scalar")
        if self.mlflow_run is not None:
            from mlflow.tracking import MlflowClient

            self.client = MlflowClient(tracking_uri=tracking_uri)

    def scalar(self, tag: str, value: float, step: int) -> None:
        if self.mlflow_run is not None:
            self.client.log_metric(self.mlflow_run, tag, value, step=step)
        elif self.wandb:
            self.writer.log({tag: value}, step=step)
        else:
            self.writer.add_scalar(tag, value, step)

    def image(self, tag: str, rgb: np.ndarray, step: int) -> None:
        if self.mlflow_run is not None:
            self.client.log_image(self.mlflow_run, rgb, key=tag.replace("/", "."), step=step)
        elif self.wandb:
            import wandb

            self.writer.log({tag: wandb.Image(rgb)}, step=step)
        else:
            self.writer.add_image(tag, rgb, step, dataformats="HWC")

    def histogram(self, tag: str, values: Tensor, step: int) -> None:
        if self.mlflow_run is not None:  # MLflow has no histograms: the counts as a JSON artifact
            tally, edges = np.histogram(to_numpy(values, torch.float32), bins=64)
            self.client.log_dict(
                self.mlflow_run,
                {"step": step, "counts": tally.tolist(), "edges": edges.tolist()},
                f"histograms/{tag}/{step:08d}.json",
            )
        elif self.wandb:
            import wandb

            counts = np.histogram(to_numpy(values), bins=64)
            self.writer.log({tag: wandb.Histogram(np_histogram=counts)}, step=step)
        else:
            self.writer.add_histogram(tag, values, step)

    def text(self, tag: str, text: str, step: int) -> None:
        if self.mlflow_run is not None:
            self.client.log_text(self.mlflow_run, text, f"text/{tag}/{step:08d}.txt")
        elif self.wandb:
            self.writer.log({tag: text}, step=step)
        else:
            self.writer.add_text(tag, text, step)

    def flush(self) -> None:
        if self.mlflow_run is None and not self.wandb:
            self.writer.flush()

    def close(self) -> None:
        """Close a writer the monitor opened (a TensorBoard directory, a tracker run from ``log=``)."""
        if self.mlflow_run is not None:
            self.client.set_terminated(self.mlflow_run, "FINISHED")
        elif self.wandb:
            self.writer.finish()
        else:
            self.writer.close()


def _tracker_run(spec: str) -> tuple[Any, str | None]:
    """``log="mlflow[:URI]"`` or ``"wandb[:PROJECT]"``: a new tracker run the monitor owns (and MLflow's
    tracking URI)."""
    trackers.check_log(spec)
    name, where = trackers.parse_log(spec)
    if name == "wandb":
        import wandb

        return wandb.init(project=where or "hookviz", name="hookviz monitor", reinit="create_new"), None
    client, uri = trackers.mlflow_client(where)
    return client.create_run(trackers.experiment(client), run_name="hookviz monitor"), uri


class Monitor:
    """Logs what a model does to a fixed probe batch while it trains; call :meth:`step` once per step.

    Args:
        model: the model being trained.
        probe: a batch of inputs ``(B, C, H, W)``, as the model takes them (a few validation images).
        layer: the layer whose maps are logged (default: the default CAM layer).
        methods: registered method names (Grad-CAM by default).
        labels: the probe's classes: maps explain them and gradient norms are those of the cross-entropy
            against them; default: the predicted class and its score.
        features: layers whose feature-map grids are logged (none by default).
        stats: layers whose activation statistics are logged (default: every leaf module with parameters,
            and every bounded activation).
        every: log every this many steps (and at step 0).
        log_dir: a TensorBoard directory.
        writer: instead of ``log_dir``, a writer: a ``SummaryWriter``, a W&B run or an MLflow run
            (``mlflow.start_run()``'s).
        log: instead of either, a tracker run the monitor opens and closes: ``"mlflow[:TRACKING_URI]"``
            or ``"wandb[:PROJECT]"`` (as the commands' ``--log``).
        images: the probe as pictures ``(B, H, W, 3)`` uint8 for the overlays (default: the probe scaled).
        watch: watch every module's output and gradient for NaN and inf at every step.
    """

    def __init__(
        self,
        model: nn.Module,
        probe: Tensor,
        *,
        layer: str | None = None,
        methods: Sequence[str] = ("gradcam",),
        labels: Tensor | None = None,
        features: Sequence[str] = (),
        stats: Sequence[str] | None = None,
        every: int = 100,
        log_dir: str | Path | None = None,
        writer: Any = None,
        images: np.ndarray | None = None,
        watch: bool = True,
        log: str | None = None,
    ) -> None:
        if every < 1:
            raise UsageError(f"every={every}: log at least every step (1) or less often")
        if sum(x is not None for x in (log_dir, writer, log)) != 1:
            raise UsageError(
                "give one of log_dir (a TensorBoard directory), writer (a SummaryWriter, a W&B or MLflow "
                "run) or log ('mlflow[:URI]', 'wandb[:PROJECT]')"
            )
        uri = None
        if log is not None:
            writer, uri = _tracker_run(log)
            self._owned = True
        elif writer is None:
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                raise SetupError(
                    "Monitor(log_dir=...) needs tensorboard: pip install 'hookviz[monitor]'"
                ) from None
            writer = SummaryWriter(str(log_dir))
            self._owned = True
        else:
            self._owned = False
        self.model, self.probe, self.every = model, probe.detach(), every
        self.methods, self.labels, self.features = tuple(methods), labels, tuple(features)
        self.sink = _Sink(writer, uri)
        with torch.random.fork_rng(devices=_cuda(probe)):
            calls = traced(model, tuple(probe.shape[1:]), probe.device)
        self.layer = layer or default_cam_layer(model, calls)
        modules = dict(model.named_modules())
        self.stats = list(stats) if stats is not None else [n for n, m in modules.items() if _watched(n, m)]
        self.images = images
        #: The first module that turned non-finite (None while every value is finite).
        self.first_nonfinite: Nonfinite | None = None
        self._watch = Watch(model) if watch else None
        #: Logging parts that failed (maps, features, statistics, gradients) and how often: never raised.
        self.failures: dict[str, int] = {}

    # -- the public steps -------------------------------------------------------------------------------
    def step(self, step: int) -> None:
        """After a training step: check the step's values, and log every ``every`` steps."""
        if self._watch is not None and self.first_nonfinite is None:
            found = self._watch.take()
            if found is not None:
                self.first_nonfinite = Nonfinite(found[0], found[1], step)
                text = f"{found[0]}'s {found[1]} turned non-finite (NaN or inf) at step {step}"
                warnings.warn(f"hookviz.Monitor: {text}", RuntimeWarning, stacklevel=2)
                self.sink.text("hookviz/nonfinite", text, step)
                self._watch.remove()  # the first is named: the watch's work is done
                self._watch = None
        if step % self.every == 0:
            self.log(step)

    def log(self, step: int) -> None:
        """Log the maps, grids, statistics and gradient norms of the probe batch now."""
        paused = self._watch.paused() if self._watch is not None else _nothing()
        with torch.random.fork_rng(devices=_cuda(self.probe)), paused:
            for part in (self._maps, self._features, self._statistics, self._gradients):
                try:
                    part(step)
                except Exception as exc:  # a monitor never stops the training it watches
                    self._failed(part.__name__.strip("_"), exc, step)
        with contextlib.suppress(Exception):
            self.sink.flush()

    def _failed(self, part: str, exc: Exception, step: int) -> None:
        """Say once per part that its logging failed (the training goes on); later failures are counted."""
        self.failures[part] = self.failures.get(part, 0) + 1
        if self.failures[part] > 1:
            return
        text = f"{part} not logged at step {step} ({type(exc).__name__}: {exc}); training goes on"
        warnings.warn(f"hookviz.Monitor: {text}", RuntimeWarning, stacklevel=3)
        with contextlib.suppress(Exception):
            self.sink.text("hookviz/monitor", text, step)

    def close(self) -> None:
        """Remove the hooks; close the writer if this monitor opened it."""
        if self._watch is not None:
            self._watch.remove()
            self._watch = None
        if self._owned:
            self.sink.close()

    def __enter__(self) -> Monitor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- what is logged ---------------------------------------------------------------------------------
    def _maps(self, step: int) -> None:
        ex = explain(self.model, self.probe, [self.layer], self.methods, self.labels)
        if self.images is None:
            self.images = _pictures(self.probe)
        for method in self.methods:
            maps = to_numpy(ex.maps[(method, self.layer)][:, 0])
            for i, cam in enumerate(maps):
                rgb = self.images[i]
                box = Box(0, 0, rgb.shape[1], rgb.shape[0])
                picture = enlarge_small(overlay(rgb, normalize(cam), box), 192)  # small probes enlarged
                self.sink.image(f"maps/{method}/{self.layer}/{i}", picture, step)

    def _features(self, step: int) -> None:
        if not self.features:
            return
        for fm in feature_maps(self.model, self.probe[:1], list(self.features)):
            t = to_numpy(fm.tensor[0], torch.float32)
            grid = feature_grid(t, list(range(min(16, t.shape[0]))), title=f"{fm.layer} at step {step}")
            self.sink.image(f"features/{fm.layer}", grid, step)

    def _statistics(self, step: int) -> None:
        modules = dict(self.model.named_modules())
        for name, out in _outputs(self.model, self.probe, self.stats).items():
            values = out.flatten().float()
            finite = values.isfinite()
            share = 1.0 - float(finite.float().mean()) if values.numel() else 0.0
            self.sink.scalar(f"activations/{name}/nonfinite", share, step)
            if share == 0.0:
                for key, value in activation_stats(out, _BOUNDS.get(type(modules[name]))).items():
                    if value is not None:
                        self.sink.scalar(f"activations/{name}/{key}", value, step)
            if bool(finite.any()):  # a histogram of nothing is an error to TensorBoard
                self.sink.histogram(f"activations/{name}", values[finite], step)

    def _gradients(self, step: int) -> None:
        labels = self.labels

        def loss(logits: Tensor) -> Tensor:
            if labels is not None:
                return F.cross_entropy(logits, labels.to(logits.device))
            return logits.gather(1, logits.argmax(1, keepdim=True)).sum()

        flow = gradient_flow(self.model, self.probe, loss)
        for s in flow.params:
            self.sink.scalar(f"gradients/{s.name}/norm", s.norm, step)


def activation_stats(out: Tensor, bound: float | None = None) -> dict[str, float | None]:
    """A layer's output over a batch: mean, standard deviation, the share of exact zeros, the share of dead
    units (channels zero for every input and position), and, for a bounded activation, the share of values
    within 1 % of the bound (saturated)."""
    x = out.detach().float()
    channels = x.transpose(0, 1).reshape(x.shape[1], -1) if x.dim() > 1 else x[None]
    return {
        "mean": float(x.mean()),
        "std": float(x.std()) if x.numel() > 1 else 0.0,
        "zeros": float((x == 0).float().mean()),
        "dead": float((channels == 0).all(dim=1).float().mean()),
        "saturated": float((x.abs() >= _SATURATED * bound).float().mean()) if bound else None,
    }


class _nothing:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


def _watched(name: str, module: nn.Module) -> bool:
    """A leaf module with parameters, or a bounded activation: the layers whose statistics are logged."""
    if not name or list(module.children()):
        return False
    return any(True for _ in module.parameters(recurse=False)) or type(module) in _BOUNDS


def _cuda(x: Tensor) -> list[int]:
    """The CUDA device whose random state a pass on ``x`` could draw from (none on the CPU)."""
    return [x.device.index or 0] if x.device.type == "cuda" else []


def _outputs(model: nn.Module, x: Tensor, names: Sequence[str]) -> dict[str, Tensor]:
    """Each named module's first output for ``x`` (eval mode, no grad, the model left as found)."""
    modules = dict(model.named_modules())
    got: dict[str, Tensor] = {}
    handles = []

    def keep(name: str) -> Any:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if isinstance(output, Tensor) and name not in got:
                got[name] = output.detach().cpu()

        return hook

    try:
        for name in names:
            handles.append(modules[name].register_forward_hook(keep(name)))
        with preserved(model), torch.no_grad():
            model.eval()
            model(x)
    finally:
        for h in handles:
            h.remove()
    return got


def _pictures(x: Tensor) -> np.ndarray:
    """A batch of inputs as pictures ``(B, H, W, 3)`` uint8, each scaled to its own range."""
    out = []
    for img in x.detach().float().cpu():
        a = normalize(to_numpy(img))
        a = np.repeat(a[:1], 3, axis=0) if a.shape[0] != 3 else a
        out.append((a.transpose(1, 2, 0) * 255).round().astype(np.uint8))
    return np.stack(out)
