"""Datasets for the benchmark: CIFAR-100, ImageNet-R, CUB-200 and a generated image dataset.

Every builder returns a ``(train, test)`` pair of :class:`ImageDataset` records with one interface:

* ``targets`` -- ``(N,)`` long tensor of class ids (dataset order, which the Si-Blurry stream uses);
* ``classes`` -- class names; ``len(ds)``; ``ds[i]`` -> ``(image, label)`` with ``image`` a
  normalised ``(3, S, S)`` float tensor (the reference *test* transform);
* ``get_batch(indices)`` -> ``(images, labels)``: a normalised ``(n, 3, S, S)`` float batch, the fast
  path for CPU streaming and evaluation (no DataLoader needed);
* ``get_raw_batch(indices)`` -> ``(uint8 images, labels)`` at stored resolution, the input of
  ``train_transform`` (the reference training augmentation applied to a whole batch).

Preprocessing follows reference-protocol section 1.8: images are ``S x S`` (224 by default) and
normalised with *dataset* statistics (CIFAR-100 statistics for CIFAR-100 and CUB-200, ImageNet
statistics for ImageNet-R). The training augmentation is Resize -> RandomCrop(pad 4) ->
RandomHorizontalFlip -> AutoAugment (CIFAR-10 policy for CIFAR-100, ImageNet policy for ImageNet-R,
none for CUB-200) -> Normalize, applied to the whole batch tensor as the reference does, so all images
of a batch share one crop, flip and AutoAugment sub-policy.

Splits: CIFAR-100 uses the official 50k/10k split. ImageNet-R uses pre-split ``train/`` and ``test/``
ImageFolders when present (FlyGCL layout) and otherwise the Si-Blurry split of the extracted archive
(a ``randperm`` with generator seed 0, first 80% train, both sides sorted). CUB-200 is an ImageFolder
over ``images/`` split like ``torch.utils.data.random_split(..., [int(0.8 N), N - int(0.8 N)],
generator=Generator().manual_seed(42))`` (train order = permuted order, as in FlyGCL).

Nothing is downloaded unless ``download=True``; a missing dataset raises one
:class:`DatasetNotFoundError` that lists where it looked and how to get the data. torchvision is
imported lazily, inside the functions that need it.

The generated dataset (:func:`make_synthetic_dataset`, :func:`make_synthetic_train_test`) draws each
class as a fixed composition of a textured background and three coloured shapes; samples vary in
pose, scale, colour, clutter and noise. A class's look depends only on ``(seed, class id)``, so
disjoint "upstream" (pretraining) and "downstream" (continual) class sets come from disjoint id
ranges (:func:`synthetic_class_split`), each with its own held-out test split. ``difficulty="hard"``
(the CPU proxy benchmark's data, see ``benchmarks/pretrain_proxy.py``) builds every class from a shared
library of parts and colours, draws the background colour per sample, varies pose and colour more
and adds four distractors made of the same parts, so that neither colour statistics nor a linear
probe on pixels separate the classes well.
"""

from __future__ import annotations

import hashlib
import math
import os
from pathlib import Path
from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.data import Dataset

__all__ = [
    "DATASET_STATS",
    "AUTOAUGMENT_POLICY",
    "DatasetNotFoundError",
    "ImageDataset",
    "TensorImageDataset",
    "FolderImageDataset",
    "SyntheticImageDataset",
    "BatchTrainTransform",
    "load_cifar100",
    "load_imagenet_r",
    "load_cub200",
    "load_dataset",
    "synthetic_class_split",
    "make_synthetic_dataset",
    "make_synthetic_train_test",
]

Stats = Tuple[Tuple[float, float, float], Tuple[float, float, float]]
Indices = Union[Tensor, Sequence[int], np.ndarray]

_CIFAR100_STATS: Stats = ((0.5071, 0.4867, 0.4408), (0.2675, 0.2565, 0.2761))
#: Normalisation (mean, std) per dataset, as in the reference ``get_statistics`` (CUB reuses CIFAR-100's).
DATASET_STATS: Dict[str, Stats] = {
    "cifar100": _CIFAR100_STATS,
    "imagenet-r": ((0.485, 0.456, 0.406), (0.229, 0.224, 0.225)),
    "cub200": _CIFAR100_STATS,
    "synthetic": ((0.5, 0.5, 0.5), (0.25, 0.25, 0.25)),
}
#: AutoAugment policy of the reference training augmentation (None: no AutoAugment).
AUTOAUGMENT_POLICY: Dict[str, Optional[str]] = {
    "cifar100": "cifar10",
    "imagenet-r": "imagenet",
    "cub200": None,
    "synthetic": None,
}
_IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".ppm", ".bmp", ".pgm", ".tif", ".tiff", ".webp")


class DatasetNotFoundError(FileNotFoundError):
    """A dataset is not on disk where it was looked for (the message says where and how to get it)."""


def _import_torchvision(feature: str):
    try:
        import torchvision  # noqa: F401  (imported lazily: only the dataset builders need it)
    except ImportError as error:  # pragma: no cover - depends on the environment
        raise ImportError(
            f"{feature} needs torchvision, which is not installed; install the benchmark extra "
            f"(pip install 'fly-modules[bench]') or torchvision itself"
        ) from error
    return torchvision


def _as_index_tensor(indices: Indices, length: int) -> Tensor:
    if isinstance(indices, Tensor):
        if indices.dtype == torch.bool or indices.is_floating_point():
            raise TypeError(f"indices must be integers, got dtype {indices.dtype}")
        index = indices.detach().cpu().long().reshape(-1)
    else:
        array = np.asarray(indices)
        if array.size and array.dtype.kind not in "iu":
            raise TypeError(f"indices must be integers, got dtype {array.dtype}")
        index = torch.from_numpy(array.astype(np.int64)).reshape(-1)
    if index.numel() and (int(index.min()) < -length or int(index.max()) >= length):
        raise IndexError(f"indices out of range for a dataset of {length} samples")
    return index % length if index.numel() else index


# ----------------------------------------------------------------------------------------------------
# Transforms
# ----------------------------------------------------------------------------------------------------


def _resize_batch(images: Tensor, size: int) -> Tensor:
    """Bilinear resize of a float batch (torchvision's tensor path: antialias when shrinking)."""
    if images.shape[-2:] == (size, size):
        return images
    return F.interpolate(images, size=(size, size), mode="bilinear", align_corners=False, antialias=True)


class BatchTrainTransform:
    """The reference training augmentation, applied to a whole batch at once (reference-protocol 1.8).

    ``uint8 batch -> Resize(S, S) -> RandomCrop(S, padding=4) -> RandomHorizontalFlip ->
    AutoAugment(policy) -> /255 -> Normalize(mean, std)``. Float input in ``[0, 1]`` is first turned
    into uint8 by ``(x * 255)`` truncation, as the reference does. Because torchvision draws one set of
    parameters per call, every image of a batch gets the same crop, flip and AutoAugment sub-policy
    (reference quirk 6.2.8, kept for fidelity). Randomness comes from torch's global generator.

    Args:
        image_size: output side ``S``.
        mean, std: normalisation statistics.
        autoaugment_policy: ``"cifar10"``, ``"imagenet"``, ``"svhn"`` or ``None``.
    """

    def __init__(
        self,
        image_size: int,
        mean: Sequence[float],
        std: Sequence[float],
        autoaugment_policy: Optional[str] = None,
    ) -> None:
        transforms = _import_torchvision("BatchTrainTransform").transforms

        steps: List[Callable[[Tensor], Tensor]] = [
            transforms.Resize((image_size, image_size), antialias=True),
            transforms.RandomCrop(image_size, padding=4),
            transforms.RandomHorizontalFlip(),
        ]
        if autoaugment_policy is not None:
            policy = {
                "cifar10": transforms.AutoAugmentPolicy.CIFAR10,
                "imagenet": transforms.AutoAugmentPolicy.IMAGENET,
                "svhn": transforms.AutoAugmentPolicy.SVHN,
            }.get(autoaugment_policy)
            if policy is None:
                raise ValueError(
                    f"autoaugment_policy must be 'cifar10', 'imagenet', 'svhn' or None, got {autoaugment_policy!r}"
                )
            steps.append(transforms.AutoAugment(policy))
        self._steps = steps
        self.image_size = int(image_size)
        self.autoaugment_policy = autoaugment_policy
        self.mean = torch.tensor(mean, dtype=torch.float32).view(1, 3, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).view(1, 3, 1, 1)

    def __call__(self, images: Tensor) -> Tensor:
        """Augment ``(n, 3, h, w)`` uint8 (or float in [0, 1]) images; returns normalised float ``(n, 3, S, S)``."""
        if images.ndim != 4 or images.shape[1] != 3:
            raise ValueError(f"expected a batch of shape (n, 3, h, w), got {tuple(images.shape)}")
        x = images if images.dtype == torch.uint8 else (images * 255).to(torch.uint8)
        for step in self._steps:
            x = step(x)
        x = x.float() / 255
        return (x - self.mean.to(x.device)) / self.std.to(x.device)

    def __repr__(self) -> str:
        return f"BatchTrainTransform(image_size={self.image_size}, autoaugment_policy={self.autoaugment_policy!r})"


# ----------------------------------------------------------------------------------------------------
# Dataset records
# ----------------------------------------------------------------------------------------------------


class ImageDataset(Dataset):
    """Common record of every dataset builder (abstract: subclasses implement ``_load_uint8``).

    Attributes:
        name: dataset key (``"cifar100"``, ``"imagenet-r"``, ``"cub200"``, ``"synthetic"``).
        targets: ``(N,)`` long class ids.
        classes: class names, ``classes[targets[i]]`` names sample ``i``.
        image_size: side ``S`` of the images ``get_batch`` returns.
        mean, std: normalisation statistics.
        autoaugment_policy: policy of :attr:`train_transform`.
    """

    def __init__(
        self,
        *,
        name: str,
        targets: Tensor,
        classes: Sequence[str],
        image_size: int,
        stats: Stats,
        autoaugment_policy: Optional[str],
    ) -> None:
        self.name = name
        self.targets = targets.long().contiguous()
        self.classes = list(classes)
        self.image_size = int(image_size)
        self.mean, self.std = tuple(stats[0]), tuple(stats[1])
        self.autoaugment_policy = autoaugment_policy
        self._mean = torch.tensor(self.mean, dtype=torch.float32).view(1, 3, 1, 1)
        self._std = torch.tensor(self.std, dtype=torch.float32).view(1, 3, 1, 1)
        self._train_transform: Optional[BatchTrainTransform] = None

    def __len__(self) -> int:
        return int(self.targets.numel())

    def __getitem__(self, index: int) -> Tuple[Tensor, int]:
        images, labels = self.get_batch([index])
        return images[0], int(labels[0])

    def __repr__(self) -> str:
        return (
            f"{type(self).__name__}(name={self.name!r}, samples={len(self)}, classes={len(self.classes)}, "
            f"image_size={self.image_size})"
        )

    def _load_uint8(self, index: Tensor) -> Tensor:
        """``(n, 3, h, w)`` uint8 images of ``index`` at stored resolution."""
        raise NotImplementedError

    def get_raw_batch(self, indices: Indices) -> Tuple[Tensor, Tensor]:
        """``(uint8 (n, 3, h, w) images at stored resolution, long labels)`` -- input of ``train_transform``."""
        index = _as_index_tensor(indices, len(self))
        return self._load_uint8(index), self.targets[index]

    def get_batch(self, indices: Indices, *, normalize: bool = True) -> Tuple[Tensor, Tensor]:
        """``(float (n, 3, S, S) images, long labels)``: resized, scaled to [0, 1] and (by default) normalised.

        This is the reference test transform (Resize -> ToTensor -> Normalize) done on a whole batch.
        """
        raw, labels = self.get_raw_batch(indices)
        images = _resize_batch(raw.float().div_(255), self.image_size)
        if images.shape[-2:] != raw.shape[-2:]:
            images = images.clamp_(0, 1)  # bilinear resampling can overshoot slightly with antialias
        return (self.normalize(images) if normalize else images), labels

    def normalize(self, images: Tensor) -> Tensor:
        """Normalise ``[0, 1]`` float images with the dataset statistics."""
        return (images - self._mean.to(images.device)) / self._std.to(images.device)

    @property
    def train_transform(self) -> BatchTrainTransform:
        """The reference training augmentation for this dataset (built on first use; needs torchvision)."""
        if self._train_transform is None:
            self._train_transform = BatchTrainTransform(self.image_size, self.mean, self.std, self.autoaugment_policy)
        return self._train_transform


class TensorImageDataset(ImageDataset):
    """An :class:`ImageDataset` whose images are one in-memory uint8 tensor ``images`` of shape ``(N, 3, h, w)``."""

    def __init__(
        self,
        images: Tensor,
        targets: Tensor,
        classes: Sequence[str],
        *,
        name: str,
        image_size: Optional[int] = None,
        stats: Optional[Stats] = None,
        autoaugment_policy: Optional[str] = None,
    ) -> None:
        if images.dtype != torch.uint8 or images.ndim != 4 or images.shape[1] != 3:
            raise ValueError(
                f"images must be a uint8 tensor of shape (N, 3, h, w), got dtype {images.dtype} and shape "
                f"{tuple(images.shape)}"
            )
        if targets.ndim != 1 or targets.numel() != images.shape[0]:
            raise ValueError(f"targets must be 1-D with {images.shape[0]} entries, got shape {tuple(targets.shape)}")
        super().__init__(
            name=name,
            targets=targets,
            classes=classes,
            image_size=images.shape[-1] if image_size is None else image_size,
            stats=stats if stats is not None else DATASET_STATS.get(name, DATASET_STATS["synthetic"]),
            autoaugment_policy=autoaugment_policy,
        )
        self.images = images.contiguous()

    def _load_uint8(self, index: Tensor) -> Tensor:
        return self.images[index]


class FolderImageDataset(ImageDataset):
    """An :class:`ImageDataset` over image files, decoded with PIL and resized to ``S x S`` on load.

    Loading resizes with PIL bilinear filtering at load time (the reference's load transform
    ``Resize((S, S))``). Decoding is per file, so use :meth:`to_memory` for small datasets that are
    streamed many times.

    Attributes:
        samples: ``(path, class id)`` pairs in dataset order.
    """

    def __init__(
        self,
        samples: Sequence[Tuple[str, int]],
        classes: Sequence[str],
        *,
        name: str,
        image_size: int,
        stats: Stats,
        autoaugment_policy: Optional[str],
    ) -> None:
        self.samples = [(str(path), int(target)) for path, target in samples]
        targets = torch.tensor([t for _, t in self.samples], dtype=torch.long)
        super().__init__(
            name=name,
            targets=targets,
            classes=classes,
            image_size=image_size,
            stats=stats,
            autoaugment_policy=autoaugment_policy,
        )

    def _load_one(self, path: str) -> Tensor:
        from PIL import Image

        with Image.open(path) as image:
            image = image.convert("RGB").resize((self.image_size, self.image_size), resample=Image.BILINEAR)
            array = np.asarray(image, dtype=np.uint8)
        return torch.from_numpy(array.copy()).permute(2, 0, 1)

    def _load_uint8(self, index: Tensor) -> Tensor:
        if index.numel() == 0:
            return torch.empty(0, 3, self.image_size, self.image_size, dtype=torch.uint8)
        # One decode per file is unavoidable; everything after decoding is batched.
        return torch.stack([self._load_one(self.samples[i][0]) for i in index.tolist()])

    def to_memory(self) -> TensorImageDataset:
        """Decode every image once and return an in-memory copy (``N * 3 * S * S`` bytes)."""
        images = self._load_uint8(torch.arange(len(self)))
        out = TensorImageDataset(
            images,
            self.targets,
            self.classes,
            name=self.name,
            image_size=self.image_size,
            stats=(self.mean, self.std),
            autoaugment_policy=self.autoaugment_policy,
        )
        return out


# ----------------------------------------------------------------------------------------------------
# Real datasets
# ----------------------------------------------------------------------------------------------------


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


def _check_image_size(image_size: int) -> int:
    if isinstance(image_size, bool) or not isinstance(image_size, int) or image_size < 1:
        raise ValueError(f"image_size must be a positive int, got {image_size!r}")
    return image_size


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
    folder = root / "cifar-100-python"
    if not download and not folder.is_dir():
        raise DatasetNotFoundError(
            f"CIFAR-100 was not found: looked for '{folder}'. Get it with load_cifar100('{root}', download=True), "
            f"or download https://www.cs.toronto.edu/~kriz/cifar-100-python.tar.gz and extract it into '{root}'."
        )
    out = []
    for train in (True, False):
        try:
            raw = tv.datasets.CIFAR100(str(root), train=train, download=download)
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


_IMAGENET_R_URL = "https://people.eecs.berkeley.edu/~hendrycks/imagenet-r.tar"


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
    candidates = [root, root / "imagenet-r"]
    folder = next((c for c in candidates if _has_class_folders(c)), None)
    if folder is None and download:
        tv = _import_torchvision("load_imagenet_r(download=True)")
        tv.datasets.utils.download_and_extract_archive(_IMAGENET_R_URL, download_root=str(root))
        folder = root / "imagenet-r"
    if folder is None:
        raise DatasetNotFoundError(
            f"ImageNet-R was not found. Looked for pre-split folders '{root / 'train'}' and '{root / 'test'}', "
            f"and for class folders in '{root}' and '{root / 'imagenet-r'}'. Get it with "
            f"load_imagenet_r('{root}', download=True), or download {_IMAGENET_R_URL} and extract it into '{root}'."
        )
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
    candidates = [root / "images", root / "CUB_200_2011" / "images"]
    folder = next((c for c in candidates if _has_class_folders(c)), None)
    if folder is None:
        looked = "', '".join(str(c) for c in candidates)
        no_auto = " Automatic download is not available for CUB-200." if download else ""
        raise DatasetNotFoundError(
            f"CUB-200-2011 was not found: looked for class folders in '{looked}'.{no_auto} Download CUB_200_2011.tgz "
            f"from https://www.vision.caltech.edu/datasets/cub_200_2011/ and extract it so that "
            f"'{candidates[0]}' (or '{candidates[1]}') holds the 200 class folders."
        )
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
    key = name.lower().replace("_", "-")
    key = {"imagenetr": "imagenet-r", "cub": "cub200", "cub-200": "cub200", "cifar-100": "cifar100"}.get(key, key)
    if key == "synthetic":
        return make_synthetic_train_test(**kwargs)
    if key not in builders:
        raise ValueError(f"unknown dataset {name!r}; expected one of {sorted(builders) + ['synthetic']}")
    if root is None:
        raise ValueError(f"load_dataset({name!r}) needs root=<folder holding the dataset>")
    return builders[key](root, **kwargs)


# ----------------------------------------------------------------------------------------------------
# Generated dataset
# ----------------------------------------------------------------------------------------------------

_NUM_SHAPES = 3  # shape slots per class
_NUM_SHAPE_KINDS = 5  # disk, box, ring, triangle, bar
_NUM_TEXTURES = 4  # flat, stripes, checker, rings
_NUM_CLUTTER = 2  # random distractor slots per sample


def _derived_seed(*parts: object) -> int:
    """A 63-bit seed that depends only on ``parts`` (stable across platforms and Python runs)."""
    digest = hashlib.sha256(":".join(str(p) for p in parts).encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def _class_recipe(seed: int, class_id: int) -> Dict[str, Tensor]:
    """The fixed look of one class: background colour/texture and three coloured shapes."""
    g = torch.Generator().manual_seed(_derived_seed("synthetic-class", seed, class_id))
    u = lambda *shape: torch.rand(*shape, generator=g)  # noqa: E731
    return {
        "bg_color": 0.15 + 0.7 * u(3),
        "texture": torch.randint(0, _NUM_TEXTURES, (1,), generator=g),
        "tex_freq": 1.5 + 3.5 * u(1),
        "tex_angle": math.pi * u(1),
        "tex_color": (u(3) - 0.5) * 0.5,
        "kind": torch.randint(0, _NUM_SHAPE_KINDS, (_NUM_SHAPES,), generator=g),
        "color": u(_NUM_SHAPES, 3),
        "center": (u(_NUM_SHAPES, 2) - 0.5) * 1.1,
        "size": 0.22 + 0.25 * u(_NUM_SHAPES),
        "aspect": 0.6 + 0.8 * u(_NUM_SHAPES),
        "angle": math.pi * u(_NUM_SHAPES),
    }


def _sample_variation(seed: int, class_id: int, split: str, count: int) -> Dict[str, Tensor]:
    """Per-sample nuisance parameters of ``count`` samples of one class (pose, colour, clutter)."""
    g = torch.Generator().manual_seed(_derived_seed("synthetic-samples", seed, class_id, split))
    u = lambda *shape: torch.rand(*shape, generator=g)  # noqa: E731
    return {
        "rotation": (u(count) - 0.5) * 1.05,  # about +-30 degrees
        "scale": 0.75 + 0.5 * u(count),
        "shift": (u(count, 2) - 0.5) * 0.4,
        "part_shift": (u(count, _NUM_SHAPES, 2) - 0.5) * 0.2,
        "part_scale": 0.85 + 0.3 * u(count, _NUM_SHAPES),
        "gain": 0.75 + 0.5 * u(count, 3),
        "offset": (u(count, 3) - 0.5) * 0.24,
        "clutter_on": (u(count, _NUM_CLUTTER) < 0.7).float(),
        "clutter_kind": torch.randint(0, _NUM_SHAPE_KINDS, (count, _NUM_CLUTTER), generator=g),
        "clutter_color": u(count, _NUM_CLUTTER, 3),
        "clutter_center": (u(count, _NUM_CLUTTER, 2) - 0.5) * 1.6,
        "clutter_size": 0.1 + 0.15 * u(count, _NUM_CLUTTER),
        "clutter_angle": math.pi * u(count, _NUM_CLUTTER),
    }


#: Hard variant: classes are built from a shared library of parts and a small colour palette (so
#: colour statistics and single parts do not identify a class), the background colour is drawn per
#: sample, and samples vary more (pose, scale, part jitter, colour jitter) among more clutter made of
#: the same parts and colours as the classes.
_HARD_PARTS = 16  # (shape kind, aspect) pairs shared by all classes
_HARD_PALETTE = 10  # colours shared by all classes
_HARD_CLUTTER = 4  # distractor slots per sample


def _hard_library(seed: int) -> Dict[str, Tensor]:
    g = torch.Generator().manual_seed(_derived_seed("synthetic-hard-library", seed))
    return {
        "part_kind": torch.arange(_HARD_PARTS) % _NUM_SHAPE_KINDS,
        "part_aspect": 0.5 + 1.0 * torch.rand(_HARD_PARTS, generator=g),
        "palette": torch.rand(_HARD_PALETTE, 3, generator=g),
    }


def _hard_class_recipe(seed: int, class_id: int, library: Dict[str, Tensor]) -> Dict[str, Tensor]:
    """One class of the hard variant: which shared parts in which palette colours, where, plus a texture."""
    g = torch.Generator().manual_seed(_derived_seed("synthetic-hard-class", seed, class_id))
    u = lambda *shape: torch.rand(*shape, generator=g)  # noqa: E731
    part = torch.randint(0, _HARD_PARTS, (_NUM_SHAPES,), generator=g)
    colour = torch.randint(0, _HARD_PALETTE, (_NUM_SHAPES,), generator=g)
    return {
        "bg_color": torch.full((3,), 0.5),  # unused: drawn per sample
        "texture": torch.randint(0, _NUM_TEXTURES, (1,), generator=g),
        "tex_freq": 1.5 + 1.5 * torch.randint(0, 3, (1,), generator=g).float(),
        "tex_angle": math.pi * u(1),
        "tex_color": torch.zeros(3),  # unused: drawn per sample
        "kind": library["part_kind"][part],
        "color": library["palette"][colour],
        "center": (u(_NUM_SHAPES, 2) - 0.5) * 1.1,
        "size": 0.22 + 0.25 * u(_NUM_SHAPES),
        "aspect": library["part_aspect"][part],
        "angle": math.pi * u(_NUM_SHAPES),
    }


def _hard_sample_variation(
    seed: int, class_id: int, split: str, count: int, library: Dict[str, Tensor]
) -> Dict[str, Tensor]:
    g = torch.Generator().manual_seed(_derived_seed("synthetic-hard-samples", seed, class_id, split))
    u = lambda *shape: torch.rand(*shape, generator=g)  # noqa: E731
    clutter_part = torch.randint(0, _HARD_PARTS, (count, _HARD_CLUTTER), generator=g)
    clutter_colour = torch.randint(0, _HARD_PALETTE, (count, _HARD_CLUTTER), generator=g)
    return {
        "rotation": (u(count) - 0.5) * 1.6,  # about +-45 degrees
        "scale": 0.7 + 0.6 * u(count),
        "shift": (u(count, 2) - 0.5) * 0.5,
        "part_shift": (u(count, _NUM_SHAPES, 2) - 0.5) * 0.3,
        "part_scale": 0.8 + 0.4 * u(count, _NUM_SHAPES),
        "gain": 0.65 + 0.7 * u(count, 3),
        "offset": (u(count, 3) - 0.5) * 0.3,
        "bg_color": 0.15 + 0.7 * u(count, 3),
        "tex_color": (u(count, 3) - 0.5) * 0.6,
        "clutter_on": (u(count, _HARD_CLUTTER) < 0.75).float(),
        "clutter_kind": library["part_kind"][clutter_part],
        "clutter_aspect": library["part_aspect"][clutter_part],
        "clutter_color": library["palette"][clutter_colour],
        "clutter_center": (u(count, _HARD_CLUTTER, 2) - 0.5) * 1.7,
        "clutter_size": 0.14 + 0.16 * u(count, _HARD_CLUTTER),
        "clutter_angle": math.pi * u(count, _HARD_CLUTTER),
    }


def _rotation(angle: Tensor) -> Tensor:
    """``(n, 2, 2)`` matrices mapping image coordinates into a frame rotated by ``angle``."""
    cos, sin = torch.cos(angle), torch.sin(angle)
    return torch.stack([torch.stack([cos, sin], -1), torch.stack([-sin, cos], -1)], -2)


def _frame(linear: Tensor, offset: Tensor, grid: Tuple[Tensor, Tensor], rows: Tensor) -> Tuple[Tensor, Tensor]:
    """Coordinates ``linear @ (x, y) + offset`` of the pixel grid for the samples ``rows``: two ``(r, H, W)``."""
    gx, gy = grid
    m, o = linear[rows].view(-1, 2, 2, 1, 1), offset[rows].view(-1, 2, 1, 1)
    return m[:, 0, 0] * gx + m[:, 0, 1] * gy + o[:, 0], m[:, 1, 0] * gx + m[:, 1, 1] * gy + o[:, 1]


def _shape_alpha(
    kind: Tensor, linear: Tensor, offset: Tensor, aspect: Tensor, size: Tensor, grid: Tuple[Tensor, Tensor]
) -> Tensor:
    """Soft coverage ``(n, H, W)`` of one shape per sample, in the shape's unit frame ``linear @ p + offset``.

    Samples are grouped by shape kind: one vectorised evaluation per kind, never per sample. The signed
    distance is negative inside; multiplying it by ``size`` brings it back to image units, which gives
    about one pixel of anti-aliasing.
    """
    height, width = grid[0].shape
    softness = 2.0 / height
    alpha = torch.empty(kind.shape[0], height, width)
    for k in range(_NUM_SHAPE_KINDS):
        rows = torch.nonzero(kind == k, as_tuple=False).flatten()
        if rows.numel() == 0:
            continue
        x, y = _frame(linear, offset, grid, rows)
        x = x / aspect[rows].view(-1, 1, 1)
        if k == 0:  # disk
            d = torch.sqrt(x * x + y * y) - 1.0
        elif k == 1:  # box
            d = torch.maximum(x.abs(), y.abs()) - 0.85
        elif k == 2:  # ring
            d = (torch.sqrt(x * x + y * y) - 0.75).abs() - 0.25
        elif k == 3:  # triangle: three half-planes
            d = torch.maximum(torch.maximum(-y - 0.5, 0.866 * x + 0.5 * y - 0.5), -0.866 * x + 0.5 * y - 0.5) * 1.6
        else:  # bar: a thick stroke
            d = torch.maximum(x.abs() - 1.0, (y.abs() - 0.22) * 3.0)
        alpha[rows] = torch.sigmoid(-d * size[rows].view(-1, 1, 1) / softness)
    return alpha


def _render(recipe: Dict[str, Tensor], var: Dict[str, Tensor], image_size: int, noise: Tensor) -> Tensor:
    """Render a chunk of samples (class recipes already gathered per sample) to float images in [0, 1].

    Every coordinate frame (object, texture, each shape, each distractor) is an affine map of the pixel
    grid, built from ``(n, 2, 2)`` matrices and evaluated with one broadcast per frame.
    """
    n = var["rotation"].shape[0]
    axis = (torch.arange(image_size, dtype=torch.float32) + 0.5) / image_size * 2 - 1
    gy, gx = torch.meshgrid(axis, axis, indexing="ij")
    grid = (gx, gy)
    # Object frame p = R(rotation) (g - shift) / scale, written p = A g + a.
    obj_linear = _rotation(var["rotation"]) / var["scale"].view(n, 1, 1)
    obj_offset = -(obj_linear @ var["shift"].unsqueeze(-1)).squeeze(-1)

    # Background: class colour plus a class texture that moves with the object.
    tex_rotation = _rotation(recipe["tex_angle"].reshape(n))
    tex_linear = tex_rotation @ obj_linear
    tex_offset = (tex_rotation @ obj_offset.unsqueeze(-1)).squeeze(-1)
    freq = recipe["tex_freq"].reshape(n) * math.pi
    texture = torch.zeros(n, image_size, image_size)
    for kind in range(1, _NUM_TEXTURES):  # kind 0 is flat
        rows = torch.nonzero(recipe["texture"] == kind, as_tuple=False).flatten()
        if rows.numel() == 0:
            continue
        tx, ty = _frame(tex_linear, tex_offset, grid, rows)
        f = freq[rows].view(-1, 1, 1)
        if kind == 1:  # stripes
            texture[rows] = torch.sin(f * tx)
        elif kind == 2:  # checker
            texture[rows] = torch.sign(torch.sin(f * tx) * torch.sin(f * ty))
        else:  # concentric rings
            texture[rows] = torch.sin(1.5 * f * torch.sqrt(tx * tx + ty * ty))
    # The hard variant draws the background colours per sample (``var``), not per class.
    bg_color = var["bg_color"] if "bg_color" in var else recipe["bg_color"]
    tex_color = var["tex_color"] if "tex_color" in var else recipe["tex_color"]
    image = bg_color.view(n, 3, 1, 1) + tex_color.view(n, 3, 1, 1) * texture.unsqueeze(1)

    for slot in range(recipe["kind"].shape[1]):
        # Shape frame q = R(angle) (p - center) / size, composed with the object frame.
        center = recipe["center"][:, slot] + var["part_shift"][:, slot]
        size = recipe["size"][:, slot] * var["part_scale"][:, slot]
        local = _rotation(recipe["angle"][:, slot]) / size.view(n, 1, 1)
        linear = local @ obj_linear
        offset = (local @ (obj_offset - center).unsqueeze(-1)).squeeze(-1)
        alpha = _shape_alpha(recipe["kind"][:, slot], linear, offset, recipe["aspect"][:, slot], size, grid)
        alpha = alpha.unsqueeze(1)
        image = image * (1 - alpha) + recipe["color"][:, slot].view(n, 3, 1, 1) * alpha

    # Clutter: small random distractors in image coordinates, unrelated to the class.
    for slot in range(var["clutter_kind"].shape[1]):
        size = var["clutter_size"][:, slot]
        linear = _rotation(var["clutter_angle"][:, slot]) / size.view(n, 1, 1)
        offset = -(linear @ var["clutter_center"][:, slot].unsqueeze(-1)).squeeze(-1)
        aspect = var["clutter_aspect"][:, slot] if "clutter_aspect" in var else torch.ones(n)
        alpha = _shape_alpha(var["clutter_kind"][:, slot], linear, offset, aspect, size, grid)
        alpha = (alpha * var["clutter_on"][:, slot].view(n, 1, 1)).unsqueeze(1)
        image = image * (1 - alpha) + var["clutter_color"][:, slot].view(n, 3, 1, 1) * alpha

    image = image * var["gain"].view(n, 3, 1, 1) + var["offset"].view(n, 3, 1, 1) + noise
    return image.clamp_(0, 1)


class SyntheticImageDataset(TensorImageDataset):
    """Generated images (see :func:`make_synthetic_dataset`).

    Attributes:
        images: ``(N, 3, S, S)`` uint8.
        targets: ``(N,)`` long, *local* labels ``0..K-1`` (position of the class in ``class_ids``).
        class_ids: ``(K,)`` long, global synthetic class ids (what defines each class's look).
        classes: names ``"synthetic-<global id>"``.
        seed, split: generation parameters.
    """

    def __init__(self, images: Tensor, targets: Tensor, class_ids: Tensor, *, seed: int, split: str) -> None:
        super().__init__(
            images,
            targets,
            [f"synthetic-{int(c):04d}" for c in class_ids],
            name="synthetic",
            stats=DATASET_STATS["synthetic"],
            autoaugment_policy=AUTOAUGMENT_POLICY["synthetic"],
        )
        self.class_ids = class_ids
        self.seed = seed
        self.split = split


def synthetic_class_split(num_upstream: int, num_downstream: int) -> Tuple[Tensor, Tensor]:
    """Disjoint global class ids: upstream (pretraining) ``0..U-1``, downstream (continual) ``U..U+D-1``."""
    for value, name in ((num_upstream, "num_upstream"), (num_downstream, "num_downstream")):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name} must be a non-negative int, got {value!r}")
    return torch.arange(num_upstream), torch.arange(num_upstream, num_upstream + num_downstream)


def make_synthetic_dataset(
    class_ids: Union[int, Sequence[int], Tensor],
    samples_per_class: int,
    *,
    split: str = "train",
    seed: int = 0,
    image_size: int = 32,
    noise_std: float = 0.06,
    shuffle: bool = True,
    chunk_size: int = 512,
    difficulty: str = "standard",
) -> SyntheticImageDataset:
    """Generate a deterministic in-memory image dataset.

    Args:
        class_ids: global class ids (or an int ``K`` for ids ``0..K-1``). A class looks the same in
            every dataset generated with the same ``seed``; labels are local (``0..K-1`` in the order
            of ``class_ids``).
        samples_per_class: images per class.
        split: name of the sample draw; different names give independent samples of the same
            classes (use ``"train"`` / ``"test"``, or e.g. ``"pretrain"``).
        seed: seed of the class looks and of the sample draws.
        image_size: side of the square RGB images.
        noise_std: standard deviation of the additive pixel noise.
        shuffle: order the samples by a seeded permutation (like CIFAR's file order) instead of by class.
        chunk_size: samples rendered per vectorised chunk (bounds memory).
        difficulty: ``"standard"`` (each class its own colours, three shapes and two distractors) or
            ``"hard"`` (the CPU proxy benchmark's data: classes share a library of 16 parts and a
            palette of 10 colours, the background colour is drawn per sample, stronger pose and colour
            variation, four distractors made of the same parts and colours). Different difficulties
            give unrelated images for the same class id; ``"standard"`` is unchanged by this option.

    Returns:
        A :class:`SyntheticImageDataset`; ``(seed, class_ids, samples_per_class, split, image_size,
        noise_std, shuffle, difficulty)`` fully determine its bytes.
    """
    if isinstance(class_ids, int) and not isinstance(class_ids, bool):
        class_ids = torch.arange(class_ids)
    ids = torch.as_tensor(class_ids, dtype=torch.long).reshape(-1)
    if ids.numel() == 0:
        raise ValueError("class_ids is empty; a dataset needs at least one class")
    if int(ids.min()) < 0 or torch.unique(ids).numel() != ids.numel():
        raise ValueError("class_ids must be distinct non-negative ints")
    if isinstance(samples_per_class, bool) or not isinstance(samples_per_class, int) or samples_per_class < 1:
        raise ValueError(f"samples_per_class must be a positive int, got {samples_per_class!r}")
    image_size = _check_image_size(image_size)
    if image_size < 8:
        raise ValueError(f"image_size must be at least 8 pixels to draw shapes, got {image_size}")

    if difficulty not in ("standard", "hard"):
        raise ValueError(f"difficulty must be 'standard' or 'hard', got {difficulty!r}")

    # Per-class parameter draws (a loop over classes, each drawing all its samples at once).
    if difficulty == "hard":
        library = _hard_library(seed)
        recipes = [_hard_class_recipe(seed, int(c), library) for c in ids]
        variations = [_hard_sample_variation(seed, int(c), split, samples_per_class, library) for c in ids]
    else:
        recipes = [_class_recipe(seed, int(c)) for c in ids]
        variations = [_sample_variation(seed, int(c), split, samples_per_class) for c in ids]
    recipe = {k: torch.stack([r[k] for r in recipes]) for k in recipes[0]}
    sample_class = torch.arange(ids.numel()).repeat_interleave(samples_per_class)
    per_sample_recipe = {k: v[sample_class] for k, v in recipe.items()}
    per_sample_recipe["texture"] = per_sample_recipe["texture"].reshape(-1)
    variation = {k: torch.cat([v[k] for v in variations]) for k in variations[0]}

    total = int(sample_class.numel())
    noise_key = ("synthetic-noise",) if difficulty == "standard" else ("synthetic-hard-noise",)
    noise_generator = torch.Generator().manual_seed(_derived_seed(*noise_key, seed, split, ids.tolist()))
    images = torch.empty(total, 3, image_size, image_size, dtype=torch.uint8)
    for start in range(0, total, chunk_size):
        part = slice(start, min(start + chunk_size, total))
        n = part.stop - part.start
        noise = torch.randn(n, 3, image_size, image_size, generator=noise_generator) * noise_std
        chunk = _render(
            {k: v[part] for k, v in per_sample_recipe.items()},
            {k: v[part] for k, v in variation.items()},
            image_size,
            noise,
        )
        images[part] = (chunk * 255).round_().to(torch.uint8)

    targets = sample_class
    if shuffle:
        order_generator = torch.Generator().manual_seed(_derived_seed("synthetic-order", seed, split))
        order = torch.randperm(total, generator=order_generator)
        images, targets = images[order], targets[order]
    return SyntheticImageDataset(images, targets, ids.clone(), seed=seed, split=split)


def make_synthetic_train_test(
    class_ids: Union[int, Sequence[int], Tensor] = 100,
    *,
    train_per_class: int = 50,
    test_per_class: int = 10,
    seed: int = 0,
    image_size: int = 32,
    noise_std: float = 0.06,
    difficulty: str = "standard",
) -> Tuple[SyntheticImageDataset, SyntheticImageDataset]:
    """A ``(train, test)`` pair of :func:`make_synthetic_dataset` over the same classes, independent samples.

    For a pretraining proxy use disjoint ids from :func:`synthetic_class_split`::

        upstream_ids, downstream_ids = synthetic_class_split(200, 100)
        pre_train, pre_test = make_synthetic_train_test(upstream_ids, train_per_class=200)
        cl_train, cl_test = make_synthetic_train_test(downstream_ids)
    """
    common = dict(seed=seed, image_size=image_size, noise_std=noise_std, difficulty=difficulty)
    train = make_synthetic_dataset(class_ids, train_per_class, split="train", **common)
    test = make_synthetic_dataset(class_ids, test_per_class, split="test", **common)
    return train, test
