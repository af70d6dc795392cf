"""Where the objects are: boxes and masks in the formats data sets come in (``evaluate --boxes/--masks``).

* **COCO** JSON (a file): ``images`` (``file_name``, ``width``, ``height``), ``annotations`` (``bbox`` as
  ``[x, y, w, h]``, polygon ``segmentation`` drawn where given), ``categories`` (``name``).
* **Pascal VOC** XML (a folder of ``NAME.xml``): ``<filename>``, ``<size>``, ``<object><name>`` and its
  ``<bndbox>`` (1-based, inclusive, as VOC writes them).
* **YOLO** (a folder of ``NAME.txt``): ``class cx cy w h`` a line, fractions of the image's size; the class an
  index, or a name when the folder has ``classes.txt`` (one name a line).
* **CSV** (a file): ``file,class,x0,y0,x1,y1`` a row (a header row is optional), pixels.
* **Masks** (a folder of ``NAME.png``): 0 is background; other values are class indices (VOC's
  ``SegmentationClass``, its 255 border ignored), except that a mask holding only {0, 1} or {0, 255} is
  binary: one object of the class explained (``mask_kind`` ``binary`` or ``classes`` decides for every file).
  A mask of another size than its photo is resized (nearest) when its aspect is the photo's, refused else;
  a mask that is no image fails its photo alone (:attr:`Annotations.unreadable`).

Boxes that cover no pixel (reversed corners, zero area, wholly outside the image) are left out and counted
in :attr:`Annotations.warnings`, one line per annotation file.

A file is named relative to the input folder (``sub/cat.jpg``) or by its bare name (``cat.jpg``; the folder
formats by stem). Classes are model class indices, or names matched to the model's labels.
"""

from __future__ import annotations

import csv
import json
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from hookviz.errors import HookvizError, UsageError
from hookviz.io.stores import LABEL_COLUMNS, PATH_COLUMNS, Blob, is_url, table_rows

#: A class as annotated: a model class index, a name to look up, or None (a binary mask's one object).
Label = int | str | None


@dataclass(frozen=True)
class Region:
    """One annotated object: a box (pixels ``x0, y0, x1, y1``; ``normalised``: fractions, YOLO's), polygons,
    or a mask, in the frame of an image ``size`` = (width, height) when the annotation says so."""

    label: Label
    box: tuple[float, float, float, float] | None = None
    polygons: tuple[tuple[float, ...], ...] = ()
    mask: np.ndarray | None = field(default=None, compare=False)
    normalised: bool = False
    size: tuple[int, int] | None = None

    def draw(self, height: int, width: int) -> np.ndarray:
        """The object as a boolean mask of an image ``height`` x ``width``."""
        import cv2

        if self.mask is not None:
            m = self.mask
            if m.shape != (height, width):
                m = cv2.resize(m.astype(np.uint8), (width, height), interpolation=cv2.INTER_NEAREST) > 0
            return m.astype(bool)
        sx, sy = (width, height) if self.normalised else (1.0, 1.0)
        if self.size is not None and not self.normalised:
            sx, sy = width / self.size[0], height / self.size[1]
        out = np.zeros((height, width), np.uint8)
        if self.polygons:
            for poly in self.polygons:
                pts = np.asarray(poly, np.float64).reshape(-1, 2) * (sx, sy)
                cv2.fillPoly(out, [np.round(pts).astype(np.int32)], 1)
        elif self.box is not None:
            x0, y0, x1, y1 = self.box
            # Every pixel the box touches; a thousandth of a pixel is rounding (YOLO's 6 decimals), not area.
            # Both corners are clipped to the image: a box wholly outside it is empty (never a negative
            # index read from the far side).
            c0, c1 = (_clip(v, width) for v in (np.floor(x0 * sx + 1e-3), np.ceil(x1 * sx - 1e-3)))
            r0, r1 = (_clip(v, height) for v in (np.floor(y0 * sy + 1e-3), np.ceil(y1 * sy - 1e-3)))
            if c1 > c0 and r1 > r0:
                out[r0:r1, c0:c1] = 1
        return out.astype(bool)


def _clip(v: float, size: int) -> int:
    return int(min(max(v, 0), size))


def empty_box(r: Region) -> str | None:
    """Why the box of ``r`` covers no pixel of its image (None: it covers some, or is not a box)."""
    if r.box is None or r.polygons:
        return None
    x0, y0, x1, y1 = r.box
    if not all(np.isfinite(r.box)):
        return "not a number"
    if x1 < x0 or y1 < y0:
        return "reversed corners"
    if x1 == x0 or y1 == y0:
        return "zero area"
    w, h = (1.0, 1.0) if r.normalised else (r.size or (np.inf, np.inf))
    if x1 <= 0 or y1 <= 0 or x0 >= w or y0 >= h:
        return "outside the image"
    return None


def _fmt(v: float) -> str:
    return f"{v:g}"


def _keep_boxes(by: dict[str, list[Region]], where: str) -> tuple[dict[str, list[Region]], list[str]]:
    """``by`` without the boxes that cover no pixel, and a warning line for them (none when all are kept)."""
    dropped: list[tuple[str, Region, str]] = []
    kept: dict[str, list[Region]] = {}
    for name, regions in by.items():
        kept[name] = []
        for r in regions:
            why = empty_box(r)
            if why is None:
                kept[name].append(r)
            else:
                dropped.append((name, r, why))
    if not dropped:
        return kept, []
    name, r, why = dropped[0]
    box = ",".join(_fmt(v) for v in r.box or ())
    return kept, [
        f"{where}: {len(dropped)} box(es) cover no pixel and are left out (reversed corners, zero area or "
        f"outside the image), e.g. {name}: {r.label} at {box} ({why})"
    ]


@dataclass
class Annotations:
    """Regions per image file, looked up by the end of the image's path (see the module's notes)."""

    source: str
    by_name: dict[str, list[Region]]
    #: Lines for the user about what was read: boxes left out, how masks were read.
    warnings: list[str] = field(default_factory=list)
    #: The folder or file the annotations came from.
    where: str = ""
    #: Why a photo's annotation could not be read (a mask that is no image), by the key it is found by: that
    #: photo fails alone (:meth:`regions` raises), the others go on.
    unreadable: dict[str, str] = field(default_factory=dict)

    def __len__(self) -> int:
        return len(self.by_name)

    def regions(self, path: Path | str) -> list[Region] | None:
        """The regions annotated for the image at ``path`` (None: the image is not in the annotations; an
        empty list: annotated, and holds no object).

        Raises:
            UsageError: the image's annotation could not be read (that image fails alone).
        """
        parts = Path(path).parts
        for key in [*(_key("/".join(parts[k:])) for k in range(len(parts))), _key(Path(path).stem)]:
            if key in self.unreadable:
                raise UsageError(self.unreadable[key])
            found = self.by_name.get(key)
            if found is not None:
                return found
        return None

    def labels(self) -> set[Label]:
        return {r.label for regions in self.by_name.values() for r in regions}

    def check(self, names: Sequence[str], classes: int) -> None:
        """Resolve every annotated class before the first image runs.

        Raises:
            UsageError: some labels are not the model's classes; the line lists them with a file each.
        """
        bad: dict[str, str] = {}
        for file, regions in self.by_name.items():
            for r in regions:
                try:
                    resolve(r.label, names, classes)
                except UsageError:
                    bad.setdefault(repr(r.label), file)
        if bad:
            listed = ", ".join(f"{label} (in {file})" for label, file in list(bad.items())[:5])
            more = f" and {len(bad) - 5} more" if len(bad) > 5 else ""
            raise UsageError(
                f"{self.where or self.source}: {len(bad)} annotated class(es) are not the model's classes "
                f"0..{classes - 1}: {listed}{more}; name them as its labels (hookviz models lists them), "
                "give class indices, or --labels FILE with your names"
            )


def _key(name: str) -> str:
    return name.replace("\\", "/").lstrip("./").lower()


def _label(text: Any) -> Label:
    s = str(text).strip()
    return int(s) if s.lstrip("-").isdigit() else s


MASK_KINDS = ("auto", "binary", "classes")


def load(boxes: Path | None = None, masks: Path | None = None, mask_kind: str = "auto") -> Annotations:
    """Read ``--boxes`` (a COCO JSON or CSV file, a VOC or YOLO folder) or ``--masks`` (a folder of PNGs;
    ``mask_kind``: ``auto``, ``binary`` or ``classes``, see the module's notes)."""
    if (boxes is None) == (masks is None):
        raise UsageError("give one of --boxes FILE|DIR and --masks DIR")
    if masks is not None:
        if masks.suffix.lower() in TABLES:  # a table's mask column
            return _table(masks, mask_kind, "--masks")
        return _masks(masks, mask_kind)
    assert boxes is not None
    found = _boxes(boxes)
    found.by_name, found.warnings = _keep_boxes(found.by_name, f"--boxes {boxes}")
    found.where = f"--boxes {boxes}"
    return found


def _boxes(boxes: Path) -> Annotations:
    if not boxes.exists():
        raise UsageError(f"--boxes {boxes}: no such file or folder")
    if boxes.is_dir():
        if any(boxes.glob("*.xml")):
            return _voc(boxes)
        if any(p for p in boxes.glob("*.txt") if p.name != "classes.txt"):
            return _yolo(boxes)
        raise UsageError(f"--boxes {boxes}: a folder of VOC .xml or YOLO .txt files; found neither")
    if boxes.suffix.lower() == ".json":
        return _coco(boxes)
    if boxes.suffix.lower() in TABLES and (boxes.suffix.lower() != ".csv" or _has_columns(boxes)):
        return _table(boxes, "auto", "--boxes")
    if boxes.suffix.lower() in (".csv", ".txt"):
        return _csv(boxes)
    raise UsageError(f"--boxes {boxes}: a COCO .json, a .csv (file,class,x0,y0,x1,y1), or a VOC/YOLO folder")


def _bad(path: Path, what: str) -> UsageError:
    return UsageError(f"--boxes {path}: {what}")


def _coco(path: Path) -> Annotations:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        names = {c["id"]: c.get("name", c["id"]) for c in data.get("categories", [])}
        images = {im["id"]: im for im in data["images"]}
        by: dict[str, list[Region]] = {_key(im["file_name"]): [] for im in images.values()}
        for ann in data.get("annotations", []):
            im = images[ann["image_id"]]
            x, y, w, h = (float(v) for v in ann["bbox"])
            seg = ann.get("segmentation")
            polys = tuple(tuple(float(v) for v in p) for p in seg) if isinstance(seg, list) else ()
            size = (int(im["width"]), int(im["height"])) if "width" in im and "height" in im else None
            label = names.get(ann["category_id"], ann["category_id"])
            by[_key(im["file_name"])].append(Region(_label(label), (x, y, x + w, y + h), polys, size=size))
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise _bad(path, f"not a COCO annotation file ({type(exc).__name__}: {exc})") from None
    return Annotations("coco", by)


def _voc(folder: Path) -> Annotations:
    import xml.etree.ElementTree as ET

    by: dict[str, list[Region]] = {}
    for xml in sorted(folder.glob("*.xml")):
        try:
            root = ET.parse(xml).getroot()
            wh = (int(float(root.findtext("size/width", "0"))), int(float(root.findtext("size/height", "0"))))
            regions = []
            for obj in root.iter("object"):
                bb = obj.find("bndbox")
                assert bb is not None
                x0, y0, x1, y1 = (float(bb.findtext(k, "nan")) for k in ("xmin", "ymin", "xmax", "ymax"))
                box = (x0 - 1, y0 - 1, x1, y1)  # VOC: 1-based, inclusive
                regions.append(Region(_label(obj.findtext("name", "")), box, size=wh if all(wh) else None))
        except (ET.ParseError, AssertionError, ValueError, AttributeError) as exc:
            raise _bad(xml, f"not a Pascal VOC annotation ({type(exc).__name__}: {exc})") from None
        by[_key(xml.stem)] = regions
        name = root.findtext("filename")
        if name:
            by[_key(name)] = regions
    return Annotations("voc", by)


def _yolo(folder: Path) -> Annotations:
    names_file = folder / "classes.txt"
    names = names_file.read_text(encoding="utf-8").split("\n") if names_file.exists() else None
    by: dict[str, list[Region]] = {}
    for txt in sorted(p for p in folder.glob("*.txt") if p.name != "classes.txt"):
        regions = []
        for n, line in enumerate(txt.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            try:
                c, cx, cy, w, h = line.split()[:5]
                k, fx, fy, fw, fh = int(c), float(cx), float(cy), float(w), float(h)
            except ValueError:
                raise _bad(txt, f"line {n}: not 'class cx cy w h' ({line.strip()!r})") from None
            label: Label = names[k].strip() if names is not None and k < len(names) else k
            regions.append(
                Region(label, (fx - fw / 2, fy - fh / 2, fx + fw / 2, fy + fh / 2), normalised=True)
            )
        by[_key(txt.stem)] = regions
    return Annotations("yolo", by)


def _csv(path: Path) -> Annotations:
    by: dict[str, list[Region]] = {}
    with path.open(encoding="utf-8", newline="") as f:
        for n, row in enumerate(csv.reader(f), 1):
            if not row or (n == 1 and row[0].strip().lower() in ("file", "filename", "image", "path")):
                continue
            try:
                name, label, *coords = (c.strip() for c in row)
                x0, y0, x1, y1 = (float(v) for v in coords[:4])
            except ValueError:
                raise _bad(path, f"row {n}: not file,class,x0,y0,x1,y1 ({','.join(row)!r})") from None
            by.setdefault(_key(name), []).append(Region(_label(label), (x0, y0, x1, y1)))
    return Annotations("csv", by)


#: Tables of inputs (``--inputs-table``) whose ``boxes`` and ``mask`` columns say where the objects lie
TABLES = (".parquet", ".jsonl", ".ndjson", ".csv")


def _has_columns(path: Path) -> bool:
    """Whether a CSV file is a table of inputs (a header naming a ``boxes`` or ``mask`` column)."""
    with path.open(encoding="utf-8", newline="") as f:
        header = next(csv.reader(f), [])
    return bool({"boxes", "mask"} & {c.strip().lower() for c in header})


def _table(path: Path, kind: str, flag: str) -> Annotations:
    """A table of inputs' annotations: per row, its ``boxes`` (``[[x0, y0, x1, y1], ...]`` in pixels, a list
    or its JSON text; ``box_labels`` their classes, else the row's label column, else the class explained) and
    its ``mask`` (a mask image's path, from the table's folder, or URL; read as ``--masks`` reads one)."""
    rows = table_rows(str(path))
    columns = set(rows[0]) if rows else set()
    name_col = next((c for c in PATH_COLUMNS if c in columns), None)
    wanted = "boxes" if flag == "--boxes" else "mask"  # --boxes reads its boxes, --masks its masks
    if name_col is None or wanted not in columns:
        raise UsageError(f"{flag} {path}: a table needs a path column and a {wanted} column")
    label_col = next((c for c in LABEL_COLUMNS if c in columns), None)
    by: dict[str, list[Region]] = {}
    for n, row in enumerate(rows, 1):
        found: list[Region] = []
        boxes = row.get("boxes") if wanted == "boxes" else None
        boxes = json.loads(boxes) if isinstance(boxes, str) and boxes.strip() else boxes
        labels = row.get("box_labels")
        labels = json.loads(labels) if isinstance(labels, str) and labels.strip() else labels
        for k, b in enumerate(boxes or []):
            if len(b) != 4:
                raise _bad(path, f"row {n}: a box is x0,y0,x1,y1, not {b!r}")
            own = labels[k] if labels else (row.get(label_col) if label_col else None)
            x0, y0, x1, y1 = (float(v) for v in b)
            found.append(Region(None if own is None or own == "" else _label(own), (x0, y0, x1, y1)))
        if wanted == "mask" and row.get("mask"):
            found += _mask_regions(_read_mask(path, str(row["mask"]), flag), kind)[0]
        by[_key(str(row[name_col]))] = found
    return Annotations("table", by, where=f"{flag} {path}")


def _read_mask(table: Path, where: str, flag: str) -> np.ndarray:
    from PIL import Image

    try:
        source: Any = Blob(where, where).open() if is_url(where) else table.parent / where
        with Image.open(source) as im:
            values = np.asarray(im.convert("L") if im.mode not in ("L", "P", "I", "I;16") else im)
    except (OSError, HookvizError) as exc:
        raise UsageError(f"{flag} {table}: the mask {where} cannot be read ({exc})") from None
    return values[..., 0] if values.ndim == 3 else values


def _mask_regions(values: np.ndarray, kind: str) -> tuple[list[Region], bool]:
    """A mask's objects (0 is background): one object of the class explained where it is binary, else one per
    class value (255 ignored); and whether it was read as binary."""
    present = [int(v) for v in np.unique(values) if v != 0]
    binary = (set(present) <= {1} or set(present) <= {255}) if kind == "auto" else kind == "binary"
    if binary:
        return ([Region(None, mask=values != 0)] if present else []), True
    return [Region(v, mask=values == v) for v in present if v != 255], False


def _masks(folder: Path, kind: str = "auto") -> Annotations:
    from PIL import Image

    if kind not in MASK_KINDS:
        raise UsageError(f"--mask-kind {kind!r}: one of {', '.join(MASK_KINDS)}")
    if not folder.is_dir():
        raise UsageError(f"--masks {folder}: not a folder (one PNG a photo, named as the photo)")
    by: dict[str, list[Region]] = {}
    unreadable: dict[str, str] = {}
    read_as = {"binary": 0, "classes": 0}
    for png in sorted(folder.glob("*.png")):
        try:
            with Image.open(png) as im:
                values = np.asarray(im.convert("L") if im.mode not in ("L", "P", "I", "I;16") else im)
        except OSError as exc:  # that photo fails alone, named; the others go on
            unreadable[_key(png.stem)] = (
                f"its mask {png} cannot be read ({exc}): give a PNG of the photo's size"
            )
            continue
        if values.ndim == 3:
            values = values[..., 0]
        by[_key(png.stem)], binary = _mask_regions(values, kind)
        read_as["binary" if binary else "classes"] += 1
    if not by and not unreadable:
        raise UsageError(f"--masks {folder}: no .png in it")
    said = {
        "binary": "binary (one object of the class explained)",
        "classes": "class-index masks (each value a class, 255 ignored)",
    }
    how = "; ".join(f"{n} read as {said[k]}" for k, n in read_as.items() if n)
    fix = " (--mask-kind binary|classes to choose)" if kind == "auto" else ""
    said_how = [f"--masks {folder}: {how}{fix}"] if how else []
    return Annotations("masks", by, said_how, where=f"--masks {folder}", unreadable=unreadable)


def resolve(label: Label, names: Sequence[str], classes: int) -> int | None:
    """A label as a model class index (None: the binary mask's class explained); a name is matched to the
    model's labels (case, spaces and underscores aside)."""
    if label is None:
        return None
    if isinstance(label, int):
        if not 0 <= label < classes:
            raise UsageError(f"annotated class {label} is out of the model's range 0..{classes - 1}")
        return label

    def norm(s: str) -> str:
        return s.strip().lower().replace("_", " ")

    lookup = {norm(n): i for i, n in enumerate(names)}
    if norm(label) not in lookup:
        raise UsageError(
            f"annotated class {label!r} is not one of the model's classes: name them as its labels "
            "(hookviz models lists them), give class indices, or --labels FILE with your names"
        )
    return lookup[norm(label)]


def input_mask(region_masks: np.ndarray, box: Any, size: tuple[int, int]) -> np.ndarray:
    """An object mask of the original image brought into the model's input frame: the region the model saw
    (``box``), resized (nearest) to the input's ``size`` = (height, width)."""
    import cv2

    crop = region_masks[box.y0 : box.y1, box.x0 : box.x1].astype(np.uint8)
    h, w = size
    return cv2.resize(crop, (w, h), interpolation=cv2.INTER_NEAREST) > 0
