"""Volumes: a 3-D scan in (``(B, C, X, Y, Z)``: NIfTI, ``.npy``, a DICOM series), one score per class out.

A volume model is not a video model, though both begin with a ``Conv3d``: a model whose first convolution is
3-D and takes other than three channels is a volume model, a three-channel one is a video model unless its
inputs are volumes (:func:`hookviz.tasks.load_model`'s ``volumes``) or ``--task volume`` says so.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from torch import nn

from hookviz.errors import InputError
from hookviz.io.images import DEFAULT_MAX_PIXELS, Box, Preprocess, quote
from hookviz.io.inputs import Item
from hookviz.io.volume import DEFAULT_MAX_VOXELS, VolumePreprocess, read_volume
from hookviz.jobs.volume import VolumeCamJob
from hookviz.models.loaded import LoadedModel
from hookviz.tasks.registry import Task, register_task

#: The side a volume model is traced at when ``--input-size`` does not say (each volume runs at its own).
TRACE_SIDE = 64


def first_conv(model: nn.Module) -> nn.Module | None:
    return next((m for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Conv3d, nn.Linear))), None)


class Volume(Task):
    name = "volume"
    noun = "a volume model"
    plural = "volume models"
    job_class = VolumeCamJob
    refuses = frozenset({"featuremaps", "channels", "dropblock", "gradflow"})

    def claims(self, model: nn.Module) -> bool:
        """A ``Conv3d`` first that takes other than three channels (three: a video model's clips)."""
        first = first_conv(model)
        return isinstance(first, nn.Conv3d) and first.in_channels != 3

    def default_preprocess(self) -> Preprocess:
        """Values as stored (mean 0, std 1), traced at ``TRACE_SIDE`` voxels a side."""
        return Preprocess(crop_size=TRACE_SIDE, resize_size=TRACE_SIDE, mean=(0.0,) * 3, std=(1.0,) * 3)

    def volumes(self, preprocess: Preprocess, size: tuple[int, int, int] | None) -> VolumePreprocess:
        c = preprocess.channels
        mean = preprocess.mean if len(preprocess.mean) == c else (0.0,) * c
        std = preprocess.std if len(preprocess.std) == c else (1.0,) * c
        return VolumePreprocess(tuple(mean), tuple(std), c, size)

    def input_shape(self, loaded: LoadedModel) -> tuple[int, ...]:
        return loaded.inputs.shape(loaded.preprocess)

    def read(self, item: Item, preprocess: Any, max_pixels: int) -> tuple[Any, np.ndarray, Box]:
        assert item.path is not None
        # The photos' default limit (80 M pixels) refuses a plain CT (512x512x320): volumes get theirs.
        limit = DEFAULT_MAX_VOXELS if max_pixels == DEFAULT_MAX_PIXELS else max_pixels
        volume = read_volume(item.path, max_voxels=limit)
        try:
            x, box = preprocess(volume)
        except InputError as exc:
            raise InputError(f"{quote(item.path)}: {exc}") from None
        return volume, x, box

    def fields(self, loaded: LoadedModel) -> dict[str, Any]:
        return {"task": self.name}

    def hints(self, loaded: LoadedModel) -> list[str]:
        v = loaded.volume
        if v is None:
            return []
        size = f"resized to {','.join(map(str, v.size))} (trilinear)" if v.size else "at their own size"
        return [
            f"{loaded.name} takes volumes of {v.channels} channel(s): read as stored, normalised with mean "
            f"{list(v.mean)} and std {list(v.std)} (--mean/--std), {size}"
        ]


VOLUME = register_task(Volume())
