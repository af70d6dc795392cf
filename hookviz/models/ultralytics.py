"""ultralytics YOLO models: ``--model ultralytics:FILE.pt`` (a checkpoint), ``ultralytics:FILE.yaml`` (a model
definition, random weights), or a name ultralytics resolves from its own cache (``ultralytics:yolo11n.pt``).

Needs ``pip install 'hookviz[ultralytics]'``. ultralytics is AGPL-3.0 licensed and hookviz does not bundle it.
A ``.pt`` checkpoint is a pickle that ultralytics loads as it always does: name only files you trust.

Detect and segment models are detectors (:class:`Yolo`): a photo is letterboxed as ``model.predict`` does
it (ultralytics' own ``LetterBox``: aspect kept, padded with grey 114 to a stride multiple, RGB in [0, 1]),
boxes come from ultralytics' own ``non_max_suppression`` at ``--score-threshold`` and IoU 0.7, and each box's
score is the class probability of the anchor NMS kept, a tensor of the same pass, so its gradient reaches the
neck. Classify models are classifiers (:class:`YoloClassifier`: the logits, not the softmax the head returns).
Module names are ultralytics' own (``model.15``, ``model.22``).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import Tensor, nn

from hookviz.core.detections import Found
from hookviz.errors import UsageError, WeightsError
from hookviz.io.files import file_digest
from hookviz.io.images import Preprocess
from hookviz.models.facade import Facade, photos_uint8
from hookviz.models.sources import WEIGHTS_DEFAULT, WEIGHTS_NONE, Built, Options, missing_extra, seeded
from hookviz.models.weights import apply_state_dict, load_state_dict_file

#: ultralytics' ``predict`` defaults.
IOU = 0.7
MAX_DET = 300
#: Where a hookviz task takes over from ultralytics' ``model.task``.
TASKS = {"detect": "detection", "segment": "detection", "classify": "classification"}


class Yolo(Facade):
    """An ultralytics detect or segment model as a hookviz detector (see the module's notes).

    ``forward`` takes photos ``(B, 3, H, W)`` in [0, 1] and returns the raw predictions ``(B, 4 + classes
    (+ masks), anchors)``; :meth:`detect` returns each photo's boxes as ``model.predict`` would.
    """

    def __init__(self, model: Any, imgsz: int) -> None:
        super().__init__(model)
        self.imgsz = imgsz
        self.stride = int(max(float(s) for s in model.stride))
        self.kind = "segment" if type(model).__name__.startswith("Segment") else "detect"
        self.end2end = bool(getattr(model, "end2end", False))
        self.iou = IOU
        self.names: dict[int, str] = dict(getattr(model, "names", None) or {})
        self.num_classes = len(self.names) or None
        #: LetterBox's ``auto`` (the smallest padding to a stride multiple), as predict has it for a module.
        self.auto = True
        head = model.model[-1]
        # The neck's scales, as the head reads them (v8: model.15, model.18, model.21: strides 8, 16, 32).
        self.default_layers = tuple(f"model.{i}" for i in head.f) if isinstance(head.f, list) else ()
        strides = "/".join(str(int(s)) for s in model.stride)
        self.layers_note = (
            f"the {len(self.default_layers)} neck outputs the detection head reads (strides {strides})"
        )

    def set_input_size(self, size: int) -> None:
        """Letterbox to ``size`` (rounded up to a stride multiple, as ultralytics' ``check_imgsz`` does)."""
        self.imgsz = -(-size // self.stride) * self.stride

    def letterbox(self, images: Tensor) -> Tensor:
        """Photos ``(B, 3, H, W)`` in [0, 1] as ultralytics feeds them: each as uint8 through its
        ``LetterBox`` (``auto``: the smallest padding to a stride multiple), back to [0, 1]."""
        from ultralytics.data.augment import LetterBox

        box = LetterBox((self.imgsz, self.imgsz), auto=self.auto, stride=self.stride)
        out = torch.stack([torch.from_numpy(box(image=img)).permute(2, 0, 1) for img in photos_uint8(images)])
        weight = next(self.parameters(), None)
        return out.to(images.device, weight.dtype if weight is not None else images.dtype) / 255

    def predictions(self, canvas: Tensor) -> tuple[Tensor, Tensor | None]:
        """The raw predictions for letterboxed inputs, and a segment head's mask prototypes (else None)."""
        out = self.wrapped(canvas)
        if isinstance(out, (tuple, list)):  # (preds, features); a segment head's ((preds, protos), features)
            out = out[0]
        if isinstance(out, (tuple, list)):
            return out[0], out[1]
        return out, None

    def forward(self, x: Tensor) -> Tensor:
        return self.predictions(self.letterbox(x))[0]

    def detect(self, images: Sequence[Tensor], threshold: float) -> list[Found]:
        from ultralytics.utils.nms import non_max_suppression
        from ultralytics.utils.ops import process_mask, scale_boxes

        found = []
        for image in images:
            canvas = self.letterbox(image[None])
            preds, protos = self.predictions(canvas)
            (kept,), (anchors,) = non_max_suppression(
                preds.detach(), threshold, self.iou, max_det=MAX_DET,
                nc=0 if self.kind == "detect" else len(self.names), end2end=self.end2end, return_idxs=True,
            )  # fmt: skip
            anchors = anchors.long()
            hw = (int(canvas.shape[2]), int(canvas.shape[3]))
            size = (int(image.shape[-2]), int(image.shape[-1]))
            top, left, rh, rw = _region(canvas, size)
            masks = None
            if protos is not None:  # predict keeps only the instances whose mask is not empty
                masks = torch.zeros(0, rh, rw, dtype=torch.bool)
                if len(kept):
                    full = process_mask(protos[0].detach(), kept[:, 6:], kept[:, :4], hw, upsample=True) > 0
                    nonempty = full.flatten(1).any(dim=1)
                    kept, anchors = kept[nonempty], anchors[nonempty]
                    masks = full[nonempty][:, top : top + rh, left : left + rw].cpu()
            labels = kept[:, 5].long()
            scores = preds[0, anchors, 4] if self.end2end else preds[0, 4 + labels, anchors]
            boxes = torch.as_tensor(scale_boxes(hw, kept[:, :4].clone(), size))
            found.append(Found(boxes, labels, scores, hw, (top, left, rh, rw), masks))
        return found


class OnnxYolo(Yolo):
    """An ultralytics detect model exported to ONNX (``model.export(format="onnx")``): the graph run by
    onnxruntime (``graph``, :class:`hookviz.models.onnx.OnnxModel`), letterboxed and decoded as ultralytics'
    ``predict`` does on that file (a graph of a fixed size is padded to its full square, ``auto=False``), so
    its boxes equal ultralytics' own. The metadata ultralytics writes (``stride``, ``imgsz``, ``names``,
    ``task``) says the rest; the default layers are the module outputs the head reads (``head_inputs``)."""

    def __init__(self, graph: Any, meta: dict[str, str], head_inputs: tuple[str, ...]) -> None:
        Facade.__init__(self, graph)
        self.imgsz = max(_literal(meta, "imgsz", [640]))
        self.stride = int(meta.get("stride", 32))
        self.kind, self.end2end, self.iou = meta["task"], meta.get("end2end") == "True", IOU
        self.names = {int(k): str(v) for k, v in _literal(meta, "names", {}).items()}
        self.num_classes = len(self.names) or None
        self.auto = graph.fixed_size is None
        self.default_layers = head_inputs
        self.layers_note = f"the {len(head_inputs)} module outputs the detection head reads"

    def set_input_size(self, size: int) -> None:
        if not self.auto and size != self.imgsz:
            raise UsageError(
                f"--input-size {size}: this ONNX file was exported for {self.imgsz} only; leave --input-size "
                "out, or export it with dynamic=True"
            )
        super().set_input_size(size)


def _literal(meta: dict[str, str], key: str, default: Any) -> Any:
    """A Python literal ultralytics wrote into an export's metadata (``imgsz``: ``[640, 640]``)."""
    import ast

    try:
        return ast.literal_eval(meta[key]) if key in meta else default
    except (ValueError, SyntaxError):
        raise WeightsError(f"the ONNX file's metadata {key}={meta[key][:40]!r} is not ultralytics'") from None


def onnx_detector(graph: Any, meta: dict[str, str], head_inputs: tuple[str, ...]) -> Built:
    """An ultralytics export as a hookviz detector (``Built``), for :func:`hookviz.models.onnx.build`."""
    if meta.get("task") != "detect" or meta.get("end2end") == "True":
        raise UsageError(
            f"{graph.path.name}: an ultralytics {meta.get('task')} export"
            f"{' (end-to-end)' if meta.get('end2end') == 'True' else ''}; hookviz explains detect "
            "exports with NMS outside the graph (the others: the .pt checkpoint as ultralytics:FILE.pt)"
        )
    try:
        with process_kept():
            import ultralytics  # noqa: F401  (its LetterBox and NMS decode the boxes)
    except ImportError:
        raise missing_extra("ultralytics", "ultralytics") from None
    yolo = OnnxYolo(graph, meta, head_inputs)
    pre = Preprocess(
        crop_size=yolo.imgsz,
        resize_size=yolo.imgsz,
        resize="model",
        mean=(0.0, 0.0, 0.0),
        std=(1.0, 1.0, 1.0),
        alpha="drop",
    )
    categories = tuple(yolo.names[i] for i in sorted(yolo.names))
    return Built(yolo, graph.path.name, f"the file's own ({graph.path.name})", True,
                 f"sha256:{file_digest(graph.path)}", categories, pre, task="detection")  # fmt: skip


def _region(canvas: Tensor, size: tuple[int, int]) -> tuple[int, int, int, int]:
    """Where ``LetterBox`` put a photo of ``size`` in ``canvas`` (as ultralytics' ``scale_boxes`` finds
    it)."""
    ch, cw = int(canvas.shape[-2]), int(canvas.shape[-1])
    gain = min(ch / size[0], cw / size[1])
    h, w = (max(round(s * gain), 1) for s in size)
    return round((ch - h) / 2 - 0.1), round((cw - w) / 2 - 0.1), h, w


class YoloClassifier(Facade):
    """An ultralytics classify model: its logits (the head's second output in eval mode)."""

    def forward(self, x: Tensor) -> Tensor:
        out = self.wrapped(x)
        return out[1] if isinstance(out, (tuple, list)) else out


@contextmanager
def process_kept() -> Iterator[None]:
    """Import ultralytics without letting it patch the process: on import it replaces ``PIL.Image.open`` (to
    pip-install a HEIF plugin the first time a file is not an image), ``torch.save``, and on Windows
    ``cv2.imread``/``imwrite``/``imshow``; every one is put back, so hookviz's own reading of photos (a bad
    file is one line, never an install) is the same whether or not a YOLO was loaded first."""
    import cv2
    from PIL import Image

    saved = [(Image, "open"), (torch, "save"), (cv2, "imread"), (cv2, "imwrite"), (cv2, "imshow")]
    values = [getattr(owner, name) for owner, name in saved]
    try:
        yield
    finally:
        for (owner, name), value in zip(saved, values, strict=True):
            setattr(owner, name, value)


def _loaded(yolo_class: Any, spec: str, where: str, path: Path) -> Any:
    """ultralytics' network for ``where``: a .yaml built with random weights (seeded), a checkpoint, or a
    name looked up in ultralytics' cache (a WeightsError when it cannot be had)."""
    try:
        with _quiet():
            return seeded(lambda: _network(yolo_class(str(path) if path.is_file() else where)))
    except Exception as exc:  # missing files, a download refused, a corrupt checkpoint
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:200]
        raise WeightsError(
            f"--model {spec}: ultralytics cannot load it ({first}); give a local .pt or .yaml file "
            "(a name needs ultralytics' cache or the network)"
        ) from None


def build(spec: str, weights: str, options: Options) -> Built:
    try:
        with process_kept():
            from ultralytics.models.yolo.model import YOLO
    except ImportError:
        raise missing_extra("ultralytics", "ultralytics") from None
    where = spec.split(":", 1)[1]
    if not where:
        raise UsageError(
            "--model ultralytics: needs a checkpoint, a model .yaml or a name (ultralytics:yolo11n.pt)"
        )
    path = Path(where).expanduser()
    local = path.is_file()
    yolo: Any = _loaded(YOLO, spec, where, path).float().eval()
    kind = str(getattr(yolo, "task", None) or _task_of(yolo))
    if kind not in TASKS:
        raise UsageError(
            f"--model {spec}: a {kind} model; hookviz explains detect, segment and classify models"
        )
    from_yaml = path.suffix.lower() in (".yaml", ".yml")
    if weights.lower() == WEIGHTS_NONE and not from_yaml:
        trained = yolo
        with _quiet():
            yolo = seeded(lambda: type(trained)(trained.yaml, verbose=False)).float().eval()
        yolo.names, yolo.args = trained.names, getattr(trained, "args", None)
        label, pretrained, weights_id = "none (random init)", False, "none"
    elif weights.upper() == WEIGHTS_DEFAULT or weights.lower() == WEIGHTS_NONE:
        label = "none (random init)" if from_yaml else f"DEFAULT ({where})"
        pretrained = not from_yaml
        weights_id = (
            "none" if from_yaml else (f"sha256:{file_digest(path)}" if local else f"ultralytics:{where}")
        )
    else:
        file = Path(weights).expanduser()
        if not file.is_file():
            raise UsageError(f"--weights {weights!r}: no such file, and not DEFAULT or none")
        yolo = apply_state_dict(yolo, load_state_dict_file(file, options.weights_key), file, spec)
        label, pretrained, weights_id = str(file), True, f"sha256:{file_digest(file)}"
    imgsz = _imgsz(yolo)
    names = getattr(yolo, "names", None) or {}
    categories = tuple(str(names[i]) for i in sorted(names)) if names else ()
    name = f"ultralytics:{path.name if local else where}"
    if TASKS[kind] == "classification":
        # ultralytics' classify_transforms: the shorter side to imgsz, the centre square, no normalisation.
        pre = Preprocess(
            crop_size=imgsz, resize_size=imgsz, mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0), alpha="drop"
        )
        return Built(YoloClassifier(yolo), name, label, pretrained, weights_id, categories, pre)
    # A file as predict reads it (cv2.imread: alpha dropped, not composited).
    pre = Preprocess(
        crop_size=imgsz, resize_size=imgsz, resize="model", mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0),
        alpha="drop",
    )  # fmt: skip
    return Built(Yolo(yolo, imgsz), name, label, pretrained, weights_id, categories, pre, task="detection")


def _network(yolo: Any) -> nn.Module:
    """The ``nn.Module`` inside ultralytics' ``YOLO`` wrapper."""
    return yolo.model


@contextmanager
def _quiet() -> Iterator[None]:
    """No lines from ultralytics' logger while it builds (hookviz's own lines say what matters)."""
    from ultralytics.utils import LOGGER

    level = LOGGER.level
    LOGGER.setLevel(logging.ERROR)
    try:
        yield
    finally:
        LOGGER.setLevel(level)


def _task_of(model: nn.Module) -> str:
    from ultralytics.nn.tasks import guess_model_task

    return str(guess_model_task(model))


def _imgsz(model: Any) -> int:
    """The size the model was trained at (what ``predict`` uses), else ultralytics' default 640."""
    args = getattr(model, "args", None)
    value = args.get("imgsz") if isinstance(args, dict) else getattr(args, "imgsz", None)
    if isinstance(value, (list, tuple)):
        value = max(value)
    return int(value) if value else 640
