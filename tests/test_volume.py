"""Volumes (#35): NIfTI, .npy and DICOM series in, maps on the volume's own grid and affine out; a trained
3-D CNN's maps in its object; Grad-CAM equal to MONAI's; MONAI networks as a source; evaluate and sanity."""

from __future__ import annotations

import json
import shutil
import time
import warnings
from pathlib import Path
from typing import Any

import nibabel as nib
import numpy as np
import pytest
import torch
from safetensors.torch import load_file
from torch import nn

from hookviz.engine.explain import explain
from hookviz.io.volume import read_volume
from hookviz.tasks import load_model
from tests import volume_net
from tests.conftest import evaluation_file, invoke, records

FIXTURE = Path(__file__).parent / "fixtures" / "volume_net.safetensors"
NET = f"{Path(volume_net.__file__)}:make"
AFFINE = np.array([[1.5, 0, 0, -20.0], [0, 1.2, 0, -30.0], [0, 0, 2.0, 10.0], [0, 0, 0, 1]])


def trained() -> volume_net.VolumeNet:
    model = volume_net.make()
    model.load_state_dict(load_file(str(FIXTURE)))
    return model.eval()


def _nifti(path: Path, v: np.ndarray, affine: np.ndarray = AFFINE) -> Path:
    nib.save(nib.Nifti1Image(v.astype(np.float32), affine), str(path))
    return path


def _maps(out: Path) -> list[dict[str, Any]]:
    return [m for r in records(out) if r["status"] == "ok" for m in r["maps"]]


def test_the_trained_nets_grad_cam_peaks_in_its_object() -> None:
    """16 held-out volumes with a cube: the Grad-CAM (and LayerCAM) peak of the cube class, on the volume's
    grid, lies in the cube (grown by one voxel) in at least 15 (measured: all 64 of 64); a voxel drawn at
    random would be in it 2 % of the time. (The rod class is told by the absence of a cube: its maps light
    the background, which the trained net's evidence is, so they are not asserted.)"""
    model = trained()
    rng = np.random.default_rng(2024)
    made = [volume_net.volume(rng, 0) for _ in range(16)]
    x = torch.from_numpy(np.stack([v for v, _ in made]))[:, None]
    ex = explain(model, x, ["features.5"], ["gradcam", "layercam"], targets=[0])
    assert (ex.predicted == 0).all()
    for method in ("gradcam", "layercam"):
        maps = ex.maps[(method, "features.5")][:, 0]  # (B, 12, 12, 12)
        full = nn.functional.interpolate(maps[:, None], size=x.shape[2:], mode="trilinear")[:, 0]
        hits = 0
        for k, (_, where) in enumerate(made):
            peak = np.unravel_index(int(full[k].argmax()), full[k].shape)
            hits += all(s.start - 1 <= p < s.stop + 1 for p, s in zip(peak, where, strict=True))
        assert hits >= 15, (method, hits)


def test_nifti_in_nifti_out_with_the_same_affine_and_grid(tmp_path: Path) -> None:
    rng = np.random.default_rng(1)
    v, where = volume_net.volume(rng, 0)
    scan = _nifti(tmp_path / "scan.nii.gz", v)
    weights = tmp_path / "net.safetensors"
    weights.write_bytes(FIXTURE.read_bytes())
    out = tmp_path / "out"
    r = invoke("gradcam", str(scan), "--model", NET, "--weights", str(weights), "-o", str(out), "--save-raw")
    assert r.exit_code == 0, r.output
    (rec,) = records(out)
    assert rec["task"] == "volume" and rec["volume"]["shape"] == [24, 24, 24]
    assert rec["volume"]["spacing"] == [1.5, 1.2, 2.0]
    (m,) = rec["maps"]
    overlay = nib.load(str(out / m["nifti"]))
    np.testing.assert_allclose(overlay.affine, AFFINE, atol=1e-6)
    codes = (int(nib.load(str(scan)).header["sform_code"]), int(nib.load(str(scan)).header["qform_code"]))
    assert overlay.shape == (24, 24, 24)  # and the scan's own sform and qform codes (nibabel's 2 and 0)
    assert (int(overlay.header["sform_code"]), int(overlay.header["qform_code"])) == codes
    full = np.load(out / m["file"].replace(".png", ".full.npy"))
    np.testing.assert_allclose(np.asarray(overlay.dataobj), full, rtol=1e-6)
    # The peak voxel lies in the cube, and its world coordinate is the affine's.
    peak = m["peak"]["voxel"]
    assert all(s.start - 1 <= p < s.stop + 1 for p, s in zip(peak, where, strict=True))
    np.testing.assert_allclose(m["peak"]["world"], (AFFINE @ [*peak, 1])[:3], atol=1e-3)
    for suffix in (".png", ".slices.png", ".webm", ".npy"):
        assert (out / m["file"].replace(".png", suffix)).stat().st_size > 0
    assert not (tmp_path / "scan.nii.gz").with_suffix(".bak").exists()  # the input is untouched
    assert np.array_equal(np.asarray(nib.load(str(scan)).dataobj), v)


def test_grad_cam_equals_monais_on_the_same_layer(tmp_path: Path) -> None:
    with warnings.catch_warnings():  # MONAI's modules use torch.jit.interface, deprecated on a newer torch
        warnings.simplefilter("ignore", FutureWarning)
        warnings.simplefilter("ignore", DeprecationWarning)
        from monai.visualize import GradCAM

    model = trained()
    rng = np.random.default_rng(3)
    vols = [volume_net.volume(rng, k % 2)[0] for k in range(2)]
    paths = [np.save(tmp_path / f"v{k}.npy", v) or tmp_path / f"v{k}.npy" for k, v in enumerate(vols)]
    weights = tmp_path / "net.safetensors"
    weights.write_bytes(FIXTURE.read_bytes())
    out = tmp_path / "out"
    r = invoke("gradcam", *map(str, paths), "--model", NET, "--weights", str(weights), "-o", str(out),
               "--layer", "features.5", "--save-raw", "--target", "1")  # fmt: skip
    assert r.exit_code == 0, r.output
    cam = GradCAM(nn_module=model, target_layers="features.5", postprocessing=lambda t: t)
    for rec in records(out):
        v = np.load(rec["input"])
        theirs = cam(torch.from_numpy(v)[None, None], class_idx=1)[0, 0].detach().numpy()
        (m,) = rec["maps"]
        ours = np.load(out / m["file"].replace(".png", ".full.npy"))
        np.testing.assert_allclose(ours, theirs, rtol=1e-4, atol=1e-6 * float(np.abs(theirs).max()))
        assert float(theirs.max()) > 0


def test_npy_with_channels_resized_and_written_back_on_its_own_grid(tmp_path: Path) -> None:
    """A (C, X, Y, Z) array for a two-channel model, --input-size D,H,W: the model sees the resized volume,
    the map is written on the volume's own 20 x 28 x 16 grid; --mean/--std per channel."""
    two = tmp_path / "two.py"
    two.write_text(
        f"import sys; sys.path.insert(0, {str(Path(volume_net.__file__).parent)!r})\n"
        "import volume_net\ndef make():\n    return volume_net.VolumeNet(channels=2)\n"
    )
    v = np.random.default_rng(4).normal(size=(2, 20, 28, 16)).astype(np.float32)
    np.save(tmp_path / "two.npy", v)
    out = tmp_path / "out"
    r = invoke("gradcam", str(tmp_path / "two.npy"), "--model", f"{two}:make", "--weights", "none", "-o",
               str(out), "--input-size", "16,16,16", "--mean", "0.5,0", "--std", "2,1",
               "--save-raw")  # fmt: skip
    assert r.exit_code == 0, r.output
    (rec,) = records(out)
    assert rec["volume"]["channels"] == 2 and rec["settings"]["volume"]["size"] == [16, 16, 16]
    (m,) = rec["maps"]
    assert m["shape"] == [8, 8, 8]
    assert np.load(out / m["file"].replace(".png", ".full.npy")).shape == (20, 28, 16)
    # The model's input is (v - mean) / std per channel, resized trilinearly.
    loaded = load_model(f"{two}:make", "none", input_size=(16, 16, 16), mean=(0.5, 0.0), std=(2.0, 1.0))
    assert loaded.volume is not None
    x, _ = loaded.volume(read_volume(tmp_path / "two.npy"))
    expected = nn.functional.interpolate(
        torch.from_numpy(
            (v - np.array([0.5, 0])[:, None, None, None]) / np.array([2.0, 1])[:, None, None, None]
        )[None].float(),
        size=(16, 16, 16),
        mode="trilinear",
    )[0]
    np.testing.assert_allclose(x, expected.numpy(), rtol=1e-5, atol=1e-6)


def _dicom_series(folder: Path, v: np.ndarray, spacing: tuple[float, float, float]) -> np.ndarray:
    """``v`` (X, Y, Z) as one DICOM file per slice (shuffled names), axial, LPS; returns the RAS affine."""
    from pydicom.dataset import FileDataset, FileMetaDataset
    from pydicom.uid import ExplicitVRLittleEndian, generate_uid

    folder.mkdir()
    series = generate_uid()
    origin = np.array([-100.0, -80.0, 30.0])
    for k in np.random.default_rng(0).permutation(v.shape[2]):
        meta = FileMetaDataset()
        meta.TransferSyntaxUID = ExplicitVRLittleEndian
        meta.MediaStorageSOPClassUID = "1.2.840.10008.5.1.4.1.1.2"
        meta.MediaStorageSOPInstanceUID = generate_uid()
        ds = FileDataset(str(folder / f"im{k}.dcm"), {}, file_meta=meta, preamble=b"\0" * 128)
        ds.SeriesInstanceUID = series
        ds.Modality = "CT"
        ds.Rows, ds.Columns = v.shape[1], v.shape[0]
        ds.PixelSpacing = [spacing[1], spacing[0]]
        ds.ImageOrientationPatient = [1, 0, 0, 0, 1, 0]
        ds.ImagePositionPatient = list(origin + np.array([0.0, 0.0, k * spacing[2]]))
        ds.RescaleSlope, ds.RescaleIntercept = 0.5, -100
        ds.BitsAllocated, ds.BitsStored, ds.HighBit, ds.PixelRepresentation = 16, 16, 15, 0
        ds.SamplesPerPixel, ds.PhotometricInterpretation = 1, "MONOCHROME2"
        stored = np.round((v[:, :, k].T + 100) / 0.5).astype(np.uint16)  # rows = y, columns = x
        ds.PixelData = stored.tobytes()
        ds.save_as(str(folder / f"im{k}.dcm"), enforce_file_format=True)
    lps = np.diag([spacing[0], spacing[1], spacing[2], 1.0])
    lps[:3, 3] = origin
    return np.diag([-1.0, -1.0, 1.0, 1.0]) @ lps


def test_a_dicom_series_is_one_volume_with_its_ras_affine(tmp_path: Path) -> None:
    pytest.importorskip("pydicom")
    v = np.round(np.random.default_rng(5).uniform(-50, 50, (24, 24, 24)) * 2) / 2
    affine = _dicom_series(tmp_path / "series", v, (0.8, 0.9, 2.5))
    got = read_volume(tmp_path / "series")
    assert got.kind == "dicom" and got.shape == (24, 24, 24)
    np.testing.assert_allclose(got.data[0], v, atol=1e-4)  # slices in order, rescaled, x along columns
    np.testing.assert_allclose(got.affine, affine, atol=1e-6)
    out = tmp_path / "out"
    r = invoke("gradcam", str(tmp_path / "series"), "--model", NET, "--weights", str(FIXTURE), "-o", str(out))
    assert r.exit_code == 0, r.output
    (rec,) = records(out)
    np.testing.assert_allclose(nib.load(str(out / rec["maps"][0]["nifti"])).affine, affine, atol=1e-6)


def test_volume_or_video_by_the_inputs(tmp_path: Path) -> None:
    """A three-channel Conv3d model is a video model, unless its inputs are volumes (or --task volume);
    a one-channel one is a volume model."""
    three = tmp_path / "three.py"
    three.write_text(
        f"import sys; sys.path.insert(0, {str(Path(volume_net.__file__).parent)!r})\n"
        "import volume_net\ndef make():\n    return volume_net.VolumeNet(channels=3)\n"
    )
    assert load_model(f"{three}:make", "none").task_name == "video"
    assert load_model(f"{three}:make", "none", volumes=True).task_name == "volume"
    assert load_model(NET, "none").task_name == "volume"
    np.save(tmp_path / "rgb.npy", np.random.default_rng(6).normal(size=(3, 16, 16, 16)).astype(np.float32))
    out = tmp_path / "out"
    r = invoke(
        "gradcam", str(tmp_path / "rgb.npy"), "--model", f"{three}:make", "--weights", "none", "-o", str(out)
    )
    assert r.exit_code == 0, r.output
    assert records(out)[0]["task"] == "volume"
    r = invoke("gradcam", str(tmp_path), "--model", f"{three}:make", "--weights", "none", "-o", str(out),
               "--task", "volume")  # fmt: skip
    assert r.exit_code == 0, r.output


def test_a_bad_volume_fails_alone(tmp_path: Path) -> None:
    rng = np.random.default_rng(7)
    _nifti(tmp_path / "good.nii", rng.normal(size=(16, 16, 16)))
    np.save(tmp_path / "flat.npy", rng.normal(size=(16, 16)).astype(np.float32))
    np.save(tmp_path / "two.npy", rng.normal(size=(2, 16, 16, 16)).astype(np.float32))
    (tmp_path / "broken.nii.gz").write_bytes(b"not a nifti")
    bad = rng.normal(size=(16, 16, 16)).astype(np.float32)
    bad[3, 3, 3] = np.nan
    np.save(tmp_path / "nan.npy", bad)
    out = tmp_path / "out"
    r = invoke("gradcam", str(tmp_path), "--model", NET, "--weights", "none", "-o", str(out))
    assert r.exit_code == 1, r.output
    by = {Path(x["input"]).name: x for x in records(out)}
    assert by["good.nii"]["status"] == "ok"
    assert "a 2-D array; a volume is 3-D" in by["flat.npy"]["error"]
    assert "2 channel(s) and the model takes 1" in by["two.npy"]["error"]
    assert "cannot be read as a volume" in by["broken.nii.gz"]["error"]
    assert "NaN or infinite" in by["nan.npy"]["error"]
    assert all("\n" not in (x.get("error") or "") for x in by.values())


def test_methods_that_do_not_apply_and_three_sides_for_a_photo_model_are_one_line(tmp_path: Path) -> None:
    _nifti(tmp_path / "v.nii", np.zeros((16, 16, 16)))
    r = invoke("gradcam", str(tmp_path / "v.nii"), "--model", NET, "--weights", "none", "-o",
               str(tmp_path / "o"),
               "--method", "integratedgradients")  # fmt: skip
    assert r.exit_code == 2 and "does not apply to a volume model" in r.output
    r = invoke("gradcam", str(tmp_path / "v.nii"), "--model", "resnet18", "--weights", "none", "-o",
               str(tmp_path / "o"), "--input-size", "16,16,16")  # fmt: skip
    assert r.exit_code == 2 and "three sides are for volume models" in r.output


def test_monai_networks_as_a_source(tmp_path: Path) -> None:
    spec = (
        "monai:DenseNet?spatial_dims=3&in_channels=1&out_channels=2&init_features=8&growth_rate=4"
        "&block_config=(2,2)"
    )
    loaded = load_model(spec, "none")
    assert loaded.task_name == "volume" and loaded.volume is not None
    torch.save(loaded.model.state_dict(), tmp_path / "model.pt")
    _nifti(tmp_path / "v.nii.gz", np.random.default_rng(8).normal(size=(24, 24, 24)))
    out = tmp_path / "out"
    r = invoke("gradcam", str(tmp_path / "v.nii.gz"), "--model", spec, "--weights",
               str(tmp_path / "model.pt"),
               "-o", str(out), "--method", "gradcam,layercam", "--save-raw")  # fmt: skip
    assert r.exit_code == 0, r.output
    (rec,) = records(out)
    assert rec["pretrained"] is True and {m["method"] for m in rec["maps"]} == {"gradcam", "layercam"}
    r = invoke("gradcam", str(tmp_path / "v.nii.gz"), "--model", spec, "-o", str(out))
    assert r.exit_code != 0 and "has no default weights" in r.output
    r = invoke(
        "gradcam",
        str(tmp_path / "v.nii.gz"),
        "--model",
        "monai:DenseNet12",
        "--weights",
        "none",
        "-o",
        str(out),
    )
    assert r.exit_code != 0 and "DenseNet121" in r.output


def test_evaluate_and_sanity_on_volumes(tmp_path: Path) -> None:
    """Deletion and insertion over voxels: the trained net's Grad-CAM deletes its cube evidence much faster
    than a random map; the sanity check's maps change when its weights are randomised."""
    rng = np.random.default_rng(9)
    for k in range(4):
        _nifti(tmp_path / f"v{k}.nii.gz", volume_net.volume(rng, 0)[0])
    out = tmp_path / "ev"
    r = invoke("evaluate", str(tmp_path), "--model", NET, "--weights", str(FIXTURE), "-o", str(out))
    assert r.exit_code == 0, r.output
    table = json.loads(evaluation_file(out).read_text())
    rows = {row["method"]: row for row in table["rows"]}
    assert table["images"] == 4
    assert rows["gradcam"]["deletion_auc"] < 0.5 * rows["random"]["deletion_auc"]
    assert rows["gradcam"]["insertion_auc"] > rows["gradcam"]["deletion_auc"] + 0.4
    out = tmp_path / "sa"
    r = invoke(
        "sanity", str(tmp_path / "v0.nii.gz"), "--model", NET, "--weights", str(FIXTURE), "-o", str(out)
    )
    assert r.exit_code == 0, r.output
    steps = records(out)[0]["steps"]
    last = [s for s in steps if s["method"] == "gradcam"][-1]
    assert last["spearman"] < 0.5


def test_explain_volumes_from_python_equals_the_command_line(tmp_path: Path) -> None:
    import hookviz
    from hookviz.jobs.settings import CamSettings

    (tmp_path / "in").mkdir()
    _nifti(tmp_path / "in" / "a.nii.gz", volume_net.volume(np.random.default_rng(10), 0)[0])
    loaded = hookviz.load_model(NET, str(FIXTURE))
    recs = hookviz.explain_volumes(loaded, tmp_path / "in", tmp_path / "lib", CamSettings(save_raw=True))
    r = invoke("gradcam", str(tmp_path / "in"), "--model", NET, "--weights", str(FIXTURE), "-o",
               str(tmp_path / "cli"), "--save-raw")  # fmt: skip
    assert r.exit_code == 0, r.output
    (lib,), (cli,) = recs, records(tmp_path / "cli")
    assert lib["maps"][0]["peak"] == cli["maps"][0]["peak"]
    a = np.load(tmp_path / "lib" / lib["maps"][0]["file"].replace(".png", ".full.npy"))
    b = np.load(tmp_path / "cli" / cli["maps"][0]["file"].replace(".png", ".full.npy"))
    np.testing.assert_allclose(a, b, rtol=1e-6)
    with pytest.raises(hookviz.HookvizError, match="does not take volumes"):
        hookviz.explain_volumes(hookviz.load_model("resnet18", "none"), tmp_path / "in", tmp_path / "x")


def test_occlusion_over_cubes_equals_captums_and_rise_finds_the_cube() -> None:
    """Occlusion with a 6-voxel cube every 3 voxels equals captum's 3-D ``Occlusion`` (the target's logit);
    RISE's masks are cubes of cells (trilinear), and its map peaks in the cube for every held-out volume."""
    from captum.attr import Occlusion

    from hookviz.methods import MethodOptions
    from hookviz.methods.perturb import random_masks

    model = trained()
    rng = np.random.default_rng(12)
    made = [volume_net.volume(rng, 0) for _ in range(4)]
    x = torch.from_numpy(np.stack([v for v, _ in made]))[:, None]
    options = MethodOptions(window=6, stride=3, baseline="mean")
    ours = explain(model, x, ["features.5"], ["occlusion"], targets=[0], relu=False, options=options)
    ours = ours.maps[("occlusion", "features.5")]
    theirs = Occlusion(model).attribute(x, target=0, sliding_window_shapes=(1, 6, 6, 6), strides=(1, 3, 3, 3),
                                        baselines=0.0)  # fmt: skip
    assert ours.shape == (4, 1, 24, 24, 24)
    np.testing.assert_allclose(ours[:, 0].numpy(), theirs[:, 0].numpy(), rtol=1e-4, atol=1e-5)
    masks = random_masks(64, 4, (24, 24, 24), seed=0)
    assert masks.shape == (64, 24, 24, 24) and 0.4 < float(masks.mean()) < 0.6
    options = MethodOptions(masks=800, cells=4, seed=0)
    rise = explain(model, x, ["features.5"], ["rise"], targets=[0], options=options).maps[
        ("rise", "features.5")
    ]
    for k, (_, where) in enumerate(made):
        peak = np.unravel_index(int(rise[k, 0].argmax()), rise[k, 0].shape)
        assert all(s.start - 2 <= p < s.stop + 2 for p, s in zip(peak, where, strict=True)), (k, peak, where)


def _header_only(path: Path, shape: tuple[int, ...]) -> Path:
    """A .nii.gz whose header names ``shape`` and whose voxels are cut short (nothing to decode)."""
    import gzip

    import nibabel as nib

    header = nib.Nifti1Header()
    header.set_data_shape(shape)
    header.set_data_dtype(np.uint8)
    header["vox_offset"] = 352
    path.write_bytes(gzip.compress(header.binaryblock + b"\0" * 4 + b"\0" * 1024))
    return path


def test_a_huge_nifti_is_refused_by_its_header_before_decoding(tmp_path: Path) -> None:
    pytest.importorskip("nibabel")
    from hookviz.errors import InputError
    from hookviz.io.volume import DEFAULT_MAX_VOXELS, read_volume

    started = time.monotonic()
    with pytest.raises(InputError, match=r"2048x2048x2048 is 8,589,934,592 voxels, over the limit") as got:
        read_volume(_header_only(tmp_path / "huge.nii.gz", (2048, 2048, 2048)), DEFAULT_MAX_VOXELS)
    assert time.monotonic() - started < 5 and "--input-size" not in str(got.value)
    # An .npy's header names its shape too (a sparse file: nothing written past the header).
    big = np.lib.format.open_memmap(tmp_path / "wide.npy", "w+", np.uint8, (1, 600, 600, 600))
    del big
    with pytest.raises(InputError, match="over the limit"):
        read_volume(tmp_path / "wide.npy", DEFAULT_MAX_VOXELS)


def test_the_default_limit_fits_a_plain_ct(tmp_path: Path) -> None:
    """512x512x320 passes the size check with the default --max-pixels (then fails: its voxels are cut)."""
    pytest.importorskip("nibabel")
    from hookviz.errors import InputError
    from hookviz.io.images import DEFAULT_MAX_PIXELS
    from hookviz.io.inputs import Item
    from hookviz.tasks.volume import VOLUME

    ct = _header_only(tmp_path / "ct.nii.gz", (512, 512, 320))
    with pytest.raises(InputError) as got:
        VOLUME.read(Item(str(ct), ct), None, DEFAULT_MAX_PIXELS)
    assert "over the limit" not in str(got.value) and "cannot be read" in str(got.value)
    with pytest.raises(InputError, match="over the limit of 1,000,000"):
        VOLUME.read(Item(str(ct), ct), None, 1_000_000)  # a limit given is the limit


def test_a_dicom_series_with_a_missing_or_doubled_slice(tmp_path: Path) -> None:
    pytest.importorskip("pydicom")
    from hookviz.errors import InputError
    from hookviz.io.volume import read_volume
    from tests.test_volume import _dicom_series

    v = np.round(np.random.default_rng(5).uniform(-50, 50, (8, 8, 10)) * 2) / 2
    _dicom_series(tmp_path / "gap", v, (1.0, 1.0, 2.5))
    (tmp_path / "gap" / "im4.dcm").unlink()
    said = r"not evenly spaced: 5 mm between slices 4 and 5 .* 2.5 mm apart \(a missing slice\?\)"
    with pytest.raises(InputError, match=said):
        read_volume(tmp_path / "gap")
    _dicom_series(tmp_path / "twice", v, (1.0, 1.0, 2.5))
    shutil.copy(tmp_path / "twice" / "im3.dcm", tmp_path / "twice" / "zz_copy.dcm")
    got = read_volume(tmp_path / "twice")
    assert got.shape == (8, 8, 10) and got.spacing[2] == pytest.approx(2.5)
    np.testing.assert_allclose(got.data[0], v, atol=1e-4)
    assert got.notes == ("1 DICOM slice(s) given twice (the same pixels at one position) were dropped",)
    import pydicom

    other = pydicom.dcmread(tmp_path / "twice" / "zz_copy.dcm")
    other.PixelData = bytes(len(other.PixelData))
    other.save_as(tmp_path / "twice" / "zz_copy.dcm")
    with pytest.raises(InputError, match="two different slices at position"):
        read_volume(tmp_path / "twice")


def test_volume_errors_name_their_file_and_maps_keep_the_inputs_codes(tmp_path: Path) -> None:
    nib = pytest.importorskip("nibabel")
    from tests.test_volume import FIXTURE, NET

    fmri = tmp_path / "run.nii.gz"
    nib.save(nib.Nifti1Image(np.zeros((12, 12, 12, 100), np.float32), np.eye(4)), str(fmri))
    out = tmp_path / "o"
    r = invoke("gradcam", str(fmri), "--model", NET, "--weights", str(FIXTURE), "-o", str(out))
    assert r.exit_code == 1
    assert "run.nii.gz" in r.output and "fMRI" in r.output and "img.slicer" in r.output, r.output
    img = nib.Nifti1Image(np.random.default_rng(0).normal(size=(24, 24, 24)).astype(np.float32), np.eye(4))
    img.set_sform(np.diag([2.0, 2.0, 2.0, 1.0]), code=4)  # MNI space
    img.set_qform(np.diag([2.0, 2.0, 2.0, 1.0]), code=1)
    nib.save(img, str(tmp_path / "aligned.nii.gz"))
    r = invoke("gradcam", str(tmp_path / "aligned.nii.gz"), "--model", NET, "--weights", str(FIXTURE), "-o",
               str(tmp_path / "o2"))  # fmt: skip
    assert r.exit_code == 0, r.output
    from tests.conftest import records

    (rec,) = records(tmp_path / "o2")
    written = nib.load(str(tmp_path / "o2" / rec["maps"][0]["nifti"])).header
    assert (int(written["sform_code"]), int(written["qform_code"])) == (4, 1)
