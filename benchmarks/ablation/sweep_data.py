"""The data of a sweep: a dataset loaded (or generated) as the sweep's protocol and settings say, one at a time."""

from __future__ import annotations

from typing import Any, Dict, Tuple

from benchmarks.ablation.sweep import Sweep
from benchmarks.core.proxy_datasets import is_generated


def load_data(name: str, sweep: Sweep, data_root: str, download: bool) -> Tuple[Any, Any]:
    """``(train, test)`` of the dataset ``name``: read from ``data_root``, or generated from the sweep's settings."""
    from benchmarks import data

    if is_generated(name):
        settings = sweep.data[name]
        # class_offset: skip the first ids (the proxy's upstream, pretraining classes).
        _, class_ids = data.synthetic_class_split(settings.get("class_offset", 0), settings["num_classes"])
        return data.make_synthetic_train_test(
            class_ids, train_per_class=settings["train_per_class"],
            test_per_class=settings["test_per_class"], seed=0, image_size=sweep.protocol.image_size,
            difficulty=settings.get("difficulty", "standard"),
        )
    return data.load_dataset(name, data_root, image_size=sweep.protocol.image_size, download=download)


class SweepData:
    """The sweep's datasets by name, one in memory at a time (loading another releases the previous one)."""

    def __init__(self, sweep: Sweep, data_root: str, download: bool) -> None:
        self.sweep, self.data_root, self.download = sweep, data_root, download
        self._loaded: Dict[str, Tuple[Any, Any]] = {}

    def __call__(self, name: str) -> Tuple[Any, Any]:
        """``(train, test)`` of the dataset ``name``."""
        if name not in self._loaded:
            self._loaded.clear()
            self._loaded[name] = load_data(name, self.sweep, self.data_root, self.download)
        return self._loaded[name]
