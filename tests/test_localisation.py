"""Grad-CAM finds the object: a small CNN trained here on synthetic shapes, checked on held-out images."""

from __future__ import annotations

import numpy as np
import torch

from hookviz.engine.explain import grad_cam
from hookviz.io.images import Preprocess
from hookviz.render import upsample
from tests.conftest import Trained, draw_shape, shapes_batch


def _peak_hits(cams: np.ndarray, masks: np.ndarray) -> np.ndarray:
    import cv2

    hits = []
    for cam, mask in zip(cams, masks, strict=True):
        up = cv2.resize(
            cam.astype(np.float32), (mask.shape[1], mask.shape[0]), interpolation=cv2.INTER_LINEAR
        )
        y, x = np.unravel_index(int(np.argmax(up)), up.shape)
        hits.append(bool(mask[y, x]))
    return np.asarray(hits)


def test_trained_model_learns_the_task(trained: Trained) -> None:
    assert trained.accuracy >= 0.95, trained.accuracy


def test_gradcam_peak_falls_inside_the_shape(trained: Trained) -> None:
    x, y, masks = shapes_batch(200, np.random.default_rng(123))
    res = grad_cam(trained.model, x, "features.8", target=y)
    rate = float(_peak_hits(res.maps.numpy(), masks).mean())
    print(f"Grad-CAM peak inside the shape on {rate:.1%} of 200 held-out images")
    assert rate >= 0.90, rate


def test_map_lines_up_with_an_off_centre_object_in_a_non_square_photo(trained: Trained) -> None:
    """The map is placed back on the crop the model saw, in the original photo's pixels."""
    rng = np.random.default_rng(7)
    hits = []
    for i in range(40):
        kind = i % 3
        # A 96-wide, 48-high photo; the centre crop (48x48) holds the object off-centre.
        crop, mask_crop = draw_shape(kind, 48, rng)
        photo = rng.normal(0.5, 0.15, (48, 96, 3)).clip(0, 1).astype(np.float32)
        photo[:, 24:72] = crop
        mask = np.zeros((48, 96), bool)
        mask[:, 24:72] = mask_crop
        pre = Preprocess(crop_size=48, resize_size=48, mean=(0, 0, 0), std=(1, 1, 1))
        x, box = pre((photo * 255).round().astype(np.uint8))
        assert (box.x0, box.y0, box.x1, box.y1) == (24, 0, 72, 48)
        res = grad_cam(trained.model, torch.from_numpy(x)[None], "features.8", target=kind)
        full = np.zeros((48, 96), np.float32) - 1
        full[box.y0 : box.y1, box.x0 : box.x1] = upsample(res.maps[0].numpy(), box)
        yy, xx = np.unravel_index(int(np.argmax(full)), full.shape)
        hits.append(bool(mask[yy, xx]))
    assert np.mean(hits) >= 0.85, np.mean(hits)
