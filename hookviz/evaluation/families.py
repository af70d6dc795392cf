"""The metric families of ``hookviz evaluate``: their figures (name, table title, better direction, kind), the
``--metric`` parser and the settings of the metrics that take any."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from hookviz.errors import UsageError

#: ``--metric`` families, in the order their columns appear.
FAMILIES = ("faithfulness", "road", "flipping", "localisation", "complexity", "robustness", "randomisation")
#: Each figure: its family, what it is called in a table, whether lower or higher is better, and whether it
#: is a proportion (a Wilson interval) or a mean (Student's t).
FIGURES: dict[str, tuple[str, str, str, bool]] = {
    "deletion_auc": ("faithfulness", "deletion AUC", "↓", False),
    "insertion_auc": ("faithfulness", "insertion AUC", "↑", False),
    "average_drop": ("faithfulness", "avg drop %", "↓", False),
    "increase": ("faithfulness", "increase %", "↑", True),
    "road_morf": ("road", "ROAD MoRF", "↓", False),
    "road_lerf": ("road", "ROAD LeRF", "↑", False),
    "road": ("road", "ROAD LeRF-MoRF", "↑", False),
    "pixel_flipping_auc": ("flipping", "pixel flipping AUC", "↓", False),
    "region_aopc": ("flipping", "region AOPC", "↑", False),
    "pointing_game": ("localisation", "pointing %", "↑", True),
    "energy_pointing_game": ("localisation", "energy pointing", "↑", False),
    "relevance_mass": ("localisation", "relevance mass", "↑", False),
    "relevance_rank": ("localisation", "relevance rank", "↑", False),
    "top_k_intersection": ("localisation", "top-k", "↑", False),
    "sparseness": ("complexity", "sparseness", "↑", False),
    "complexity": ("complexity", "complexity", "↓", False),
    "max_sensitivity": ("robustness", "max sensitivity", "↓", False),
    "avg_sensitivity": ("robustness", "avg sensitivity", "↓", False),
    "relative_input_stability": ("robustness", "RIS", "↓", False),
    "relative_output_stability": ("robustness", "ROS", "↓", False),
    "random_logit": ("randomisation", "random-logit SSIM", "↓", False),
}
#: A figure's name in the summary where it differs from the per-image one (a per-image yes/no there).
SUMMARY_NAMES = {"increase": "increase_in_confidence"}


def summary_name(figure: str) -> str:
    return SUMMARY_NAMES.get(figure, figure)


#: Families that perturb an image's pixels, or need its annotations: not for a video model's clips.
PIXEL_FAMILIES = ("road", "flipping", "localisation")


def parse_metrics(spec: Sequence[str] | None, annotated: bool = False) -> tuple[str, ...]:
    """``--metric`` values (repeatable, comma-separated; ``all``) as families in table order. Default: the
    faithfulness set, with ``localisation`` too when annotations are given."""
    asked = [p.strip().lower() for s in spec or () for p in s.split(",") if p.strip()]
    if not asked:
        return ("faithfulness", "localisation") if annotated else ("faithfulness",)
    if "all" in asked:
        return tuple(f for f in FAMILIES if f != "localisation" or annotated)
    aliases = {"localization": "localisation", "randomization": "randomisation", "pixel-flipping": "flipping"}
    unknown = [a for a in asked if aliases.get(a, a) not in FAMILIES]
    if unknown:
        raise UsageError(f"--metric {unknown[0]!r}: one of {', '.join(FAMILIES)}, or all")
    chosen = {aliases.get(a, a) for a in asked}
    if "localisation" in chosen and not annotated:
        raise UsageError("--metric localisation needs where the objects are: --boxes FILE|DIR or --masks DIR")
    return tuple(f for f in FAMILIES if f in chosen)


@dataclass(frozen=True)
class MetricSettings:
    """The settings of the metrics that take any (recorded with every evaluation)."""

    tolerance: float = 15.0  # pointing game, pixels of the input
    top_k: int = 1000  # top-k intersection
    radius: float = 0.2  # robustness: uniform noise in [-radius, radius] of the model's input
    robust_samples: int = 10
    patch: int = 8  # region perturbation
    regions: int = 100
    road_noise: float = 0.01

    def record(self, families: Sequence[str]) -> dict[str, Any]:
        used: dict[str, dict[str, Any]] = {
            "localisation": {"tolerance": self.tolerance, "top_k": self.top_k},
            "robustness": {"radius": self.radius, "samples": self.robust_samples},
            "flipping": {"patch": self.patch, "regions": self.regions},
            "road": {"percentages": [10, 20, 30, 40, 50, 60, 70, 80, 90], "noise": self.road_noise},
        }
        return {k: v for f in families for k, v in used.get(f, {}).items()}
