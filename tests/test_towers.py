"""The vision towers of vision-language models loaded through ``--model hf:DIR`` (:mod:`.models.towers`):
each family's tower fed one square view of the photo, its image embedding the family's own, and the towers
that take something else refused in one line."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch

from hookviz.models.build import build
from hookviz.models.sources import Options
from tests.conftest import invoke, write_image

pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny random models of the families (seed 0), saved with their processors."""
    from tests.vlm_models import save

    root = tmp_path_factory.mktemp("towers")
    return {f: save(f, root / f) for f in ("llava-next", "idefics3", "internvl", "qwen2-vl", "qwen2.5-vl")}


def _built(folder: Path) -> Any:
    return build(f"hf:{folder}", "DEFAULT", Options())


def test_each_family_s_tower_takes_one_square_view_and_gives_the_family_s_own_embedding(
    folders: dict[str, Path],
) -> None:
    """LLaVA-NeXT: its base view (the photo squashed to 32 x 32), whose 16 projected tokens are the first 16
    of the features transformers packs for a photo of base view and tiles; Idefics3: its global view
    (squashed to the tower's 64), the features of one image; InternVL: one tile of 32 (the thumbnail)."""
    x = torch.randn(2, 3, 32, 32, generator=torch.Generator().manual_seed(1))
    nxt = _built(folders["llava-next"])
    p = nxt.preprocess
    assert (p.resize, p.resize_size, p.crop_size) == ("squash", 32, 32)
    with torch.no_grad():
        mine = nxt.model(x)
        tiles = x[:1].expand(5, 3, 32, 32)[None]  # a 64 x 64 photo: the base view and 2 x 2 tiles
        packed = nxt.model.wrapped.get_image_features(
            pixel_values=tiles, image_sizes=torch.tensor([[64, 64]])
        )
    assert mine.shape == (2, 16, 32) and packed.pooler_output[0].shape[0] > 16
    torch.testing.assert_close(mine[0], packed.pooler_output[0][:16], rtol=1e-5, atol=1e-6)
    idefics = _built(folders["idefics3"])
    p = idefics.preprocess
    assert (p.resize, p.resize_size, p.crop_size, p.interpolation) == ("squash", 64, 64, "lanczos")
    y = torch.randn(2, 3, 64, 64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        mine = idefics.model(y)
        own = idefics.model.wrapped.get_image_features(pixel_values=y[:, None]).pooler_output
    assert mine.shape == (2, 16, 32)
    torch.testing.assert_close(mine, torch.stack(list(own)).reshape(2, 16, 32), rtol=1e-5, atol=1e-6)
    assert float((mine[0] - mine[1]).abs().max()) > 1e-3  # each photo its own embedding
    intern = _built(folders["internvl"])
    assert (intern.preprocess.resize, intern.preprocess.resize_size, intern.preprocess.crop_size) == (
        "squash",
        32,
        32,
    )
    with torch.no_grad():
        own = intern.model.wrapped.get_image_features(pixel_values=x).pooler_output
        torch.testing.assert_close(intern.model(x), own, rtol=0, atol=0)


@pytest.mark.parametrize(("family", "name"), [("qwen2-vl", "Qwen2-VL"), ("qwen2.5-vl", "Qwen2.5-VL")])
def test_a_tower_fed_flattened_patches_is_refused_in_one_line_by_every_command(
    folders: dict[str, Path], family: str, name: str, tmp_path: Path
) -> None:
    """Qwen2-VL's tower takes its patches flattened with their grid (image_grid_thw): every command that loads
    it through hf: refuses in one line (exit 2) naming the family, why, and what works; none exits 70."""
    photo = tmp_path / "p.png"
    write_image(photo, np.random.default_rng(0).integers(0, 256, (40, 50, 3), dtype=np.uint8))
    model = ["--model", f"hf:{folders[family]}", "--weights", "DEFAULT"]
    out = str(tmp_path / "out")
    commands = [
        ["layers", *model],
        ["summary", *model],
        ["featuremaps", str(photo), *model, "--out", out],
        ["gradcam", str(photo), *model, "--prompt", "a square", "--out", out],
        ["sae", "train", str(photo), *model, "--layer", "visual.blocks.1", "--out", out],
    ]
    for args in commands:
        res = invoke(*args)
        lines = res.stderr.strip().splitlines()
        assert res.exit_code == 2 and len(lines) == 1, (args, res.output)
        assert f"({name})" in lines[0] and "image_grid_thw" in lines[0], lines
        assert "hookviz vlm" in lines[0] and "LLaVA-NeXT (its base view)" in lines[0], lines
    assert not (tmp_path / "out").exists()


def test_a_generative_vlm_scores_no_prompts_and_says_so_in_one_line(
    folders: dict[str, Path], tmp_path: Path
) -> None:
    """gradcam on InternVL (its output is the image embedding): with --prompt or without, one line (exit 2)
    saying it is a vision-language model and what to use, not an AttributeError (exit 70)."""
    photo = tmp_path / "p.png"
    write_image(photo, np.random.default_rng(0).integers(0, 256, (40, 50, 3), dtype=np.uint8))
    model = ["--model", f"hf:{folders['internvl']}", "--weights", "DEFAULT", "--device", "cpu"]
    for extra in (["--prompt", "a square"], []):
        res = invoke("gradcam", str(photo), *model, *extra, "--out", str(tmp_path / "out"))
        lines = res.stderr.strip().splitlines()
        assert res.exit_code == 2 and len(lines) == 1, res.output
        assert "vision-language model (InternVL)" in lines[0] and "hookviz vlm" in lines[0], lines
