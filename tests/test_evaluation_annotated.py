"""``evaluate`` against annotations on a model trained here: the shapes' true boxes written in the four
formats (COCO, Pascal VOC, YOLO, CSV) and their true masks as PNGs; and the randomisation tests that tell a
map that explains the class from one that shows the image."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
from PIL import Image
from typer.testing import CliRunner

from hookviz.cli import app
from hookviz.engine.explain import explain
from hookviz.errors import UsageError
from hookviz.evaluation import cascade, random_logit, spearman
from hookviz.io import annotation as ann
from hookviz.io.shapes import SHAPES, draw_shape
from hookviz.jobs.sanity import _edges
from hookviz.report import build_report
from tests.conftest import (
    Trained,
    evaluation_file,
    invoke,
    records,
    write_image,
)

N = 30
#: The photos' side: twice what the model was trained on (it is fully convolutional), so that the shapes
#: are where a centre prior does not find them by chance.
S = 96


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory, trained: Trained) -> dict[str, Any]:
    """30 photos (96 x 96, ten of each shape) in two sub-folders, and where their shapes are, in every
    format: COCO names files relative to the input folder, CSV by bare name, VOC and YOLO by stem."""
    d = tmp_path_factory.mktemp("loc")
    torch.save(trained.model.state_dict(), d / "tiny.pth")
    (d / "labels.txt").write_text("\n".join(SHAPES))
    rng = np.random.default_rng(11)
    coco: dict[str, Any] = {
        "images": [],
        "annotations": [],
        "categories": [{"id": 7 + k, "name": n} for k, n in enumerate(SHAPES)],
    }
    rows, boxes = [["file", "class", "x0", "y0", "x1", "y1"]], {}
    for name in ("voc", "yolo", "masks", "in/a", "in/b"):
        (d / name).mkdir(parents=True)
    (d / "yolo" / "classes.txt").write_text("\n".join(SHAPES))  # YOLO's classes by name
    for i in range(N):
        kind = i % 3
        img, mask = draw_shape(kind, S, rng)
        sub = "a" if i < N // 2 else "b"
        rel = f"{sub}/p{i:02d}.png"
        write_image(d / "in" / rel, (img * 255).round().astype(np.uint8))
        ys, xs = np.nonzero(mask)
        x0, y0, x1, y1 = int(xs.min()), int(ys.min()), int(xs.max()) + 1, int(ys.max()) + 1
        boxes[i] = (kind, x0, y0, x1, y1)
        coco["images"].append({"id": i, "file_name": rel, "width": S, "height": S})
        coco["annotations"].append(
            {"id": i, "image_id": i, "category_id": 7 + kind, "bbox": [x0, y0, x1 - x0, y1 - y0]}
        )
        rows.append([f"p{i:02d}.png", SHAPES[kind], str(x0), str(y0), str(x1), str(y1)])
        (d / "voc" / f"p{i:02d}.xml").write_text(
            f"<annotation><filename>p{i:02d}.png</filename><size><width>{S}</width><height>{S}</height></size>"
            f"<object><name>{SHAPES[kind]}</name><bndbox><xmin>{x0 + 1}</xmin><ymin>{y0 + 1}</ymin>"
            f"<xmax>{x1}</xmax><ymax>{y1}</ymax></bndbox></object></annotation>"
        )
        cx, cy, w, h = (x0 + x1) / (2 * S), (y0 + y1) / (2 * S), (x1 - x0) / S, (y1 - y0) / S
        (d / "yolo" / f"p{i:02d}.txt").write_text(f"{kind} {cx:.6f} {cy:.6f} {w:.6f} {h:.6f}\n")
        Image.fromarray((mask * 255).astype(np.uint8)).save(d / "masks" / f"p{i:02d}.png")  # binary
    (d / "coco.json").write_text(json.dumps(coco))
    with (d / "boxes.csv").open("w", newline="") as f:
        csv.writer(f).writerows(rows)
    return {"dir": d, "boxes": boxes, "model": trained.model}


def _model(d: Path) -> list[str]:
    model = [
        "--model",
        "tests.conftest:TinyCNN",
        "--weights",
        str(d / "tiny.pth"),
        "--labels",
        str(d / "labels.txt"),
    ]
    return [*model, "--input-size", str(S), "--resize", "squash", "--mean", "0,0,0", "--std", "1,1,1"]


def _evaluate(d: Path, out: Path, *extra: str) -> dict[str, Any]:
    r = CliRunner().invoke(
        app, ["evaluate", str(d / "in"), *_model(d), "--out", str(out), "--tolerance", "2", *extra]
    )
    assert r.exit_code == 0, r.stderr
    return json.loads(evaluation_file(out).read_text())


def test_the_four_box_formats_give_the_same_numbers_and_grad_cam_points_at_the_shapes(
    data: dict[str, Any], tmp_path: Path
) -> None:
    d = data["dir"]
    got = {
        fmt: _evaluate(d, tmp_path / fmt, "--boxes", str(path), "--metric", "localisation")
        for fmt, path in (
            ("coco", d / "coco.json"),
            ("voc", d / "voc"),
            ("yolo", d / "yolo"),
            ("csv", d / "boxes.csv"),
        )
    }
    rows = {fmt: g["rows"] for fmt, g in got.items()}
    assert rows["coco"] == rows["voc"] == rows["yolo"] == rows["csv"]
    assert all(g["by_class"] == got["coco"]["by_class"] for g in got.values())
    by = {r["method"]: r for r in rows["coco"]}
    assert by["gradcam"]["objects"] == N and "images" not in by["gradcam"]  # no image-level family asked
    # Measured (tolerance 2 px): Grad-CAM 100 %, the centre map 6.7 %, the random map 0 %; energy 0.48 vs
    # 0.04 and 0.03; rank accuracy 0.83 vs 0.02 and 0.03.
    assert by["gradcam"]["pointing_game"] >= by["center"]["pointing_game"] + 60
    assert by["gradcam"]["pointing_game"] >= by["random"]["pointing_game"] + 60
    assert by["gradcam"]["energy_pointing_game"] > 4 * by["center"]["energy_pointing_game"]
    assert by["gradcam"]["relevance_rank"] > by["random"]["relevance_rank"] + 0.4
    classes = {(r["method"], r["name"]) for r in got["coco"]["by_class"]}
    assert {("gradcam", s) for s in SHAPES} <= classes
    page = build_report(tmp_path / "coco").read_text()  # the report shows the tables
    assert "<caption>localisation</caption>" in page and "localisation by annotated class" in page
    assert page.count("<td>gradcam</td>") == 1 + 3  # overall, and one row a class
    table = evaluation_file(tmp_path / "coco", "evaluation_by_class", "csv").read_text().splitlines()
    assert table[0].startswith("method,layer,class,name,objects,pointing_game,pointing_game_ci95_low")
    # The figures are each object's own: the pointing game by hand for the CSV's first photo.
    rec = next(json.loads(line) for line in (tmp_path / "csv" / "manifest.jsonl").read_text().splitlines()
               if '"p00.png"' in line or "p00.png" in json.loads(line).get("input", ""))  # fmt: skip
    kind, x0, y0, x1, y1 = data["boxes"][0]
    x = torch.from_numpy(np.asarray(Image.open(d / "in" / "a" / "p00.png"), np.float32) / 255).permute(
        2, 0, 1
    )[None]
    cam = explain(data["model"], x, ["features"], ["gradcam"], [kind]).maps[("gradcam", "features")][0, 0]
    up = torch.nn.functional.interpolate(cam[None, None], size=(S, S), mode="bilinear", align_corners=False)[
        0, 0
    ]
    yy, xx = np.unravel_index(int(up.argmax()), (S, S))
    near = x0 - 2 <= xx < x1 + 2 and y0 - 2 <= yy < y1 + 2
    (obj,) = rec["objects"]
    assert obj["class"]["name"] == SHAPES[kind] and obj["pixels"] == (x1 - x0) * (y1 - y0)
    assert obj["metrics"]["gradcam@features"]["pointing_game"] == float(near)


def test_masks_localise_the_shapes_themselves(data: dict[str, Any], tmp_path: Path) -> None:
    """Binary masks: each photo's one object is of the class explained (the top-1)."""
    d = data["dir"]
    got = _evaluate(d, tmp_path / "m", "--masks", str(d / "masks"), "--metric", "localisation,complexity")
    by = {r["method"]: r for r in got["rows"]}
    # Measured: 100 % vs 6.7 %; relevance mass 0.38 vs 0.02, sparseness 0.89 vs 0.22.
    assert by["gradcam"]["pointing_game"] >= by["center"]["pointing_game"] + 60
    assert by["gradcam"]["relevance_mass"] > 4 * by["random"]["relevance_mass"]
    assert "deletion_auc" not in by["gradcam"] and by["gradcam"]["sparseness"] > by["random"]["sparseness"]


def test_annotation_readers_refuse_what_they_cannot_read(tmp_path: Path) -> None:
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(UsageError, match="not a COCO annotation file"):
        ann.load(tmp_path / "bad.json")
    (tmp_path / "b.csv").write_text("a.png,cat,1,2,x,4\n")
    with pytest.raises(UsageError, match="row 1: not file,class,x0,y0,x1,y1"):
        ann.load(tmp_path / "b.csv")
    with pytest.raises(UsageError, match="'zebra' is not one of the model's classes"):
        ann.resolve("zebra", SHAPES, 3)
    assert ann.resolve("Disc", SHAPES, 3) == 1 and ann.resolve(2, SHAPES, 3) == 2
    # A multi-class mask: each value a class, 255 VOC's border (ignored).
    m = np.zeros((8, 8), np.uint8)
    m[:2], m[4:6], m[7] = 1, 2, 255
    (tmp_path / "mk").mkdir()
    Image.fromarray(m).save(tmp_path / "mk" / "x.png")
    regions = ann.load(masks=tmp_path / "mk").regions(Path("any/where/x.jpg"))
    assert regions is not None and [(r.label, int(r.draw(8, 8).sum())) for r in regions] == [(1, 16), (2, 16)]


def test_an_image_missing_from_the_annotations_fails_alone(data: dict[str, Any], tmp_path: Path) -> None:
    d = data["dir"]
    lines = (d / "boxes.csv").read_text().splitlines()
    (tmp_path / "some.csv").write_text("\n".join(line for line in lines if not line.startswith("p01.png")))
    some = str(tmp_path / "some.csv")
    r = CliRunner().invoke(
        app,
        [
            "evaluate",
            str(d / "in" / "a"),
            *_model(d),
            "--boxes",
            some,
            "--out",
            str(tmp_path / "o"),
            "--json",
            "-q",
        ],
    )
    assert r.exit_code != 0  # one input failed
    recs = [json.loads(line) for line in r.stdout.splitlines()]
    bad = [x for x in recs if x["status"] == "error"]
    assert len(bad) == 1 and "not in the annotations" in bad[0]["error"] and len(recs) == N // 2


def test_random_logit_and_independent_randomisation_separate_grad_cam_from_the_edges(
    data: dict[str, Any],
) -> None:
    model = data["model"]
    rng = np.random.default_rng(3)
    x = torch.from_numpy(np.stack([draw_shape(i % 3, 48, rng)[0].transpose(2, 0, 1) for i in range(12)]))
    y = model(x).argmax(1)

    def cam(m: torch.nn.Module, targets: torch.Tensor) -> torch.Tensor:
        return explain(m, x, ["features"], ["gradcam"], targets).maps[("gradcam", "features")][:, 0]

    edges = _edges(x)
    ours = random_logit(lambda t: cam(model, t), y, 3, seed=0)
    blind = random_logit(lambda t: edges, y, 3, seed=0)
    # Measured: Grad-CAM's map for another class has SSIM 0.14 with its own; the edges are the same map.
    assert float(ours["similarity"].mean()) < 0.5 and float(blind["similarity"].mean()) == pytest.approx(1.0)
    steps = cascade(model, lambda m: {"gradcam": cam(m, y), "edges": edges}, order="independent")
    assert [s for s, _ in steps] == ["none", "fc", *(f"features.{i}" for i in (9, 8, 5, 4, 1, 0))]
    original = steps[0][1]
    rho = {
        k: np.mean([spearman(maps[k][i], original[k][i]) for _, maps in steps[1:] for i in range(12)])
        for k in ("gradcam", "edges")
    }
    # Measured: Grad-CAM's maps keep a Spearman of 0.24 with the original, on average over the layers
    # randomised one at a time; the edges 1.
    assert rho["edges"] == pytest.approx(1.0) and rho["gradcam"] < 0.5, rho


def test_metric_families_parse_and_the_cost_is_said_first(data: dict[str, Any], tmp_path: Path) -> None:
    from hookviz.evaluation.families import FAMILIES, parse_metrics

    assert parse_metrics(None) == ("faithfulness",)
    assert parse_metrics(None, annotated=True) == ("faithfulness", "localisation")
    assert parse_metrics(["road", "complexity,faithfulness"]) == ("faithfulness", "road", "complexity")
    assert parse_metrics(["all"]) == tuple(f for f in FAMILIES if f != "localisation")
    with pytest.raises(UsageError, match="--metric 'speed': one of faithfulness"):
        parse_metrics(["speed"])
    with pytest.raises(UsageError, match="needs where the objects are: --boxes"):
        parse_metrics(["localisation"])
    d = data["dir"]
    r = CliRunner().invoke(
        app, ["evaluate", str(d / "in" / "a" / "p00.png"), *_model(d), "--metric",
              "faithfulness,flipping,robustness,randomisation", "--regions", "5", "--robust-samples", "2",
              "--out", str(tmp_path / "o")],
    )  # fmt: skip
    assert r.exit_code == 0, r.stderr
    # 3 maps x (2 x 17 + 1) deletion/insertion/drop, 3 x (16 + 5 + 1) flipping; robustness: 2 noisy copies
    # explained, and Grad-CAM's map read out on the photo and on each; randomisation: one other class.
    said = "forward passes an image: faithfulness 105, flipping 66, robustness 5, randomisation 1 = 177"
    assert said in r.stderr and "backward passes on 2 noisy copies and a random other class" in r.stderr
    assert r.stdout.startswith("[faithfulness]")  # no line per image before the table
    rec = json.loads((tmp_path / "o" / "manifest.jsonl").read_text().splitlines()[-1])
    assert rec["forward_passes"] == 177


def test_the_library_evaluates_a_batch_with_masks(data: dict[str, Any]) -> None:
    """``hookviz.evaluate``: the same figures from Python, for a batch and masks in the input's frame."""
    import hookviz

    d = data["dir"]
    loaded = hookviz.load_model(
        "tests.conftest:TinyCNN", weights=str(d / "tiny.pth"), labels=str(d / "labels.txt"), device="cpu",
        input_size=S, resize="squash", mean=(0.0, 0.0, 0.0), std=(1.0, 1.0, 1.0),
    )  # fmt: skip
    rng = np.random.default_rng(4)
    shots = [draw_shape(k, S, rng) for k in (0, 1, 2, 0)]
    x = torch.from_numpy(np.stack([img.transpose(2, 0, 1) for img, _ in shots]))
    masks = [[(k, mask)] for k, (_, mask) in zip((0, 1, 2, 0), shots, strict=True)]
    got = hookviz.evaluate(loaded, x, ["features"], metrics=["localisation", "complexity"], masks=masks)
    assert set(got["figures"]) == {"gradcam@features", "random", "center"}
    assert got["figures"]["gradcam@features"]["sparseness"].shape == (4,)
    hits = [obj[0][2]["gradcam@features"]["pointing_game"] for obj in got["objects"]]
    assert hits == [1.0] * 4 and got["forward_passes"] == 0  # localisation and complexity run no model


def test_a_table_of_inputs_gives_its_boxes_and_masks_to_evaluate(
    data: dict[str, Any], tmp_path: Path
) -> None:
    """``--inputs-table`` rows with a ``label``, ``boxes`` (a Parquet list, or JSON text in a CSV) and
    ``mask`` column: ``--boxes TABLE`` gives the numbers of the CSV annotation file, ``--masks TABLE``
    those of the masks folder."""
    pa = pytest.importorskip("pyarrow")
    pq = pytest.importorskip("pyarrow.parquet")
    d = data["dir"]
    paths = [f"in/{'a' if i < N // 2 else 'b'}/p{i:02d}.png" for i in range(N)]
    boxes = [[list(data["boxes"][i][1:])] for i in range(N)]
    labels = [SHAPES[data["boxes"][i][0]] for i in range(N)]
    masks = [f"masks/p{i:02d}.png" for i in range(N)]
    pq.write_table(
        pa.table({"path": paths, "label": labels, "boxes": boxes, "mask": masks}), d / "rows.parquet"
    )
    with (d / "rows.csv").open("w", newline="") as f:
        rows = zip(paths, labels, map(json.dumps, boxes), strict=True)
        csv.writer(f).writerows([["path", "label", "boxes"], *rows])

    def run(out: str, *extra: str) -> list[Any]:
        r = CliRunner().invoke(app, ["evaluate", *_model(d), "--out", str(tmp_path / out), "--tolerance", "2",
                                     *extra])  # fmt: skip
        assert r.exit_code == 0, r.stderr
        return json.loads(evaluation_file(tmp_path / out).read_text())["rows"]  # type: ignore[no-any-return]

    want = run("csv", str(d / "in"), "--boxes", str(d / "boxes.csv"), "--metric", "localisation")
    assert run("parquet", "--inputs-table", str(d / "rows.parquet"), "--boxes", str(d / "rows.parquet"),
               "--metric", "localisation") == want  # fmt: skip
    assert run("rows.csv", "--inputs-table", str(d / "rows.csv"), "--boxes", str(d / "rows.csv"), "--metric",
               "localisation") == want  # fmt: skip
    want = run("masks", str(d / "in"), "--masks", str(d / "masks"), "--metric", "localisation")
    assert run("tmasks", "--inputs-table", str(d / "rows.parquet"), "--masks", str(d / "rows.parquet"),
               "--metric", "localisation") == want  # fmt: skip
    table = ["--inputs-table", str(d / "rows.csv"), "--boxes", str(d / "rows.csv")]
    r = CliRunner().invoke(
        app, ["evaluate", *_model(d), "--out", str(tmp_path / "both"), *table, "--target", "label"]
    )
    assert r.exit_code == 2 and "the annotations name each image's classes" in r.stderr, r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


TINY = ["--model", "tests.conftest:TinyCNN", "--weights", "none", "--input-size", "32", "--device", "cpu"]


def _mask(path: Path, values: np.ndarray) -> None:
    path.parent.mkdir(exist_ok=True)
    Image.fromarray(values.astype(np.uint8)).save(path)


def test_a_box_wholly_left_of_or_above_the_image_is_empty_not_the_whole_image() -> None:
    for box in [(-50, -50, -10, -10), (-50, 5, -10, 20), (5, -50, 20, -10), (60, 60, 90, 90)]:
        assert not ann.Region("cat", box).draw(40, 40).any(), box
    # A box across an edge keeps its inside part only.
    inside = ann.Region("cat", (-10, -10, 5, 5)).draw(40, 40)
    assert inside.sum() == 25 and inside[:5, :5].all()


def test_boxes_that_cover_nothing_are_left_out_with_one_warning_per_file(tmp_path: Path) -> None:
    rows = [
        "file,class,x0,y0,x1,y1",
        "p0.png,disc,10,10,20,20",
        "p1.png,disc,20,20,10,10",  # reversed corners
        "p2.png,disc,5,5,5,9",  # zero area
        "p3.png,disc,12,12,30,30",
    ]
    (tmp_path / "b.csv").write_text("\n".join(rows))
    found = ann.load(tmp_path / "b.csv")
    assert [len(found.regions(Path(f"p{i}.png")) or []) for i in range(4)] == [1, 0, 0, 1]
    assert len(found.warnings) == 1
    assert "2 box(es) cover no pixel" in found.warnings[0] and "reversed corners" in found.warnings[0]
    coco = {
        "images": [{"id": 0, "file_name": "p0.png", "width": 40, "height": 40}],
        "annotations": [{"id": 0, "image_id": 0, "category_id": 1, "bbox": [50, 50, 5, 5]}],
        "categories": [{"id": 1, "name": "disc"}],
    }
    (tmp_path / "c.json").write_text(json.dumps(coco))
    found = ann.load(tmp_path / "c.json")
    assert found.regions(Path("p0.png")) == [] and "outside the image" in found.warnings[0]


def test_evaluate_says_which_boxes_it_left_out_and_what_the_crop_lost(
    labelled_photos: Path, tmp_path: Path
) -> None:
    rows = [
        "file,class,x0,y0,x1,y1",
        "p0.png,disc,-50,-50,-10,-10",
        "p1.png,1,0,0,2,40",
        "p2.png,1,8,8,30,30",
    ]
    rows.append("p3.png,2,10,10,30,30")
    (tmp_path / "b.csv").write_text("\n".join(rows))
    r = invoke("evaluate", str(labelled_photos), *TINY, "--labels", str(tmp_path / "labels.txt"), "--boxes",
               str(tmp_path / "b.csv"), "--metric", "localisation", "--out", str(tmp_path / "o"))  # fmt: skip
    assert r.exit_code == 0, r.stderr
    assert "1 box(es) cover no pixel" in r.stderr and "outside the image" in r.stderr
    # p1's strip at the left edge lies outside the centre crop the model saw (crop is the default resize).
    assert "outside the region the model saw" in r.stderr
    by = {Path(x["input"]).name: x for x in records(tmp_path / "o")}
    assert by["p0.png"]["objects"] == [] and by["p1.png"]["objects"] == []
    assert [o["class"]["index"] for o in by["p3.png"]["objects"]] == [2]


def test_a_mask_holding_one_class_index_is_that_class_not_binary(tmp_path: Path) -> None:
    m = np.zeros((40, 40), np.uint8)
    m[5:15, 5:15] = 3
    _mask(tmp_path / "m" / "p0.png", m)
    _mask(tmp_path / "m" / "p1.png", (m > 0) * 255)
    _mask(tmp_path / "m" / "p2.png", (m > 0) * 1)
    found = ann.load(masks=tmp_path / "m")
    assert [r.label for r in found.regions(Path("p0.png")) or []] == [3]
    assert [r.label for r in found.regions(Path("p1.png")) or []] == [None]
    assert [r.label for r in found.regions(Path("p2.png")) or []] == [None]
    assert "1 read as class-index masks" in found.warnings[0] and "2 read as binary" in found.warnings[0]
    forced = ann.load(masks=tmp_path / "m", mask_kind="classes")
    assert [r.label for r in forced.regions(Path("p2.png")) or []] == [1]
    assert [
        r.label for r in ann.load(masks=tmp_path / "m", mask_kind="binary").regions(Path("p0")) or []
    ] == [None]


def test_a_mask_of_another_aspect_fails_its_image_and_another_size_is_resized(
    labelled_photos: Path, tmp_path: Path
) -> None:
    wide = np.zeros((20, 60), np.uint8)
    wide[5:10, 5:20] = 1
    _mask(tmp_path / "m" / "p0.png", wide)  # another aspect: refused
    half = np.zeros((20, 20), np.uint8)
    half[5:15, 5:15] = 2
    _mask(tmp_path / "m" / "p1.png", half)  # half the size, same aspect: resized, with a note
    r = invoke("evaluate", str(labelled_photos / "p0.png"), str(labelled_photos / "p1.png"), *TINY,
               "--labels", str(tmp_path / "labels.txt"), "--masks", str(tmp_path / "m"), "--metric",
               "localisation", "--mask-kind", "classes", "--out", str(tmp_path / "o"))  # fmt: skip
    assert r.exit_code == 1, r.stderr
    by = {Path(x["input"]).name: x for x in records(tmp_path / "o")}
    assert by["p0.png"]["status"] == "error" and "another aspect" in by["p0.png"]["error"]
    assert by["p1.png"]["status"] == "ok" and [o["class"]["index"] for o in by["p1.png"]["objects"]] == [2]
    assert "resized (nearest)" in r.stderr and "read as class-index masks" in r.stderr


def test_unknown_classes_are_refused_before_the_first_image_listing_them(
    labelled_photos: Path, tmp_path: Path
) -> None:
    rows = ["file,class,x0,y0,x1,y1", "p0.png,disc,1,1,20,20", "p2.png,zebra,1,1,20,20", "p3.png,9,1,1,9,9"]
    (tmp_path / "b.csv").write_text("\n".join(rows))
    out = tmp_path / "o"
    r = invoke("evaluate", str(labelled_photos), *TINY, "--labels", str(tmp_path / "labels.txt"), "--boxes",
               str(tmp_path / "b.csv"), "--out", str(out))  # fmt: skip
    assert r.exit_code == 2, r.stderr
    assert "2 annotated class(es) are not the model's classes" in r.stderr
    assert "'zebra' (in p2.png)" in r.stderr and "9 (in p3.png)" in r.stderr
    assert not (out / "manifest.jsonl").exists() or not (out / "manifest.jsonl").read_text()


def test_the_library_refuses_an_unknown_class_too() -> None:
    found = ann.Annotations("csv", {"a.png": [ann.Region("zebra", (0, 0, 4, 4))]}, where="--boxes b.csv")
    with pytest.raises(UsageError, match="'zebra' \\(in a.png\\)"):
        found.check(("square", "disc", "cross"), 3)


def test_a_box_beyond_the_right_or_bottom_edge_is_left_out_with_a_note(photos: Path, tmp_path: Path) -> None:
    (tmp_path / "labels.txt").write_text("square\ndisc\ncross\n")
    rows = [
        "file,class,x0,y0,x1,y1",
        "p0.png,disc,50,5,90,20",
        "p1.png,disc,5,60,20,90",
        "p2.png,1,8,8,30,30",
        "p3.png,2,10,10,30,30",
    ]
    (tmp_path / "b.csv").write_text("\n".join(rows))
    r = invoke("evaluate", str(photos), *TINY, "--labels", str(tmp_path / "labels.txt"), "--resize", "squash",
               "--boxes", str(tmp_path / "b.csv"), "--metric", "localisation", "--out",
               str(tmp_path / "o"))  # fmt: skip
    assert r.exit_code == 0, r.stderr
    assert (
        "a box lies wholly outside its photo and is left out" in r.stderr and "the photo is 40x40" in r.stderr
    )
    from tests.conftest import records

    by = {Path(x["input"]).name: x for x in records(tmp_path / "o")}
    assert by["p0.png"]["objects"] == [] and by["p1.png"]["objects"] == []
    assert [o["class"]["index"] for o in by["p2.png"]["objects"]] == [1]
