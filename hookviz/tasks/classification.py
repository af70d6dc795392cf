"""Classification: one score per class for each photo (the default task)."""

from __future__ import annotations

from typing import Any

from hookviz.core.conventions import declared_kind
from hookviz.models.loaded import LoadedModel
from hookviz.models.weights import classifier_out
from hookviz.tasks.registry import Task, register_task


class Classification(Task):
    name = "classification"
    prompts = True

    def fields(self, loaded: LoadedModel) -> dict[str, Any]:
        return {}  # the default task: a classifier's records name none, as before tasks were named

    def hints(self, loaded: LoadedModel) -> list[str]:
        own = super().hints(loaded)
        if declared_kind(loaded.model) == "raw":
            own.append(
                f"{loaded.name}'s outputs are read as regression values (--head sigmoid if they are logits "
                "of independent labels, such as one binary logit)"
            )
        if not loaded.categories and classifier_out(loaded.model) == 1000:
            return [
                *own,
                f"{loaded.name}'s head has 1000 classes and no names; if they are ImageNet's, "
                "--labels imagenet names them",
            ]
        return own


CLASSIFICATION = register_task(Classification())
