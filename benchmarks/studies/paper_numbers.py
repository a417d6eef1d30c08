"""The paper's numbers the studies' tables are printed beside (means over five seeds, Sup-21K, percent;
seconds per batch on the authors' GPU)."""

from __future__ import annotations

__all__ = ["FALLBACK_DATASET", "paper_dataset", "AGGREGATIONS", "COMPONENTS", "COST", "ROUTING"]

#: routing algorithms on random expanded features (FlyPrompt): router -> {dataset: (A_auc, A_last)},
#: and the training / inference seconds per batch on CIFAR-100
ROUTING = {
    "prototype": {"cifar100": (80.67, 83.80), "imagenet-r": (54.29, 52.36), "cub200": (67.00, 66.66), "seconds": (5.58, 0.90)},
    "naive_bayes": {"cifar100": (82.73, 85.51), "imagenet-r": (55.85, 53.84), "cub200": (69.08, 69.63), "seconds": (5.30, 0.93)},
    "mlp": {"cifar100": (81.75, 82.76), "imagenet-r": (56.31, 53.70), "cub200": (68.53, 67.92), "seconds": (7.03, 1.00)},
    "kmeans": {"cifar100": (82.22, 85.27), "imagenet-r": (54.93, 53.08), "cub200": (68.33, 68.24), "seconds": (6.11, 1.49)},
    "ridge": {"cifar100": (83.24, 86.76), "imagenet-r": (56.58, 55.27), "cub200": (70.64, 73.40), "seconds": (4.96, 0.92)},
}

#: TE2 aggregation rules (FlyPrompt): rule -> {dataset: (A_auc, A_last)}
AGGREGATIONS = {
    "mean": {"cifar100": (81.34, 85.11), "imagenet-r": (52.71, 53.24), "cub200": (68.49, 73.95)},
    "max_prob": {"cifar100": (82.29, 84.95), "imagenet-r": (55.56, 53.53), "cub200": (68.00, 66.56)},
    "min_entropy": {"cifar100": (81.92, 84.23), "imagenet-r": (55.05, 52.88), "cub200": (66.78, 64.73)},
    "softmax_mean": {"cifar100": (82.30, 85.98), "imagenet-r": (56.16, 55.53), "cub200": (70.77, 74.86)},
    "softmax_max": {"cifar100": (83.24, 86.76), "imagenet-r": (56.58, 55.27), "cub200": (70.64, 73.40)},
    "softmax_min_entropy": {"cifar100": (83.11, 86.50), "imagenet-r": (55.94, 54.24), "cub200": (69.86, 71.51)},
}

#: method -> (A_auc, BWT, total parameters M, trainable parameters M, training s/batch, inference s/batch),
#: CIFAR-100
COST = {
    "l2p": (76.23, 0.10, 86.01, 0.22, 5.57, 0.95),
    "dualprompt": (76.04, -2.93, 86.35, 0.55, 4.78, 0.90),
    "mvp": (67.74, -18.09, 86.12, 0.32, 5.35, 1.27),
    "misa": (80.35, -1.76, 86.37, 0.58, 4.78, 0.90),
    "hide": (77.10, 3.35, 86.81, 0.94, 6.13, 1.27),
    "norga": (78.89, 2.72, 86.81, 0.94, 6.69, 1.05),
    "hide-lora": (80.07, 0.36, 87.39, 1.51, 6.80, 1.17),
    "hide-adapter": (79.52, -2.05, 87.41, 1.53, 6.68, 1.04),
    "sd-lora": (79.26, -6.66, 87.72, 1.92, 7.24, 0.82),
    "flyprompt": (83.24, 4.35, 87.08, 0.46, 4.96, 0.92),
}

#: the components table (``ablation_results``), Sup-21K: row -> {dataset: (A_auc, A_last)}; the rows are
#: those of ``benchmarks.studies.components_table.COMPONENT_ROWS``
COMPONENTS = {
    "ranpac": {"cifar100": (69.91, 79.92), "imagenet-r": (47.29, 47.33)},
    "linear_probe": {"cifar100": (71.33, 73.22), "imagenet-r": (41.73, 37.33)},
    "linear_probe_ema": {"cifar100": (71.69, 73.30), "imagenet-r": (42.50, 38.35)},
    "prompts": {"cifar100": (80.75, 83.65), "imagenet-r": (54.91, 52.58)},
    "prompts_ema": {"cifar100": (82.17, 83.75), "imagenet-r": (55.90, 53.65)},
    "prompts_rear": {"cifar100": (81.90, 84.23), "imagenet-r": (55.76, 52.76)},
    "flyprompt": {"cifar100": (83.24, 86.76), "imagenet-r": (56.58, 55.27)},
}


#: the paper's dataset a table compares with when the sweep's dataset is not one of the paper's (the
#: generated data of the CPU proxy): CIFAR-100, as the cross-ablation's table does
FALLBACK_DATASET = "cifar100"


def paper_dataset(dataset: str, numbers: dict) -> str:
    """``dataset`` when the paper's ``numbers`` (``{dataset: ...}``) have it, else :data:`FALLBACK_DATASET`."""
    return dataset if dataset in numbers else FALLBACK_DATASET

