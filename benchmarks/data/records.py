"""Dataset records and the batch training transform shared by every dataset of the benchmark.

Every builder returns a ``(train, test)`` pair of :class:`ImageDataset` records with one interface:

* ``targets`` -- ``(N,)`` long tensor of class ids (dataset order, which the Si-Blurry stream uses);
* ``classes`` -- class names; ``len(ds)``; ``ds[i]`` -> ``(image, label)`` with ``image`` a
  normalised ``(3, S, S)`` float tensor (the reference *test* transform);
* ``get_batch(indices)`` -> ``(images, labels)``: a normalised ``(n, 3, S, S)`` float batch;
* ``get_raw_batch(indices)`` -> ``(uint8 images, labels)`` at stored resolution, the input of
  ``train_transform`` (the reference training augmentation applied to a whole batch, so all images
  of a batch share one crop, flip and AutoAugment sub-policy; docs/protocol.md).
"""

from __future__ import annotations

from typing import Callable, Dict, List, Optional, Sequence, Tuple, Union

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor
from torch.utils.data import Dataset

from fly_modules._validation import check_int

__all__ = [
    "DATASET_STATS",
    "AUTOAUGMENT_POLICY",
    "DatasetNotFoundError",
    "ImageDataset",
    "TensorImageDataset",
    "FolderImageDataset",
    "BatchTrainTransform",
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
    """The reference training augmentation, applied to a whole batch at once (docs/protocol.md §1.8).

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


def _check_image_size(image_size: int) -> int:
    return check_int(image_size, "image_size", caller="benchmarks.data", minimum=1)

