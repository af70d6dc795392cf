"""``hookviz.lightning.Monitor``: the training monitor as a Lightning callback (``hookviz[lightning]``)."""

from __future__ import annotations

from hookviz.training.lightning import Monitor

__all__ = ["Monitor"]
