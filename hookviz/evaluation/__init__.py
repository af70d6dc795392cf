"""Which map to trust: the field's evaluation metrics, in families (``hookviz evaluate --metric``).

=================  ===============================================================================
family             metrics (module)
=================  ===============================================================================
faithfulness       deletion / insertion AUC, average drop, increase in confidence (``faithfulness``)
road               ROAD, most and least relevant first, noisy linear imputation (``perturbation``)
flipping           pixel flipping, region perturbation / AOPC (``perturbation``)
localisation       pointing game, energy pointing game, relevance mass / rank, top-k (``localisation``)
complexity         sparseness (Gini), complexity (entropy) (``localisation``)
robustness         max / average sensitivity, relative input / output stability (``robustness``)
randomisation      random-logit here; the parameter-randomisation tests in ``hookviz sanity``
=================  ===============================================================================

Statistics (confidence intervals, ranks, SSIM) come from scipy and scikit-image (``stats``).
"""

from hookviz.evaluation.faithfulness import (
    STEPS,
    Faithfulness,
    auc,
    blurred,
    center_maps,
    choose_layer,
    faithfulness,
    image_generators,
    image_seeds,
    random_maps,
    rank_layers,
    upsample,
)
from hookviz.evaluation.randomisation import (
    cascade,
    off_classes,
    random_logit,
    randomisation_blocks,
    randomise,
    randomised_models,
    smoothed,
)
from hookviz.evaluation.stats import mean_ci, rankdata, spearman, ssim, wilson

__all__ = [
    "STEPS",
    "Faithfulness",
    "auc",
    "blurred",
    "cascade",
    "center_maps",
    "choose_layer",
    "faithfulness",
    "image_generators",
    "image_seeds",
    "mean_ci",
    "off_classes",
    "random_logit",
    "random_maps",
    "randomisation_blocks",
    "randomise",
    "randomised_models",
    "rank_layers",
    "rankdata",
    "smoothed",
    "spearman",
    "ssim",
    "upsample",
    "wilson",
]
