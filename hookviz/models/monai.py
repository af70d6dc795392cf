"""MONAI networks: ``--model 'monai:DenseNet121?spatial_dims=3&in_channels=1&out_channels=2'`` (needs
``pip install 'hookviz[monai]'``).

Any class of ``monai.networks.nets`` built with the arguments of the query (values as Python literals:
``spatial_dims=3``, ``channels=(16,32)``, ``norm='batch'``), with weights from a file (``--weights
model.pt``: a state_dict, a bundle's ``models/model.pt``, a checkpoint) or seeded random ones (``none``).
MONAI publishes no default weights for its network classes (its bundles carry their own), so ``DEFAULT``
is refused in one line. A network of ``spatial_dims=3`` is a volume model (:mod:`hookviz.tasks.volume`),
of 2 a classifier of photos of ``in_channels`` bands.
"""

from __future__ import annotations

import warnings
from pathlib import Path
from typing import Any

from hookviz.errors import ModelNotFoundError, SetupError, UsageError, WeightsError, close_matches
from hookviz.io.files import file_digest
from hookviz.io.images import Preprocess
from hookviz.models.sources import WEIGHTS_DEFAULT, WEIGHTS_NONE, Built, Options, missing_extra, query, seeded
from hookviz.models.weights import apply_state_dict, load_state_dict_file


def _nets() -> Any:
    """``monai.networks.nets``, imported without the deprecation notices MONAI's import raises on a newer
    torch (``torch.jit.interface`` in its modules): they are MONAI's, not the user's."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", FutureWarning)
            warnings.simplefilter("ignore", DeprecationWarning)
            from monai.networks import nets
    except ImportError:
        raise missing_extra("monai", "monai") from None
    return nets


def build(spec: str, weights: str, options: Options) -> Built:
    """A MONAI network, built as the query says, with the weights of a file or seeded random ones."""
    nets = _nets()
    name, kwargs = query(spec)  # the class name and its arguments
    known = sorted(n for n in dir(nets) if n[:1].isupper() and isinstance(getattr(nets, n), type))
    if name not in known:
        raise ModelNotFoundError(
            f"unknown MONAI network {name!r}{close_matches(name, known)} (monai.networks.nets has "
            f"{len(known)}: DenseNet121, ResNet, EfficientNetBN, SEResNet50, ViT, ...)"
        )

    def make() -> Any:
        try:
            return getattr(nets, name)(**kwargs)
        except TypeError as exc:
            raise UsageError(
                f"monai:{name}: {exc}; give its arguments in the query (?spatial_dims=3&...)"
            ) from None

    args = ",".join(f"{k}={v}" for k, v in sorted(kwargs.items()))
    label = f"monai:{name}" + (f"[{args}]" if args else "")
    if weights.lower() == WEIGHTS_NONE:
        model = seeded(make)
        shown, pretrained, weights_id = "none (random init)", False, "none"
    elif weights.upper() == WEIGHTS_DEFAULT:
        raise WeightsError(
            f"monai:{name} has no default weights (MONAI's bundles carry their own): give --weights FILE "
            "(a state_dict such as a bundle's models/model.pt) or --weights none"
        )
    else:
        path = Path(weights).expanduser()
        if not path.is_file():
            raise UsageError(f"--weights {weights!r}: no such file, and not none (for monai:{name})")
        state = load_state_dict_file(path, options.weights_key)
        model = apply_state_dict(seeded(make), state, path, f"monai:{name}")
        key = f"[{options.weights_key}]" if options.weights_key else ""
        shown, pretrained, weights_id = str(path), True, f"sha256:{file_digest(path)}{key}"
    dims = int(kwargs.get("spatial_dims", 3))
    if dims not in (2, 3):
        raise SetupError(f"monai:{name}: spatial_dims={dims}; hookviz explains 2-D and 3-D networks")
    side = 64 if dims == 3 else 224
    bands = int(kwargs.get("in_channels", 1))
    preprocess = Preprocess(
        crop_size=side,
        resize_size=side,
        mean=(0.0,) * bands,
        std=(1.0,) * bands,
        resize="squash",
        channels=bands,
    )
    return Built(
        model,
        label,
        shown,
        pretrained,
        weights_id,
        (),
        preprocess,
        "volume" if dims == 3 else "classification",
    )
