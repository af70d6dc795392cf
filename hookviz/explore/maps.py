"""The explorer's maps panel: each view made by the very job ``hookviz gradcam`` runs (kept, the least
recently used dropped first), what an input can be explained for, the ``gradcam`` line of a view, and how
faithful its map is against chance."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable
from typing import Any, TypeVar

import torch

from hookviz.core.hooks import ModuleCall
from hookviz.core.readout import scorer
from hookviz.errors import UsageError
from hookviz.evaluation.faithfulness import faithfulness, random_maps
from hookviz.explore.inputs import Inputs
from hookviz.explore.view import Made, View
from hookviz.io.outputs import settings_key
from hookviz.models.loaded import LoadedModel
from hookviz.run.pipeline import output_prefix
from hookviz.tasks import make_cam_job

T = TypeVar("T")

#: Views kept made (PNG, raw map, record), least recently used dropped first.
VIEWS_KEPT = 64


class Maps:
    """The views of one model's session; ``on_model(work)`` runs ``work`` on the session's model thread."""

    def __init__(
        self,
        loaded: LoadedModel,
        inputs: Inputs,
        calls: list[ModuleCall],
        on_model: Callable[[Callable[[], Any]], Any],
        model_words: list[str],
    ) -> None:
        self.loaded, self.inputs, self.calls, self.on_model = loaded, inputs, calls, on_model
        #: The model options a command needs to load the same model (``--model NAME --weights W ...``).
        self.model_words = model_words
        self._top: dict[int, dict[str, Any]] = {}
        self._made: OrderedDict[tuple[Any, ...], Made] = OrderedDict()
        inputs.forget.append(self._forget)

    def _forget(self, index: int) -> None:
        self._top.pop(index, None)
        for key in [k for k in self._made if k[0] == index]:
            self._made.pop(key, None)

    def command(self, view: View) -> list[str]:
        """The ``hookviz gradcam`` line that writes ``view``'s PNG (see :meth:`View.command`); a dropped
        photo by its own name (the user's copy; the session's is private and goes with it)."""
        photo = self.inputs.dropped.get(view.input) or str(self.inputs.items[view.input].path)
        return view.command(self.model_words, photo)

    def predict(self, index: int, k: int = 5) -> dict[str, Any]:
        """What input ``index`` can be explained for, as the default view's pass reads it: ``kind``
        ``classes`` (the ``k`` most likely, softmax), ``labels`` (a multi-label head's sigmoids, each
        ``positive`` at 0.5 or more), ``regions`` (a segmenter's classes by their share of the pixels) or
        ``boxes`` (a detector's, numbered from 1 as ``gradcam`` names their files); ``targets`` each with
        index, name and score."""
        self.inputs.fresh(index)
        if index not in self._top:
            made = self.view(View(input=index), draw=False)
            assert made is not None
            self._top[index] = _targets(made, self.loaded)
        found = self._top[index]
        return {**found, "targets": found["targets"][: k if found["kind"] == "classes" else 50]}

    def view(self, view: View, wanted: Callable[[], bool] | None = None, draw: bool = True) -> Made | None:
        """The view's PNG, raw map and record, made by ``hookviz gradcam``'s own job (kept once made); None
        when ``wanted()`` says, once the model is free, that a newer view has been asked for instead.
        ``draw``: draw its picture now, on the model's thread (where OpenCV's and torch's pools are warm)."""
        self.inputs.fresh(view.input)
        key = view.made_of()
        if key in self._made:
            self._made.move_to_end(key)
            made = self._made[key]
            if draw:
                self.on_model(lambda: made.png_of(view))
            return made
        rgb, x, box = self.inputs.read(view.input)

        def compute() -> tuple[Any, Any] | None:
            if wanted is not None and not wanted():
                return None
            job = make_cam_job(self.loaded, view.settings(), calls=self.calls, target_option="target=").job
            return job, job.compute(torch.from_numpy(x)[None].to(self.loaded.device))

        done = self.on_model(compute)
        if done is None:
            return None
        job, result = done
        item = self.inputs.items[view.input]
        assert item.path is not None
        prefix = output_prefix(item.path, self.loaded.name, settings_key(job.settings()))
        made = Made(job, result, (rgb, box), prefix, item.name)
        self._made[key] = made
        if draw:
            self.on_model(lambda: made.png_of(view))
        if len(self._made) > VIEWS_KEPT:
            self._made.popitem(last=False)
        return made

    def trust(self, view: View, steps: int = 16) -> dict[str, Any]:
        """How faithful the view's map is, against chance: deletion and insertion AUC of the map and of a
        seeded random map (the ``evaluate`` command's ``random`` baseline) on this photo."""
        made = self.view(view, draw=False)
        assert made is not None
        kind = self.inputs.kind.name
        if made.detector or kind != "photo":
            raise UsageError(f"the trust panel measures photos of classifiers and segmenters, not "
                             f"{'a detector' if made.detector else kind + 's'} (yet)")  # fmt: skip
        _, x, _ = self.inputs.read(view.input)
        batch = torch.from_numpy(x)[None].to(self.loaded.device)
        cam = torch.from_numpy(made.map)[None]
        ex = made.result.explanation
        target = ex.targets[:1, 0].cpu()
        score = scorer(ex.labels, ex.region, ex.score_kind)
        chance_map = random_maps(1, cam.shape[-2], cam.shape[-1], x=batch)
        model = self.loaded.model
        ours, chance = self.on_model(
            lambda: [
                faithfulness(model, batch, m, target, steps=steps, scorer=score) for m in (cam, chance_map)
            ]
        )
        return {
            "deletion_auc": float(ours.deletion_auc[0]), "insertion_auc": float(ours.insertion_auc[0]),
            "random": {"deletion_auc": float(chance.deletion_auc[0]),
                       "insertion_auc": float(chance.insertion_auc[0])},
            "steps": steps,
        }  # fmt: skip


def _targets(made: Made, loaded: LoadedModel) -> dict[str, Any]:
    """What a view's pass says the input can be explained for (see :meth:`Maps.predict`)."""
    if made.detector:
        found = made.result[0]
        return {
            "kind": "boxes",
            "targets": [
                {"box": k + 1, "index": label, "name": loaded.class_name(label),
                 "score": round(float(found.scores[k]), 6),
                 "xyxy": [round(float(v), 2) for v in found.boxes[k].tolist()]}
                for k, label in enumerate(found.labels.tolist())
            ],
        }  # fmt: skip
    ex = made.result.explanation
    probs = ex.probs[0].float()
    order = torch.argsort(-probs, stable=True).tolist()
    kind = "labels" if ex.score_kind == "sigmoid" else "regions" if ex.labels is not None else "classes"
    if kind == "regions":  # the classes that own pixels, by their share
        present = set(torch.unique(ex.labels[0]).tolist())
        order = [c for c in order if c in present]
    each = [
        {"index": int(c), "name": loaded.class_name(int(c)), "score": round(float(probs[c]), 6)}
        | ({"positive": bool(probs[c] >= 0.5)} if kind == "labels" else {})
        for c in order[:50]
    ]
    return {"kind": kind, "targets": each}
