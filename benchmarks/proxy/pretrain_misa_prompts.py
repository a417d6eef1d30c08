"""Pretrain MISA's prompts for the CPU proxy by MISA's initial session adaptation (docs/methods.md).

    python -m benchmarks.proxy.pretrain_misa_prompts      # the committed prompts (about 15 CPU minutes, 1 thread)
    python -m benchmarks.proxy.pretrain_misa_prompts --quick --output /tmp/p.safetensors   # a few steps (tests)

MISA starts DualPrompt from a G-prompt and an E-prompt pool adapted beforehand on data of the backbone's
own pretraining, never the continual stream's. Here that data is the proxy backbone's pretraining classes
(generated classes 0..399): the first nine tenths form a stream of ten sessions of disjoint classes, the
last tenth are the held-out classes whose batches drive the forgetting-aware update. The proxy backbone
(benchmarks/proxy/weights/proxy_vit.safetensors) stays frozen. Deterministic for a command line and a
thread count. Writes the two prompt tensors as safetensors (``g_prompt``, ``e_prompt``) and a JSON sidecar
with the command, the settings, the SHA-256 of the file and of the backbone, and what the run reached.
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from functools import partial
from pathlib import Path
from typing import Any, Dict, List, Optional, Sequence

import torch

from benchmarks.flags import Parser, add_common_flag, add_flag, add_output_flag
from benchmarks.proxy.pretrain import (
    DATA_SEED,
    MODEL_KWARGS,
    MODEL_NAME,
    NOISE_STD,
    NUM_UPSTREAM,
    augment,
    sha256_file,
)
from benchmarks.proxy.pretrain import DEFAULT_OUTPUT as BACKBONE
from fly_modules._validation import Integer, Real

DEFAULT_OUTPUT = BACKBONE.with_name("proxy_misa_prompts.safetensors")
#: MISA's prompt layout (its DualPrompt with --load_pt): G at blocks 0-1, E at 2-4, a pool of 10.
LAYOUT: Dict[str, Any] = dict(g_prompt_layers=[0, 1], g_prompt_length=10, e_prompt_layers=[2, 3, 4],
                              e_prompt_length=20, pool_size=10)


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(description=__doc__.split("\n\n")[0], formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_flag(parser, "--classes", Integer(minimum=2), default=NUM_UPSTREAM, help="pretraining classes 0..N-1 used")
    add_flag(parser, "--held-out-classes", Integer(minimum=1), default=NUM_UPSTREAM // 10,
             help="the last of them, drawn from for the forgetting-aware update, never streamed")
    add_flag(parser, "--draw-classes", Integer(minimum=1), default=10, help="held-out classes per draw")
    add_flag(parser, "--sessions", Integer(minimum=1), default=10, help="sessions of the stream")
    add_flag(parser, "--train-per-class", Integer(minimum=1), default=32, help="training images per class")
    add_flag(parser, "--test-per-class", Integer(minimum=1), default=5, help="test images per class")
    add_flag(parser, "--epochs", Integer(minimum=1), default=3, help="passes over each session's images")
    add_flag(parser, "--online-iter", Integer(minimum=1), default=3, help="updates per stream batch")
    add_flag(parser, "--batch-size", Integer(minimum=1), default=16, help="images per stream batch")
    add_flag(parser, "--lr", Real(above=0), default=5e-3, help="learning rate of the prompts")
    add_flag(parser, "--rho", Real(minimum=0), default=0.1, help="radius of the forgetting-aware move")
    add_common_flag(parser, "seed", default=0, help="seed of the prompts, the stream, draws and augmentation")
    add_common_flag(parser, "threads", default=1, help="torch intra-op threads (part of the determinism)")
    parser.add_argument("--backbone", default=str(BACKBONE), help="the proxy backbone (safetensors)")
    add_output_flag(parser, "--output", "file", default=str(DEFAULT_OUTPUT),
                    help="safetensors file (a .json sidecar goes next to it)")
    parser.add_argument("--quick", action="store_true", help="a few steps on a few classes (end-to-end check)")
    parser.add_argument("--no-progress", action="store_true")
    return parser


class HeldOutBatches:
    """Batches of the held-out classes, ``draw`` classes at a time: their images in a random order; once
    used up, the same classes again with probability 1/3, otherwise ``draw`` newly drawn classes (MISA's rule)."""

    def __init__(self, images: torch.Tensor, targets: torch.Tensor, classes: torch.Tensor, *, draw: int,
                 batch_size: int, generator: torch.Generator) -> None:
        self.images, self.targets, self.classes = images, targets, classes
        self.draw, self.batch_size, self.generator = min(draw, len(classes)), batch_size, generator
        self.drawn = self._draw()
        self.order, self.position = self._order(), 0

    def _draw(self) -> torch.Tensor:
        return self.classes[torch.randperm(len(self.classes), generator=self.generator)[: self.draw]]

    def _order(self) -> torch.Tensor:
        index = torch.nonzero(torch.isin(self.targets, self.drawn)).flatten()
        return index[torch.randperm(len(index), generator=self.generator)]

    def next(self) -> torch.Tensor:
        """Indices of the next batch."""
        if self.position >= len(self.order):
            if float(torch.rand((), generator=self.generator)) <= 0.67:
                self.drawn = self._draw()
            self.order, self.position = self._order(), 0
        batch = self.order[self.position:self.position + self.batch_size]
        self.position += self.batch_size
        return batch


class Adaptation:
    """The adaptation run: the model, its update, the seen-class mask and the data."""

    def __init__(self, args: argparse.Namespace, backbone: torch.nn.Module, data: Dict[str, torch.Tensor]) -> None:
        from benchmarks.methods.misa_adaptation import ForgettingAwareStep, SessionAdaptation

        torch.manual_seed(args.seed)
        self.model = SessionAdaptation(backbone, args.classes, pool_size=LAYOUT["pool_size"],
                                       g_prompt_length=LAYOUT["g_prompt_length"],
                                       e_prompt_length=LAYOUT["e_prompt_length"])
        self.initial = self.model.adapted_prompts()
        parameters = self.model.trainable_parameters()
        self.update = ForgettingAwareStep(parameters, torch.optim.Adam(parameters, lr=args.lr), rho=args.rho)
        self.mask = torch.full((args.classes,), float("-inf"))
        self.args, self.data = args, data
        self.generator = torch.Generator().manual_seed(args.seed)
        held_out = torch.arange(args.classes - args.held_out_classes, args.classes)
        self.held_out = HeldOutBatches(data["train_images"], data["train_targets"], held_out, draw=args.draw_classes,
                                       batch_size=args.batch_size, generator=self.generator)

    def _loss(self, index: torch.Tensor, augmentations: int) -> torch.Tensor:
        images, targets = self.data["train_images"][index], self.data["train_targets"][index]
        for _ in range(augmentations):
            images = augment(images, self.generator)
        self.mask[targets] = 0.0  # classes seen so far, the held-out ones drawn included
        return self.model.loss(self.model(images), targets, self.mask)

    def session(self, classes: torch.Tensor) -> Dict[str, float]:
        """Every epoch over the session's images in batches; ``online_iter`` updates per batch."""
        args = self.args
        index = torch.nonzero(torch.isin(self.data["train_targets"], classes)).flatten()
        totals, updates = [0.0, 0.0], 0
        self.model.train()
        for _ in range(args.epochs):
            order = index[torch.randperm(len(index), generator=self.generator)]
            for start in range(0, len(order), args.batch_size):
                batch = order[start:start + args.batch_size]
                self.mask[self.data["train_targets"][batch]] = 0.0  # exposed before the held-out batch is
                for _ in range(args.online_iter):
                    held_out = self.held_out.next()
                    # The held-out batch gets the augmentation twice, as MISA's gets its policy twice.
                    losses = self.update.step(partial(self._loss, held_out, 2), partial(self._loss, batch, 1))
                    totals = [totals[0] + losses[0], totals[1] + losses[1]]
                    updates += 1
        return {"updates": updates, "held_out_loss": totals[0] / max(updates, 1),
                "train_loss": totals[1] / max(updates, 1)}

    @torch.no_grad()
    def accuracy(self, classes: torch.Tensor) -> float:
        """Top-1 on the test images of ``classes``, over every output (no mask)."""
        self.model.eval()
        keep = torch.isin(self.data["test_targets"], classes)
        images, targets = self.data["test_images"][keep], self.data["test_targets"][keep]
        correct = sum(int((self.model.predict(images[s:s + 256]).argmax(1) == targets[s:s + 256]).sum())
                      for s in range(0, len(targets), 256))
        self.model.train()
        return correct / max(len(targets), 1)


def load_data(args: argparse.Namespace) -> Dict[str, torch.Tensor]:
    from benchmarks.data import make_synthetic_train_test

    train, test = make_synthetic_train_test(
        torch.arange(args.classes), train_per_class=args.train_per_class, test_per_class=args.test_per_class,
        seed=DATA_SEED, image_size=MODEL_KWARGS["img_size"], noise_std=NOISE_STD, difficulty="hard",
    )
    train_images, train_targets = train.get_batch(torch.arange(len(train)))
    test_images, test_targets = test.get_batch(torch.arange(len(test)))
    return {"train_images": train_images, "train_targets": train_targets, "test_images": test_images,
            "test_targets": test_targets}


def load_backbone(path: str) -> torch.nn.Module:
    from benchmarks.backbone import backbone_of
    from benchmarks.core.protocol import Protocol

    return backbone_of(Protocol(model=MODEL_NAME, model_kwargs=dict(MODEL_KWARGS), pretrained=True, weights=path))


def check_arguments(args: argparse.Namespace) -> None:
    streamed = args.classes - args.held_out_classes
    if not 0 < args.held_out_classes < args.classes or streamed < args.sessions or args.classes > NUM_UPSTREAM:
        raise SystemExit(f"error: expected 0 < --held-out-classes < --classes <= {NUM_UPSTREAM} and at least "
                         f"--sessions ({args.sessions}) streamed classes, got --classes {args.classes} "
                         f"--held-out-classes {args.held_out_classes}")


def run(args: argparse.Namespace) -> Dict[str, Any]:
    """Train; the sidecar's measured part (history, accuracies, prompt statistics)."""
    started = time.perf_counter()
    data = load_data(args)
    adaptation = Adaptation(args, load_backbone(args.backbone), data)
    streamed = args.classes - args.held_out_classes
    order = torch.randperm(streamed, generator=adaptation.generator)
    sessions = torch.tensor_split(order, args.sessions)
    history: List[Dict[str, Any]] = []
    for number, classes in enumerate(sessions):
        record = adaptation.session(classes)
        record.update(session=number + 1, classes=len(classes), elapsed_seconds=time.perf_counter() - started)
        history.append(record)
        if not args.no_progress:
            print(f"session {number + 1}/{args.sessions}: {record['updates']} updates, training loss "
                  f"{record['train_loss']:.3f}, held-out loss {record['held_out_loss']:.3f} "
                  f"({record['elapsed_seconds']:.0f} s)", flush=True)
    prompts = adaptation.model.adapted_prompts()
    moved = {name: float((prompts[name] - adaptation.initial[name]).abs().mean()) for name in prompts}
    return {
        "prompts": prompts,
        "history": history,
        "streamed_test_accuracy": adaptation.accuracy(torch.arange(streamed)),
        "first_session_test_accuracy": adaptation.accuracy(sessions[0]),
        "prompt_std": {name: float(tensor.std()) for name, tensor in prompts.items()},
        "mean_abs_change_from_initial": moved,
    }


def sidecar(args: argparse.Namespace, argv: Sequence[str], output: Path, result: Dict[str, Any],
            seconds: Dict[str, float]) -> Dict[str, Any]:
    import timm

    streamed = args.classes - args.held_out_classes
    shapes = {name: list(tensor.shape) for name, tensor in result["prompts"].items()}
    return {
        "file": output.name, "sha256": sha256_file(output), "bytes": output.stat().st_size,
        "command": "python -m benchmarks.proxy.pretrain_misa_prompts" + "".join(f" {shlex.quote(a)}" for a in argv),
        "tensors": shapes, "layout": LAYOUT,
        "backbone": {"file": Path(args.backbone).name, "sha256": sha256_file(Path(args.backbone)),
                     "model": MODEL_NAME, "model_kwargs": MODEL_KWARGS},
        "data": {"generator": "benchmarks.data.make_synthetic_train_test", "difficulty": "hard", "seed": DATA_SEED,
                 "noise_std": NOISE_STD, "streamed_class_ids": [0, streamed - 1],
                 "held_out_class_ids": [streamed, args.classes - 1], "train_per_class": args.train_per_class,
                 "test_per_class": args.test_per_class},
        "training": {"sessions": args.sessions, "epochs": args.epochs, "online_iter": args.online_iter,
                     "batch_size": args.batch_size, "optimizer": "Adam", "lr": args.lr, "schedule": "constant",
                     "update": "forgetting-aware minimisation", "rho": args.rho, "draw_classes": args.draw_classes,
                     "augmentation": "random crop (pad 4) + horizontal flip; held-out batches twice",
                     "trained": "G-prompt, E-prompts, E-keys, E-projector, head (only the prompts are kept)",
                     "e_prompt": "the E-prompt pool with the projector folded in (e + projector(e))",
                     "seed": args.seed, "threads": args.threads,
                     "updates": sum(record["updates"] for record in result["history"])},
        "history": result["history"],
        "reached": {key: result[key] for key in ("streamed_test_accuracy", "first_session_test_accuracy",
                                                   "prompt_std", "mean_abs_change_from_initial")},
        **seconds, "torch": torch.__version__, "timm": timm.__version__, "quick": args.quick,
    }


def main(argv: Optional[Sequence[str]] = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if args.quick:
        args.classes, args.held_out_classes, args.draw_classes, args.sessions = 12, 4, 2, 2
        args.train_per_class, args.test_per_class, args.epochs, args.online_iter = 4, 2, 1, 1
    check_arguments(args)
    from safetensors.torch import save_file

    torch.set_num_threads(args.threads)
    torch.use_deterministic_algorithms(True)
    started, cpu_started = time.perf_counter(), time.process_time()
    result = run(args)
    output = Path(args.output)
    output.parent.mkdir(parents=True, exist_ok=True)
    save_file(result["prompts"], str(output))  # no metadata: the sidecar has it all
    seconds = {"wall_seconds": time.perf_counter() - started, "cpu_seconds": time.process_time() - cpu_started}
    record = sidecar(args, argv, output, result, seconds)
    output.with_suffix(".json").write_text(json.dumps(record, indent=2) + "\n")
    print(f"saved {output}: streamed-class test accuracy {100 * record['reached']['streamed_test_accuracy']:.2f}%, "
          f"wall {seconds['wall_seconds']:.0f} s, CPU {seconds['cpu_seconds']:.0f} s")
    print(f"sha256 {record['sha256']}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
