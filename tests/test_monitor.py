"""The training monitor: training with it is bit-identical to training without it (a plain loop and
Lightning), the events read back from TensorBoard hold the maps at steps 0, N, 2N and each layer's figures
equal a direct computation, and the first module to turn non-finite is named with its step."""

from __future__ import annotations

import io
import os
import sys
import warnings
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from hookviz.errors import UsageError
from hookviz.io.shapes import shapes_batch
from hookviz.training.monitor import Monitor, Nonfinite, activation_stats
from tests.conftest import ROOT, TinyCNN, hook_counts, run_cli

pytestmark = [
    # TensorBoard, Lightning and W&B warn about their own dependencies on import.
    pytest.mark.filterwarnings("ignore::DeprecationWarning"),
    pytest.mark.filterwarnings("ignore::UserWarning"),
    pytest.mark.filterwarnings("ignore::FutureWarning"),
]


def _probe() -> tuple[torch.Tensor, torch.Tensor]:
    x, y, _ = shapes_batch(4, np.random.default_rng(9))
    return x, y


def _train(
    steps: int, monitor: dict[str, Any] | None = None, model: nn.Module | None = None
) -> tuple[nn.Module, Any]:
    """A seeded training loop that draws from the global generator every step (input noise, dropout)."""
    torch.manual_seed(0)
    model = nn.Sequential(TinyCNN(), nn.Dropout(0.2))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    rng = np.random.default_rng(0)
    mon = Monitor(model, *_probe()[:1], **monitor) if monitor is not None else None
    model.train()
    for step in range(steps):
        x, y, _ = shapes_batch(16, rng)
        loss = F.cross_entropy(model(x + 0.01 * torch.randn_like(x)), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if mon is not None:
            mon.step(step)
    if mon is not None:
        mon.close()
    return model, mon


def _events(folder: Path) -> Any:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    found = {p.parent for p in folder.rglob("events.out.tfevents.*")}
    assert len(found) == 1, found
    ea = EventAccumulator(str(found.pop()), size_guidance={"images": 0, "scalars": 0, "histograms": 0})
    ea.Reload()
    return ea


def test_training_with_the_monitor_is_bit_identical(tmp_path: Path) -> None:
    plain, _ = _train(12)
    _, y = _probe()
    watched, mon = _train(12, {"labels": y, "every": 4, "log_dir": tmp_path, "features": ["0.features.4"]})
    for (name, a), b in zip(plain.state_dict().items(), watched.state_dict().values(), strict=True):
        assert torch.equal(a, b), name  # parameters and BatchNorm's running statistics alike
    assert hook_counts(watched) == 0 and mon.first_nonfinite is None
    ea = _events(tmp_path)
    images = ea.Tags()["images"]
    assert "maps/gradcam/0.features/0" in images and "features/0.features.4" in images
    assert [e.step for e in ea.Images("maps/gradcam/0.features/0")] == [0, 4, 8]
    scalars = ea.Tags()["scalars"]
    for layer in ("0.features.0", "0.features.1", "0.fc"):  # conv, BatchNorm, the head
        assert f"activations/{layer}/mean" in scalars and f"gradients/{layer}.weight/norm" in scalars
    assert "activations/0.features.0" in ea.Tags()["histograms"]


def test_logged_figures_equal_a_direct_computation(tmp_path: Path) -> None:
    torch.manual_seed(1)
    model = TinyCNN().eval()
    x, y = _probe()
    with Monitor(model, x, labels=y, every=1, log_dir=tmp_path) as mon:
        mon.log(7)
    ea = _events(tmp_path)
    outputs: dict[str, torch.Tensor] = {}
    handle = model.features[0].register_forward_hook(lambda m, a, o: outputs.setdefault("conv", o.detach()))
    with torch.no_grad():
        model(x)
    handle.remove()
    conv = outputs["conv"]
    got = {k: ea.Scalars(f"activations/features.0/{k}")[0].value for k in ("mean", "std", "zeros", "dead")}
    assert got["mean"] == pytest.approx(float(conv.mean()), rel=1e-5)
    assert got["std"] == pytest.approx(float(conv.std()), rel=1e-5)
    dead = float((conv.transpose(0, 1).reshape(conv.shape[1], -1) == 0).all(1).float().mean())
    assert got["zeros"] == pytest.approx(float((conv == 0).float().mean())) and got["dead"] == pytest.approx(
        dead
    )
    # The gradient norm: of the cross-entropy against the probe's labels, w.r.t. the head's weight.
    loss = F.cross_entropy(model(x), y)
    (g,) = torch.autograd.grad(loss, [model.fc.weight])
    assert ea.Scalars("gradients/fc.weight/norm")[0].value == pytest.approx(float(g.norm()), rel=1e-4)
    assert model.fc.weight.grad is None  # the monitor's pass left .grad alone
    # The map: Grad-CAM of the probe's class over the probe, a 48 px picture enlarged 4 times (nearest).
    (image,) = ea.Images("maps/gradcam/features/0")
    assert (image.step, image.width, image.height) == (7, 192, 192)
    from PIL import Image

    from hookviz.engine.explain import explain
    from hookviz.io.images import Box
    from hookviz.render import normalize, overlay

    cam = explain(model, x, ["features"], ["gradcam"], y).maps[("gradcam", "features")][0, 0].numpy()
    photo = (x[0].numpy().transpose(1, 2, 0) * 255).round().astype(np.uint8)  # the probe is in [0, 1]
    expected = overlay(photo, normalize(cam), Box(0, 0, 48, 48))
    got = np.asarray(Image.open(io.BytesIO(image.encoded_image_string)).convert("RGB"))[::4, ::4]
    assert np.abs(got.astype(int) - expected.astype(int)).max() <= 2


def test_activation_statistics_of_bounded_and_dead_units() -> None:
    out = torch.zeros(2, 3, 4, 4)
    out[:, 0] = 0.995  # a saturated tanh channel
    out[:, 1, 0, 0] = 0.5  # alive at one place
    stats = activation_stats(out, bound=1.0)
    assert stats["dead"] == pytest.approx(1 / 3) and stats["saturated"] == pytest.approx(1 / 3)
    assert stats["zeros"] == pytest.approx(1 - (32 + 2) / 96)
    assert activation_stats(out)["saturated"] is None  # an unbounded layer has no saturation


class _NanForward(nn.Module):
    """Multiplies by NaN once armed: the module to be named."""

    armed = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * float("nan") if self.armed else x


class _NanBackward(torch.autograd.Function):
    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        return x.clone()

    @staticmethod
    def backward(ctx: Any, g: torch.Tensor) -> torch.Tensor:
        return g * float("nan")


class _NanGradient(nn.Module):
    """Finite forward; passes NaN back once armed."""

    armed = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return _NanBackward.apply(x) if self.armed else x


@pytest.mark.parametrize(("bomb", "where", "at"), [(_NanForward, "output", 5), (_NanGradient, "gradient", 3)])
def test_the_first_module_to_turn_non_finite_is_named_with_its_step(
    bomb: type[nn.Module], where: str, at: int, tmp_path: Path
) -> None:
    torch.manual_seed(0)
    model = TinyCNN()
    model.features.insert(4, bomb())  # after the first conv-bn-relu-pool: what comes after inherits its NaN
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    rng = np.random.default_rng(0)
    said = f"features.4's {where} turned non-finite .* at step {at}"
    with (
        pytest.warns(RuntimeWarning, match=said),
        Monitor(model, _probe()[0], every=100, log_dir=tmp_path) as mon,
    ):
        model.train()
        for step in range(at + 3):
            model.features[4].armed = step == at
            x, y, _ = shapes_batch(8, rng)
            loss = F.cross_entropy(model(x), y)
            opt.zero_grad()
            loss.backward()
            opt.step()
            mon.step(step)
            if step == at:  # named: the watch is removed, nothing accumulates after
                assert hook_counts(model) == 0
    assert mon.first_nonfinite == Nonfinite("features.4", where, at)
    (event,) = _events(tmp_path).Tensors("hookviz/nonfinite/text_summary")
    assert event.step == at


def test_an_attention_mask_of_minus_infinity_raises_nothing(tmp_path: Path) -> None:
    """-inf inside the model that leaves its output finite (a masked softmax) is not a non-finite output."""

    class MaskDiagonal(nn.Module):  # a leaf whose output holds -inf on purpose
        def forward(self, s: torch.Tensor) -> torch.Tensor:
            return s.masked_fill(torch.eye(s.shape[-1], dtype=torch.bool), float("-inf"))

    model = nn.Sequential(nn.Linear(4, 4), MaskDiagonal(), nn.Softmax(-1))
    with warnings.catch_warnings():
        warnings.simplefilter("error", RuntimeWarning)
        with Monitor(model, torch.randn(2, 4, 4), layer="0", every=100, log_dir=tmp_path) as mon:
            for step in range(3):
                model(torch.randn(5, 4, 4)).pow(2).sum().backward()
                mon.step(step + 1)
    assert mon.first_nonfinite is None


def test_without_tensorboard_a_log_dir_is_one_line(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:

    from hookviz.errors import SetupError

    monkeypatch.setitem(sys.modules, "torch.utils.tensorboard", None)  # as if it were not installed
    with pytest.raises(SetupError, match=r"needs tensorboard: pip install 'hookviz\[monitor\]'"):
        Monitor(TinyCNN(), _probe()[0], log_dir=tmp_path)


def test_bad_arguments_are_one_line(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="every=0"):
        Monitor(TinyCNN(), _probe()[0], every=0, log_dir=tmp_path)
    with pytest.raises(UsageError, match="give one of log_dir"):
        Monitor(TinyCNN(), _probe()[0])


@pytest.mark.slow
def test_lightning_training_with_the_callback_is_bit_identical(tmp_path: Path) -> None:
    import lightning as L
    from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
    from torch.utils.data import DataLoader, TensorDataset

    import hookviz.lightning

    class Lit(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = TinyCNN()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.net(x)

        def training_step(self, batch: Any, i: int) -> torch.Tensor:
            x, y = batch
            return F.cross_entropy(self(x + 0.01 * torch.randn_like(x)), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.05)

    def fit(callbacks: list[Any], logger: Any, root: Path) -> nn.Module:
        L.seed_everything(0, verbose=False)
        x, y, _ = shapes_batch(96, np.random.default_rng(0))
        model = Lit()
        trainer = L.Trainer(
            max_steps=12, logger=logger, callbacks=callbacks, enable_progress_bar=False,
            enable_model_summary=False, accelerator="cpu", deterministic=True, default_root_dir=root,
            enable_checkpointing=False,
        )  # fmt: skip
        trainer.fit(model, DataLoader(TensorDataset(x, y), batch_size=8, shuffle=True))
        return model

    px, py = _probe()
    plain = fit([], False, tmp_path / "plain")
    callback = hookviz.lightning.Monitor(px, labels=py, every=4)
    watched = fit([callback], TensorBoardLogger(tmp_path / "tb"), tmp_path / "tb")
    for (name, a), b in zip(plain.state_dict().items(), watched.state_dict().values(), strict=True):
        assert torch.equal(a, b), name
    ea = _events(tmp_path / "tb")
    assert [e.step for e in ea.Images("maps/gradcam/net.features/0")] == [0, 4, 8]
    assert callback.first_nonfinite is None and hook_counts(watched) == 0
    # A CSV logger takes no pictures: the monitor writes a TensorBoard folder beside its files.
    fit([hookviz.lightning.Monitor(px, every=4)], CSVLogger(tmp_path / "csv"), tmp_path / "csv")
    assert list((tmp_path / "csv").rglob("hookviz/events.out.tfevents.*"))


@pytest.mark.slow
def test_lightning_module_without_forward_is_watched_through_its_submodule(tmp_path: Path) -> None:
    """Lightning calls ``forward`` optional: a module calling ``self.net`` in ``training_step`` is watched
    through ``net`` (the child owning ``layer``, the one child with parameters, or ``module=``); one that
    cannot be watched is said once, and the fit goes on."""
    import lightning as L
    from lightning.pytorch.loggers import TensorBoardLogger
    from torch.utils.data import DataLoader, TensorDataset

    import hookviz.lightning

    class NoForward(L.LightningModule):
        def __init__(self, second: bool = False) -> None:
            super().__init__()
            self.net = TinyCNN()
            self.loss = nn.CrossEntropyLoss()  # a child without parameters
            if second:
                self.ema = TinyCNN()  # a second child with parameters: which to watch is the user's call

        def training_step(self, batch: Any, i: int) -> torch.Tensor:
            x, y = batch
            return self.loss(self.net(x), y)

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.net.parameters(), lr=0.05)

    def fit(callback: Any, root: Path, second: bool = False) -> L.Trainer:
        L.seed_everything(0, verbose=False)
        x, y, _ = shapes_batch(48, np.random.default_rng(0))
        trainer = L.Trainer(
            max_steps=5, logger=TensorBoardLogger(root), callbacks=[callback], enable_progress_bar=False,
            enable_model_summary=False, accelerator="cpu", default_root_dir=root, enable_checkpointing=False,
        )  # fmt: skip
        trainer.fit(NoForward(second), DataLoader(TensorDataset(x, y), batch_size=8))
        return trainer

    px, py = _probe()
    for name, options in (
        ("layer", {"layer": "net.features"}),
        ("child", {}),
        ("module", {"module": "net", "features": ["net.features.4"]}),
    ):
        callback = hookviz.lightning.Monitor(px, labels=py, every=4, **options)
        with warnings.catch_warnings():
            warnings.simplefilter("error", RuntimeWarning)  # watched: no "not watching" warning
            trainer = fit(callback, tmp_path / name)
        assert trainer.global_step == 5 and callback.not_started is None, name
        ea = _events(tmp_path / name)
        assert [e.step for e in ea.Images("maps/gradcam/features/0")] == [0, 4], name
        assert "gradients/fc.weight/norm" in ea.Tags()["scalars"], name
    assert "features/features.4" in ea.Tags()["images"]
    # Two children with parameters and no forward: said once, the fit goes on to its end.
    callback = hookviz.lightning.Monitor(px, every=1)
    with pytest.warns(RuntimeWarning, match=r"not watching NoForward \(UsageError: .*module=") as said:
        trainer = fit(callback, tmp_path / "two", second=True)
    assert trainer.global_step == 5 and callback.monitor is None and callback.not_started is not None
    assert len([w for w in said if "hookviz" in str(w.message)]) == 1
    from hookviz.training.lightning import _watched_module

    with pytest.raises(UsageError, match="module='nope' is not a submodule of NoForward"):
        _watched_module(NoForward(), "nope", None)


@pytest.mark.slow
def test_a_wandb_run_in_offline_mode_gets_the_logs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import wandb

    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = wandb.init(project="hookviz-test", dir=str(tmp_path), mode="offline")
    x, y = _probe()
    with Monitor(TinyCNN(), x, labels=y, every=1, writer=run) as mon:
        mon.step(0)
        mon.step(1)
    run.finish()
    (folder,) = list((tmp_path / "wandb").glob("offline-run-*"))
    assert list(folder.glob("run-*.wandb")) and os.path.getsize(next(folder.glob("run-*.wandb"))) > 1000


@pytest.mark.slow
def test_the_example_logs_maps_a_user_can_open(tmp_path: Path) -> None:

    example = str(ROOT / "examples/monitor_shapes.py")
    r = run_cli([sys.executable, example, "--steps", "60", "--log-dir", str(tmp_path)])
    assert r.returncode == 0, r.stderr[-2000:]
    ea = _events(tmp_path)
    assert [e.step for e in ea.Images("maps/gradcam/10/0")] == [0, 50]
    assert "features/4" in ea.Tags()["images"]


def test_the_replay_of_a_bad_step_leaves_the_random_state_and_batchnorm_as_they_were(tmp_path: Path) -> None:
    """A forward turning non-finite is replayed (the same dropout masks: the same random state), and the step
    goes on as without the monitor: the random state after it and BatchNorm's buffers are the same."""

    def build() -> nn.Sequential:
        torch.manual_seed(0)
        return nn.Sequential(
            nn.Conv2d(3, 4, 3),
            nn.BatchNorm2d(4),
            nn.Dropout(0.5),
            _NanForward(),
            nn.Flatten(),
            nn.LazyLinear(2),
        )

    x = torch.randn(2, 3, 8, 8)
    after = []
    for watched in (False, True):
        model = build().train()
        model(x)  # the lazy layer takes its shape
        model[3].armed = True
        mon = Monitor(model, x[:1], every=10**9, log_dir=tmp_path / str(watched)) if watched else None
        torch.manual_seed(1)
        model(x).sum().backward()
        after.append((torch.get_rng_state(), {k: v.clone() for k, v in model[1].state_dict().items()}))
        if mon is not None:
            with pytest.warns(RuntimeWarning, match="3's output turned non-finite"):
                mon.step(1)
            assert mon.first_nonfinite == Nonfinite("3", "output", 1)
            mon.close()
    assert torch.equal(after[0][0], after[1][0])
    for key, value in after[0][1].items():
        assert torch.equal(value, after[1][1][key]), key


def test_a_users_own_gradients_over_the_parameters_still_work(tmp_path: Path) -> None:
    """A gradient penalty (torch.autograd.grad over the parameters, create_graph) under the watch."""
    torch.manual_seed(0)
    model = TinyCNN()
    x, y, _ = shapes_batch(4, np.random.default_rng(0))
    with Monitor(model, x[:1], every=10**9, log_dir=tmp_path) as mon:
        loss = F.cross_entropy(model(x), y)
        grads = torch.autograd.grad(loss, list(model.parameters()), create_graph=True)
        (loss + sum(g.pow(2).sum() for g in grads)).backward()
        mon.step(1)
    assert mon.first_nonfinite is None


def test_an_mlflow_run_gets_the_same_figures_as_tensorboard(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    torch.manual_seed(1)
    model = TinyCNN().eval()
    x, y = _probe()
    with Monitor(model, x, labels=y, every=1, log_dir=tmp_path / "tb") as mon:
        mon.log(3)
    ea = _events(tmp_path / "tb")
    store = tmp_path / "mlruns"
    with Monitor(model, x, labels=y, every=1, log=f"mlflow:{store}") as mon:
        mon.log(3)
    client = MlflowClient(tracking_uri=store.resolve().as_uri())
    (run,) = client.search_runs([client.get_experiment_by_name("hookviz").experiment_id])
    assert run.info.status == "FINISHED"
    for tag in ("activations/features.0/mean", "gradients/fc.weight/norm"):
        (point,) = client.get_metric_history(run.info.run_id, tag)
        assert point.step == 3
        assert point.value == pytest.approx(ea.Scalars(tag)[0].value, rel=1e-5)
    fetched = Path(client.download_artifacts(run.info.run_id, "images", str(tmp_path / "back")))
    pictures = [p for p in fetched.rglob("*.png") if "maps.gradcam.features.0" in p.name]
    assert pictures, sorted(p.name for p in fetched.rglob("*"))
    from PIL import Image

    (image,) = ea.Images("maps/gradcam/features/0")
    want = np.asarray(Image.open(io.BytesIO(image.encoded_image_string)).convert("RGB")).astype(int)
    got = np.asarray(Image.open(pictures[0]).convert("RGB")).astype(int)
    assert got.shape == want.shape and np.abs(got - want).max() <= 2
    with pytest.raises(UsageError, match="give one of log_dir"):
        Monitor(model, x, log="mlflow", log_dir=tmp_path)


class _Block(torch.nn.Module):
    """An attention-like block whose own code makes the NaN: a softmax over a row masked whole."""

    def __init__(self) -> None:
        super().__init__()
        self.qkv, self.proj = torch.nn.Linear(4, 4), torch.nn.Linear(4, 4)
        self.armed = False

    def forward(self, x: Any) -> Any:
        h = self.qkv(x)
        if self.armed:
            h = h.masked_fill(h == h, float("-inf"))  # every position masked
        return self.proj(h.softmax(-1))


def _train_blocks(model: Any, steps: int, arm: Any, tmp_path: Path, every: int = 100) -> Any:
    import torch

    from hookviz.training.monitor import Monitor

    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(0)
    probe = torch.randn(2, 3, 4, generator=g)
    with warnings.catch_warnings(record=True) as said:
        warnings.simplefilter("always")
        with Monitor(model, probe, layer="0", every=every, log_dir=tmp_path) as mon:
            for step in range(steps):
                arm(step)
                loss = model(torch.randn(5, 3, 4, generator=g)).pow(2).mean()
                opt.zero_grad()
                loss.backward()
                opt.step()
                mon.step(step)
    return mon, [str(w.message) for w in said]


def test_a_nan_made_in_a_composite_modules_own_code_names_that_module(tmp_path: Path) -> None:
    import torch

    block = _Block()
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), block, torch.nn.Linear(4, 2))

    def arm(step: int) -> None:
        block.armed = step == 2

    mon, said = _train_blocks(model, 4, arm, tmp_path)
    assert mon.first_nonfinite is not None and mon.first_nonfinite.step == 2
    assert mon.first_nonfinite.module == "1 (1's own code, between 1.qkv and 1.proj)"
    assert any("1's own code, between 1.qkv and 1.proj" in s for s in said)


def test_a_nan_made_in_the_models_forward_is_said_to_be_there(tmp_path: Path) -> None:
    import torch

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a, self.b = torch.nn.Linear(4, 4), torch.nn.Linear(4, 2)
            self.armed = False

        def forward(self, x: Any) -> Any:
            h = self.a(x)
            return self.b(h * float("nan") if self.armed else h)

    net = Net()
    mon, _ = _train_blocks(torch.nn.Sequential(net), 3, lambda s: setattr(net, "armed", s == 1), tmp_path)
    assert mon.first_nonfinite is not None
    assert mon.first_nonfinite.module == "0 (0's own code, between 0.a and 0.b)"


def test_a_nan_that_persists_across_logging_steps_never_stops_the_training(tmp_path: Path) -> None:
    """Weights turned NaN at step 1: every later logging step sees only NaN activations."""
    import torch
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 2))

    def arm(step: int) -> None:
        if step == 1:
            with torch.no_grad():
                model[0].weight.fill_(float("nan"))

    mon, _ = _train_blocks(model, 7, arm, tmp_path, every=2)  # logs at 0, 2, 4, 6
    assert mon.first_nonfinite is not None and mon.first_nonfinite.module.startswith("0")
    ea = EventAccumulator(str(tmp_path), size_guidance={"scalars": 0, "histograms": 0})
    ea.Reload()
    share = {e.step: e.value for e in ea.Scalars("activations/0/nonfinite")}
    assert share == {0: 0.0, 2: 1.0, 4: 1.0, 6: 1.0}
    assert [e.step for e in ea.Histograms("activations/0")] == [0]  # none of nothing
    assert [e.step for e in ea.Scalars("activations/0/mean")] == [0]
