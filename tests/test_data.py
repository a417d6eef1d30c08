"""Tests of benchmarks.data: folder loaders on tiny fake trees, missing-data errors, the generated dataset."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest
import torch
from PIL import Image

from benchmarks.data import (
    DATASET_STATS,
    BatchTrainTransform,
    DatasetNotFoundError,
    FolderImageDataset,
    TensorImageDataset,
    load_cifar100,
    load_cub200,
    load_dataset,
    load_imagenet_r,
    make_synthetic_dataset,
    make_synthetic_train_test,
    synthetic_class_split,
)
from fly_modules import InvalidParameterError


def _colour(class_index: int, image_index: int) -> tuple:
    return (20 * class_index + 3, 200 - 10 * image_index, 100)


def _write_tree(root: Path, classes, per_class: int, size=(20, 12)) -> None:
    """``root/<class>/img_<i>.png``: flat images whose colour encodes (class, image)."""
    for c, name in enumerate(classes):
        folder = root / name
        folder.mkdir(parents=True)
        for i in range(per_class):
            Image.new("RGB", size, _colour(c, i)).save(folder / f"img_{i:02d}.png")
    (root / classes[0] / "notes.txt").write_text("not an image")  # ignored by the ImageFolder scan


CLASSES = ["n001_cat", "n002_dog", "n003_fox"]


def test_imagenet_r_pre_split_folders(tmp_path):
    _write_tree(tmp_path / "train", CLASSES, 4)
    _write_tree(tmp_path / "test", CLASSES, 2)
    train, test = load_imagenet_r(tmp_path, image_size=8)
    assert isinstance(train, FolderImageDataset)
    assert train.classes == CLASSES and test.classes == CLASSES
    assert train.targets.tolist() == [0] * 4 + [1] * 4 + [2] * 4  # ImageFolder order
    assert len(test) == 6 and test.targets.dtype == torch.long
    images, labels = train.get_batch([5, 0])
    assert images.shape == (2, 3, 8, 8) and images.dtype == torch.float32
    assert labels.tolist() == [1, 0]
    # A flat image normalises to (colour / 255 - mean) / std everywhere.
    mean, std = DATASET_STATS["imagenet-r"]
    expected = (torch.tensor(_colour(1, 1), dtype=torch.float32) / 255 - torch.tensor(mean)) / torch.tensor(std)
    assert torch.allclose(images[0].mean(dim=(1, 2)), expected, atol=1e-5)
    image, label = train[5]
    assert torch.equal(image, images[0]) and label == 1
    raw, _ = train.get_raw_batch([5])
    assert raw.dtype == torch.uint8 and raw.shape == (1, 3, 8, 8)


def test_imagenet_r_unsplit_archive_uses_seeded_80_20_split(tmp_path):
    _write_tree(tmp_path / "imagenet-r", CLASSES, 10)
    train, test = load_imagenet_r(tmp_path, image_size=8)
    assert len(train) == 24 and len(test) == 6
    all_paths = sorted(p for p, _ in train.samples + test.samples)
    assert len(set(all_paths)) == 30
    # Si-Blurry: randperm(N) with seed 0, first int(0.8 N) train, both sides sorted.
    permutation = torch.randperm(30, generator=torch.Generator().manual_seed(0))
    ordered = sorted(str(p) for p in (tmp_path / "imagenet-r").rglob("*.png"))
    assert [p for p, _ in train.samples] == [ordered[i] for i in sorted(permutation[:24].tolist())]
    assert [p for p, _ in test.samples] == [ordered[i] for i in sorted(permutation[24:].tolist())]


def test_imagenet_r_train_test_class_mismatch(tmp_path):
    _write_tree(tmp_path / "train", CLASSES, 2)
    _write_tree(tmp_path / "test", CLASSES[:2], 2)
    with pytest.raises(ValueError, match="same class folders"):
        load_imagenet_r(tmp_path)


def test_cub200_split_equals_random_split_with_seed_42(tmp_path):
    _write_tree(tmp_path / "CUB_200_2011" / "images", CLASSES, 7)
    train, test = load_cub200(tmp_path, image_size=8)
    assert len(train) == int(21 * 0.8) and len(test) == 21 - int(21 * 0.8)
    subsets = torch.utils.data.random_split(range(21), [16, 5], generator=torch.Generator().manual_seed(42))
    ordered = sorted(str(p) for p in (tmp_path / "CUB_200_2011" / "images").rglob("*.png"))
    assert [p for p, _ in train.samples] == [ordered[i] for i in subsets[0].indices]
    assert [p for p, _ in test.samples] == [ordered[i] for i in subsets[1].indices]
    assert train.autoaugment_policy is None and train.mean == DATASET_STATS["cifar100"][0]
    memory = train.to_memory()
    assert isinstance(memory, TensorImageDataset)
    assert torch.equal(memory.get_batch([3, 1])[0], train.get_batch([3, 1])[0])


@pytest.mark.parametrize(
    "loader, needle",
    [
        (lambda root: load_cifar100(root), "cifar-100-python"),
        (lambda root: load_imagenet_r(root), "imagenet-r"),
        (lambda root: load_cub200(root), "CUB_200_2011"),
        (lambda root: load_cub200(root, download=True), "Automatic download is not available"),
    ],
)
def test_missing_dataset_gives_one_clear_error(tmp_path, loader, needle):
    root = tmp_path / "nowhere"
    with pytest.raises(DatasetNotFoundError) as info:
        loader(root)
    message = str(info.value)
    assert str(root) in message and needle in message
    assert "download" in message.lower()
    assert info.value.__cause__ is None and info.value.__context__ is None
    assert not root.exists()  # nothing was downloaded or created


def test_load_dataset_dispatch(tmp_path):
    train, test = load_dataset("synthetic", class_ids=3, train_per_class=2, test_per_class=1)
    assert len(train) == 6 and len(test) == 3
    with pytest.raises(ValueError, match="unknown dataset 'mnist'"):
        load_dataset("mnist", tmp_path)
    with pytest.raises(ValueError, match="needs root"):
        load_dataset("cub200")
    with pytest.raises(DatasetNotFoundError):
        load_dataset("ImageNet_R", tmp_path)


def test_get_batch_validates_indices():
    train = make_synthetic_dataset(2, 3, seed=0)
    with pytest.raises(IndexError, match="out of range"):
        train.get_batch([6])
    with pytest.raises(TypeError, match="integers"):
        train.get_batch(torch.tensor([0.0]))
    images, labels = train.get_batch(torch.tensor([], dtype=torch.long))
    assert images.shape[0] == 0 and labels.numel() == 0


def test_tensor_dataset_resizes_and_normalises_like_the_test_transform():
    images = torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8)
    ds = TensorImageDataset(images, torch.arange(4), ["a", "b", "c", "d"], name="cifar100", image_size=64)
    batch, _ = ds.get_batch([2])
    assert batch.shape == (1, 3, 64, 64)
    unnormalised, _ = ds.get_batch([2], normalize=False)
    assert float(unnormalised.min()) >= 0 and float(unnormalised.max()) <= 1
    assert torch.allclose(ds.normalize(unnormalised), batch)
    native = TensorImageDataset(images, torch.arange(4), list("abcd"), name="cifar100")
    x, _ = native.get_batch([1], normalize=False)
    assert torch.equal(x[0], images[1].float() / 255)
    with pytest.raises(ValueError, match="uint8 tensor of shape"):
        TensorImageDataset(images.float(), torch.arange(4), list("abcd"), name="x")


def test_batch_train_transform_shares_parameters_across_the_batch():
    image = torch.randint(0, 256, (1, 3, 32, 32), dtype=torch.uint8)
    batch = image.repeat(4, 1, 1, 1)
    transform = BatchTrainTransform(32, *DATASET_STATS["cifar100"], autoaugment_policy="cifar10")
    torch.manual_seed(0)
    out = transform(batch)
    assert out.shape == (4, 3, 32, 32) and out.dtype == torch.float32
    # One set of random parameters per call: identical inputs stay identical (reference quirk 6.2.8).
    assert all(torch.equal(out[0], out[i]) for i in range(1, 4))
    # Float input in [0, 1] goes through the reference's (x * 255) truncation first.
    torch.manual_seed(0)
    assert torch.equal(transform(batch.float() / 255), out)
    with pytest.raises(ValueError, match="autoaugment_policy"):
        BatchTrainTransform(32, (0, 0, 0), (1, 1, 1), autoaugment_policy="mnist")
    synthetic = make_synthetic_dataset(2, 2, seed=0)
    raw, _ = synthetic.get_raw_batch([0, 1])
    assert synthetic.train_transform(raw).shape == (2, 3, 32, 32)


# ----------------------------------------------------------------------------------------------------
# Generated dataset
# ----------------------------------------------------------------------------------------------------


def test_synthetic_dataset_is_deterministic_and_well_formed():
    a = make_synthetic_dataset(5, 4, seed=3)
    b = make_synthetic_dataset(5, 4, seed=3)
    c = make_synthetic_dataset(5, 4, seed=4)
    assert torch.equal(a.images, b.images) and torch.equal(a.targets, b.targets)
    assert not torch.equal(a.images, c.images)
    assert a.images.shape == (20, 3, 32, 32) and a.images.dtype == torch.uint8
    assert a.targets.dtype == torch.long and torch.bincount(a.targets).tolist() == [4] * 5
    assert a.classes == [f"synthetic-{i:04d}" for i in range(5)]
    assert len(a) == 20
    images, labels = a.get_batch(torch.arange(20))
    assert images.shape == (20, 3, 32, 32) and torch.equal(labels, a.targets)
    small = make_synthetic_dataset(2, 2, seed=0, image_size=16)
    assert small.images.shape == (4, 3, 16, 16)


def test_synthetic_train_and_test_are_independent_draws_of_the_same_classes():
    train, test = make_synthetic_train_test(4, train_per_class=6, test_per_class=3, seed=1)
    assert train.classes == test.classes and len(test) == 12
    assert torch.equal(train.class_ids, test.class_ids)
    flat_train = train.images.flatten(1)
    flat_test = test.images.flatten(1)
    # No test image is a copy of a train image.
    assert torch.cdist(flat_test.float(), flat_train.float()).min() > 0


def test_class_look_depends_only_on_seed_and_class_id():
    upstream, downstream = synthetic_class_split(6, 4)
    assert set(upstream.tolist()).isdisjoint(downstream.tolist())
    assert downstream.tolist() == [6, 7, 8, 9]
    # Class 7 generated inside two different class sets (no shuffling, same split name).
    alone = make_synthetic_dataset([7], 8, seed=0, shuffle=False, noise_std=0.0)
    mixed = make_synthetic_dataset([6, 7, 8], 8, seed=0, shuffle=False, noise_std=0.0)
    assert torch.equal(alone.images, mixed.images[mixed.targets == 1])


def test_synthetic_classes_are_separable_by_nearest_class_mean():
    train, test = make_synthetic_train_test(20, train_per_class=30, test_per_class=10, seed=0)
    x = train.images.flatten(1).float() / 255
    means = torch.zeros(20, x.shape[1]).index_add_(0, train.targets, x) / 30
    predictions = torch.cdist(test.images.flatten(1).float() / 255, means).argmin(1)
    accuracy = float((predictions == test.targets).float().mean())
    assert accuracy > 0.3, f"nearest-class-mean accuracy {accuracy:.2f} (chance 0.05)"


def test_synthetic_generation_is_fast_and_vectorised():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        start = time.perf_counter()
        ds = make_synthetic_dataset(100, 50, seed=0)
        elapsed = time.perf_counter() - start
    finally:
        torch.set_num_threads(threads)
    assert len(ds) == 5000
    # Typically about 1 s on one core; the bound only catches an accidental per-sample loop.
    assert elapsed < 15, f"generating 5000 images took {elapsed:.1f} s"


def test_synthetic_argument_validation():
    with pytest.raises(ValueError, match="distinct non-negative"):
        make_synthetic_dataset([1, 1], 2)
    with pytest.raises(InvalidParameterError, match="samples_per_class must be an int >= 1, got 0"):
        make_synthetic_dataset(2, 0)
    with pytest.raises(ValueError, match="at least 8 pixels"):
        make_synthetic_dataset(2, 2, image_size=4)
    with pytest.raises(ValueError, match="empty"):
        make_synthetic_dataset([], 2)
    with pytest.raises(InvalidParameterError, match="num_upstream must be an int >= 0, got -1"):
        synthetic_class_split(-1, 3)


def test_synthetic_images_use_the_value_range():
    ds = make_synthetic_dataset(10, 10, seed=2)
    pixels = ds.images.float() / 255
    assert 0.3 < float(pixels.mean()) < 0.7 and float(pixels.std()) > 0.1
    assert np.isfinite(ds.get_batch(torch.arange(10))[0].numpy()).all()
