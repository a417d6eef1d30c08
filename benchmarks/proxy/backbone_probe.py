"""Does the proxy pretraining matter? A linear probe on frozen features of the *downstream* classes.

    python -m benchmarks.proxy.backbone_probe              # pretrained vs random backbone vs raw pixels

The same probe -- a closed-form ridge classifier on standardised features, its ridge chosen on a
held-out fifth of the training images, then refitted on all of them -- is fitted on three inputs:
the committed proxy backbone's features (loaded through ``backbone_of``, the path real
pretrained weights take), the features of the same architecture randomly initialised, and the raw
pixels. The downstream classes are disjoint from the classes the backbone was pretrained on. The
script prints the test accuracies and the ratio pretrained / random, and exits with status 1 when the
ratio is below ``--min-ratio`` (2 by default).
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Dict, Optional, Sequence

import torch

from benchmarks.core.results import write_text_atomic
from benchmarks.flags import Parser, add_common_flag, add_flag, add_output_flag
from benchmarks.proxy.pretrain import (
    DATA_SEED,
    DEFAULT_OUTPUT,
    MODEL_KWARGS,
    MODEL_NAME,
    NOISE_STD,
    NUM_DOWNSTREAM,
    NUM_UPSTREAM,
)
from fly_modules._validation import Integer, Real

RIDGES = (1e-3, 1e-2, 1e-1, 1.0, 1e1, 1e2, 1e3, 1e4)


def ridge_probe(train_x: torch.Tensor, train_y: torch.Tensor, test_x: torch.Tensor, test_y: torch.Tensor,
                num_classes: int) -> Dict[str, float]:
    """Closed-form ridge regression onto one-hot targets; ridge picked on a held-out fifth of train."""
    mean, std = train_x.mean(0), train_x.std(0).clamp_min(1e-6)

    def prepare(x: torch.Tensor) -> torch.Tensor:
        x = ((x - mean) / std).double()
        return torch.cat([x, torch.ones(len(x), 1, dtype=x.dtype)], 1)

    def fit(x: torch.Tensor, y: torch.Tensor, ridge: float) -> torch.Tensor:
        targets = torch.nn.functional.one_hot(y, num_classes).double()
        gram = x.T @ x
        gram += ridge * torch.eye(gram.shape[0], dtype=gram.dtype)
        return torch.linalg.solve(gram, x.T @ targets)

    def accuracy(weights: torch.Tensor, x: torch.Tensor, y: torch.Tensor) -> float:
        return float(((x @ weights).argmax(1) == y).double().mean())

    x, xt = prepare(train_x), prepare(test_x)
    cut = len(x) * 4 // 5
    scores = {ridge: accuracy(fit(x[:cut], train_y[:cut], ridge), x[cut:], train_y[cut:]) for ridge in RIDGES}
    best = max(RIDGES, key=lambda r: (scores[r], r))
    return {"accuracy": accuracy(fit(x, train_y, best), xt, test_y), "ridge": best, "validation_accuracy": scores[best]}


@torch.no_grad()
def features(model: Optional[torch.nn.Module], images: torch.Tensor, batch_size: int = 500) -> torch.Tensor:
    if model is None:
        return images.flatten(1)
    model.eval()
    return torch.cat([model(images[i:i + batch_size]) for i in range(0, len(images), batch_size)])


def _display_path(path: str) -> str:
    """``path`` relative to the repository when it lies inside it (so the JSON is machine-independent)."""
    resolved = Path(path).resolve()
    repo = Path(__file__).resolve().parents[2]
    return str(resolved.relative_to(repo)) if resolved.is_relative_to(repo) else str(path)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = Parser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--weights", default=str(DEFAULT_OUTPUT), help="the proxy backbone (safetensors)")
    add_flag(parser, "--upstream-classes", Integer(minimum=0), default=NUM_UPSTREAM,
             help="downstream class ids start here (must match the pretraining)")
    add_flag(parser, "--classes", Integer(minimum=2), default=NUM_DOWNSTREAM, help="downstream classes probed")
    add_flag(parser, "--train-per-class", Integer(minimum=1), default=50, help="training images per class")
    add_flag(parser, "--test-per-class", Integer(minimum=1), default=20, help="test images per class")
    add_common_flag(parser, "threads", default=1)
    add_flag(parser, "--min-ratio", Real(above=0), default=2.0, help="the probe's accuracy over chance it must reach")
    add_output_flag(parser, "--output", "file", default=None, help="also write the numbers to this JSON file")
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)

    from benchmarks.backbone import backbone_of
    from benchmarks.core.protocol import Protocol
    from benchmarks.data import make_synthetic_train_test, synthetic_class_split

    started = time.perf_counter()
    _, downstream = synthetic_class_split(args.upstream_classes, args.classes)
    train, test = make_synthetic_train_test(
        downstream, train_per_class=args.train_per_class, test_per_class=args.test_per_class, seed=DATA_SEED,
        image_size=MODEL_KWARGS["img_size"], noise_std=NOISE_STD, difficulty="hard",
    )
    train_images, train_y = train.get_batch(torch.arange(len(train)))
    test_images, test_y = test.get_batch(torch.arange(len(test)))

    pretrained = backbone_of(Protocol(model=MODEL_NAME, model_kwargs=dict(MODEL_KWARGS), pretrained=True,
                                         weights=args.weights))
    torch.manual_seed(0)
    random = backbone_of(Protocol(model=MODEL_NAME, model_kwargs=dict(MODEL_KWARGS), pretrained=False))
    results: Dict[str, Dict[str, float]] = {}
    for name, model in (("pretrained", pretrained), ("random", random), ("pixels", None)):
        results[name] = ridge_probe(features(model, train_images), train_y, features(model, test_images), test_y,
                                    args.classes)
        print(f"{name:>10}: linear-probe test accuracy {100 * results[name]['accuracy']:.2f}% "
              f"(ridge {results[name]['ridge']:g})", flush=True)
    ratio = results["pretrained"]["accuracy"] / max(results["random"]["accuracy"], 1e-12)
    chance = 1 / args.classes
    print(f"pretrained / random = {ratio:.2f} (required >= {args.min_ratio:g}); chance {100 * chance:.2f}%; "
          f"{len(train)} train / {len(test)} test images of {args.classes} downstream classes; "
          f"{time.perf_counter() - started:.0f} s")
    if args.output:
        payload = {"results": results, "ratio": ratio, "chance": chance, "classes": args.classes,
                   "train_per_class": args.train_per_class, "test_per_class": args.test_per_class,
                   "weights": _display_path(args.weights), "command": "python -m benchmarks.proxy.backbone_probe " + " ".join(argv or sys.argv[1:])}
        write_text_atomic(args.output, json.dumps(payload, indent=2) + "\n")
    return 0 if ratio >= args.min_ratio else 1


if __name__ == "__main__":
    sys.exit(main())
