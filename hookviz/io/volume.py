"""3-D volumes as model inputs: NIfTI (``.nii``, ``.nii.gz``, through nibabel), 3-D or 4-D ``.npy`` arrays and
DICOM series folders (through pydicom, where it is installed); maps written back in the volume's own voxel
grid and affine.

A volume is kept in its file's array order with the channels first, ``(C, X, Y, Z)``: what MONAI's
``LoadImage`` + ``EnsureChannelFirst`` hand a network, so a model trained that way sees the same tensor. A
NIfTI's values are its stored values scaled by the header (``scl_slope``/``scl_inter``), a DICOM series' by
``RescaleSlope``/``RescaleIntercept``; nothing else is done to them but ``mean``/``std`` per channel and,
when asked, a trilinear resize (:class:`VolumePreprocess`). A DICOM series is stacked along its slices'
normal and given the RAS affine NIfTI uses (DICOM's LPS with x and y negated), so a map written back as
NIfTI lies on the series in 3D Slicer or ITK-SNAP.
"""

from __future__ import annotations

import gzip
import importlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar

import numpy as np

from hookviz.errors import InputError, SetupError
from hookviz.io.images import Box, quote

#: File suffixes read as volumes (a folder of DICOM files is one too).
VOLUME_SUFFIXES = (".nii.gz", ".nii", ".npy")
#: Voxels a volume may hold before it is refused (``--max-pixels`` counts voxels for a volume).
DEFAULT_MAX_VOXELS = 512**3


def volume_suffix(path: Path) -> str | None:
    """The volume suffix ``path`` ends with (``.nii.gz`` before ``.nii``), or None."""
    name = path.name.strip().lower()
    return next((s for s in VOLUME_SUFFIXES if name.endswith(s)), None)


def is_dicom_folder(path: Path) -> bool:
    """A folder whose files include a DICOM file (a ``DICM`` marker at byte 128, or a ``.dcm`` name)."""
    if not path.is_dir():
        return False
    return any(_is_dicom(f) for f in sorted(path.iterdir())[:64] if f.is_file())


def _is_dicom(f: Path) -> bool:
    if f.suffix.lower() == ".dcm":
        return True
    try:
        with open(f, "rb") as fh:
            fh.seek(128)
            return fh.read(4) == b"DICM"
    except OSError:
        return False


def is_volume(path: Path) -> bool:
    return volume_suffix(path) is not None or is_dicom_folder(path)


def all_volumes(specs: Sequence[str]) -> bool:
    """Whether every input names a volume (a NIfTI or ``.npy`` file, a DICOM folder, a folder of volumes):
    then the inputs decide the model's task (a 3-D CNN)."""

    def one(spec: str) -> bool:
        path = Path(spec).expanduser()
        return is_volume(path) or (path.is_dir() and any(volume_suffix(f) for f in path.iterdir()))

    return bool(specs) and "-" not in specs and all(one(s) for s in specs)


@dataclass(frozen=True)
class Volume:
    """A volume as read: its values ``(C, X, Y, Z)`` float32, the voxel-to-world ``affine`` (mm, RAS; the
    identity for an ``.npy``), and where it came from (``nifti``, ``npy``, ``dicom``)."""

    data: np.ndarray
    affine: np.ndarray
    kind: str
    #: A NIfTI's sform and qform codes (what its affine means: 1 scanner, 2 aligned, ...), kept in the maps
    #: written back; 1 (scanner) for DICOM and arrays.
    codes: tuple[int, int] = (1, 1)
    #: What reading it changed, in words (a DICOM slice given twice and dropped).
    notes: tuple[str, ...] = ()

    @property
    def shape(self) -> tuple[int, int, int]:
        x, y, z = self.data.shape[1:]
        return (int(x), int(y), int(z))

    @property
    def spacing(self) -> tuple[float, float, float]:
        """Each axis' voxel size (mm for NIfTI and DICOM, 1 for an array)."""
        norms = np.linalg.norm(self.affine[:3, :3], axis=0)
        return (float(norms[0]), float(norms[1]), float(norms[2]))

    def grey(self) -> np.ndarray:
        """The first channel as uint8 grey ``(X, Y, Z)``, windowed between its 1st and 99th percentiles."""
        v = self.data[0]
        lo, hi = (float(p) for p in np.percentile(v, [1, 99]))
        if hi <= lo:
            hi = lo + 1.0
        return (np.clip((v - lo) / (hi - lo), 0, 1) * 255 + 0.5).astype(np.uint8)

    @property
    def frames(self) -> np.ndarray:
        """The volume as RGB slices along its first axis, ``(X, Y, Z, 3)`` uint8: what a picture of a map
        over time (the sanity check's strip) draws on, as a clip's frames."""
        return np.repeat(self.grey()[..., None], 3, axis=-1)

    def world(self, voxel: Sequence[float]) -> list[float]:
        """A voxel's place in the world (mm) by the affine."""
        return [float(v) for v in (self.affine @ np.array([*voxel, 1.0]))[:3]]


def read_volume(path: Path, max_voxels: int = DEFAULT_MAX_VOXELS) -> Volume:
    """The volume at ``path``: a NIfTI file, an ``.npy`` array ``(X, Y, Z)`` or ``(C, X, Y, Z)``, or a folder
    holding one DICOM series.

    Raises:
        InputError: not a volume, damaged, not 3-D, too many voxels (one line naming the file).
        SetupError: nibabel or pydicom is missing (the extra to install named).
    """
    suffix = volume_suffix(path)
    try:
        if suffix in (".nii", ".nii.gz"):
            volume = _read_nifti(path, max_voxels)
        elif suffix == ".npy":
            volume = _read_npy(path, max_voxels)
        elif is_dicom_folder(path):
            volume = _read_dicom(path, max_voxels)
        else:
            raise InputError(
                f"{quote(path)}: not a volume; give a .nii, .nii.gz, .npy or a DICOM series folder"
            )
    except (InputError, SetupError):
        raise
    except Exception as exc:  # each reader raises its own kinds on a damaged file
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
        raise InputError(f"{quote(path)}: cannot be read as a volume ({first})") from None
    if not np.isfinite(volume.data).all():
        raise InputError(f"{quote(path)}: holds NaN or infinite values; replace them before explaining")
    return volume


def _check_size(path: Path, shape: Sequence[int], max_voxels: int) -> None:
    """Refuse a volume by its header's shape, before a byte of it is decoded.

    Raises:
        InputError: more voxels (in its three spatial axes) than ``max_voxels``.
    """
    voxels = int(np.prod([int(v) for v in shape[:3]]))
    if voxels > max_voxels:
        shown = "x".join(str(int(v)) for v in shape)
        raise InputError(
            f"{quote(path)}: {shown} is {voxels:,} voxels, over the limit of {max_voxels:,}; raise "
            "--max-pixels (for a volume it counts voxels) if the machine has the memory"
        )


def _channels_first(data: np.ndarray, path: Path, layout: str) -> np.ndarray:
    if data.ndim == 3:
        return data[None]
    if data.ndim == 4:
        return data if layout == "first" else np.moveaxis(data, -1, 0)
    raise InputError(
        f"{quote(path)}: a {data.ndim}-D array; a volume is 3-D (X,Y,Z), or 4-D with its channels "
        f"({'C,X,Y,Z' if layout == 'first' else 'X,Y,Z,C'})"
    )


def _reader(package: str, what: str) -> Any:
    """``package`` (nibabel, pydicom), imported when a volume is read, or a SetupError naming the extra."""
    try:
        return importlib.import_module(package)
    except ImportError:
        raise SetupError(
            f"reading {what} needs {package}, which is not installed: pip install 'hookviz[volume]'"
        ) from None


def _read_nifti(path: Path, max_voxels: int = DEFAULT_MAX_VOXELS) -> Volume:
    nib = _reader("nibabel", "NIfTI")
    img: Any = nib.load(str(path))  # the header only: the voxels are read below
    _check_size(path, img.shape, max_voxels)
    data = np.asarray(img.dataobj, dtype=np.float32)  # scl_slope/scl_inter applied
    if data.ndim == 5 and data.shape[3] == 1:  # NIfTI's (X, Y, Z, time=1, components)
        data = data[:, :, :, 0]
    header = img.header
    codes = (int(header["sform_code"]), int(header["qform_code"])) if "sform_code" in header else (1, 1)
    values = np.ascontiguousarray(_channels_first(data, path, "last"))
    return Volume(values, np.asarray(img.affine, np.float64), "nifti", codes)


def _read_npy(path: Path, max_voxels: int = DEFAULT_MAX_VOXELS) -> Volume:
    header = np.load(path, mmap_mode="r", allow_pickle=False)  # its shape, nothing read yet
    shape = header.shape if header.ndim != 4 else header.shape[1:]
    _check_size(path, shape, max_voxels)
    data = np.load(path, allow_pickle=False)
    if not np.issubdtype(data.dtype, np.number) or np.iscomplexobj(data):
        raise InputError(f"{quote(path)}: a {data.dtype} array; a volume holds real numbers")
    return Volume(
        np.ascontiguousarray(_channels_first(data.astype(np.float32), path, "first")), np.eye(4), "npy"
    )


def _read_dicom(folder: Path, max_voxels: int = DEFAULT_MAX_VOXELS) -> Volume:
    pydicom = _reader("pydicom", "DICOM")
    slices = []
    for f in sorted(folder.iterdir()):
        if f.is_file() and _is_dicom(f):
            ds = pydicom.dcmread(f, defer_size="64 KB")  # the pixels are read when used, not before
            if "PixelData" in ds and "ImagePositionPatient" in ds:
                slices.append(ds)
    if not slices:
        raise InputError(f"{quote(folder)}: no DICOM image with a position in this folder")
    series = {str(getattr(ds, "SeriesInstanceUID", "")) for ds in slices}
    if len(series) > 1:
        raise InputError(f"{quote(folder)}: holds {len(series)} DICOM series; give each its own folder")
    _check_size(folder, (int(slices[0].Columns), int(slices[0].Rows), len(slices)), max_voxels)
    row, col = (
        np.array(v, float) for v in np.reshape(np.array(slices[0].ImageOrientationPatient, float), (2, 3))
    )
    normal = np.cross(row, col)
    slices.sort(key=lambda ds: float(np.dot(normal, np.array(ds.ImagePositionPatient, float))))
    slices, notes = _one_per_position(folder, slices, normal)
    first, last = (np.array(s.ImagePositionPatient, float) for s in (slices[0], slices[-1]))
    dr, dc = (float(v) for v in slices[0].PixelSpacing)  # between rows, between columns
    step = (
        (last - first) / (len(slices) - 1)
        if len(slices) > 1
        else normal * float(getattr(slices[0], "SliceThickness", 1.0) or 1.0)
    )
    # Voxel (i: column, j: row, k: slice) -> IPP_k + i*dc*row + j*dr*col, in LPS; NIfTI's RAS negates x, y.
    lps = np.eye(4)
    lps[:3, 0], lps[:3, 1], lps[:3, 2], lps[:3, 3] = row * dc, col * dr, step, first
    affine = np.diag([-1.0, -1.0, 1.0, 1.0]) @ lps
    planes = [
        ds.pixel_array.astype(np.float32) * float(getattr(ds, "RescaleSlope", 1) or 1)
        + float(getattr(ds, "RescaleIntercept", 0) or 0)
        for ds in slices
    ]
    data = np.stack([p.T for p in planes], axis=-1)  # (columns, rows, slices) = (X, Y, Z)
    return Volume(np.ascontiguousarray(data[None]), affine, "dicom", notes=notes)


def _one_per_position(
    folder: Path, slices: list[Any], normal: np.ndarray
) -> tuple[list[Any], tuple[str, ...]]:
    """The sorted slices checked: exact copies at one position dropped (with a note), and the positions
    evenly spaced, since one step per slice is what the affine can say.

    Raises:
        InputError: two different slices at one position, or a gap (a missing slice) or uneven spacing.
    """
    where = [float(np.dot(normal, np.array(ds.ImagePositionPatient, float))) for ds in slices]
    kept, kept_at, dropped = [slices[0]], [where[0]], 0
    for ds, z in zip(slices[1:], where[1:], strict=True):
        if abs(z - kept_at[-1]) < 1e-4:
            if ds.PixelData != kept[-1].PixelData:
                raise InputError(
                    f"{quote(folder)}: two different slices at position {z:g} mm (a second acquisition in "
                    "one series?); give a folder with one slice per position"
                )
            dropped += 1
            continue
        kept.append(ds)
        kept_at.append(z)
    if len(kept) > 2:
        steps = np.diff(kept_at)
        usual = float(np.median(steps))
        off = int(np.argmax(np.abs(steps - usual)))
        if abs(steps[off] - usual) > max(1e-3, 0.01 * usual):
            missing = " (a missing slice?)" if steps[off] > 1.5 * usual else ""
            raise InputError(
                f"{quote(folder)}: slices are not evenly spaced: {steps[off]:g} mm between slices "
                f"{off + 1} and {off + 2} (at {kept_at[off]:g} and {kept_at[off + 1]:g} mm) where the others "
                f"are {usual:g} mm apart{missing}; give a complete series"
            )
    notes = (f"{dropped} DICOM slice(s) given twice (the same pixels at one position) were dropped",)
    return kept, notes if dropped else ()


@dataclass(frozen=True)
class VolumePreprocess:
    """How a volume becomes a model input: ``(x - mean) / std`` per channel, then a trilinear resize to
    ``size`` (None: the volume's own grid)."""

    mean: tuple[float, ...] = (0.0,)
    std: tuple[float, ...] = (1.0,)
    channels: int = 1
    size: tuple[int, int, int] | None = None

    kind: ClassVar[str] = "volume"
    sides: ClassVar[str] = "D,H,W"

    def shape(self, preprocess: Any) -> tuple[int, ...]:
        """``(C, D, H, W)``: its ``size``, or a cube of the preprocessing's side when it has none."""
        side = preprocess.crop_size
        return (preprocess.channels, *(self.size if self.size is not None else (side, side, side)))

    def key(self) -> dict[str, Any]:
        return {"volume": {"size": self.size}}

    def __call__(self, volume: Volume) -> tuple[np.ndarray, Box]:
        data = volume.data
        if data.shape[0] != self.channels:
            n = data.shape[0]
            if volume.kind == "nifti":  # NIfTI's 4th axis is time: an fMRI run, not channels
                raise InputError(
                    f"a 4-D NIfTI of {n} volumes along its 4th axis (time: an fMRI run?) and the model takes "
                    f"{self.channels} channel(s); give one volume (nibabel: img.slicer[..., t])"
                )
            raise InputError(
                f"the volume has {n} channel(s) and the model takes {self.channels}; give a volume of "
                f"{self.channels} channel(s)"
            )
        mean = np.asarray(self.mean, np.float32).reshape(-1, 1, 1, 1)
        std = np.asarray(self.std, np.float32).reshape(-1, 1, 1, 1)
        x = (data - mean) / std
        if self.size is not None and tuple(x.shape[1:]) != self.size:
            x = resample(x, self.size)
        _, _, y, z = data.shape
        return np.ascontiguousarray(x, dtype=np.float32), Box(0, 0, z, y)


def resample(values: np.ndarray, size: Sequence[int]) -> np.ndarray:
    """``values`` ``(C, X, Y, Z)`` (or ``(X, Y, Z)``) trilinearly resized to ``size`` (align_corners=False,
    as :func:`torch.nn.functional.interpolate`)."""
    import torch
    import torch.nn.functional as F

    from hookviz.core.arrays import to_numpy

    t = torch.from_numpy(np.ascontiguousarray(values, dtype=np.float32))
    three = t.ndim == 3
    t = t[None, None] if three else t[None]
    out = F.interpolate(t, size=tuple(int(s) for s in size), mode="trilinear", align_corners=False)[0]
    return to_numpy(out[0] if three else out)


def nifti_bytes(
    values: np.ndarray, affine: np.ndarray, *, description: str = "", codes: tuple[int, int] = (1, 1)
) -> bytes:
    """``values`` ``(X, Y, Z)`` as a gzipped NIfTI-1 file with ``affine`` as both its sform and qform, with
    the input's ``codes`` (sform, qform; 1: scanner), byte for byte the same for the same values."""
    import nibabel as nib

    img = nib.Nifti1Image(np.asarray(values, np.float32), affine)
    img.header.set_sform(affine, code=codes[0])
    img.header.set_qform(affine, code=codes[1])
    img.header["descrip"] = description.encode()[:79]
    return gzip.compress(img.to_bytes(), compresslevel=6, mtime=0)
