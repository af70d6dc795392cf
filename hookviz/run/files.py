"""One input's files in a run: those planned, what the ones already there make of it (skipped, completed,
added to, or an error) and writing them, where an ``--overwrite`` or ``--skip-existing`` decides."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from hookviz.io.images import quote
from hookviz.io.inputs import Item
from hookviz.io.outputs import Output

if TYPE_CHECKING:  # the protocol every job follows (hookviz.jobs); the run imports no job
    from hookviz.jobs.common import Job

__all__ = ["Files"]


class Files:
    """The files of the run's inputs under ``output``: planned by ``job``, kept by the output."""

    def __init__(self, job: Job, output: Output, skip_existing: bool) -> None:
        self.job, self.output, self.skip_existing = job, output, skip_existing

    def planned(self, prefix: str) -> list[str]:
        """The outputs an input gets: the job's, less those the output does not keep (``--no-pictures``)."""
        return [n for n in self.job.planned(prefix) if self.output.keeps(n)]

    def write(self, files: list[tuple[str, bytes]], note: str | None, attrs: dict[str, Any]) -> list[str]:
        """Write an input's files; "add" writes only those missing. Resuming, an input is redone only when
        its outputs are incomplete (a killed run): replacing the partial set is the point."""
        out = self.output
        files = [(n, data) for n, data in files if out.keeps(n)]
        if note == "add":
            return [
                out.where(n) if out.exists(n) else str(out.write(n, data, attrs=attrs)) for n, data in files
            ]
        written, taken = [], None
        for name, data in files:
            try:
                written.append(str(out.write(name, data, replace=self.skip_existing, attrs=attrs)))
            except FileExistsError as exc:  # another run writing this input too: complete the set with it
                taken = taken or exc
        if taken is not None:
            raise taken  # finish: the set complete, skipped; else an output that exists is said
        return written

    def state(self, item: Item, prefix: str) -> str | None:
        """What the outputs already there make of an input: None (none there, or --overwrite), "skipped",
        "fill", "add", or an error."""
        planned = self.planned(prefix)
        existing = [n for n in planned if self.output.exists(n)]
        if not existing or self.output.overwrite:
            return None
        missing = [n for n in planned if n not in existing]
        if len(existing) == len(planned):
            return "skipped" if prefix in self.output.previous else "fill"
        if all(n.endswith(".npy") for n in missing) and not self.skip_existing:
            return "add"  # --save-raw added to a finished run: write the arrays, keep the pictures
        if self.skip_existing:
            return None
        return (
            f"{quote(item.name)}: {len(existing)} of {len(planned)} outputs exist from an "
            f"earlier run with these settings ({existing[0]}); pass --skip-existing "
            "to complete them, or --overwrite to redo them"
        )

    def named(self, fields: dict[str, Any], prefix: str) -> dict[str, Any]:
        """``fields`` naming only what is written: with ``--no-pictures`` a map's ``file`` (its PNG) is None,
        and ``raw`` says where its raw map went (a ``.npy`` file, its Zarr array), if anywhere."""
        maps = fields.get("maps")
        if self.output.pictures or not isinstance(maps, list):
            return fields
        planned = set(self.planned(prefix))
        named = []
        for entry in maps:
            file = entry.get("file") if isinstance(entry, dict) else None
            if isinstance(file, str) and not self.output.keeps(file):
                raw = f"{file[: -len('.png')]}.npy"
                entry = {**entry, "file": None, **({"raw": self.output.where(raw)} if raw in planned else {})}
            named.append(entry)
        return {**fields, "maps": named}
