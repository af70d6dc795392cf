"""Tasks as a registry, like methods: a task is one class and one :func:`register_task`.

A task says what a model's output is and everything hookviz does differently for it: which models are of
it, how photos (or videos) become its inputs, how many classes it scores, which job explains it and which
commands apply, how a record of it reads on a line, and the hints a run of it gets. Everything that would
compare a task's name asks the task instead.

Example (a task of the user's own, from outside the package):
    >>> class Depth(Task):
    ...     name = "depth"
    ...     def claims(self, model): return isinstance(model, MyDepthNet)
    >>> register_task(Depth())
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from hookviz.core.hooks import ModuleCall
from hookviz.core.targets import Target
from hookviz.errors import UsageError
from hookviz.io.images import Box, Preprocess
from hookviz.io.inputs import Item, read_input
from hookviz.io.video import VideoPreprocess
from hookviz.io.volume import VolumePreprocess
from hookviz.jobs.build import BuiltJob, RunContext
from hookviz.jobs.cam import CamJob
from hookviz.jobs.cam_build import classifier_job
from hookviz.jobs.settings import CamSettings
from hookviz.models.loaded import LoadedModel, photo_shape
from hookviz.models.several import Several
from hookviz.models.sources import Built
from hookviz.models.weights import classifier_out

if TYPE_CHECKING:
    from torch import nn

#: The per-image commands hookviz has, in the order a refusal lists the ones a task takes. A task takes every
#: command but those it refuses, so a new command runs on every task that does not name it.
ORDER = ("gradcam", "featuremaps", "channels", "dropblock", "evaluate", "sanity", "gradflow")


class Task:
    """A kind of model output; the defaults are a classifier's (one score per class for each photo)."""

    #: What ``--task``, records and :func:`get_task` call it.
    name: ClassVar[str] = ""
    #: How a line names one model of it, and several.
    noun: ClassVar[str] = "a classifier"
    plural: ClassVar[str] = "classifiers"
    #: The per-image commands that do not apply (each refuses it with one line); every other one does, so a
    #: new command runs on a task that does not name it. ``commands``, when a task sets it, lists instead
    #: the only ones that apply.
    refuses: ClassVar[frozenset[str]] = frozenset()
    commands: ClassVar[frozenset[str] | None] = None

    @classmethod
    def takes(cls, command: str) -> bool:
        """Whether ``command`` applies to a model of this task."""
        return command in cls.commands if cls.commands is not None else command not in cls.refuses

    #: Whether text prompts and ``--similar-to`` may replace its classes.
    prompts: ClassVar[bool] = False
    #: The job of the default :meth:`cam_job` (a subclass of ``CamJob``: a video model's), and whether a
    #: class's score sums its pixels (a segmenter's: records say which pixels).
    job_class: ClassVar[type[CamJob]] = CamJob
    dense: ClassVar[bool] = False

    # -- which models, and how they are loaded -------------------------------------------------------------
    def claims(self, model: nn.Module) -> bool:
        """Whether a model from the user's own code (not named by a source) is of this task."""
        return False

    def default_preprocess(self) -> Preprocess:
        """How photos become inputs of a model of this task that its source did not set up."""
        return Preprocess()

    def base_preprocess(self, built: Built) -> Preprocess:
        return built.preprocess if built.task == self.name else self.default_preprocess()

    def clips(self, built: Built) -> VideoPreprocess | None:
        return None

    def volumes(self, preprocess: Preprocess, size: tuple[int, int, int] | None) -> VolumePreprocess | None:
        """How volumes become inputs, for a model that takes volumes (None: it takes photos or clips);
        ``size``: ``--input-size D,H,W``."""
        return None

    def head_classes(self, model: nn.Module) -> int | None:
        return classifier_out(model)

    def known_classes(self, model: nn.Module) -> int | None:
        return None

    def set_input_size(self, model: nn.Module, size: int, name: str) -> None:
        return None

    def input_shape(self, loaded: LoadedModel) -> tuple[int, ...]:
        return photo_shape(loaded)

    # -- inputs ----------------------------------------------------------------------------------------------
    def read(self, item: Item, preprocess: Any, max_pixels: int) -> tuple[Any, np.ndarray, Box]:
        """One input as ``(what is drawn on, the model's input array, where the model saw it)``."""
        return read_input(item, preprocess, max_pixels)

    # -- explaining ------------------------------------------------------------------------------------------
    def cam_job(
        self,
        loaded: LoadedModel,
        settings: CamSettings,
        calls: list[ModuleCall],
        targets: Target,
        context: RunContext,
    ) -> BuiltJob:
        """The ``gradcam`` job for ``loaded``: layers chosen, the notes to print (``context``: what the run
        gives the choice of ``--layer auto``)."""
        return classifier_job(
            loaded, settings, calls, targets, context, job_class=self.job_class, dense=self.dense
        )

    def fields(self, loaded: LoadedModel) -> dict[str, Any]:
        """What every record of a run of this task holds besides the job's own fields."""
        return {"task": self.name}

    def describe(self, record: dict[str, Any]) -> list[str] | None:
        """What a line says of a record before its prediction (None: the prediction is the whole story)."""
        return None

    def hints(self, loaded: LoadedModel) -> list[str]:
        """Notes for the user about a model of this task as loaded (said unless ``--quiet``)."""
        p = loaded.preprocess
        if loaded.several is not None:
            model = loaded.model
            how = "by name" if isinstance(model, Several) and model.by_name else "in this order"
            each = "; ".join(
                f"{n}: {q.channels} band(s), mean {list(q.mean)}, std {list(q.std)}"
                for n, q in zip(loaded.several.names, loaded.several.each, strict=True)
            )
            return [f"{loaded.name} is called with {len(loaded.several.names)} inputs {how} ({each}; "
                    "--mean/--std NAME=...)"]  # fmt: skip
        if p.channels == 3:
            return []
        return [
            f"{loaded.name} takes {p.channels} band(s): images are read as they are (8-bit / 255, 16-bit / "
            f"65535), normalised with mean {list(p.mean)} and std {list(p.std)} (--mean/--std, one per band)"
        ]


_TASKS: dict[str, Task] = {}


def register_task(task: Task, *, replace: bool = False) -> Task:
    """Add ``task`` to the registry (a later one claims models first); returns it.

    Raises:
        UsageError: no name, or a name taken (unless ``replace``).
    """
    if not task.name:
        raise UsageError(f"{type(task).__name__}: a task needs a name")
    if task.name in _TASKS and not replace:
        raise UsageError(f"a task named {task.name!r} is registered already; pass replace=True")
    _TASKS[task.name] = task
    return task


def unregister_task(name: str) -> None:
    _TASKS.pop(name, None)


def get_task(name: str) -> Task:
    """The task called ``name``.

    Raises:
        UsageError: no such task (the registered ones listed).
    """
    try:
        return _TASKS[name]
    except KeyError:
        raise UsageError(f"no task {name!r}; the tasks are {', '.join(_TASKS)}") from None


def task_names() -> list[str]:
    return list(_TASKS)


def task_for(built: Built) -> Task:
    """The task of a built model: the one its source named, else the last registered that claims it,
    else a classifier."""
    if built.task != "classification":
        return get_task(built.task)
    for task in reversed(list(_TASKS.values())):
        if task.claims(built.model):
            return task
    return get_task("classification")


def task_of(loaded: LoadedModel) -> Task:
    """The task of a loaded model (a model wrapped by hand, without one, is a classifier)."""
    task = loaded.task
    return task if isinstance(task, Task) else get_task(loaded.task_name)


def plural_list(words: list[str]) -> str:
    return words[0] if len(words) == 1 else f"{', '.join(words[:-1])} and {words[-1]}"
