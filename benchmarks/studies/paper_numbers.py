"""The paper's numbers the studies' tables are printed beside (means over five seeds, percent; seconds per
batch on the authors' GPU), and the rule naming the backbone and dataset of the paper a run compares with."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Mapping, Optional, Tuple

from ..backbone import BACKBONES
from .paper_tables import FALLBACK_DATASET, compared_dataset

__all__ = [
    "FALLBACK_BACKBONE", "FALLBACK_DATASET", "compared_backbone", "paper_backbone", "paper_dataset", "AGGREGATIONS",
    "AGGREGATIONS_BY_BACKBONE", "AGGREGATION_PAPER_ROWS", "COMPONENTS", "COMPONENTS_BY_BACKBONE", "COST", "ROUTING",
    "ROUTING_BACKBONE", "SWEEPS", "sweep_paper_numbers",
]

#: routing algorithms on random expanded features (FlyPrompt, Sup-21K only): router -> {dataset: (A_auc, A_last)},
#: and the training / inference seconds per batch on CIFAR-100
ROUTING = {
    "prototype": {"cifar100": (80.67, 83.80), "imagenet-r": (54.29, 52.36), "cub200": (67.00, 66.66), "seconds": (5.58, 0.90)},
    "naive_bayes": {"cifar100": (82.73, 85.51), "imagenet-r": (55.85, 53.84), "cub200": (69.08, 69.63), "seconds": (5.30, 0.93)},
    "mlp": {"cifar100": (81.75, 82.76), "imagenet-r": (56.31, 53.70), "cub200": (68.53, 67.92), "seconds": (7.03, 1.00)},
    "kmeans": {"cifar100": (82.22, 85.27), "imagenet-r": (54.93, 53.08), "cub200": (68.33, 68.24), "seconds": (6.11, 1.49)},
    "ridge": {"cifar100": (83.24, 86.76), "imagenet-r": (56.58, 55.27), "cub200": (70.64, 73.40), "seconds": (4.96, 0.92)},
}

#: TE2 aggregation rules (``ensemble_all_results``): backbone (a ``benchmarks.backbone.BACKBONES`` name) ->
#: rule -> {dataset: (A_auc, A_last)}
AGGREGATIONS_BY_BACKBONE = {
    "sup21k": {
        "mean": {"cifar100": (81.34, 85.11), "imagenet-r": (52.71, 53.24), "cub200": (68.49, 73.95)},
        "max_prob": {"cifar100": (82.29, 84.95), "imagenet-r": (55.56, 53.53), "cub200": (68.00, 66.56)},
        "min_entropy": {"cifar100": (81.92, 84.23), "imagenet-r": (55.05, 52.88), "cub200": (66.78, 64.73)},
        "softmax_mean": {"cifar100": (82.30, 85.98), "imagenet-r": (56.16, 55.53), "cub200": (70.77, 74.86)},
        "softmax_max": {"cifar100": (83.24, 86.76), "imagenet-r": (56.58, 55.27), "cub200": (70.64, 73.40)},
        "softmax_min_entropy": {"cifar100": (83.11, 86.50), "imagenet-r": (55.94, 54.24), "cub200": (69.86, 71.51)},
    },
    "sup21k-1k": {
        "mean": {"cifar100": (79.44, 82.82), "imagenet-r": (60.84, 56.97), "cub200": (56.64, 60.39)},
        "max_prob": {"cifar100": (72.58, 71.31), "imagenet-r": (54.28, 46.44), "cub200": (47.05, 44.42)},
        "min_entropy": {"cifar100": (71.27, 69.73), "imagenet-r": (53.05, 44.80), "cub200": (45.36, 42.82)},
        "softmax_mean": {"cifar100": (77.72, 81.77), "imagenet-r": (60.35, 56.63), "cub200": (57.68, 62.60)},
        "softmax_max": {"cifar100": (78.48, 80.39), "imagenet-r": (62.01, 56.55), "cub200": (54.42, 55.50)},
        "softmax_min_entropy": {"cifar100": (78.30, 80.07), "imagenet-r": (60.89, 55.59), "cub200": (54.12, 54.75)},
    },
    "ibot21k": {
        "mean": {"cifar100": (76.59, 81.40), "imagenet-r": (54.92, 51.82), "cub200": (29.31, 37.60)},
        "max_prob": {"cifar100": (68.51, 67.60), "imagenet-r": (46.74, 37.64), "cub200": (24.14, 28.53)},
        "min_entropy": {"cifar100": (67.03, 65.44), "imagenet-r": (45.33, 35.86), "cub200": (23.44, 27.40)},
        "softmax_mean": {"cifar100": (74.69, 80.58), "imagenet-r": (54.41, 52.58), "cub200": (29.09, 36.28)},
        "softmax_max": {"cifar100": (75.58, 79.36), "imagenet-r": (57.75, 54.39), "cub200": (28.86, 36.79)},
        "softmax_min_entropy": {"cifar100": (74.87, 77.60), "imagenet-r": (55.98, 52.03), "cub200": (27.47, 34.57)},
    },
    "ibot1k": {
        "mean": {"cifar100": (70.96, 76.38), "imagenet-r": (58.15, 54.24), "cub200": (37.64, 44.46)},
        "max_prob": {"cifar100": (62.92, 63.09), "imagenet-r": (52.02, 44.15), "cub200": (31.53, 34.27)},
        "min_entropy": {"cifar100": (61.36, 60.73), "imagenet-r": (50.74, 42.27), "cub200": (30.53, 32.82)},
        "softmax_mean": {"cifar100": (67.24, 72.80), "imagenet-r": (56.14, 53.35), "cub200": (38.08, 44.13)},
        "softmax_max": {"cifar100": (70.14, 74.84), "imagenet-r": (61.50, 57.18), "cub200": (38.54, 45.00)},
        "softmax_min_entropy": {"cifar100": (69.72, 73.76), "imagenet-r": (59.87, 55.39), "cub200": (37.31, 41.86)},
    },
    "dino1k": {
        "mean": {"cifar100": (66.72, 73.94), "imagenet-r": (54.00, 51.60), "cub200": (37.91, 44.02)},
        "max_prob": {"cifar100": (59.76, 62.61), "imagenet-r": (48.12, 42.17), "cub200": (31.36, 34.50)},
        "min_entropy": {"cifar100": (58.51, 60.79), "imagenet-r": (47.14, 40.95), "cub200": (30.15, 32.83)},
        "softmax_mean": {"cifar100": (64.79, 72.87), "imagenet-r": (52.98, 51.38), "cub200": (37.22, 43.74)},
        "softmax_max": {"cifar100": (65.92, 72.66), "imagenet-r": (57.29, 54.72), "cub200": (37.38, 44.66)},
        "softmax_min_entropy": {"cifar100": (65.48, 71.88), "imagenet-r": (55.69, 52.55), "cub200": (36.48, 41.43)},
    },
    "mocov3-1k": {
        "mean": {"cifar100": (64.29, 72.17), "imagenet-r": (49.69, 46.86), "cub200": (27.92, 33.32)},
        "max_prob": {"cifar100": (58.70, 63.89), "imagenet-r": (44.07, 37.06), "cub200": (21.35, 24.21)},
        "min_entropy": {"cifar100": (57.84, 62.21), "imagenet-r": (42.79, 35.51), "cub200": (20.59, 22.75)},
        "softmax_mean": {"cifar100": (62.90, 71.71), "imagenet-r": (50.56, 47.95), "cub200": (26.95, 31.50)},
        "softmax_max": {"cifar100": (64.12, 71.51), "imagenet-r": (52.32, 49.06), "cub200": (25.49, 30.44)},
        "softmax_min_entropy": {"cifar100": (63.92, 71.29), "imagenet-r": (51.46, 47.93), "cub200": (25.26, 29.33)},
    },
}

#: the Sup-21K rows, the backbone of the paper's main tables
AGGREGATIONS = AGGREGATIONS_BY_BACKBONE["sup21k"]

#: our rule (``fly_modules.AGGREGATION_RULES``) -> the row of the paper's aggregation table that the official
#: code computed the same way (``python -m benchmarks.fidelity.aggregations``); ``None``: no row. The paper's
#: "Min Entropy" ran the official ``min_entropy``, which is ``logit_min_entropy`` here; our ``min_entropy``
#: selects by the softmax's entropy and predicts as ``softmax_min_entropy``.
AGGREGATION_PAPER_ROWS = {
    "mean": "mean", "max_prob": "max_prob", "min_entropy": None, "softmax_mean": "softmax_mean",
    "softmax_max": "softmax_max", "softmax_min_entropy": "softmax_min_entropy", "logit_min_entropy": "min_entropy",
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
    "coda-prompt": (79.13, -0.83, 86.72, 0.92, 4.75, 0.94),
    "s-prompt": (80.21, 0.81, 86.26, 0.46, 6.03, 1.18),
}

#: the components table (``ablation_results``): backbone -> row -> {dataset: (A_auc, A_last)}; the rows are
#: those of ``benchmarks.studies.components_table.COMPONENT_ROWS``. ``linear_probe`` is its row "− × ×"
#: (FlyPrompt without its components), not Table 1's Linear Probe (``paper_tables.OVERALL``, another training)
COMPONENTS_BY_BACKBONE = {
    "sup21k": {
        "ranpac": {"cifar100": (69.91, 79.92), "imagenet-r": (47.29, 47.33)},
        "linear_probe": {"cifar100": (71.33, 73.22), "imagenet-r": (41.73, 37.33)},
        "linear_probe_ema": {"cifar100": (71.69, 73.30), "imagenet-r": (42.50, 38.35)},
        "prompts": {"cifar100": (80.75, 83.65), "imagenet-r": (54.91, 52.58)},
        "prompts_ema": {"cifar100": (82.17, 83.75), "imagenet-r": (55.90, 53.65)},
        "prompts_rear": {"cifar100": (81.90, 84.23), "imagenet-r": (55.76, 52.76)},
        "flyprompt": {"cifar100": (83.24, 86.76), "imagenet-r": (56.58, 55.27)},
    },
    "sup21k-1k": {
        "ranpac": {"cifar100": (69.76, 79.49), "imagenet-r": (52.91, 54.79)},
        "linear_probe": {"cifar100": (57.82, 62.67), "imagenet-r": (46.24, 39.06)},
        "linear_probe_ema": {"cifar100": (60.76, 63.39), "imagenet-r": (49.88, 41.65)},
        "prompts": {"cifar100": (70.09, 67.62), "imagenet-r": (52.07, 44.13)},
        "prompts_ema": {"cifar100": (72.51, 68.66), "imagenet-r": (55.55, 45.90)},
        "prompts_rear": {"cifar100": (71.28, 69.73), "imagenet-r": (53.12, 44.69)},
        "flyprompt": {"cifar100": (78.48, 80.39), "imagenet-r": (62.01, 56.55)},
    },
}

COMPONENTS = COMPONENTS_BY_BACKBONE["sup21k"]

#: the backbone of :data:`ROUTING`: the paper's routing table has no other
ROUTING_BACKBONE = "sup21k"

def paper_dataset(dataset: str, numbers: dict) -> str:
    """The paper's dataset of ``dataset`` (``paper_tables.compared_dataset``: the proxy's ``*-like`` datasets
    their model's, the generated data CIFAR-100) when the paper's ``numbers`` (``{dataset: ...}``) have it,
    else :data:`FALLBACK_DATASET`."""
    compared = compared_dataset(dataset)
    return compared if compared in numbers else FALLBACK_DATASET


#: the paper's backbone a table compares with when the run's model is none of its presets (the CPU proxy's
#: tiny ViT): Sup-21K, as the dataset falls back to CIFAR-100
FALLBACK_BACKBONE = "sup21k"


def paper_backbone(protocol: Mapping[str, Any]) -> str:
    """The ``BACKBONES`` name of the run whose recorded ``protocol`` this is: the preset whose timm model it
    ran (``--backbone`` sets it), :data:`FALLBACK_BACKBONE` for a model of none. Presets sharing a model are
    told apart by the weights file (``NAME.safetensors`` or the preset's official file), then by the ridge;
    raises ``ValueError`` where neither does."""
    names = [name for name, preset in BACKBONES.items() if preset.model == protocol["model"]]
    if not names:
        return FALLBACK_BACKBONE
    weights = Path(protocol.get("weights") or "")
    for told in ((lambda n: weights.stem == n or weights.name == BACKBONES[n].official_file),
                 (lambda n: protocol.get("ridge") == BACKBONES[n].ridge)):
        if len(names) > 1 and any(told(name) for name in names):
            names = [name for name in names if told(name)]
    if len(names) > 1:
        raise ValueError(f"model {protocol['model']} (ridge {protocol.get('ridge')}) is the model of the backbones "
                         f"{', '.join(names)}: name the weights file NAME.safetensors (python -m benchmarks.backbone "
                         f"NAME FILE NAME.safetensors) and pass it with --weights, so that the study knows which")
    return names[0]


def compared_backbone(study: str, protocol: Mapping[str, Any]) -> str:
    """The backbone whose numbers of the paper the ``study``'s table shows beside a run of ``protocol``: the
    run's (:func:`paper_backbone`), Sup-21K for the routers (the paper's routing table has no other); raises
    ``ValueError`` for a backbone the paper's components table has not."""
    if study == "routers":
        return ROUTING_BACKBONE
    backbone = paper_backbone(protocol)
    if study == "components" and backbone not in COMPONENTS_BY_BACKBONE:
        raise ValueError(f"the paper's components table has the backbones {', '.join(COMPONENTS_BY_BACKBONE)}, not "
                         f"{backbone}: run the components study with --backbone "
                         f"{' or --backbone '.join(COMPONENTS_BY_BACKBONE)}")
    return backbone


#: the studies with points and the EMA-decay study: study -> backbone -> row label -> method -> dataset ->
#: [A_auc, A_last] (``paper_sweeps.json``, transcribed from the paper's appendix tables and its Tab. 6)
SWEEPS = {name: value for name, value in json.loads((Path(__file__).with_name("paper_sweeps.json")).read_text()).items()
          if name != "about"}


def sweep_paper_numbers(study: str, label: str, method: str, dataset: str,
                        backbone: str) -> Tuple[Optional[str], Optional[str], Optional[Tuple[float, float]]]:
    """``(paper dataset, paper backbone, (A_auc, A_last))`` the paper prints for the row ``label`` of ``study``
    for ``method``: of ``backbone`` where the paper's table has it, else of its Sup-21K; of ``dataset`` where it
    has it, else of CIFAR-100 (:func:`paper_dataset`); ``(None, None, None)`` where the paper has no such row."""
    tables = SWEEPS.get(study, {})
    backbone = backbone if backbone in tables else FALLBACK_BACKBONE
    numbers = tables.get(backbone, {}).get(label, {}).get(method)
    if not numbers:
        return None, None, None
    compared = paper_dataset(dataset, numbers)
    if compared not in numbers:
        return None, None, None
    return compared, backbone, tuple(numbers[compared])
