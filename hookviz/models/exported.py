"""``--model FILE.pt2``: a program ``torch.export.save`` wrote, the model you deploy. It is loaded and
unflattened (``torch.export.unflatten``): its submodules come back under the module paths of the model it
was exported from (``features.4``, ``layer4``), so hooks, taps and every method run on it as on the module
itself, the input-gradient methods and the CAMs included. The program holds its weights (``--weights`` is
not taken) and its input size where the export fixed it. Its batch dimension must be dynamic (hookviz runs
photos and masked copies in batches): export with ``dynamic_shapes={"x": {0: torch.export.Dim("batch")}}``.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path

import torch

from hookviz.errors import UsageError, WeightsError, first_line
from hookviz.io.files import file_digest
from hookviz.io.images import Preprocess
from hookviz.models.sources import WEIGHTS_DEFAULT, WEIGHTS_NONE, Built, Options


def _input_shape(program: torch.export.ExportedProgram) -> list[int | None]:
    """The first user input's shape, ``None`` for a dimension the export left dynamic."""
    spec = program.graph_signature.user_inputs[0]
    node = next(n for n in program.graph.nodes if n.op == "placeholder" and n.name == spec)
    value = node.meta.get("val")
    if value is None:
        return []
    return [int(d) if isinstance(d, int) else None for d in value.shape]


def build(spec: str, weights: str, options: Options) -> Built:
    path = Path(spec).expanduser()
    if weights.upper() != WEIGHTS_DEFAULT and weights.lower() != WEIGHTS_NONE:
        raise UsageError(f"--weights {weights}: {path.name} holds its own weights; leave --weights out")
    quiet = logging.getLogger("torch.export")  # torch logs a traceback of its own before raising
    level = quiet.level
    quiet.setLevel(logging.CRITICAL)
    try:
        program = torch.export.load(path)
    except Exception as exc:  # a truncated or foreign file: torch's own reasons vary by version
        raise WeightsError(f"{path}: not a program torch.export can load ({first_line(exc)})") from None
    finally:
        quiet.setLevel(level)
    shape = _input_shape(program)
    if shape and shape[0] is not None:
        raise UsageError(
            f"{path.name} was exported for a batch of {shape[0]}; export it with a dynamic batch dimension "
            '(dynamic_shapes={"x": {0: torch.export.Dim("batch")}}): hookviz runs photos in batches'
        )
    preprocess, size_note = Preprocess(), None
    if len(shape) == 4 and (shape[2] is None or shape[3] is None):
        size_note = (
            f"{path.name} takes any input size (its height and width are dynamic): give --input-size N, "
            "the side it was trained at"
        )
    elif len(shape) == 4 and shape[2] != shape[3]:
        raise UsageError(
            f"{path.name} takes {shape[2]}x{shape[3]} inputs only, and hookviz feeds square ones: export it "
            "at a square size or with a dynamic height and width"
        )
    elif len(shape) == 4 and shape[2] is not None:  # a fixed square input: its size
        preprocess = dataclasses.replace(
            preprocess, crop_size=shape[2], resize_size=round(shape[2] * 256 / 224)
        )
    module = torch.export.unflatten(program)
    return Built(module, path.name, f"the program's own ({path.name})", True, f"sha256:{file_digest(path)}",
                 preprocess=preprocess, input_size_note=size_note)  # fmt: skip
