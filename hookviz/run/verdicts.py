"""A ``hookviz trust`` run read back, for what reads its verdicts: ``gradcam --method auto`` (the method and
layer it recommends), the report and the explorer (each method's verdict beside it).

A run is found by its key: the model's name and its weights' fingerprint, as every output's settings key has
them (:func:`hookviz.models.settings.model_settings`: a torchvision weights name, ``sha256:`` of a file,
``none``...), which ``trust`` writes into ``trust.json``. It is looked for in the folder given (``--trust
DIR``: its ``trust.json`` or its subfolders'), else in the run's ``--out`` folder and its subfolders; when
none there is of this model and weights, ``--method auto`` runs trust on the first photos
(:data:`AUTO_PHOTOS`) and keeps it in ``OUT/trust.KEY/``, where the next run, and the report, find it.

Example:
    >>> run = find_trust(trust_key(loaded), [Path("trust/")])
    >>> choose(run).method, badge_for(run, "gradcam", "layer4")
"""

from __future__ import annotations

import dataclasses
import shlex
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hookviz.errors import UntrustedError, UsageError
from hookviz.evaluation.trust_read import (
    TRUST_JSON,
    TrustRun,
    badge_for,
    find_trust,
    read_trust,
    trust_runs,
)
from hookviz.io.outputs import command_words, settings_key
from hookviz.jobs.build import BuiltJob, CamSettings, RunContext
from hookviz.models.loaded import LoadedModel
from hookviz.models.settings import model_settings
from hookviz.run import distributed
from hookviz.run.trust import trust_photos, write_trust
from hookviz.tasks import make_cam_job

__all__ = ["AUTO", "AUTO_PHOTOS", "Choice", "TrustRun", "auto_choice", "auto_job", "auto_settings",
           "badge_for", "choose", "find_trust", "read_trust", "trust_key", "trust_run_of", "trust_runs",
           "with_badges"]  # fmt: skip

#: ``--method auto``: the method and layer of the model's trust run.
AUTO = "auto"
#: Photos a trust run made for ``--method auto`` tests, the first by name: enough for an interval, few enough
#: to be quick (``hookviz trust --max-photos 16`` gives answers worth reading; point ``--trust`` at it).
AUTO_PHOTOS = 8


def trust_key(loaded: LoadedModel) -> dict[str, str]:
    """What a trust run is of: the model's name and its weights' fingerprint (as its outputs' keys say)."""
    settings = model_settings(loaded)
    return {"model": str(settings["model"]), "weights": str(settings["weights"])}


def key_digest(key: Mapping[str, Any]) -> str:
    """8 hex digits of a key (the folder a trust run made for ``--method auto`` is kept in)."""
    return settings_key({"model": key.get("model"), "weights": key.get("weights")})


@dataclass(frozen=True)
class Choice:
    """The method and layer ``--method auto`` draws, and the trust run that chose them."""

    method: str
    layer: str
    verdict: str
    reason: str
    run: TrustRun
    #: Whether the run was made now, on the first photos (none of this model and weights was found).
    made: bool = False

    def line(self) -> str:
        """What ``gradcam`` says of the choice."""
        run = str(self.run).replace("the trust run", "the trust run made now") if self.made else str(self.run)
        if self.verdict == "recommended":
            how = f"recommended by {run}"
        else:
            how = f"usable with care ({self.reason}): nothing in {run} passes every test"
        return f"--method auto chose {self.method} at {self.layer}, {how}"


def choose(run: TrustRun) -> Choice:
    """What the run recommends (the most faithful candidate recommended), else the one usable with care that
    its answer names.

    Raises:
        UntrustedError: the run says no map here can be trusted.
    """
    report = run.report
    best = report.recommended()
    usable = [c for c in report.candidates if c.verdict == "care" and not c.control]
    if report.model_check.at_chance or (best is None and not usable):
        raise UntrustedError(
            f"--method auto: {run} says {report.answer}; nothing drawn (name a --method to draw one anyway)"
        )
    chosen = best or usable[0]
    return Choice(chosen.method, chosen.layer, chosen.verdict, chosen.reason, run)


def _made(
    loaded: LoadedModel,
    photos: Sequence[str],
    out: Path,
    key: dict[str, str],
    seed: int,
    words: Sequence[str],
) -> TrustRun:
    """A trust run on the first photos, kept in ``out/trust.KEY/`` (``words``: the model's options, for the
    command that reproduces it)."""
    if not photos or "-" in photos:
        raise UsageError(
            f"--method auto found no trust run of {key['model']} (weights {key['weights']}) in {out}, and "
            "cannot make one from stdin or a table: run hookviz trust over some photos first and give "
            "--trust DIR"
        )
    try:
        report, refused, failed = trust_photos(loaded, photos, seed=seed, max_photos=AUTO_PHOTOS)
    except UsageError as exc:
        raise UsageError(f"--method auto runs hookviz trust when none is found: {exc}") from None
    folder = out / f"trust.{key_digest(key)}"
    options = [*(words or ["--model", key["model"]]), "--seed", str(seed), "--max-photos", str(AUTO_PHOTOS),
               "--out", str(folder)]  # fmt: skip
    command = shlex.join(command_words(["hookviz", "trust"], photos, options))
    write_trust(report, folder, command=command, refused=refused, overwrite=True, failed=failed, key=key)
    return TrustRun(folder, key, report)


def auto_choice(
    loaded: LoadedModel,
    *,
    trust: Path | None = None,
    out: Path | None = None,
    photos: Sequence[str] = (),
    seed: int = 0,
    model_words: Sequence[str] = (),
    note: Callable[[str], None] | None = None,
) -> Choice:
    """``--method auto``'s choice for ``loaded``: from the trust run in ``trust`` (it must be of this model
    and weights), else the one of this model and weights in ``out`` (or its subfolders), else one made now on
    the first of ``photos`` and kept in ``out/trust.KEY/`` (``model_words``: the options that load the
    model, for the command its ``trust.md`` gives).

    Raises:
        UsageError: ``trust`` holds no run of this model and weights; none found and none can be made.
        UntrustedError: the run says no map here can be trusted.
    """
    key = trust_key(loaded)
    if trust is not None:
        return choose(trust_run_of(loaded, trust, note))
    run = find_trust(key, [out], note) if out is not None else None
    if run is not None:
        return choose(run)
    if out is None:
        raise UsageError("--method auto needs a trust run: give trust=DIR, or out= to keep one made now")
    if note is not None:
        note(f"--method auto: no trust run of {key['model']} (weights {key['weights']}) in {out}; running "
             f"hookviz trust on the first {AUTO_PHOTOS} photos (--trust DIR gives one)")  # fmt: skip
    return dataclasses.replace(choose(_made(loaded, photos, out, key, seed, model_words)), made=True)


def trust_run_of(loaded: LoadedModel, folder: Path, note: Callable[[str], None] | None = None) -> TrustRun:
    """The trust run in ``folder`` (or its subfolders) of ``loaded``'s model and weights, the newest; a
    ``trust.json`` there that cannot be read, when another run is found, is named to ``note`` (never
    skipped in silence).

    Raises:
        UsageError: none there is of this model and weights (the runs there are named), or one there cannot
            be read (a ``trust.json`` cut short: run trust again with ``--overwrite``).
    """
    key = trust_key(loaded)
    unreadable: list[str] = []
    run = find_trust(key, [folder], unreadable.append)
    if run is None and unreadable:  # the run asked for may be the one cut short: say so, not "none"
        raise UsageError(f"--trust {folder}: {unreadable[0].removeprefix('left out: ')}")
    if note is not None and run is not None:
        for line in unreadable:
            note(f"--trust {folder}: {line}")
    if run is None:
        there = [f"{r.key.get('model')} (weights {r.key.get('weights')})" for r in trust_runs([folder])]
        found = f"holds trust runs of {', '.join(there)}" if there else f"holds no {TRUST_JSON}"
        raise UsageError(f"--trust {folder} {found}, not of {key['model']} (weights {key['weights']}); "
                         "run hookviz trust with this model and weights")  # fmt: skip
    return run


def with_badges(listed: list[dict[str, Any]], run: TrustRun | None, layer: str) -> list[dict[str, Any]]:
    """The explorer's method list, each method with its verdict in ``run`` (``trust``: at ``layer``, the
    default, when tested there, else its best; None when the run did not test it). Unchanged without a run."""
    if run is None:
        return listed
    return [{**m, "trust": badge_for(run, str(m["name"]), layer)} for m in listed]


def auto_settings(settings: CamSettings, choice: Choice) -> CamSettings:
    """``settings`` with ``--method auto`` replaced by the chosen method and layer."""
    return dataclasses.replace(settings, methods=(choice.method,), layers=(choice.layer,))


def wants_auto(settings: CamSettings) -> bool:
    """Whether ``settings`` ask for ``--method auto``.

    Raises:
        UsageError: ``auto`` among other methods, or with layers named (it chooses the layer too).
    """
    names = [n.strip().lower() for m in settings.methods for n in m.split(",") if n.strip()]
    if AUTO not in names:
        return False
    if names != [AUTO]:
        raise UsageError("--method auto stands alone (it draws the one method a trust run recommends)")
    if settings.layers:
        raise UsageError("--method auto chooses the layer too; leave out --layer, or name the method")
    return True


def auto_job(
    settings: CamSettings,
    loaded: LoadedModel,
    context: RunContext,
    *,
    trust: Path | None = None,
    out: Path | None = None,
    photos: Sequence[str] = (),
    model_words: Sequence[str] = (),
    note: Callable[[str], None] | None = None,
) -> tuple[BuiltJob, Choice]:
    """The ``gradcam`` job of ``--method auto`` and its choice (made on rank 0 under torchrun, every rank
    drawing the same).

    Raises:
        UsageError, UntrustedError: as :func:`auto_choice`.
    """
    dist = distributed.from_env()
    found: Choice | str | None = None
    if dist is None or dist.rank == 0:
        try:
            found = auto_choice(
                loaded, trust=trust, out=out, photos=photos, model_words=model_words, note=note
            )
        except UntrustedError as exc:
            found = str(exc)
    found = context.agree(found)
    if not isinstance(found, Choice):
        raise UntrustedError(str(found))
    return make_cam_job(loaded, auto_settings(settings, found), context=context), found
