"""Where a volume model looks: the CAM job over 3-D volumes (NIfTI, ``.npy``, DICOM series).

Each volume (a batch row) gets, per method x layer x target: the map at the layer's resolution ``(d, h, w)``
resized trilinearly onto the volume's own voxel grid, written as a NIfTI overlay with the volume's affine
(``.nii.gz``: 3D Slicer and ITK-SNAP lay it on the scan), three orthogonal slices through the map's peak
(``.png``), a mosaic of slices (``.slices.png``) and a sweep through the slices (``.webm``); with
``--save-raw`` the map at the layer's resolution (``.npy``) and on the voxel grid (``.full.npy``). Records
carry the peak's voxel and world (mm) coordinates.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from hookviz.errors import UsageError
from hookviz.io.images import Box, encode_png
from hookviz.io.video import encode_webm
from hookviz.io.volume import Volume, nifti_bytes, resample
from hookviz.jobs.cam import CamBatch, CamJob
from hookviz.jobs.common import check_finite, npy_bytes, weights_note
from hookviz.jobs.video import refuse_methods, video_methods
from hookviz.methods import title as method_title
from hookviz.render import sheet as render_sheet
from hookviz.render import volume as draw


def volume_methods() -> list[str]:
    """The methods that apply to volumes: those of video models (a layer's activations and gradients, the
    same layouts) and Occlusion and RISE, whose windows and random grids are cubes."""
    return [*video_methods(), "occlusion", "rise"]


#: Slices a second in a sweep.
SWEEP_FPS = 8.0


@dataclass(kw_only=True)
class VolumeCamJob(CamJob):
    """:class:`CamJob` for a volume model: its ``render`` takes a :class:`hookviz.io.volume.Volume`."""

    kind: str = "gradcam"
    pictures = (".png", ".slices.png", ".webm", ".nii.gz")

    def __post_init__(self) -> None:
        super().__post_init__()
        refuse_methods(self.methods, volume_methods(), "a volume model", "voxels")
        if self.params.fuse is not None:
            raise UsageError("--fuse is for photos; leave it out for a volume model")
        if self.params.metrics:
            raise UsageError("--metrics is for photos; `hookviz evaluate` measures a volume model's maps")

    def planned(self, stem: str) -> list[str]:
        sheet = self._sheet_name(stem)  # its render draws no channel terms
        return [*self._planned_maps(stem), *([sheet] if sheet else [])]

    def stills(self, rgb: Volume, axis: int = 2) -> int:
        """How many slices :meth:`still` draws along ``axis``."""
        return int(rgb.shape[axis])

    def still(self, result: CamBatch, rgb: Volume, box: Box, k: int, axis: int = 2) -> np.ndarray:
        """Slice ``k`` along ``axis`` of the first image's volume with its first map over it (on the map's
        scale, as the orthogonal slices are drawn)."""
        (method, layer), maps = next(iter(result.maps.items()))
        full = resample(np.nan_to_num(maps[0, 0].astype(np.float32)), rgb.shape)
        unit = self._unit(full, result.scales[(method, layer)], method)
        return draw.overlay_slice(
            rgb.grey(), unit, axis, k, rgb, alpha=self.params.alpha, colormap=self.params.colormap
        )

    def render(
        self, result: CamBatch, index: int, rgb: Any, box: Box, stem: str
    ) -> tuple[list[tuple[str, bytes]], dict[str, Any]]:
        volume: Volume = rgb
        lm, ex = self.loaded, result.explanation
        check_finite(ex, index)
        pred, p_score = int(ex.predicted[index]), float(ex.predicted_score[index])
        files: list[tuple[str, bytes]] = []
        records, rows = [], []
        for (method, layer), maps in result.maps.items():
            for j, suffix in self._shown(ex, index):
                cam = maps[index, j]  # (d, h, w) at the layer
                tgt, t_score = int(ex.targets[index, j]), float(ex.target_scores[index, j])
                head = [
                    f"{lm.name} | {method_title(method)} at {layer} | {weights_note(lm)}",
                    f"predicted: {lm.describe(pred)} {self._scored(ex, p_score)}",
                    f"explained: {lm.describe(tgt)} {self._scored(ex, t_score)}",
                ]
                base = self._name(stem, method, layer, suffix)
                got, peak, tiles = self._map_files(
                    volume, cam, result.scales[(method, layer)], method, head, base
                )
                files += got
                row = f"{method_title(method)} at {layer} | {lm.describe(tgt)} {self._scored(ex, t_score)}"
                rows.append((row, tiles))
                records.append(
                    {
                        **self._map_record(f"{base}.png", method, layer, tgt, t_score, cam),
                        "shape": list(cam.shape),
                        "nifti": f"{base}.nii.gz",
                        "peak": {"voxel": peak, "world": [round(v, 3) for v in volume.world(peak)]},
                        **self._cost_fields(method, layer, len(self._shown(ex, index)), result),
                        **self._sign_fields(ex, method, layer, index),
                    }
                )
        sheet = self._sheet_name(stem)
        if sheet is not None:
            title = (
                f"{lm.name} | predicted {lm.describe(pred)} {self._scored(ex, p_score)} | {weights_note(lm)}"
            )
            axes = ["X", "Y", "Z"] if volume.kind != "npy" else ["axis 0", "axis 1", "axis 2"]
            files.append((sheet, encode_png(render_sheet(rows, axes, title=title, cell=200))))
        fields = {
            "shape": list(volume.shape),
            "channels": int(volume.data.shape[0]),
            "spacing": [round(s, 6) for s in volume.spacing],
            "kind": volume.kind,
            "affine": [[round(float(v), 6) for v in row] for row in volume.affine],
            **({"notes": list(volume.notes)} if volume.notes else {}),
        }
        return files, self._fields(ex, index, records, volume=fields)

    def _map_files(
        self, volume: Volume, cam: np.ndarray, scale: Any, method: str, head: list[str], base: str
    ) -> tuple[list[tuple[str, bytes]], list[int], list[np.ndarray]]:
        """One map's files, its peak voxel, and its three orthogonal slices for the sheet."""
        full = resample(np.nan_to_num(cam.astype(np.float32)), volume.shape)  # the volume's voxel grid
        unit = self._unit(full, scale, method)
        peak = [int(v) for v in np.unravel_index(int(np.argmax(full)), full.shape)]
        style: dict[str, Any] = {"alpha": self.params.alpha, "colormap": self.params.colormap}
        grey = volume.grey()
        tiles = [draw.overlay_slice(grey, unit, a, peak[a], volume, **style) for a in range(3)]
        files = [
            (f"{base}.png", encode_png(draw.orthogonal(volume, unit, peak, head, **style))),
            (f"{base}.slices.png", encode_png(draw.mosaic(volume, unit, head, **style))),
            (f"{base}.webm", encode_webm(draw.sweep(volume, unit, head[:1], **style), SWEEP_FPS)),
            (
                f"{base}.nii.gz",
                nifti_bytes(full, volume.affine, description=f"hookviz {method}", codes=volume.codes),
            ),
        ]
        if self.params.save_raw:
            files += [
                (f"{base}.npy", npy_bytes(cam.astype(np.float32))),
                (f"{base}.full.npy", npy_bytes(full)),
            ]
        return files, peak, tiles
