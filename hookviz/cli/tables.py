"""``evaluate``'s words and files: the cost said before it starts, the tables after, ``evaluation.KEY.csv`` /
``evaluation_by_class.KEY.csv`` / ``evaluation.KEY.json`` (``KEY``: the settings' key, as the maps have)."""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path
from typing import Any

import typer

from hookviz.io.files import atomic_write
from hookviz.io.outputs import MANIFEST, finite, settings_key
from hookviz.report import latest_records


def announce(job: Any) -> None:
    """One line on stderr before the run: what each family costs in forward passes per image."""
    maps = len(job.methods) * len(job.layers) + 2
    cost = job.passes_per_image(maps, job.loaded.input_shape)
    parts = [f"{family} {n:,}" for family, n in cost.items()]
    on = [f"{job.metric_settings.robust_samples} noisy copies"] if "robustness" in job.metrics else []
    on += ["a random other class"] if "randomisation" in job.metrics else []
    extra = [f"the methods' backward passes on {' and '.join(on)}"] if on else []
    free = [f for f in job.metrics if f in ("localisation", "complexity")]
    line = (
        f"evaluate: {maps} maps an image ({len(job.methods)} method(s) x {len(job.layers)} layer(s) + the "
        f"random and center baselines); forward passes an image: {', '.join(parts) or 'none'}"
        f"{' = ' + format(sum(cost.values()), ',') if len(cost) > 1 else ''}"
        f"{'; plus ' + ' and '.join(extra) if extra else ''}"
        f"{'; ' + ' and '.join(free) + ' cost none' if free else ''}"
    )
    typer.echo(line, err=True)


def _columns(rows: list[dict[str, Any]], lead: list[str]) -> tuple[list[str], list[dict[str, Any]]]:
    """CSV columns (each figure, then its interval: ``_ci95`` for a mean's half-width, ``_ci95_low`` /
    ``_ci95_high`` for a proportion's Wilson interval) and the rows flattened to them."""
    from hookviz.evaluation.families import FIGURES, summary_name

    columns = list(lead)
    names = [(summary_name(f), spec[3]) for f, spec in FIGURES.items()]
    for fig, proportion in names:
        if any(fig in r for r in rows):
            columns += [fig, f"{fig}_ci95_low", f"{fig}_ci95_high"] if proportion else [fig, f"{fig}_ci95"]
    flat = []
    for r in rows:
        row = dict(r)
        for fig, proportion in names:
            if proportion and fig in r:
                row[f"{fig}_ci95_low"], row[f"{fig}_ci95_high"] = r[f"{fig}_ci95"]
        flat.append(row)
    return columns, flat


def _csv(columns: list[str], rows: list[dict[str, Any]]) -> str:
    buf = io.StringIO()
    writer = csv.DictWriter(buf, fieldnames=columns, lineterminator="\n", extrasaction="ignore")
    writer.writeheader()
    writer.writerows(rows)
    return buf.getvalue()


def _table(rows: list[dict[str, Any]], families: list[str], label: bool = False) -> list[str]:
    from hookviz.evaluation.summary import tables

    out = []
    for t in tables(rows, families):
        wm = max(6, *(len(r["method"]) for r in t["rows"]))
        wl = max(5, *(len(r["layer"]) for r in t["rows"]))
        wc = max(5, *(len(r["name"]) for r in t["rows"])) if label else 0
        out.append(f"[{t['family']}]")
        who = f"{'method':<{wm}}  {'layer':<{wl}}  " + (f"{'class':<{wc}}  " if label else "")
        out.append(who + f"{t['count']:>7}  " + "  ".join(f"{c:>20}" for c in t["columns"]))
        for r in t["rows"]:
            who = f"{r['method']:<{wm}}  {r['layer']:<{wl}}  " + (f"{r['name']:<{wc}}  " if label else "")
            out.append(who + f"{r['n']:>7}  " + "  ".join(f"{c:>20}" for c in r["cells"]))
    return out


def write_evaluation(job: Any, out: Path, quiet: bool, as_json: bool, overwrite: bool = False) -> None:
    """The tables (stdout, or stderr with --json), OUT/evaluation.KEY.csv, OUT/evaluation_by_class.KEY.csv
    (with annotations) and OUT/evaluation.KEY.json, ``KEY`` the settings' key: an evaluation with other
    settings (another method set) in the same folder keeps its own files. Files of these settings already
    there are kept when they hold the same figures, replaced when the folder's run has grown (more images:
    those of before are among them) or with ``overwrite``, else kept and said."""
    from hookviz.evaluation.summary import summarise_by_class, summarise_evaluation

    key = settings_key(job.settings())
    lines = (out / MANIFEST).read_text(encoding="utf-8", errors="replace").splitlines()
    recs = [x for x in latest_records(lines) if x.get("key") == key and x.get("status") in ("ok", "skipped")]
    rows = summarise_evaluation(recs)
    by_class = summarise_by_class(recs) if job.annotations is not None else []
    passes = sum(int(x.get("forward_passes", 0)) for x in recs)
    lead = ["method", "layer", "images", *(["objects"] if job.annotations is not None else [])]
    columns, flat = _columns(rows, lead)
    files = [(f"evaluation.{key}.csv", _csv(columns, flat))]
    if job.annotations is not None:
        ccols, cflat = _columns(by_class, ["method", "layer", "class", "name", "objects"])
        files.append((f"evaluation_by_class.{key}.csv", _csv(ccols, cflat)))
    summary = {
        "key": key,
        "settings": job.settings(),
        "images": len(recs),
        "forward_passes": passes,
        "rows": rows,
        **({"by_class": by_class} if job.annotations is not None else {}),
    }
    files.append((f"evaluation.{key}.json", json.dumps(finite(summary), indent=1, allow_nan=False)))
    said = _written(out, files, len(recs), overwrite)
    table = _table(rows, list(job.metrics))
    if by_class and len({r["class"] for r in by_class}) > 1:
        table += ["", "by annotated class:", *_table(by_class, ["localisation"], label=True)]
    table.append(
        f"{len(recs)} image(s), {passes:,} forward passes; ± is the 95 % confidence interval of the mean "
        "(Student's t), [low, high] that of a proportion (Wilson); random and center are chance baselines"
    )
    table.append(said)
    if not quiet or not as_json:
        typer.echo("\n".join(table), err=as_json)


def _written(out: Path, files: list[tuple[str, str]], images: int, overwrite: bool) -> str:
    """Write an evaluation's files unless those there (the same settings) hold the same figures, or other
    figures over as many images or more and no ``overwrite``; what was done, in words."""
    named = ", ".join(str(out / name) for name, _ in files)
    there = out / files[-1][0]  # the summary (.json): its images tell a grown run from another
    if there.is_file():
        if all((out / n).is_file() and (out / n).read_text(encoding="utf-8") == t for n, t in files):
            return f"kept {named} (the same figures: these settings over the same images)"
        try:
            before = int(json.loads(there.read_text(encoding="utf-8")).get("images", 0))
        except (ValueError, TypeError, AttributeError):
            before = images + 1  # unreadable: never replaced silently
        if not overwrite and images <= before:
            return (
                f"kept {named}: they hold other figures for these settings ({before} image(s)); pass "
                "--overwrite to replace them"
            )
    for name, text in files:
        atomic_write(out / name, text)
    return f"wrote {named}"
