"""The CPU proxy's datasets: generated stand-ins in the shapes of the paper's three datasets.

Each stands in for one of the paper's datasets (:data:`~benchmarks.core.dataset_sizes.DATASET_SIZES`) and
has its number of classes, so that each of the five sessions holds as many classes as the real stream's (20
for CIFAR-100, 40 for ImageNet-R and CUB-200). Its training images per class are the real set's times
:data:`PROXY_SCALE` (the CIFAR-100-shaped stream then holds 10,000 images, what two CPU cores train for every
method and three seeds in about an hour) and its test images the real set's times :data:`PROXY_TEST_SCALE`
(the test set is scored at every evaluation, 15 times a training; docs/proxy.md). The classes are generated
ids the proxy backbone never saw (it was pretrained on ids ``0..399``), a separate range for each dataset.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Dict, Optional

from .dataset_sizes import DATASET_SIZES

__all__ = ["PROXY_DATASETS", "PROXY_SCALE", "PROXY_TEST_SCALE", "ProxyDataset", "generated_settings", "is_generated", "paper_dataset_of"]

#: the training images per class of a proxy dataset against the real one's
PROXY_SCALE = 0.2
#: the test images per class of a proxy dataset against the real one's
PROXY_TEST_SCALE = 0.1


@dataclass(frozen=True)
class ProxyDataset:
    """A generated dataset in the shape of the paper's dataset ``stands_for``, on the classes ``class_offset``
    onwards of the "hard" generated images."""

    name: str
    stands_for: str
    class_offset: int

    def settings(self, scale: float = 1.0, image_size: int = 32) -> Dict[str, Any]:
        """The generated data's settings (``load_data``'s): the real set's images per class times
        :data:`PROXY_SCALE` (training) or :data:`PROXY_TEST_SCALE` (test) and ``scale`` (a shortened proxy),
        rounded, at least one."""
        size = DATASET_SIZES[self.stands_for]
        per_class = {split: max(1, round(total / size.classes * factor * scale))
                     for split, total, factor in (("train", size.train, PROXY_SCALE), ("test", size.test, PROXY_TEST_SCALE))}
        return dict(num_classes=size.classes, class_offset=self.class_offset, difficulty="hard",
                    train_per_class=per_class["train"], test_per_class=per_class["test"], image_size=image_size)


#: name -> the proxy dataset; the class ranges are disjoint from the pretraining classes and from each other
PROXY_DATASETS: Dict[str, ProxyDataset] = {
    dataset.name: dataset for dataset in (
        ProxyDataset("cifar100-like", "cifar100", class_offset=400),
        ProxyDataset("imagenet-r-like", "imagenet-r", class_offset=500),
        ProxyDataset("cub-like", "cub200", class_offset=700),
    )
}


def is_generated(dataset: str) -> bool:
    """Whether ``dataset`` is generated (no files to read): ``synthetic`` or a proxy dataset."""
    return dataset == "synthetic" or dataset in PROXY_DATASETS


def paper_dataset_of(dataset: str) -> Optional[str]:
    """The paper's dataset that ``dataset`` is or stands in for; ``None`` for the plain generated data."""
    if dataset in PROXY_DATASETS:
        return PROXY_DATASETS[dataset].stands_for
    return dataset if dataset in DATASET_SIZES else None


def generated_settings(scale: float = 1.0) -> Dict[str, Dict[str, Any]]:
    """Every proxy dataset's settings at ``scale`` (a preset's ``generated`` entry)."""
    return {name: dataset.settings(scale) for name, dataset in PROXY_DATASETS.items()}
