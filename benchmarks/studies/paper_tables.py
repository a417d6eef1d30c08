"""The paper's main tables as data, transcribed from the paper (percent, means over its five seeds), and the
rule naming the paper's dataset a run's dataset is compared with.

``OVERALL`` is Table 1 (``overall_results``: six backbones, A_auc / A_last), ``OFFLINE`` Table 2
(``offline_methods``, Sup-21K), ``CROSS_ABLATION`` the cross-ablation in full (``cross_ablation_all``,
Sup-21K: each method's baseline, with REAR, with TE2, with both), ``AVERAGE_FORGETTING`` the appendix
table of A_avg and F_last (``avg_acc_forgetting``). Methods are named as ``benchmarks.methods`` names
them; datasets as the paper's loaders (``cifar100``, ``imagenet-r``, ``cub200``); backbones as
``benchmarks.backbone.BACKBONES``. The variants of ``CROSS_ABLATION`` are the cross-ablation's:
``router`` is "w/ REAR", ``ensemble`` "w/ TE2", ``both`` "w/ both"; FlyPrompt is its ``both`` row.
"""

from __future__ import annotations

from typing import Dict, Tuple

from ..core.proxy_datasets import paper_dataset_of

__all__ = ["PAPER_DATASETS", "FALLBACK_DATASET", "compared_dataset", "OVERALL", "OFFLINE", "CROSS_ABLATION",
           "AVERAGE_FORGETTING", "TABLE_1_NOT_OURS", "PAPER_LABELS"]

Pair = Tuple[float, float]
#: method -> dataset -> a pair of numbers
Rows = Dict[str, Dict[str, Pair]]

#: the paper's three datasets, each compared with itself (the keys every table below has)
PAPER_DATASETS: Dict[str, str] = {"cifar100": "cifar100", "imagenet-r": "imagenet-r", "cub200": "cub200"}

#: the paper's dataset of a dataset that is none of the paper's nor shaped like one (the generated
#: ``synthetic`` data): CIFAR-100, as every table of the proxy so far
FALLBACK_DATASET = "cifar100"


def compared_dataset(dataset: str) -> str:
    """The paper's dataset whose numbers a run on ``dataset`` is printed beside: the paper's own, the one a
    proxy dataset is shaped like (``benchmarks.core.proxy_datasets``, the one rule), else CIFAR-100."""
    return paper_dataset_of(dataset) or FALLBACK_DATASET


#: Table 1: backbone -> method -> dataset -> (A_auc, A_last)
OVERALL: Dict[str, Rows] = {
    "sup21k": {
        "seq-ft": {"cifar100": (19.71, 10.42), "imagenet-r": (7.51, 2.29), "cub200": (3.47, 1.49)},
        "linear-probe": {"cifar100": (49.69, 23.07), "imagenet-r": (29.24, 16.87), "cub200": (28.96, 17.33)},
        "seq-ft-sl": {"cifar100": (64.90, 62.06), "imagenet-r": (47.20, 39.60), "cub200": (56.16, 56.50)},
        "l2p": {"cifar100": (76.23, 79.11), "imagenet-r": (44.40, 42.03), "cub200": (64.30, 61.42)},
        "dualprompt": {"cifar100": (76.04, 76.62), "imagenet-r": (46.13, 40.80), "cub200": (65.03, 62.43)},
        "coda-prompt": {"cifar100": (79.13, 80.91), "imagenet-r": (51.87, 48.09), "cub200": (66.01, 62.90)},
        "mvp": {"cifar100": (67.74, 63.22), "imagenet-r": (39.50, 32.63), "cub200": (54.69, 50.07)},
        "misa": {"cifar100": (80.35, 80.75), "imagenet-r": (51.52, 45.08), "cub200": (65.40, 60.20)},
        "flyprompt": {"cifar100": (83.24, 86.76), "imagenet-r": (56.58, 55.27), "cub200": (70.64, 73.40)},
    },
    "sup21k-1k": {
        "l2p": {"cifar100": (63.88, 68.96), "imagenet-r": (47.10, 42.22), "cub200": (42.96, 45.00)},
        "dualprompt": {"cifar100": (68.02, 67.04), "imagenet-r": (52.80, 47.39), "cub200": (46.80, 46.39)},
        "coda-prompt": {"cifar100": (69.29, 69.47), "imagenet-r": (51.20, 44.30), "cub200": (44.66, 45.18)},
        "mvp": {"cifar100": (64.69, 51.29), "imagenet-r": (48.99, 38.12), "cub200": (44.10, 33.97)},
        "misa": {"cifar100": (62.91, 67.99), "imagenet-r": (50.87, 47.75), "cub200": (42.76, 44.05)},
        "flyprompt": {"cifar100": (78.48, 80.39), "imagenet-r": (62.01, 56.55), "cub200": (54.42, 55.50)},
    },
    "ibot21k": {
        "l2p": {"cifar100": (56.82, 67.61), "imagenet-r": (35.97, 36.95), "cub200": (14.76, 24.51)},
        "dualprompt": {"cifar100": (66.06, 67.14), "imagenet-r": (42.48, 35.91), "cub200": (19.90, 21.84)},
        "coda-prompt": {"cifar100": (62.13, 63.38), "imagenet-r": (45.50, 39.44), "cub200": (17.72, 20.82)},
        "mvp": {"cifar100": (62.33, 48.32), "imagenet-r": (41.55, 29.29), "cub200": (28.73, 23.62)},
        "misa": {"cifar100": (65.30, 67.43), "imagenet-r": (40.94, 36.16), "cub200": (18.62, 23.66)},
        "flyprompt": {"cifar100": (75.58, 79.36), "imagenet-r": (57.75, 54.39), "cub200": (28.86, 36.79)},
    },
    "ibot1k": {
        "l2p": {"cifar100": (53.17, 62.28), "imagenet-r": (38.29, 39.86), "cub200": (19.20, 31.21)},
        "dualprompt": {"cifar100": (52.39, 53.56), "imagenet-r": (45.76, 39.19), "cub200": (29.32, 30.53)},
        "coda-prompt": {"cifar100": (59.29, 61.30), "imagenet-r": (49.56, 42.64), "cub200": (27.57, 33.61)},
        "mvp": {"cifar100": (57.52, 44.08), "imagenet-r": (44.76, 34.93), "cub200": (33.81, 26.32)},
        "misa": {"cifar100": (54.31, 55.89), "imagenet-r": (43.91, 40.09), "cub200": (27.76, 33.74)},
        "flyprompt": {"cifar100": (70.14, 74.84), "imagenet-r": (61.50, 57.18), "cub200": (38.75, 45.00)},
    },
    "dino1k": {
        "l2p": {"cifar100": (47.98, 59.13), "imagenet-r": (35.81, 36.58), "cub200": (21.18, 32.47)},
        "dualprompt": {"cifar100": (52.12, 55.71), "imagenet-r": (43.03, 35.40), "cub200": (27.80, 29.49)},
        "coda-prompt": {"cifar100": (54.69, 58.91), "imagenet-r": (45.16, 38.23), "cub200": (29.22, 31.85)},
        "mvp": {"cifar100": (53.64, 41.02), "imagenet-r": (41.78, 32.00), "cub200": (33.44, 26.02)},
        "misa": {"cifar100": (52.03, 55.98), "imagenet-r": (41.26, 37.50), "cub200": (27.13, 33.08)},
        "flyprompt": {"cifar100": (65.92, 72.66), "imagenet-r": (57.29, 54.72), "cub200": (37.38, 44.66)},
    },
    "mocov3-1k": {
        "l2p": {"cifar100": (28.17, 39.07), "imagenet-r": (17.43, 16.27), "cub200": (12.42, 20.00)},
        "dualprompt": {"cifar100": (53.33, 58.20), "imagenet-r": (36.69, 30.24), "cub200": (19.88, 21.93)},
        "coda-prompt": {"cifar100": (53.47, 58.55), "imagenet-r": (39.89, 31.72), "cub200": (20.09, 24.10)},
        "mvp": {"cifar100": (54.33, 40.84), "imagenet-r": (36.45, 26.37), "cub200": (28.48, 23.56)},
        "misa": {"cifar100": (57.00, 62.18), "imagenet-r": (38.85, 33.47), "cub200": (25.02, 27.68)},
        "flyprompt": {"cifar100": (64.12, 71.51), "imagenet-r": (52.32, 49.06), "cub200": (27.92, 33.32)},
}
}

#: the methods of ours that do not stand for their Table 1 row, and why (the tables print that row as not run)
TABLE_1_NOT_OURS: Dict[str, str] = {
    "linear-probe": (
        "ours is the components table's row without REAR, prompt experts or EMA heads (71.33 / 73.22 on CIFAR-100): "
        "FlyPrompt's training with its components removed; Table 1's Linear Probe (49.69 / 23.07) is another "
        "recipe, which the paper does not give and no official script runs"),
}

#: Table 2, Sup-21K: method -> dataset -> (A_auc, A_last)
OFFLINE: Rows = {
    "s-prompt": {"cifar100": (80.21, 83.48), "imagenet-r": (52.14, 49.13), "cub200": (66.61, 64.73)},
    "hide": {"cifar100": (77.10, 81.77), "imagenet-r": (53.77, 49.87), "cub200": (67.05, 67.12)},
    "hide-lora": {"cifar100": (80.07, 82.00), "imagenet-r": (55.09, 51.29), "cub200": (67.26, 67.28)},
    "hide-adapter": {"cifar100": (79.52, 81.41), "imagenet-r": (53.92, 50.86), "cub200": (66.09, 64.53)},
    "norga": {"cifar100": (78.89, 83.03), "imagenet-r": (54.12, 50.09), "cub200": (67.16, 67.06)},
    "sd-lora": {"cifar100": (79.26, 78.91), "imagenet-r": (55.51, 51.97), "cub200": (64.12, 60.57)},
    "flyprompt": {"cifar100": (83.24, 86.76), "imagenet-r": (56.58, 55.27), "cub200": (70.64, 73.40)},
}

#: the cross-ablation in full, Sup-21K: variant -> method -> dataset -> (A_auc, A_last)
CROSS_ABLATION: Dict[str, Rows] = {
    "baseline": {
        "dualprompt": {"cifar100": (76.04, 76.62), "imagenet-r": (46.13, 40.80), "cub200": (65.03, 62.43)},
        "mvp": {"cifar100": (67.74, 63.22), "imagenet-r": (39.50, 32.63), "cub200": (54.69, 50.07)},
        "misa": {"cifar100": (80.35, 80.75), "imagenet-r": (51.52, 45.08), "cub200": (65.40, 60.20)},
        "s-prompt": {"cifar100": (80.21, 83.48), "imagenet-r": (52.14, 49.13), "cub200": (66.61, 64.73)},
        "hide": {"cifar100": (77.10, 81.77), "imagenet-r": (53.77, 49.87), "cub200": (67.05, 67.12)},
        "norga": {"cifar100": (78.89, 83.03), "imagenet-r": (54.12, 50.09), "cub200": (67.16, 67.06)},
    },
    "router": {
        "dualprompt": {"cifar100": (80.63, 83.65), "imagenet-r": (53.16, 51.11), "cub200": (65.96, 63.81)},
        "mvp": {"cifar100": (67.44, 62.33), "imagenet-r": (38.87, 31.59), "cub200": (53.65, 48.25)},
        "misa": {"cifar100": (82.03, 83.82), "imagenet-r": (57.30, 54.02), "cub200": (68.04, 65.55)},
        "s-prompt": {"cifar100": (81.43, 83.93), "imagenet-r": (54.74, 52.30), "cub200": (66.80, 64.72)},
        "hide": {"cifar100": (78.41, 83.46), "imagenet-r": (53.61, 49.26), "cub200": (67.05, 66.99)},
        "norga": {"cifar100": (79.37, 83.79), "imagenet-r": (54.78, 50.24), "cub200": (67.26, 67.20)},
    },
    "ensemble": {
        "dualprompt": {"cifar100": (76.83, 78.00), "imagenet-r": (47.11, 42.15), "cub200": (66.47, 65.42)},
        "mvp": {"cifar100": (68.91, 64.28), "imagenet-r": (42.06, 35.94), "cub200": (56.98, 54.14)},
        "misa": {"cifar100": (81.65, 82.80), "imagenet-r": (54.05, 48.46), "cub200": (69.30, 67.29)},
        "s-prompt": {"cifar100": (81.93, 83.98), "imagenet-r": (55.37, 52.91), "cub200": (67.97, 67.68)},
        "hide": {"cifar100": (77.46, 82.09), "imagenet-r": (54.83, 50.26), "cub200": (67.77, 69.64)},
        "norga": {"cifar100": (79.16, 83.01), "imagenet-r": (54.08, 51.81), "cub200": (67.97, 69.58)},
    },
    "both": {
        "dualprompt": {"cifar100": (82.33, 86.14), "imagenet-r": (54.72, 54.00), "cub200": (69.65, 72.75)},
        "mvp": {"cifar100": (68.93, 64.52), "imagenet-r": (41.59, 35.45), "cub200": (55.65, 51.84)},
        "misa": {"cifar100": (83.60, 86.66), "imagenet-r": (59.12, 56.62), "cub200": (72.38, 74.68)},
        "s-prompt": {"cifar100": (83.11, 86.67), "imagenet-r": (56.57, 55.24), "cub200": (70.65, 73.42)},
        "hide": {"cifar100": (78.60, 83.14), "imagenet-r": (54.79, 51.30), "cub200": (68.27, 69.61)},
        "norga": {"cifar100": (79.37, 83.79), "imagenet-r": (55.75, 52.50), "cub200": (68.32, 70.03)},
        "flyprompt": {"cifar100": (83.24, 86.76), "imagenet-r": (56.58, 55.27), "cub200": (70.64, 73.40)},
}
}

#: A_avg and F_last: backbone -> method -> dataset -> (A_avg, F_last)
AVERAGE_FORGETTING: Dict[str, Rows] = {
    "sup21k": {
        "l2p": {"cifar100": (75.41, 11.53), "imagenet-r": (47.82, 19.16), "cub200": (65.44, 29.15)},
        "dualprompt": {"cifar100": (75.96, 11.42), "imagenet-r": (49.90, 18.24), "cub200": (66.54, 27.18)},
        "coda-prompt": {"cifar100": (78.73, 9.95), "imagenet-r": (55.75, 18.49), "cub200": (67.19, 27.43)},
        "mvp": {"cifar100": (64.70, 33.19), "imagenet-r": (40.14, 43.39), "cub200": (52.42, 47.61)},
        "misa": {"cifar100": (79.67, 9.67), "imagenet-r": (55.78, 21.46), "cub200": (66.92, 30.06)},
        "flyprompt": {"cifar100": (82.72, 5.03), "imagenet-r": (60.38, 13.42), "cub200": (72.22, 10.97)},
    },
    "sup21k-1k": {
        "l2p": {"cifar100": (60.98, 14.88), "imagenet-r": (50.21, 35.88), "cub200": (43.72, 35.05)},
        "dualprompt": {"cifar100": (66.13, 19.18), "imagenet-r": (56.53, 30.73), "cub200": (47.37, 35.40)},
        "coda-prompt": {"cifar100": (66.81, 19.82), "imagenet-r": (55.01, 35.58), "cub200": (45.38, 35.73)},
        "mvp": {"cifar100": (63.22, 46.98), "imagenet-r": (50.91, 51.11), "cub200": (46.13, 62.93)},
        "misa": {"cifar100": (60.11, 11.38), "imagenet-r": (54.17, 28.66), "cub200": (43.33, 33.95)},
        "flyprompt": {"cifar100": (76.86, 9.50), "imagenet-r": (64.41, 21.59), "cub200": (55.12, 21.71)},
    },
    "ibot21k": {
        "l2p": {"cifar100": (52.73, 12.58), "imagenet-r": (38.41, 34.17), "cub200": (14.93, 19.09)},
        "dualprompt": {"cifar100": (62.86, 19.22), "imagenet-r": (46.07, 37.96), "cub200": (21.96, 30.18)},
        "coda-prompt": {"cifar100": (59.59, 22.20), "imagenet-r": (49.47, 41.21), "cub200": (18.77, 28.98)},
        "mvp": {"cifar100": (61.48, 50.23), "imagenet-r": (44.01, 62.17), "cub200": (30.92, 62.20)},
        "misa": {"cifar100": (62.87, 17.34), "imagenet-r": (44.62, 35.62), "cub200": (19.48, 21.18)},
        "flyprompt": {"cifar100": (73.08, 8.38), "imagenet-r": (59.40, 23.40), "cub200": (30.78, 18.85)},
    },
    "ibot1k": {
        "l2p": {"cifar100": (48.97, 16.47), "imagenet-r": (41.23, 33.01), "cub200": (19.75, 21.26)},
        "dualprompt": {"cifar100": (50.16, 20.45), "imagenet-r": (49.51, 35.14), "cub200": (30.29, 32.70)},
        "coda-prompt": {"cifar100": (55.84, 22.72), "imagenet-r": (53.49, 40.23), "cub200": (28.85, 27.71)},
        "mvp": {"cifar100": (56.41, 53.47), "imagenet-r": (46.96, 56.26), "cub200": (34.97, 62.61)},
        "misa": {"cifar100": (52.58, 19.16), "imagenet-r": (48.89, 33.52), "cub200": (27.98, 29.35)},
        "flyprompt": {"cifar100": (64.94, 11.52), "imagenet-r": (63.77, 20.89), "cub200": (38.05, 21.62)},
    },
    "dino1k": {
        "l2p": {"cifar100": (45.45, 14.82), "imagenet-r": (38.98, 33.00), "cub200": (23.21, 24.23)},
        "dualprompt": {"cifar100": (49.65, 18.69), "imagenet-r": (47.16, 37.89), "cub200": (29.48, 31.35)},
        "coda-prompt": {"cifar100": (50.76, 19.43), "imagenet-r": (48.68, 41.26), "cub200": (29.43, 32.69)},
        "mvp": {"cifar100": (52.41, 54.70), "imagenet-r": (44.45, 56.54), "cub200": (34.71, 64.21)},
        "misa": {"cifar100": (49.81, 17.76), "imagenet-r": (46.61, 34.38), "cub200": (27.46, 25.77)},
        "flyprompt": {"cifar100": (63.59, 9.04), "imagenet-r": (60.83, 20.65), "cub200": (37.50, 19.47)},
    },
    "mocov3-1k": {
        "l2p": {"cifar100": (26.75, 19.68), "imagenet-r": (19.02, 43.59), "cub200": (13.42, 26.38)},
        "dualprompt": {"cifar100": (49.61, 14.79), "imagenet-r": (41.37, 35.07), "cub200": (21.87, 28.42)},
        "coda-prompt": {"cifar100": (48.26, 16.97), "imagenet-r": (44.71, 43.27), "cub200": (22.33, 30.90)},
        "mvp": {"cifar100": (52.82, 55.42), "imagenet-r": (38.68, 55.87), "cub200": (30.74, 62.97)},
        "misa": {"cifar100": (53.46, 16.19), "imagenet-r": (45.41, 34.42), "cub200": (26.92, 35.50)},
        "flyprompt": {"cifar100": (60.16, 7.69), "imagenet-r": (55.95, 21.27), "cub200": (26.52, 20.69)},
}
}

#: the paper's name of each method of its tables
PAPER_LABELS: Dict[str, str] = {
    "seq-ft": "Seq FT", "linear-probe": "Linear Probe", "seq-ft-sl": "Seq FT w/ SL", "l2p": "L2P",
    "dualprompt": "DualPrompt", "coda-prompt": "CODA-P", "mvp": "MVP", "misa": "MISA", "s-prompt": "S-Prompt++",
    "hide": "HiDe-Prompt", "hide-lora": "HiDe-LoRA", "hide-adapter": "HiDe-Adapter", "norga": "NoRGa",
    "sd-lora": "SD-LoRA", "flyprompt": "FlyPrompt",
}
