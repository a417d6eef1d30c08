"""Loaders of the paper's datasets: CIFAR-100, ImageNet-R and CUB-200.

Splits: CIFAR-100 uses the official 50k/10k split. ImageNet-R uses pre-split ``train/`` and ``test/``
ImageFolders when present (FlyGCL layout) and otherwise the Si-Blurry split of the extracted archive
(a ``randperm`` with generator seed 0, first 80% train, both sides sorted). CUB-200 is an ImageFolder
over ``images/`` split like ``torch.utils.data.random_split(..., [int(0.8 N), N - int(0.8 N)],
generator=Generator().manual_seed(42))`` (train order = permuted order, as in FlyGCL).

Nothing is downloaded unless ``download=True``; a missing dataset raises one
:class:`DatasetNotFoundError` that lists where it looked and how to get the data. torchvision is
imported lazily, inside the functions that need it.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Dict, List, Optional, Tuple, Union

import numpy as np
import torch

from .generated import make_synthetic_train_test
from .records import (
    _IMAGE_EXTENSIONS,
    AUTOAUGMENT_POLICY,
    DATASET_STATS,
    DatasetNotFoundError,
    FolderImageDataset,
    ImageDataset,
    TensorImageDataset,
    _check_image_size,
    _import_torchvision,
)

__all__ = [
    "DATASETS", "DOWNLOADABLE", "canonical_dataset_name", "check_dataset", "load_cifar100", "load_imagenet_r",
    "load_cub200", "load_dataset",
]

#: Dataset names ``load_dataset`` accepts, and those it can download (``download=True``).
DATASETS = ("cifar100", "imagenet-r", "cub200", "synthetic")
DOWNLOADABLE = ("cifar100", "imagenet-r")
_ALIASES = {"imagenetr": "imagenet-r", "cub": "cub200", "cub-200": "cub200", "cifar-100": "cifar100"}
_CIFAR100_URL = "https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz"
_IMAGENET_R_URL = "https://people.eecs.berkeley.edu/~hendrycks/imagenet-r.tar"
_CUB200_URL = "https://www.vision.caltech.edu/datasets/cub_200_2011/"
# What a failed download raises (urllib's URLError and socket errors are OSErrors); reported in one line.
_DOWNLOAD_ERRORS = (OSError,)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def canonical_dataset_name(name: str) -> str:
    """``name`` normalised (``"ImageNet_R"`` -> ``"imagenet-r"``); unknown names are returned as given."""
    key = name.lower().replace("_", "-")
    return _ALIASES.get(key, key)


def _cub_candidates(root: Path) -> List[Path]:
    return [root / "images", root / "CUB_200_2011" / "images"]


def check_dataset(name: str, root: Union[str, os.PathLike], *, download: bool = False) -> None:
    """Raise :class:`DatasetNotFoundError` now if ``load_dataset(name, root, download=download)`` would not
    find the data on disk (nothing is read or downloaded; ``"synthetic"`` is always available)."""
    key = canonical_dataset_name(name)
    root = Path(root).expanduser()
    if key == "cifar100" and not download and not (root / "cifar-100-python").is_dir():
        raise DatasetNotFoundError(
            f"CIFAR-100 was not found: looked for '{root / 'cifar-100-python'}'; download {_CIFAR100_URL} and "
            f"extract it into '{root}' (load_cifar100(..., download=True) does it)"
        )
    if key == "imagenet-r" and not download:
        presplit = (root / "train").is_dir() and (root / "test").is_dir()
        if not presplit and not any(_has_class_folders(c) for c in (root, root / "imagenet-r")):
            raise DatasetNotFoundError(
                f"ImageNet-R was not found: looked for '{root / 'train'}' + '{root / 'test'}' and for class "
                f"folders in '{root}' and '{root / 'imagenet-r'}'; download {_IMAGENET_R_URL} and extract it into "
                f"'{root}' (load_imagenet_r(..., download=True) does it)"
            )
    if key == "cub200" and not any(_has_class_folders(c) for c in _cub_candidates(root)):
        looked = "' and '".join(str(c) for c in _cub_candidates(root))
        raise DatasetNotFoundError(
            f"CUB-200-2011 was not found: looked for class folders in '{looked}'. Automatic download is not available "
            f"for CUB-200: get CUB_200_2011.tgz from {_CUB200_URL} and extract it into '{root}'"
        )


def _scan_image_folder(directory: Path) -> Tuple[List[str], List[Tuple[str, int]]]:
    """Classes and ``(path, class id)`` samples in torchvision ``ImageFolder`` order."""
    tv = _import_torchvision("reading ImageFolder layouts")
    classes, class_to_idx = tv.datasets.folder.find_classes(str(directory))
    samples = tv.datasets.folder.make_dataset(str(directory), class_to_idx, extensions=_IMAGE_EXTENSIONS)
    return classes, samples


def _has_class_folders(directory: Path) -> bool:
    if not directory.is_dir():
        return False
    for entry in os.scandir(directory):
        if entry.is_dir() and not entry.name.startswith("."):
            for sub in os.scandir(entry.path):
                if sub.is_file() and sub.name.lower().endswith(_IMAGE_EXTENSIONS):
                    return True
    return False


def _split_fraction(count: int, train_fraction: float) -> int:
    if not 0 < train_fraction < 1:
        raise ValueError(f"train_fraction must lie in (0, 1), got {train_fraction}")
    return int(count * train_fraction)


def load_cifar100(
    root: Union[str, os.PathLike], *, image_size: int = 224, download: bool = False
) -> Tuple[TensorImageDataset, TensorImageDataset]:
    """CIFAR-100 (50k train / 10k test) through torchvision, held in memory as uint8 32x32 images.

    Args:
        root: folder that contains (or will contain) ``cifar-100-python/``.
        image_size: side of the images ``get_batch`` returns (224 as in the reference; the 32x32
            originals are upsampled bilinearly on the fly).
        download: fetch the archive from the official site if it is missing.
    """
    image_size = _check_image_size(image_size)
    tv = _import_torchvision("load_cifar100")
    root = Path(root).expanduser()
    check_dataset("cifar100", root, download=download)
    folder = root / "cifar-100-python"
    out = []
    for train in (True, False):
        try:
            raw = tv.datasets.CIFAR100(str(root), train=train, download=download)
        except _DOWNLOAD_ERRORS as error:
            raise DatasetNotFoundError(f"downloading CIFAR-100 into '{root}' failed: {_first_line(error)}") from None
        except RuntimeError as error:  # torchvision: "Dataset not found or corrupted"
            raise DatasetNotFoundError(
                f"CIFAR-100 in '{folder}' is missing files or corrupted ({error}). Delete the folder and call "
                f"load_cifar100('{root}', download=True), or extract cifar-100-python.tar.gz again."
            ) from None
        images = torch.from_numpy(np.ascontiguousarray(raw.data)).permute(0, 3, 1, 2).contiguous()
        out.append(
            TensorImageDataset(
                images,
                torch.tensor(raw.targets, dtype=torch.long),
                raw.classes,
                name="cifar100",
                image_size=image_size,
                stats=DATASET_STATS["cifar100"],
                autoaugment_policy=AUTOAUGMENT_POLICY["cifar100"],
            )
        )
    return out[0], out[1]



def _imagenet_r_pre_split(root: Path, make: Dict[str, Any]) -> Tuple[FolderImageDataset, FolderImageDataset]:
    """``root/train`` and ``root/test`` as they are; they must hold the same class folders."""
    train_classes, train_samples = _scan_image_folder(root / "train")
    test_classes, test_samples = _scan_image_folder(root / "test")
    if train_classes != test_classes:
        missing = sorted(set(train_classes) ^ set(test_classes))[:5]
        raise ValueError(
            f"ImageNet-R train/ and test/ in '{root}' must hold the same class folders; they differ "
            f"in {len(set(train_classes) ^ set(test_classes))} classes, e.g. {missing}"
        )
    return (
        FolderImageDataset(train_samples, train_classes, **make),
        FolderImageDataset(test_samples, test_classes, **make),
    )


def load_imagenet_r(
    root: Union[str, os.PathLike],
    *,
    image_size: int = 224,
    split_seed: int = 0,
    train_fraction: float = 0.8,
    download: bool = False,
) -> Tuple[FolderImageDataset, FolderImageDataset]:
    """ImageNet-R (200 classes), from pre-split folders or split 80/20 from the extracted archive.

    Looked for, in order: ``root/train`` + ``root/test`` (FlyGCL's pre-split ImageFolders, used as they
    are), then class folders directly in ``root`` or in ``root/imagenet-r`` (the extracted
    ``imagenet-r.tar``), split like Si-Blurry: ``randperm(N)`` from a generator seeded with
    ``split_seed`` (0), the first ``int(0.8 N)`` are train, each side sorted (24,000 / 6,000).

    Args:
        root: dataset folder.
        image_size: side of the loaded images (224 in the reference).
        split_seed, train_fraction: the seeded split (only used without pre-split folders).
        download: fetch and extract ``imagenet-r.tar`` (about 2 GB) into ``root`` if nothing is found.
    """
    image_size = _check_image_size(image_size)
    root = Path(root).expanduser()
    make = dict(
        name="imagenet-r",
        image_size=image_size,
        stats=DATASET_STATS["imagenet-r"],
        autoaugment_policy=AUTOAUGMENT_POLICY["imagenet-r"],
    )
    if (root / "train").is_dir() and (root / "test").is_dir():
        return _imagenet_r_pre_split(root, make)
    candidates = [root, root / "imagenet-r"]
    folder = next((c for c in candidates if _has_class_folders(c)), None)
    if folder is None and download:
        tv = _import_torchvision("load_imagenet_r(download=True)")
        try:
            tv.datasets.utils.download_and_extract_archive(_IMAGENET_R_URL, download_root=str(root))
        except _DOWNLOAD_ERRORS as error:
            raise DatasetNotFoundError(f"downloading ImageNet-R into '{root}' failed: {_first_line(error)}") from None
        folder = root / "imagenet-r"
    if folder is None:
        check_dataset("imagenet-r", root)  # raises with where it looked
    classes, samples = _scan_image_folder(folder)
    generator = torch.Generator().manual_seed(int(split_seed))
    permutation = torch.randperm(len(samples), generator=generator)
    num_train = _split_fraction(len(samples), train_fraction)
    train_index = permutation[:num_train].sort().values.tolist()
    test_index = permutation[num_train:].sort().values.tolist()
    return (
        FolderImageDataset([samples[i] for i in train_index], classes, **make),
        FolderImageDataset([samples[i] for i in test_index], classes, **make),
    )


def load_cub200(
    root: Union[str, os.PathLike],
    *,
    image_size: int = 224,
    split_seed: int = 42,
    train_fraction: float = 0.8,
    download: bool = False,
) -> Tuple[FolderImageDataset, FolderImageDataset]:
    """CUB-200-2011: an ImageFolder over ``images/`` with FlyGCL's seeded random 80/20 split.

    Looked for in ``root/images`` and ``root/CUB_200_2011/images``. The split equals
    ``random_split(folder, [int(0.8 N), N - int(0.8 N)], generator=Generator().manual_seed(42))``:
    train and test keep the permuted order (9,430 / 2,358 images for the full dataset).

    ``download`` exists for a uniform signature only: there is no automatic download (the archive
    sits behind the Caltech data site), so a missing dataset raises with manual instructions either way.
    """
    image_size = _check_image_size(image_size)
    root = Path(root).expanduser()
    check_dataset("cub200", root)
    folder = next(c for c in _cub_candidates(root) if _has_class_folders(c))
    classes, samples = _scan_image_folder(folder)
    generator = torch.Generator().manual_seed(int(split_seed))
    permutation = torch.randperm(len(samples), generator=generator).tolist()
    num_train = _split_fraction(len(samples), train_fraction)
    make = dict(
        name="cub200",
        image_size=image_size,
        stats=DATASET_STATS["cub200"],
        autoaugment_policy=AUTOAUGMENT_POLICY["cub200"],
    )
    return (
        FolderImageDataset([samples[i] for i in permutation[:num_train]], classes, **make),
        FolderImageDataset([samples[i] for i in permutation[num_train:]], classes, **make),
    )


def load_dataset(
    name: str, root: Optional[Union[str, os.PathLike]] = None, **kwargs
) -> Tuple[ImageDataset, ImageDataset]:
    """Build ``(train, test)`` by name: ``"cifar100"``, ``"imagenet-r"``, ``"cub200"`` or ``"synthetic"``.

    ``root`` is required for the real datasets; keyword arguments go to the builder
    (:func:`load_cifar100`, :func:`load_imagenet_r`, :func:`load_cub200`, :func:`make_synthetic_train_test`).
    """
    builders = {"cifar100": load_cifar100, "imagenet-r": load_imagenet_r, "cub200": load_cub200}
    key = canonical_dataset_name(name)
    if key == "synthetic":
        return make_synthetic_train_test(**kwargs)
    if key not in builders:
        raise ValueError(f"unknown dataset {name!r}; expected one of {sorted(builders) + ['synthetic']}")
    if root is None:
        raise ValueError(f"load_dataset({name!r}) needs root=<folder holding the dataset>")
    return builders[key](root, **kwargs)
