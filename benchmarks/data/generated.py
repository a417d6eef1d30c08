"""The generated image dataset of the CPU proxy benchmark (docs/proxy.md).

Each class is a fixed composition of a textured background and coloured shapes; samples vary in
pose, scale, colour, clutter and noise. A class's look depends only on ``(seed, class id)``, so
disjoint "upstream" (pretraining) and "downstream" (continual) class sets come from disjoint id
ranges (:func:`synthetic_class_split`), each with its own held-out test split. ``difficulty="hard"``
builds every class from a shared library of parts and colours, draws the background colour per
sample, varies pose and colour more and adds distractors made of the same parts, so that neither
colour statistics nor a linear probe on pixels separate the classes well.
"""

from __future__ import annotations

import hashlib
import math
from typing import Dict, Sequence, Tuple, Union

import torch
from torch import Tensor

from fly_modules._validation import check_int

from .records import (
    AUTOAUGMENT_POLICY,
    DATASET_STATS,
    TensorImageDataset,
    _check_image_size,
)

__all__ = ["SyntheticImageDataset", "synthetic_class_split", "make_synthetic_dataset", "make_synthetic_train_test"]

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
    num_upstream = check_int(num_upstream, "num_upstream", caller="synthetic_class_split", minimum=0)
    num_downstream = check_int(num_downstream, "num_downstream", caller="synthetic_class_split", minimum=0)
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
    ids = _class_id_tensor(class_ids)
    samples_per_class = check_int(samples_per_class, "samples_per_class", caller="make_synthetic_dataset", minimum=1)
    image_size = _check_image_size(image_size)
    if image_size < 8:
        raise ValueError(f"image_size must be at least 8 pixels to draw shapes, got {image_size}")

    if difficulty not in ("standard", "hard"):
        raise ValueError(f"difficulty must be 'standard' or 'hard', got {difficulty!r}")

    per_sample_recipe, variation, sample_class = _draw_samples(ids, samples_per_class, seed, split, difficulty)
    noise_key = ("synthetic-noise",) if difficulty == "standard" else ("synthetic-hard-noise",)
    noise_generator = torch.Generator().manual_seed(_derived_seed(*noise_key, seed, split, ids.tolist()))
    total = int(sample_class.numel())
    images = _render_in_chunks(per_sample_recipe, variation, total, image_size, noise_std, noise_generator, chunk_size)

    targets = sample_class
    if shuffle:
        order_generator = torch.Generator().manual_seed(_derived_seed("synthetic-order", seed, split))
        order = torch.randperm(total, generator=order_generator)
        images, targets = images[order], targets[order]
    return SyntheticImageDataset(images, targets, ids.clone(), seed=seed, split=split)


def _render_in_chunks(per_sample_recipe: Dict[str, Tensor], variation: Dict[str, Tensor], total: int,
                      image_size: int, noise_std: float, noise_generator: torch.Generator, chunk_size: int) -> Tensor:
    """The ``total`` samples rendered as uint8, ``chunk_size`` at a time (bounds memory), the noise drawn chunk
    by chunk."""
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
    return images


def _class_id_tensor(class_ids: Union[int, Sequence[int], Tensor]) -> Tensor:
    """``class_ids`` as a flat long tensor (an int ``K``: ``0..K-1``), checked distinct and non-negative."""
    if isinstance(class_ids, int) and not isinstance(class_ids, bool):
        class_ids = torch.arange(class_ids)
    ids = torch.as_tensor(class_ids, dtype=torch.long).reshape(-1)
    if ids.numel() == 0:
        raise ValueError("class_ids is empty; a dataset needs at least one class")
    if int(ids.min()) < 0 or torch.unique(ids).numel() != ids.numel():
        raise ValueError("class_ids must be distinct non-negative ints")
    return ids


def _draw_samples(ids: Tensor, samples_per_class: int, seed: int, split: str,
                  difficulty: str) -> Tuple[Dict[str, Tensor], Dict[str, Tensor], Tensor]:
    """Each sample's class recipe and its own variation, and its class's position in ``ids``, in class order.

    The parameters are drawn per class (a loop over classes, each drawing all its samples at once).
    """
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
    return per_sample_recipe, variation, sample_class


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
