"""The job settings (hookviz/jobs/settings.py): one object per job family, held whole by its jobs, every
default stated once and the command line's defaults equal to the library's, a misspelt setting refused."""

from __future__ import annotations

import dataclasses
import inspect
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import typer

from hookviz import explain_inputs
from hookviz.cli import app
from hookviz.cli.options import CamLook, CamMaps, MethodFlags, cam_settings
from hookviz.errors import UsageError
from hookviz.evaluation.families import MetricSettings
from hookviz.jobs.cam import CamJob
from hookviz.jobs.detection import DetectionJob
from hookviz.jobs.evaluate import EvaluateJob, evaluate_job
from hookviz.jobs.features import featuremap_job
from hookviz.jobs.labelled import LabelledCamJob
from hookviz.jobs.sanity import SanityJob
from hookviz.jobs.settings import CamSettings, settings_of
from hookviz.jobs.several import SeveralCamJob
from hookviz.jobs.training import DropBlockJob, gradflow_job
from hookviz.jobs.video import VideoCamJob
from hookviz.jobs.volume import VolumeCamJob
from hookviz.methods import MethodOptions
from tests.conftest import TinyCNN, tiny_loaded, write_image

#: The jobs of ``gradcam``, each holding a CamSettings (which holds a MethodOptions).
CAM_JOBS = (CamJob, LabelledCamJob, SeveralCamJob, VideoCamJob, VolumeCamJob, DetectionJob)


def _names(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def test_no_field_is_declared_in_two_settings_or_job_classes() -> None:
    """A CAM job holds its settings whole (``params``): none of its fields repeats a setting, and the
    settings repeat none of the method settings they hold (today's count: 0; it was 16 in CamJob alone)."""
    settings = _names(CamSettings) | _names(MethodOptions)
    twice = {(job.__name__, name) for job in CAM_JOBS for name in _names(job) & settings}
    twice |= {("CamSettings", name) for name in _names(CamSettings) & _names(MethodOptions)}
    assert twice == set()
    assert all(isinstance(f.default_factory(), CamSettings) for f in dataclasses.fields(CamJob)
               if f.name == "params")  # fmt: skip


def _defaults(command: str) -> dict[str, Any]:
    """What ``hookviz COMMAND`` gives each parameter when no option is given (by its Python name)."""
    cmd = typer.main.get_command(app).commands[command]  # type: ignore[attr-defined]
    return {p.name: p.default for p in cmd.params if p.name}


def _fields(cls: type, given: dict[str, Any]) -> Any:
    """An option group built from the command's defaults, as :func:`hookviz.cli.options.grouped` does."""
    return cls(**{name: given[name] for name in _names(cls) if name in given})


@pytest.mark.parametrize("command", ["gradcam", "evaluate", "sanity", "trust"])
def test_every_method_flag_default_is_the_library_s(command: str) -> None:
    given = _defaults(command)
    if command in ("evaluate", "trust"):  # --masks is the objects' masks folder there, not RISE's count
        assert given.pop("masks") is None
    if command == "evaluate":  # RISE's are --rise-masks there (trust runs RISE with the library's count)
        assert given["rise_masks"] == MethodOptions().masks
    flags = _fields(MethodFlags, {**dataclasses.asdict(MethodFlags()), **given})
    assert flags.options() == MethodOptions()


def test_gradcam_s_defaults_are_the_library_s() -> None:
    """Every ``gradcam`` option left out gives ``CamSettings()``: ``--probe`` 8 from Python as from the
    command line (Python, Ray and the explorer said 4)."""
    given = _defaults("gradcam")
    maps, look, flags = (_fields(c, given) for c in (CamMaps, CamLook, MethodFlags))
    got = cam_settings(given["layers"], given["methods"], given["target"], maps, look, flags)
    assert got == CamSettings()
    assert got.probe_images == CamSettings().probe_images == 8


def _signature_defaults(fn: Any) -> dict[str, Any]:
    return {n: p.default for n, p in inspect.signature(fn).parameters.items() if p.default is not p.empty}


def _field_defaults(cls: type) -> dict[str, Any]:
    return {f.name: f.default for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}


@pytest.mark.parametrize(
    ("command", "library", "renamed"),
    [
        ("featuremaps", _signature_defaults(featuremap_job), {}),
        ("gradflow", _signature_defaults(gradflow_job), {}),
        ("dropblock", _field_defaults(DropBlockJob), {}),
        ("evaluate", {**_signature_defaults(evaluate_job), **_field_defaults(EvaluateJob)}, {}),
        ("evaluate", _field_defaults(MetricSettings), {"patch_size": "patch"}),
        ("sanity", _field_defaults(SanityJob), {"smooth_noise": "noise"}),
    ],
)
def test_every_command_s_defaults_are_the_library_s(
    command: str, library: dict[str, Any], renamed: dict[str, str]
) -> None:
    """Each option a command shares with its library builder, job or settings has the library's default
    (``--method`` left out is None: the library's default methods)."""
    given = _defaults(command)
    claimed = set(renamed.values())  # sanity's --noise is SmoothGrad's; the job's noise is --smooth-noise
    shared = {
        name: renamed.get(name, name)
        for name in given
        if renamed.get(name, name) in library and name != "methods" and name not in claimed
    }
    assert shared, f"{command}: no option matched the library's names"
    differ = {
        name: (given[name], library[lib])
        for name, lib in shared.items()
        if given[name] != library[lib] and str(given[name]) != str(library[lib])
    }
    assert differ == {}


def test_a_misspelt_setting_is_refused_naming_the_closest() -> None:
    with pytest.raises(UsageError, match=r"CamSettings has no setting 'methd'; did you mean 'methods'\?"):
        settings_of(CamSettings, {"methd": ("layercam",)})
    with pytest.raises(UsageError, match=r"no setting 'alfa'; did you mean 'alpha'\?"):
        settings_of(CamSettings, CamSettings(), alfa=0.3)
    with pytest.raises(UsageError, match=r"MethodOptions has no setting 'sed'; did you mean 'seed'\?"):
        settings_of(CamSettings, {"options": {"sed": 3}})
    got = settings_of(CamSettings, {"methods": ["layercam"], "alpha": 0.3, "options": {"seed": 3}})
    assert got == CamSettings(methods=("layercam",), alpha=0.3, options=MethodOptions(seed=3))
    with pytest.raises(UsageError, match="--colormap 'jett': choose one of jet"):
        CamSettings(colormap="jett")


def test_explain_inputs_refuses_a_misspelt_setting(tmp_path: Path) -> None:
    photo = write_image(tmp_path / "a.png", np.full((40, 40, 3), 120, np.uint8))
    with pytest.raises(UsageError, match="did you mean 'methods'"):
        explain_inputs(tiny_loaded(TinyCNN()), photo, tmp_path / "out", methd=("x",))


def test_python_settings_are_checked_as_the_command_line_checks_them(tmp_path: Path) -> None:
    """A misspelt keyword to CamSettings or Run is refused naming the closest, across Run's keywords and the
    settings; values the command line refuses (--alpha 7, --probe 0, --batch-size 0) are refused before any
    input; a comma list given as one string is split into its methods."""
    from hookviz import Run

    with pytest.raises(UsageError, match=r"CamSettings has no setting 'layer'; did you mean 'layers'\?"):
        CamSettings(layer=("features.6",))  # type: ignore[call-arg]
    loaded = tiny_loaded(TinyCNN())
    with pytest.raises(
        UsageError, match=r"Run has no keyword 'skip_exsting'; did you mean 'skip_existing'\?"
    ):
        Run(loaded, [], out=tmp_path / "o", skip_exsting=True)  # type: ignore[call-arg]
    with pytest.raises(UsageError, match=r"Run has no keyword 'methds'; did you mean 'methods' \(a setting"):
        Run(loaded, [], out=tmp_path / "o", methds=("gradcam",))  # type: ignore[call-arg]
    with pytest.raises(
        UsageError, match=r"explain_inputs has no setting 'skip_exsting'; did you mean 'skip_exi"
    ):
        explain_inputs(loaded, [], tmp_path / "o", skip_exsting=True)
    with pytest.raises(UsageError, match=r"alpha 7.0: must be in \[0, 1\]"):
        CamSettings(alpha=7.0)
    with pytest.raises(UsageError, match="probe_images 0: must be at least 1"):
        CamSettings(layers=("auto",), probe_images=0)
    with pytest.raises(UsageError, match="batch_size 0: must be at least 1"):
        Run(loaded, [], out=tmp_path / "o", batch_size=0)
    assert CamSettings(methods="gradcam, layercam").methods == ("gradcam", "layercam")  # type: ignore[arg-type]
    assert CamSettings(layers="features.6").layers == ("features.6",)  # type: ignore[arg-type]
    assert CamSettings(alpha=0.0).alpha == 0.0 and CamSettings(alpha=1).alpha == 1
