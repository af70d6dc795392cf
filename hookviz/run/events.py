"""What a :class:`hookviz.run.runner.Run` tells as it goes, in order: a small union of events that the command
line prints (each one line, or nothing) and Python reads, or ignores.

- :class:`Note`: something the user should know (how ``--layer auto`` chose, how the model was set up, a batch
  split to fit ``--max-memory``, the report's place, the inputs that failed);
- :class:`Built`: the job is built (its layers chosen), before what its building found is said;
- :class:`Started`: the inputs are found, the job built, the output ready: ``total`` to go;
- :class:`Record`: one input's record, as appended to the manifest (and to ``--records``' sink);
- :class:`Written`: every record of the run is in ``manifest.jsonl`` (merged, under torchrun, on rank 0);
- :class:`Finished`: the last event: the counts, and the exit code the command line ends with.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from hookviz import tasks
from hookviz.models.labels import class_label

#: What a note is about: ``auto`` (how ``--layer auto`` chose: a result, said even when quiet), ``built``
#: (how the job was built), ``setup`` (how the model was set up), ``note`` (said during the run), ``warning``,
#: ``report`` (the report's path), ``failed`` (how many inputs failed), ``rank`` (a torchrun rank's error).
NoteKind = Literal["auto", "built", "setup", "note", "warning", "report", "failed", "rank"]


#: How a note's line starts, by its kind (the others: ``hookviz: note:``).
LEADS = {"auto": "hookviz: ", "built": "hookviz: ", "failed": "hookviz: ", "rank": "hookviz",
         "report": "hookviz: report: ", "warning": "hookviz: warning: "}  # fmt: skip


@dataclass(frozen=True)
class Note:
    """One line for the user (:data:`NoteKind` says what about)."""

    kind: NoteKind
    text: str

    @property
    def loud(self) -> bool:
        """Whether it is said even when quiet: a result (how ``--layer auto`` chose, the report, the failed
        inputs), a warning, a rank's error."""
        return self.kind not in ("built", "setup", "note")

    def line(self) -> str:
        """The note as the command line says it (``hookviz: note: ...``)."""
        return LEADS.get(self.kind, "hookviz: note: ") + self.text


@dataclass(frozen=True)
class Built:
    """The job the run runs (a :class:`hookviz.jobs.common.Job`), built for the model and the inputs."""

    job: Any


@dataclass(frozen=True)
class Started:
    """The run starts on ``total`` inputs (a video's clips each count, when its kind cuts inputs)."""

    total: int
    #: Under torchrun, on rank 0: how many inputs every rank has done (for one progress bar); else None.
    done: Callable[[], int] | None = None


@dataclass(frozen=True)
class Record:
    """One input's record (:meth:`line`: how the command line says it)."""

    record: dict[str, Any]

    def line(self) -> str:
        """The line the command prints: an error's own line (``hookviz: 'x.jpg': cannot decode ...``), else
        :func:`describe`'s."""
        if self.record.get("status") == "error" and self.record.get("error") and "video" not in self.record:
            return f"hookviz: {self.record['error']}"
        return describe(self.record)


@dataclass(frozen=True)
class Written:
    """Every record of the run is in the manifest, from byte ``start`` on (what ``--log`` logs)."""

    start: int
    #: The job's kind (``gradcam``, ``featuremaps``, ...).
    command: str | None
    #: Under torchrun, on rank 0: the merged records' lines (what ``--json`` prints); else None.
    merged: str | None = None


@dataclass(frozen=True)
class Finished:
    """The run is over: ``ok`` and ``failed`` inputs (this process's), and the exit code the command line
    ends with (0; 1 when an input failed; under torchrun, the worst rank's on rank 0)."""

    ok: int
    failed: int
    code: int


Event = Note | Built | Started | Record | Written | Finished


def named(d: dict[str, Any]) -> str:
    """``tabby (281)``, or ``class 281`` for a class without a name (not ``class 281 (281)``)."""
    return class_label(d.get("name"), d.get("index"))


def shown(name: object) -> str:
    """A name as a line shows it: as it is, or quoted with its escapes where it holds a newline or another
    unprintable character (one input, one line; as error lines quote it)."""
    text = str(name)
    return text if text.isprintable() else repr(text)


def describe(rec: dict[str, Any]) -> str:
    """A record as one line: the input (a clip's frames), the prediction, the class explained, the outputs."""
    if "video" in rec:  # a whole video's prediction, after its clips
        v = rec["video"]
        return (
            f"{shown(rec['input'])}: whole video: predicted {named(v)} p={v['score']:.3f} "
            f"({v['clips_agreeing']} of {v['clips']} clips agree)"
        )
    parts = [f"{shown(rec['input'])}:"]
    clip = rec.get("clip")
    if clip:
        span = f"frames {clip['frames'][0]}-{clip['frames'][1]}"
        if clip.get("seconds"):
            span += f", {clip['seconds'][0]:.2f}-{clip['seconds'][1]:.2f}s"
        parts = [f"{shown(rec['input'])} clip {clip['number']}/{clip['of']} ({span}):"]
    told = tasks.describe(rec)
    if told is not None:  # the task's account (a detector's boxes) replaces the prediction
        parts += told
        rec = {**rec, "predicted": None}
    p, t = rec.get("predicted"), rec.get("target")

    def scored(score: float) -> str:  # a probability, or a segmentation's share of the pixels
        return f"{score:.1%} of pixels" if rec.get("region") else f"p={score:.3f}"

    if p:
        parts.append(f"predicted {named(p)} {scored(p['score'])};")
        if t and t["index"] != p["index"]:
            said = f" {scored(t['score'])}" if "score" in t else ""  # channels' target carries none
            parts.append(f"explained {named(t)}{said};")
    outs = rec["outputs"]
    verb = "exists" if rec["status"] == "skipped" else "wrote"
    if outs:
        parts.append(f"{verb} {shown(outs[0])}" + (f" (+{len(outs) - 1} more)" if len(outs) > 1 else ""))
    return " ".join(parts)
