"""A vision-language model as :class:`hookviz.run.Run` takes it: :func:`prompted` wraps a :class:`Vlm` and the
prompt in a :class:`~hookviz.models.loaded.LoadedModel` whose inputs are photos with a prompt, and
:class:`PromptedPhotos` is their input kind (registered): found as photos are, each read and handed to the
model's processor with the prompt in the reading threads, while the model works on the batch before."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import Any, ClassVar

import numpy as np

from hookviz.errors import InputError
from hookviz.io import timing
from hookviz.io.images import Box, Preprocess, load_rgb
from hookviz.io.inputs import Item
from hookviz.models.loaded import LoadedModel
from hookviz.run.kinds import InputKind, Reader, register_input_kind
from hookviz.tasks.registry import Task
from hookviz.vlm.families import Placement
from hookviz.vlm.model import Vlm, encode


@dataclass
class Photo:
    """One photo as the reader leaves it for the model: its pixels, the processor's inputs, and where its
    image tokens lie on it."""

    rgb: np.ndarray
    encoded: dict[str, Any]
    placement: Placement


@dataclass(frozen=True)
class PromptInputs:
    """What a vision-language model takes (:class:`~hookviz.models.loaded.ModelInputs`): photos, each asked
    ``prompt`` (the processor sizes each photo itself)."""

    kind: ClassVar[str] = "prompted"
    sides: ClassVar[str] = "N"
    vlm: Vlm
    prompt: str

    def shape(self, preprocess: Preprocess) -> tuple[int, ...]:
        return (3, 0, 0)  # the processor's own size, photo by photo

    def key(self) -> dict[str, Any]:
        return {}  # the prompt is the job's setting, in its key


class VisionLanguage(Task):
    """The task of a vision-language model: ``hookviz vlm`` alone applies (not registered among the tasks a
    model built by :func:`hookviz.load_model` may take); its records say no more than the job's."""

    name = "vlm"
    noun = "a vision-language model"
    plural = "vision-language models"
    commands = frozenset({"vlm"})

    def fields(self, loaded: LoadedModel) -> dict[str, Any]:
        return {}

    def hints(self, loaded: LoadedModel) -> list[str]:
        return []


class PromptedPhotos(InputKind):
    """Photos with a prompt, for a vision-language model (:func:`prompted`)."""

    name = "prompted"
    refusal = "{name} is not a vision-language model; run hookviz vlm with --model hf:DIR"

    def claims(self, loaded: LoadedModel, specs: Sequence[str]) -> bool:
        return isinstance(loaded.inputs, PromptInputs)

    def preprocess(self, loaded: LoadedModel) -> Any:
        return None

    def read(self, loaded: LoadedModel) -> Reader:
        assert isinstance(loaded.inputs, PromptInputs)
        return partial(read_prompted, loaded.inputs)

    def first_images(self, items: list[Item], loaded: LoadedModel, n: int, max_pixels: int) -> None:
        return None


def read_prompted(
    inputs: PromptInputs, item: Item, preprocess: Any, max_pixels: int
) -> tuple[Photo, np.ndarray, Box]:
    """One photo read and handed to the processor with the prompt (in a reading thread); every photo is
    one batch's (the model's input array is a placeholder: the job stacks the processor's inputs).

    Raises:
        InputError: the photo cannot be read, or the processor cannot take it.
    """
    vlm = inputs.vlm
    with timing.stage("decode"):
        rgb = load_rgb(item.source(), max_pixels=max_pixels)
    try:
        with timing.stage("preprocess"):
            encoded = encode(vlm, rgb, inputs.prompt)
            placement = vlm.family.placement(vlm.model, vlm.processor, encoded, rgb.shape[:2])
    except InputError as exc:
        raise InputError(f"{item.name}: {exc}") from None
    return Photo(rgb, encoded, placement), np.zeros(1, np.uint8), placement.box()


def prompted(vlm: Vlm, prompt: str, weights: str | None = None) -> LoadedModel:
    """``vlm`` asked ``prompt`` of each photo, as a :class:`hookviz.run.Run` takes a model (its input kind
    :class:`PromptedPhotos`); ``weights``: where they came from, for the records (default its name)."""
    return LoadedModel(
        model=vlm.model, name=vlm.name, weights=weights or vlm.name, pretrained=True, categories=(),
        preprocess=Preprocess(), device=vlm.device, task=VisionLanguage(), inputs=PromptInputs(vlm, prompt),
    )  # fmt: skip


PROMPTED = register_input_kind(PromptedPhotos(), replace=True)
