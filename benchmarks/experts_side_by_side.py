"""HiDe-LoRA, HiDe-Adapter and SD-LoRA side by side with the official code: the same initial weights,
the same batches, each side's own training step; the weights after the stream and the predictions on
a test batch are compared.

``python -m benchmarks.experts_side_by_side --reference-repo PATH`` with ``PATH`` a checkout of
AnAppleCore/FlyGCL (read-only; loaded as ``benchmarks.speed.reference_checkout`` loads it: imported in
memory, never copied, random ViT weights of a small shape). The official side is its model and its
trainer (``online_step``, ``online_after_task``; its own prediction functions); ours is the reference
method with the loop's calls (``on_expert_start``, forward, ``loss``, Adam, ``on_session_end``,
``predict``). Exit status 0 when every method's weights agree within ``--atol`` and every prediction
(and HiDe's task identification) is equal.
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import sys
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

from fly_modules import batch_seen_class_mask, seen_class_mask

from .methods import create_method
from .speed import reference_checkout as rc

__all__ = ["OFFICIAL", "Stream", "compare", "main"]

#: method -> (model module, model class, trainer module, trainer class) of the official code
OFFICIAL: Dict[str, Tuple[str, str, str, str]] = {
    "hide-lora": ("hide_lora_vit", "HiDeLoRAModel", "hide_norga_trainer", "HiDeGCLTrainer"),
    "hide-adapter": ("hide_adapter_vit", "HiDeAdapterModel", "hide_norga_trainer", "HiDeGCLTrainer"),
    "sd-lora": ("sdlora", "SDLoRAModel", "sdlora", "SDLoRAGCL"),
}
SHAPE = "micro"
RANK, ALPHA, LAYERS = 2, 0.8, 3  # the official keyword names: sdlora_rank, sdlora_alpha, num_*_layers
CA = dict(samples=4, steps=5, batch=8)


# --------------------------------------------------------------------------------- checkout
@contextlib.contextmanager
def official_classes(path: str) -> Iterator[Dict[str, Tuple[type, type]]]:
    """``method -> (model class, trainer class)`` imported from the checkout at ``path``, and its
    ``models.vit`` under the key ``"vit"``; the checkout's modules leave ``sys.modules`` afterwards."""
    root = Path(path).resolve()
    saved = {n: sys.modules.pop(n) for n in list(sys.modules) if n.split(".")[0] in rc._TOP_LEVEL}
    sys.path.insert(0, str(root))
    try:
        methods = type(sys)("methods")
        methods.__path__ = [str(root / "methods")]
        sys.modules["methods"] = methods
        sys.modules["datasets"] = rc._stand_in("datasets", {"__all__": []})
        importlib.import_module("utils")
        sys.modules["utils.data_loader"] = rc._stand_in("utils.data_loader", {"get_statistics": rc._no_data})
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            classes: Dict[str, Any] = {"vit": importlib.import_module("models.vit")}
            for method, (model_module, model_class, trainer_module, trainer_class) in OFFICIAL.items():
                classes[method] = (getattr(importlib.import_module(f"models.{model_module}"), model_class),
                                   getattr(importlib.import_module(f"methods.{trainer_module}"), trainer_class))
        yield classes
    finally:
        sys.path.remove(str(root))
        for name in [n for n in sys.modules if n.split(".")[0] in rc._TOP_LEVEL]:
            del sys.modules[name]
        sys.modules.update(saved)


@contextlib.contextmanager
def _random_vit(vit: Any) -> Iterator[str]:
    name, shape = "bench_vit_side_by_side", rc.VIT_PRESETS[SHAPE]
    setattr(vit, name, lambda pretrained=False, **kwargs: vit.VisionTransformer(**shape, **kwargs))
    try:
        yield name
    finally:
        delattr(vit, name)


def build_official(classes: Dict[str, Any], method: str, num_classes: int, tasks: int) -> nn.Module:
    model_class = classes[method][0]
    with _random_vit(classes["vit"]) as backbone:
        if method == "sd-lora":
            return model_class(task_num=tasks, num_classes=num_classes, backbone_name=backbone, sdlora_rank=RANK,
                               sdlora_alpha=ALPHA, sdlora_layers=",".join(map(str, range(LAYERS))))
        layers = {"hide-lora": "num_lora_layers", "hide-adapter": "num_adapter_layers"}[method]
        return model_class(backbone_name=backbone, num_classes=num_classes, task_num=tasks, pretrained=True,
                           sdlora_rank=RANK, sdlora_alpha=ALPHA, **{layers: LAYERS})


def official_trainer(classes: Dict[str, Any], method: str, model: nn.Module, *, lr: float, num_classes: int,
                     online_iter: int) -> Any:
    """The official trainer around ``model``, with the attributes its setup would give it (no data)."""
    trainer_class = classes[method][1]
    base = trainer_class.__mro__[[c.__name__ for c in trainer_class.__mro__].index("_Trainer")]
    with rc._patched(base, "__init__", lambda self, *args, **kwargs: None):
        trainer = trainer_class()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=0)
    trainer.__dict__.update(
        model=model, model_without_ddp=model, device=torch.device("cpu"), use_amp=False, n_classes=num_classes,
        exposed_classes=[], mask=torch.zeros(num_classes) - torch.inf, topk=1, no_batchmask=False,
        distributed=False, train_transform=rc._identity, test_transform_tensor=rc._identity, optimizer=optimizer,
        scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1), sched_name="const", lr=lr,
        scaler=rc._grad_scaler(False), criterion=nn.CrossEntropyLoss(), online_iter=online_iter,
        class_to_first_task=[-1] * num_classes, lam_orth=1.0, ca_num_per_class=CA["samples"],
        ca_steps=CA["steps"], batchsize=CA["batch"], sdlora_ortho_weight=0.0, task_id=0,
    )
    return trainer


# ---------------------------------------------------------------------------- weight pairs
def _backbone_pairs(official: nn.Module, ours: nn.Module) -> List[Tuple[str, Tensor, Tensor]]:
    theirs = dict(official.backbone.named_parameters())
    pairs = []
    for name, parameter in ours.backbone.named_parameters():
        key = name if name in theirs else name.replace("attn.qkv.", "attn.qkv.base_qkv.")  # SD-LoRA's wrap
        pairs.append((f"backbone.{key}", theirs[key], parameter))
    return pairs


def _hide_head_pairs(official: nn.Module, ours: nn.Module) -> List[Tuple[str, Tensor, Tensor]]:
    pairs = []
    for theirs, mine in (("prompt_head", ours.head), ("g_mlp.0", ours.g_mlp[0]), ("g_head", ours.g_head)):
        module = official.get_submodule(theirs)
        pairs += [(f"{theirs}.weight", module.weight, mine.weight), (f"{theirs}.bias", module.bias, mine.bias)]
    return pairs


def weight_pairs(method: str, official: nn.Module, ours: nn.Module) -> List[Tuple[str, Tensor, Tensor]]:
    """``(official name, official tensor, our tensor)`` of every weight, the two holding the same numbers
    when the models agree (ours a view into our parameter)."""
    pairs = _backbone_pairs(official, ours)
    for layer in range(LAYERS):
        for task in range(len(_banks(ours))):
            pairs += _expert_pairs(method, official, _banks(ours)[task], layer, task)
    if method == "sd-lora":
        return pairs + [("backbone.fc.weight", official.backbone.fc.weight, ours.head.weight),
                        ("backbone.fc.bias", official.backbone.fc.bias, ours.head.bias)]
    return pairs + _hide_head_pairs(official, ours)


def _banks(ours: nn.Module) -> nn.ModuleList:
    for name in ("lora", "adapter"):
        if hasattr(ours, name):
            return getattr(ours, name).banks
    return ours.banks


def _expert_pairs(method: str, official: nn.Module, bank: nn.Module, layer: int,
                  task: int) -> List[Tuple[str, Tensor, Tensor]]:
    if method == "hide-lora":
        lora = official.lora_expert
        return [(f"lora_expert.lora_{kv}.{layer}.{task}.lora_{ab}", getattr(getattr(lora, f"lora_{kv}")[layer][task],
                 f"lora_{ab}"), getattr(bank, part)[layer, j])
                for j, kv in enumerate("kv") for ab, part in (("A", "down"), ("B", "up"))]
    if method == "hide-adapter":
        adapter = official.adapter_expert.adapters[layer][task]
        prefix = f"adapter_expert.adapters.{layer}.{task}"
        return [(f"{prefix}.down_proj.weight", adapter.down_proj.weight, bank.down_weight[layer]),
                (f"{prefix}.down_proj.bias", adapter.down_proj.bias, bank.down_bias[layer]),
                (f"{prefix}.up_proj.weight", adapter.up_proj.weight, bank.up_weight[layer]),
                (f"{prefix}.up_proj.bias", adapter.up_proj.bias, bank.up_bias[layer]),
                (f"{prefix}.scale", adapter.scale, bank.scale[layer:layer + 1])]
    qkv = official.backbone.blocks[layer].attn.qkv
    prefix = f"backbone.blocks.{layer}.attn.qkv"
    pairs = []
    for j, qv in enumerate("qv"):
        pairs += [(f"{prefix}.A_{qv}.{task}.weight", getattr(qkv, f"A_{qv}")[task].weight, bank.down[layer, j]),
                  (f"{prefix}.B_{qv}.{task}.weight", getattr(qkv, f"B_{qv}")[task].weight, bank.up[layer, j]),
                  (f"{prefix}.alpha_{qv}.{task}", getattr(qkv, f"alpha_{qv}")[task], bank.magnitude[layer, j:j + 1])]
    return pairs


# --------------------------------------------------------------------------------- stream
@dataclass
class Stream:
    """Generated class-prototype images: ``sessions`` lists of ``(images, labels)`` batches, two new classes
    per session (first seen in label order, so exposure order is the label), and a test batch."""

    sessions: List[List[Tuple[Tensor, Tensor]]]
    test: Tuple[Tensor, Tensor]
    num_classes: int

    @classmethod
    def generate(cls, tasks: int, batches: int, batch_size: int, seed: int) -> "Stream":
        generator = torch.Generator().manual_seed(seed)
        size = rc.VIT_PRESETS[SHAPE]["img_size"]
        prototypes = torch.randn(2 * tasks, 3, size, size, generator=generator)

        def batch(labels: Tensor) -> Tuple[Tensor, Tensor]:
            return prototypes[labels] + 0.5 * torch.randn(len(labels), 3, size, size, generator=generator), labels

        sessions = [[batch(2 * t + torch.arange(batch_size) % 2) for _ in range(batches)] for t in range(tasks)]
        return cls(sessions, batch(torch.arange(4 * 2 * tasks) % (2 * tasks)), 2 * tasks)


# ------------------------------------------------------------------------------- training
def train_official(trainer: Any, stream: Stream, ca_seed: int) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # the official code's torch.cuda.amp calls
        for task, batches in enumerate(stream.sessions):
            for images, labels in batches:
                trainer.online_step(images.clone(), labels.clone(), None)
            torch.manual_seed(ca_seed + task)  # classifier alignment draws from the global generator
            trainer.online_after_task(task)


def train_ours(method: nn.Module, stream: Stream, *, lr: float, online_iter: int, ca_seed: int) -> None:
    optimizer = torch.optim.Adam(method.trainable_parameters(), lr=lr)
    for task, batches in enumerate(stream.sessions):
        method.on_expert_start(task)
        for images, labels in batches:
            mask = batch_seen_class_mask(labels, stream.num_classes)
            for _ in range(online_iter):
                method.train()
                loss = method.loss(method(images), labels, mask)
                optimizer.zero_grad(set_to_none=True)
                loss.backward()
                optimizer.step()
        torch.manual_seed(ca_seed + task)
        method.on_session_end(task)


@torch.no_grad()
def official_predictions(method: str, trainer: Any, images: Tensor) -> Tuple[Tensor, Optional[Tensor]]:
    """``(classes, tasks)`` as the official evaluation computes them (``tasks`` None for SD-LoRA)."""
    model = trainer.model
    model.eval()
    if method == "sd-lora":
        return (model(images) + trainer.mask).argmax(dim=1), None
    tasks = trainer._predict_task_from_gate(images)
    logits, _ = model.forward_prompt(images, task_id=tasks)
    return (logits + trainer.mask).argmax(dim=1), tasks


@torch.no_grad()
def our_predictions(method: nn.Module, images: Tensor, exposed: int, num_classes: int) -> Tuple[Tensor, Tensor]:
    method.eval()
    output = method(images)
    return (output.logits + seen_class_mask(exposed, num_classes)).argmax(dim=1), output.selection


# -------------------------------------------------------------------------------- compare
@dataclass
class Comparison:
    method: str
    weight_gap: float          # largest |official - ours| over every weight after the stream
    worst_weight: str
    predictions_equal: int
    tasks_equal: Optional[int]  # HiDe's task identification (None: SD-LoRA has none)
    samples: int
    weights_changed: bool       # training moved the experts (the comparison is not of untouched weights)

    def passed(self, atol: float) -> bool:
        tasks_ok = self.tasks_equal is None or self.tasks_equal == self.samples
        return self.weight_gap <= atol and self.predictions_equal == self.samples and tasks_ok and self.weights_changed

    def line(self, atol: float) -> str:
        tasks = "" if self.tasks_equal is None else f", tasks {self.tasks_equal}/{self.samples} equal"
        verdict = "PASS" if self.passed(atol) else "FAIL"
        return (f"[{verdict}] {self.method}: weights max |diff| {self.weight_gap:.2e} ({self.worst_weight}), "
                f"predictions {self.predictions_equal}/{self.samples} equal{tasks}")


def compare(classes: Dict[str, Any], method: str, stream: Stream, *, seed: int, lr: float,
            online_iter: int) -> Comparison:
    """Build both sides with the official initial weights, train each with its own step, compare."""
    tasks = len(stream.sessions)
    torch.manual_seed(seed)
    official = build_official(classes, method, stream.num_classes, tasks)
    from timm.models.vision_transformer import VisionTransformer  # the class: timm's registry may hold the checkout's

    kwargs: Dict[str, Any] = dict(num_tasks=tasks)
    if method == "sd-lora":
        kwargs.update(lora_layers=LAYERS, lora_rank=RANK, lora_alpha=ALPHA)
    else:
        kwargs.update(ca_samples_per_class=CA["samples"], ca_steps=CA["steps"], ca_batch_size=CA["batch"], ca_lr=lr)
        kwargs.update(dict(lora_layers=LAYERS, lora_rank=RANK, lora_alpha=ALPHA) if method == "hide-lora"
                      else dict(adapter_layers=LAYERS, adapter_width=2 * RANK))
    ours = create_method(method, VisionTransformer(**rc.VIT_PRESETS[SHAPE], num_classes=0), stream.num_classes, **kwargs)
    with torch.no_grad():
        for _, theirs, mine in weight_pairs(method, official, ours):
            mine.copy_(theirs.reshape(mine.shape))
    initial = [mine.detach().clone() for _, _, mine in weight_pairs(method, official, ours)]
    trainer = official_trainer(classes, method, official, lr=lr, num_classes=stream.num_classes,
                               online_iter=online_iter)
    train_official(trainer, stream, ca_seed=seed + 1)
    train_ours(ours, stream, lr=lr, online_iter=online_iter, ca_seed=seed + 1)
    pairs = weight_pairs(method, official, ours)
    gaps = [float((theirs.detach().reshape(mine.shape) - mine.detach()).abs().max()) for _, theirs, mine in pairs]
    worst = max(range(len(gaps)), key=gaps.__getitem__)
    changed = any(not torch.equal(before, mine) for before, (_, _, mine) in zip(initial, pairs))
    images, _ = stream.test
    theirs_pred, theirs_tasks = official_predictions(method, trainer, images)
    ours_pred, ours_tasks = our_predictions(ours, images, stream.num_classes, stream.num_classes)
    tasks_equal = None if theirs_tasks is None else int((theirs_tasks == ours_tasks).sum())
    return Comparison(method, gaps[worst], pairs[worst][0], int((theirs_pred == ours_pred).sum()), tasks_equal,
                      len(images), changed)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reference-repo", required=True, help="a checkout of AnAppleCore/FlyGCL")
    parser.add_argument("--methods", default=",".join(OFFICIAL), help="comma-separated, from " + ", ".join(OFFICIAL))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--lr", type=float, default=0.003)
    parser.add_argument("--online-iter", type=int, default=2)
    parser.add_argument("--batches", type=int, default=3, help="stream batches per session (3 sessions)")
    parser.add_argument("--atol", type=float, default=1e-4, help="largest weight difference accepted (float rounding)")
    args = parser.parse_args(argv)
    methods = [m for m in args.methods.split(",") if m]
    unknown = [m for m in methods if m not in OFFICIAL]
    if unknown:
        parser.error(f"--methods: unknown {unknown}; expected some of {list(OFFICIAL)}")
    missing = [OFFICIAL[m][0] for m in methods if not (Path(args.reference_repo) / "models" / f"{OFFICIAL[m][0]}.py").is_file()]
    if missing:
        parser.error(f"--reference-repo {args.reference_repo}: no models/{missing[0]}.py; expected a FlyGCL checkout")
    stream = Stream.generate(tasks=3, batches=args.batches, batch_size=8, seed=args.seed)
    with official_classes(args.reference_repo) as classes:
        results = [compare(classes, m, stream, seed=args.seed, lr=args.lr, online_iter=args.online_iter) for m in methods]
    for result in results:
        print(result.line(args.atol))
    return 0 if all(r.passed(args.atol) for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
