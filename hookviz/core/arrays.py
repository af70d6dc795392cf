"""Tensors to NumPy: the one way hookviz moves a tensor off its device.

``tensor.numpy()`` works only on a CPU tensor that needs no gradient and whose dtype NumPy knows; a map
computed on ``--device cuda`` is none of these until it is moved. Every move goes through
:func:`to_numpy` (a test keeps ``.numpy()`` out of the rest of the package), so that a code path first run on
a GPU does not fail where the CPU never could.

Example:
    >>> to_numpy(torch.ones(2, requires_grad=True))
    array([1., 1.], dtype=float32)
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

#: Tensor dtypes NumPy has no dtype for: copied as float32.
_WIDENED = (torch.bfloat16,)


def to_numpy(t: torch.Tensor, dtype: torch.dtype | None = None) -> np.ndarray[Any, Any]:
    """``t`` as a NumPy array: detached, on the CPU, as ``dtype`` when given (else ``t``'s own dtype,
    bfloat16 widened to float32). One copy at most (none for a CPU tensor of that dtype: the array then
    shares its memory, as ``tensor.numpy()`` does).

    Args:
        t: any tensor, on any device, with or without a graph.
        dtype: the torch dtype of the array, e.g. ``torch.float32``.

    Returns:
        The array.
    """
    if dtype is None and t.dtype in _WIDENED:
        dtype = torch.float32
    return t.detach().to(device="cpu", dtype=dtype).numpy()
