"""An evaluation's summary: each figure's mean and 95 % interval per method@layer (and per class), and the
same as tables of text cells, one a family (the CLI, the report and ``evaluation.json`` read these)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from hookviz.evaluation.families import FIGURES, summary_name
from hookviz.evaluation.stats import mean_ci, wilson


def tables(rows: Sequence[dict[str, Any]], families: Sequence[str]) -> list[dict[str, Any]]:
    """The summary as tables, one a family: ``{"family", "count" (images or objects), "columns" (each
    figure's name and its better direction), "rows" [{"method", "layer", "name", "n", "cells"}]}``, each
    cell the figure and its interval as text (``0.372 ±0.041``, a proportion ``100.0 [89, 100]``)."""
    out = []
    for family in families:
        figs = [(summary_name(f), spec) for f, spec in FIGURES.items() if spec[0] == family]
        figs = [(f, spec) for f, spec in figs if any(f in r for r in rows)]
        if not figs:
            continue
        count = "objects" if family == "localisation" else "images"
        body = [
            {
                "method": r["method"],
                "layer": r["layer"],
                "name": str(r.get("name", "")),
                "n": int(r.get(count, 0)),
                "cells": [_cell(r, f, spec[3]) for f, spec in figs],
            }
            for r in rows
            if any(f in r for f, _ in figs)
        ]
        columns = [f"{spec[1]} {spec[2]}" for _, spec in figs]
        out.append({"family": family, "count": count, "columns": columns, "rows": body})
    return out


def _cell(row: dict[str, Any], fig: str, proportion: bool) -> str:
    if row.get(fig) is None:
        return "-"
    if proportion:
        low, high = row[f"{fig}_ci95"]
        return f"{row[fig]:.1f} [{low:.0f}, {high:.0f}]"
    half = row.get(f"{fig}_ci95")
    if half is None or half != half:  # one value: no interval
        return f"{row[fig]:.3f} (n/a)"
    return f"{row[fig]:.3f} ±{half:.3f}"


def summarise_evaluation(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """One row per method@layer (and per chance baseline): each figure's mean and 95 % interval over the
    images (localisation: over the annotated objects)."""
    return _summarise(records, by_class=False)


def summarise_by_class(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """The localisation figures per method@layer and annotated class."""
    return _summarise(records, by_class=True)


def _summarise(records: Sequence[dict[str, Any]], by_class: bool) -> list[dict[str, Any]]:
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    names: dict[tuple[str, ...], str] = {}
    for rec in records:
        if not by_class:
            for name, figures in rec.get("metrics", {}).items():
                groups.setdefault((name,), []).append(figures)
        for obj in rec.get("objects", []):
            for name, figures in obj.get("metrics", {}).items():
                key: tuple[str, ...] = (name, str(obj["class"]["index"])) if by_class else (name,)
                names[key] = obj["class"]["name"]
                groups.setdefault(key, []).append(figures)
    rows = []
    for key, values in groups.items():
        method, _, layer = key[0].partition("@")
        row: dict[str, Any] = {"method": method, "layer": layer or "-"}
        if by_class:
            row |= {"class": int(key[1]), "name": names[key]}
        for fig, (family, _, _, proportion) in FIGURES.items():
            got = [v[fig] for v in values if v.get(fig) is not None]
            if not got:
                continue
            row.setdefault("objects" if family == "localisation" else "images", len(got))
            out = summary_name(fig)
            if proportion:  # the Wilson interval stays inside 0..100 % for small n (a t interval does not)
                hits = sum(bool(g) for g in got)
                low, high = wilson(hits, len(got))
                row[out] = round(100.0 * hits / len(got), 2)
                row[f"{out}_ci95"] = [round(100.0 * low, 2), round(100.0 * high, 2)]
            else:
                mean, half = mean_ci([float(g) for g in got])
                row[out], row[f"{out}_ci95"] = round(mean, 4), round(half, 4)
        rows.append(row)
    return rows


def summarise_sanity(records: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean Spearman and SSIM over the images, with their 95 % intervals, for each step and method, in the
    test's order."""
    groups: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for rec in records:
        for step in rec.get("steps", []):
            groups.setdefault((step["randomized_up_to"], step["method"]), []).append(step)
    rows = []
    for (name, method), v in groups.items():
        row: dict[str, Any] = {"randomized_up_to": name, "method": method, "images": len(v)}
        for key in ("spearman", "ssim"):
            mean, half = mean_ci([s[key] for s in v])
            row[key], row[f"{key}_ci95"] = round(mean, 4), round(half, 4)
        rows.append(row)
    return rows
