"""The paper's numbers of the analysis studies (means over five seeds, percent): its RanPAC variants table
and the FlyPrompt row beside them. Figures 2b, 2c and the CKA matrices print no number in the paper's
text (their data are images), so they have none here."""

from __future__ import annotations

__all__ = ["RANPAC_VARIANTS", "RANPAC_VARIANTS_BACKBONE"]

#: ``ranpac_vs_flyprompt``: row key -> {dataset: (A_auc, A_last)} (Sup-21K, the paper's main backbone)
RANPAC_VARIANTS = {
    "ranpac": {"cifar100": (69.91, 79.92), "imagenet-r": (47.14, 50.75), "cub200": (60.18, 66.21)},
    "ranpac-frozen": {"cifar100": (57.35, 77.65), "imagenet-r": (36.90, 44.39), "cub200": (64.52, 71.65)},
    "ranpac-collect": {"cifar100": (77.88, 86.52), "imagenet-r": (53.18, 54.71), "cub200": (69.64, 72.30)},
    "flyprompt": {"cifar100": (83.24, 86.76), "imagenet-r": (56.58, 55.27), "cub200": (70.64, 73.40)},
}

RANPAC_VARIANTS_BACKBONE = "sup21k"
