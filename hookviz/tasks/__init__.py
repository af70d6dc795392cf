"""Tasks: what a model's output is, and everything hookviz does differently for it (see
:mod:`hookviz.tasks.registry`). The built-in ones are registered here; register your own with
:func:`register_task`."""

from __future__ import annotations

from hookviz.tasks.api import cam_job, describe, hints, load_model, make_cam_job, refuse, with_options
from hookviz.tasks.classification import CLASSIFICATION
from hookviz.tasks.detection import DETECTION
from hookviz.tasks.registry import (
    Task,
    get_task,
    register_task,
    task_for,
    task_names,
    task_of,
    unregister_task,
)
from hookviz.tasks.segmentation import SEGMENTATION
from hookviz.tasks.video import VIDEO
from hookviz.tasks.volume import VOLUME

__all__ = [
    "CLASSIFICATION",
    "DETECTION",
    "SEGMENTATION",
    "VIDEO",
    "VOLUME",
    "Task",
    "cam_job",
    "describe",
    "get_task",
    "hints",
    "load_model",
    "make_cam_job",
    "refuse",
    "register_task",
    "task_for",
    "task_names",
    "task_of",
    "unregister_task",
    "with_options",
]
