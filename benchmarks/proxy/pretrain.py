"""Pretrain the CPU proxy backbone: a tiny timm ViT on the *upstream* classes of the hard generated data.

    python -m benchmarks.proxy.pretrain            # the committed checkpoint (about 40 CPU minutes, 1 thread)
    python -m benchmarks.proxy.pretrain --quick --output /tmp/proxy_vit.safetensors   # a few steps (tests)

The proxy benchmark (``cross_ablation.py --preset proxy``) stands in for the paper's setting -- a
pretrained, frozen ViT and a continual stream of classes it has never seen -- at a scale a CPU can
run: classes ``0..U-1`` of ``make_synthetic_dataset(..., difficulty="hard")`` pretrain the backbone
here, classes ``U..U+D-1`` (disjoint, :func:`benchmarks.data.synthetic_class_split`) form the stream.

Training is deterministic for a given command line and thread count: seeded model initialisation,
data, shuffling and augmentation, ``torch.use_deterministic_algorithms(True)`` and a fixed number of
intra-op threads (``--threads``). The result is the backbone *without* its classifier head, saved as
safetensors (loadable by ``timm.create_model(..., num_classes=0, pretrained=True,
pretrained_cfg_overlay=dict(file=...))``, the path ``backbone_of`` takes for real weights),
plus a JSON sidecar with its SHA-256, the command, the model and data settings, the upstream accuracy
and the wall time.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import shlex
import sys
import time
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import torch
import torch.nn.functional as F

from benchmarks.flags import Parser, add_common_flag, add_flag, add_output_flag
from fly_modules._validation import Integer, Real

REPO = Path(__file__).resolve().parents[2]
DEFAULT_OUTPUT = REPO / "benchmarks" / "proxy" / "weights" / "proxy_vit.safetensors"
#: The proxy backbone: a standard timm VisionTransformer (vit_tiny_patch16_224 family) on 32x32 images.
MODEL_NAME = "vit_tiny_patch16_224"
MODEL_KWARGS: Dict[str, Any] = dict(img_size=32, patch_size=8, embed_dim=128, depth=6, num_heads=4)
#: The proxy data: hard generated images, upstream classes 0..U-1, downstream U..U+D-1.
DATA_SEED = 0
NUM_UPSTREAM = 400
NUM_DOWNSTREAM = 100
NOISE_STD = 0.06


def sha256_file(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as stream:
        for block in iter(lambda: stream.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_flag(parser, "--upstream-classes", Integer(minimum=2), default=NUM_UPSTREAM, help="pretraining classes")
    add_flag(parser, "--train-per-class", Integer(minimum=1), default=120, help="training images per class")
    add_flag(parser, "--test-per-class", Integer(minimum=1), default=10, help="test images per class")
    add_flag(parser, "--epochs", Integer(minimum=1), default=20, help="passes over the training images")
    add_flag(parser, "--batch-size", Integer(minimum=1), default=128, help="images per step")
    add_flag(parser, "--lr", Real(above=0), default=1e-3, help="peak AdamW learning rate")
    add_flag(parser, "--weight-decay", Real(minimum=0), default=0.05, help="AdamW weight decay")
    add_flag(parser, "--warmup-steps", Integer(minimum=0), default=300, help="steps of the linear warm-up")
    add_flag(parser, "--label-smoothing", Real(minimum=0, below=1), default=0.1, help="label smoothing of the loss")
    add_common_flag(parser, "seed", default=0, help="seed of the initialisation, shuffling and augmentation")
    add_common_flag(parser, "threads", default=1,
                    help="torch intra-op threads (part of the determinism; 1 is fastest on a shared 2-core box)")
    add_output_flag(parser, "--output", "file", default=str(DEFAULT_OUTPUT),
                    help="safetensors file (a .json sidecar goes next to it)")
    parser.add_argument("--quick", action="store_true",
                        help="a few steps on a few classes (end-to-end check, not a usable backbone)")
    parser.add_argument("--no-progress", action="store_true")
    return parser


def augment(images: torch.Tensor, generator: torch.Generator, pad: int = 4) -> torch.Tensor:
    """Per-sample random crop (zero padding ``pad``) and horizontal flip of a normalised float batch."""
    n, _, h, w = images.shape
    padded = F.pad(images, (pad, pad, pad, pad))
    dx = torch.randint(0, 2 * pad + 1, (n,), generator=generator)
    dy = torch.randint(0, 2 * pad + 1, (n,), generator=generator)
    flip = torch.rand(n, generator=generator) < 0.5
    rows = (dy.view(n, 1) + torch.arange(h).view(1, h)).view(n, 1, h, 1).expand(n, 3, h, w + 2 * pad)
    out = padded.gather(2, rows)
    cols = (dx.view(n, 1) + torch.arange(w).view(1, w)).view(n, 1, 1, w).expand(n, 3, h, w)
    out = out.gather(3, cols)
    return torch.where(flip.view(n, 1, 1, 1), out.flip(3), out)


@torch.no_grad()
def evaluate(model: torch.nn.Module, images: torch.Tensor, targets: torch.Tensor, batch_size: int = 512) -> float:
    model.eval()
    correct = 0
    for start in range(0, len(targets), batch_size):
        correct += int((model(images[start:start + batch_size]).argmax(1) == targets[start:start + batch_size]).sum())
    model.train()
    return correct / max(len(targets), 1)


def backbone_state(model: torch.nn.Module) -> Dict[str, torch.Tensor]:
    """The state dict without the classifier head (what ``num_classes=0`` models expect)."""
    return {k: v.detach().clone().contiguous() for k, v in model.state_dict().items() if not k.startswith("head.")}


def make_optimizer(model: torch.nn.Module, lr: float, weight_decay: float) -> torch.optim.AdamW:
    """AdamW with weight decay on the matrices but not on the position embedding, biases and norms."""
    decay = [p for n, p in model.named_parameters() if p.ndim > 1 and "pos_embed" not in n]
    no_decay = [p for n, p in model.named_parameters() if not (p.ndim > 1 and "pos_embed" not in n)]
    return torch.optim.AdamW([{"params": decay, "weight_decay": weight_decay},
                              {"params": no_decay, "weight_decay": 0.0}], lr=lr)


class WarmupCosine:
    """The learning rate of a step: linear warm-up over ``warmup_steps``, then cosine to zero at ``total_steps``."""

    def __init__(self, lr: float, warmup_steps: int, total_steps: int) -> None:
        self.lr, self.warmup_steps, self.total_steps = lr, warmup_steps, total_steps

    def __call__(self, step: int) -> float:
        if step < self.warmup_steps:
            return self.lr * (step + 1) / self.warmup_steps
        progress = (step - self.warmup_steps) / max(self.total_steps - self.warmup_steps, 1)
        return self.lr * 0.5 * (1 + math.cos(math.pi * progress))


class UpstreamImages:
    """The upstream classes' training and test images as whole tensors, and the downstream classes' ids."""

    def __init__(self, args: argparse.Namespace) -> None:
        from benchmarks.data import make_synthetic_train_test, synthetic_class_split

        upstream, self.downstream = synthetic_class_split(args.upstream_classes, NUM_DOWNSTREAM)
        train, test = make_synthetic_train_test(
            upstream, train_per_class=args.train_per_class, test_per_class=args.test_per_class, seed=DATA_SEED,
            image_size=MODEL_KWARGS["img_size"], noise_std=NOISE_STD, difficulty="hard",
        )
        self.train_images, self.train_targets = train.get_batch(torch.arange(len(train)))
        self.test_images, self.test_targets = test.get_batch(torch.arange(len(test)))
        self.train_size, self.test_size = len(train), len(test)


class Pretraining:
    """The model, its optimizer and schedule, the generator of the shuffling and augmentation, the step
    counter and the progress bar (``None`` with ``--no-progress`` or without tqdm)."""

    def __init__(self, args: argparse.Namespace, model: torch.nn.Module, data: UpstreamImages) -> None:
        self.args, self.model, self.data = args, model, data
        self.optimizer = make_optimizer(model, args.lr, args.weight_decay)
        self.total_steps = math.ceil(data.train_size / args.batch_size) * args.epochs
        self.lr_at = WarmupCosine(args.lr, args.warmup_steps, self.total_steps)
        self.generator = torch.Generator().manual_seed(args.seed)
        self.bar = None if args.no_progress else progress_bar(self.total_steps)
        self.step = 0

    def train_step(self, index: torch.Tensor) -> float:
        """One optimizer step on the augmented images of ``index``; the batch's loss."""
        images = augment(self.data.train_images[index], self.generator)
        for group in self.optimizer.param_groups:
            group["lr"] = self.lr_at(self.step)
        loss = F.cross_entropy(self.model(images), self.data.train_targets[index],
                               label_smoothing=self.args.label_smoothing)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        self.optimizer.step()
        self.step += 1
        return loss.item()

    def run_epoch(self, epoch: int) -> float:
        """One shuffled pass over the training images; the mean training loss."""
        order = torch.randperm(self.data.train_size, generator=self.generator)
        running, seen = 0.0, 0
        for start in range(0, len(order), self.args.batch_size):
            index = order[start:start + self.args.batch_size]
            running += self.train_step(index) * len(index)
            seen += len(index)
            if self.bar is not None:
                self.bar.update(1)
                self.bar.set_postfix(epoch=epoch, loss=f"{running / seen:.3f}")
        return running / seen

    def run(self, started: float) -> List[Dict[str, Any]]:
        """Every epoch, each followed by the upstream test accuracy; the per-epoch history."""
        history = []
        self.model.train()
        for epoch in range(self.args.epochs):
            loss = self.run_epoch(epoch)
            accuracy = evaluate(self.model, self.data.test_images, self.data.test_targets)
            history.append({"epoch": epoch + 1, "train_loss": loss, "upstream_test_accuracy": accuracy,
                            "elapsed_seconds": time.perf_counter() - started})
            message = (f"epoch {epoch + 1}/{self.args.epochs}: train loss {loss:.3f}, upstream test accuracy "
                       f"{100 * accuracy:.2f}% ({time.perf_counter() - started:.0f} s)")
            (self.bar.write if self.bar is not None else print)(message)
        if self.bar is not None:
            self.bar.close()
        return history


def progress_bar(total_steps: int) -> Any:
    """A tqdm bar over the steps, or ``None`` without tqdm."""
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return None
    return tqdm(total=total_steps, desc="pretrain", mininterval=30)


def use_quick_sizes(args: argparse.Namespace) -> None:
    """With --quick: a few steps on a few classes."""
    if args.quick:
        args.upstream_classes, args.train_per_class, args.test_per_class = 8, 8, 2
        args.epochs, args.batch_size, args.warmup_steps = 1, 16, 1


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    import timm
    from safetensors.torch import save_file

    use_quick_sizes(args)
    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    started, cpu_started = time.perf_counter(), time.process_time()
    data = UpstreamImages(args)
    data_seconds = time.perf_counter() - started
    print(f"data: {data.train_size} train / {data.test_size} test images of {args.upstream_classes} upstream classes "
          f"({data_seconds:.0f} s)", flush=True)

    torch.manual_seed(args.seed)
    model = timm.create_model(MODEL_NAME, pretrained=False, num_classes=args.upstream_classes, **MODEL_KWARGS)
    training = Pretraining(args, model, data)
    history = training.run(started)
    train_accuracy = evaluate(model, data.train_images[:data.test_size], data.train_targets[:data.test_size])
    wall_seconds = time.perf_counter() - started
    cpu_seconds = time.process_time() - cpu_started

    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    # No safetensors metadata: its header order is not stable across processes (the sidecar has it all).
    save_file(backbone_state(model), str(output))
    digest = sha256_file(output)
    sidecar = {
        "file": output.name, "sha256": digest, "bytes": output.stat().st_size,
        "command": "python -m benchmarks.proxy.pretrain" + "".join(f" {shlex.quote(a)}" for a in argv),
        **run_settings(args, data, training.total_steps),
        "history": history,
        "upstream_test_accuracy": history[-1]["upstream_test_accuracy"] if history else None,
        "upstream_train_accuracy_subset": train_accuracy,
        "wall_seconds": wall_seconds, "cpu_seconds": cpu_seconds,
        "torch": torch.__version__, "timm": timm.__version__, "quick": args.quick,
    }
    output.with_suffix(".json").write_text(json.dumps(sidecar, indent=2) + "\n")
    print(f"saved {output} ({output.stat().st_size / 2**20:.2f} MiB), upstream test accuracy "
          f"{100 * sidecar['upstream_test_accuracy']:.2f}%, wall {wall_seconds:.0f} s, CPU {cpu_seconds:.0f} s")
    print(f"sha256 {digest}")
    return 0


def run_settings(args: argparse.Namespace, data: UpstreamImages, total_steps: int) -> Dict[str, Any]:
    """The sidecar's model, data and training settings."""
    return {
        "model": MODEL_NAME,
        "model_kwargs": MODEL_KWARGS,
        "num_classes": 0,
        "data": {
            "generator": "benchmarks.data.make_synthetic_train_test",
            "difficulty": "hard", "seed": DATA_SEED, "noise_std": NOISE_STD,
            "image_size": MODEL_KWARGS["img_size"],
            "upstream_class_ids": [0, args.upstream_classes - 1],
            "downstream_class_ids": [int(data.downstream[0]), int(data.downstream[-1])],
            "train_per_class": args.train_per_class, "test_per_class": args.test_per_class,
        },
        "training": {
            "epochs": args.epochs, "batch_size": args.batch_size, "optimizer": "AdamW", "lr": args.lr,
            "weight_decay": args.weight_decay, "warmup_steps": args.warmup_steps, "schedule": "cosine",
            "label_smoothing": args.label_smoothing, "augmentation": "random crop (pad 4) + horizontal flip",
            "seed": args.seed, "threads": args.threads, "steps": total_steps,
        },
    }


if __name__ == "__main__":
    sys.exit(main())
