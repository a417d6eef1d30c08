"""The official FlyPrompt code (a user's checkout of AnAppleCore/FlyGCL), loaded read-only for
``benchmarks.speed.vs_reference``: its DualPrompt / MVP models and trainers, built with random weights.

Nothing is copied from the checkout and nothing in it is written. In memory only:

* its top-level packages (``models``, ``methods``, ``utils``, ...) are imported with the checkout on
  ``sys.path`` and removed from ``sys.modules`` again afterwards (the classes keep working), so the
  generic names never leak into this process's imports;
* ``methods/__init__.py`` (which imports every trainer, some needing scikit-learn) is skipped, and
  the data pipeline (``datasets``, ``utils.data_loader``: pandas, dataset classes) is replaced by empty
  stand-ins: nothing here loads data;
* the ViT factory the model asks for (``models.vit.<backbone_name>``) is swapped, for the build only,
  for one that returns the checkout's own ``VisionTransformer`` in the requested shape with random
  weights (the official factory loads pretrained weights);
* a trainer is created with ``_Trainer.__init__`` (argument parsing, data sets, log folders) replaced
  by a no-op, and given the attributes its setup would give it (optimizer, scaler, masks, ...).
"""

from __future__ import annotations

import contextlib
import copy
import importlib
import sys
import types
import warnings
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Dict, Iterator, List, Sequence, Tuple

import torch
from torch import Tensor, nn

from .errors import UsageError

__all__ = [
    "CheckoutError", "CLASSES", "METHODS", "VIT_PRESETS", "Checkout", "backbone_factory", "load_checkout", "build_models",
    "make_trainer", "clean_query", "mvp_query", "ema_bank_weights", "timm_registry_kept", "EvalBatches",
]

METHODS = ("dualprompt", "mvp")
# method -> (module, class) of its model in ``models/``, and (module, class) of its trainer in ``methods/``.
CLASSES: Dict[str, Tuple[str, str, str, str]] = {
    "l2p": ("l2p", "L2P", "l2p", "L2P"),
    "dualprompt": ("dualprompt", "DualPrompt", "dualprompt", "DualPrompt"),
    "mvp": ("mvp", "MVP", "mvp", "MVP"),
    "flyprompt": ("flyprompt", "FlyPrompt", "flyprompt", "FlyPrompt"),
    "hide": ("hide_norga_prefix_vit", "HiDePrefixModel", "hide_norga_trainer", "HiDeGCLTrainer"),
    "norga": ("hide_norga_prefix_vit", "NoRGaPrefixModel", "hide_norga_trainer", "NoRGaGCLTrainer"),
    "hide-lora": ("hide_lora_vit", "HiDeLoRAModel", "hide_norga_trainer", "HiDeGCLTrainer"),
    "hide-adapter": ("hide_adapter_vit", "HiDeAdapterModel", "hide_norga_trainer", "HiDeGCLTrainer"),
    "sd-lora": ("sdlora", "SDLoRAModel", "sdlora", "SDLoRAGCL"),
    "ranpac": ("ranpac", "RanPAC", "ranpac", "RanPAC"),
    "slca": ("vit", "VisionTransformer", "slca", "SLCA"),  # Seq FT: the ViT itself, its fc the head
    "coda-prompt": ("codaprompt", "CodaPrompt", "codaprompt", "CodaPrompt"),
    "s-prompt": ("sprompt", "SPrompt", "sprompt", "SPrompt"),
}
# What every load imports, relative to the checkout; checked (with the methods' modules) before anything is imported.
REQUIRED_FILES = (
    "models/__init__.py", "models/vit.py", "models/flyprompt.py", "methods/_trainer.py", "utils/__init__.py",
)
_TOP_LEVEL = ("models", "methods", "utils", "datasets", "optim", "configuration")

# Shapes of the checkout's VisionTransformer. "base" is ViT-B/16 (the paper's backbone); "tiny" is the
# shape of this repository's CPU proxy backbone; "micro" is for smoke tests.
VIT_PRESETS: Dict[str, Dict[str, int]] = {
    "micro": dict(img_size=16, patch_size=8, embed_dim=32, depth=5, num_heads=2),
    "tiny": dict(img_size=32, patch_size=8, embed_dim=128, depth=6, num_heads=4),
    "base": dict(img_size=224, patch_size=16, embed_dim=768, depth=12, num_heads=12),
}
# The name the model asks the ViT module for (the official factory of that shape, or a neutral name).
_BACKBONE_NAMES = {"base": "vit_base_patch16_224", "tiny": "bench_vit_tiny", "micro": "bench_vit_micro"}


@dataclass
class Checkout:
    """Classes of one loaded checkout."""

    path: Path
    vit: types.ModuleType                  # models.vit (the factory is swapped on this module object)
    models: Dict[str, type]                # method -> model class (models.dualprompt.DualPrompt, models.mvp.MVP)
    trainers: Dict[str, type]              # method -> trainer class (methods.dualprompt.DualPrompt, ...)
    base_trainer: type                     # methods._trainer._Trainer


def required_files(methods: Sequence[str]) -> List[str]:
    names = [f"models/{CLASSES[method][0]}.py" for method in methods]
    names += [f"methods/{CLASSES[method][2]}.py" for method in methods]
    return [*REQUIRED_FILES, *dict.fromkeys(names)]


def missing_files(path: Path, methods: Sequence[str] = METHODS) -> List[str]:
    return [name for name in required_files(methods) if not (path / name).is_file()]


class CheckoutError(UsageError):
    """A checkout a command was pointed at (by its ``flag``) is not one it can load: one line naming the
    flag, the path and what is missing."""

    def __init__(self, flag: str, path: Any, expected: str, problem: str) -> None:
        super().__init__(f"{flag} {path}: expected a checkout of {expected}, {problem}")

    @classmethod
    def missing_module(cls, flag: str, path: Any, expected: str, error: ModuleNotFoundError) -> "CheckoutError":
        """The checkout's own code imports a module of it (``error.name``) whose file is missing."""
        return cls(flag, path, expected, f"missing {(error.name or '?').replace('.', '/')}.py (which its own code imports)")


def load_checkout(path: str, methods: Sequence[str] = METHODS, *, flag: str = "--reference-repo") -> Checkout:
    """Import the official models and trainers of ``methods`` from ``path`` (see the module docstring);
    :class:`CheckoutError` naming ``flag`` (the calling command's) for a checkout that lacks a file."""
    unknown = sorted(set(methods) - set(CLASSES))
    if unknown:
        raise ValueError(f"no official classes known for {', '.join(unknown)}; known: {', '.join(CLASSES)}")
    root = Path(path).resolve()
    missing = missing_files(root, methods)
    if missing:
        raise CheckoutError(flag, path, FLYGCL, f"missing {', '.join(missing)}")
    try:
        return _import_checkout(root, methods)
    except ModuleNotFoundError as error:  # a file the checkout's own modules import
        if (error.name or "").split(".")[0] not in _TOP_LEVEL:
            raise
        raise CheckoutError.missing_module(flag, path, FLYGCL, error) from None


def _import_checkout(root: Path, methods: Sequence[str]) -> Checkout:
    saved = {name: sys.modules.pop(name) for name in list(sys.modules) if name.split(".")[0] in _TOP_LEVEL}
    sys.path.insert(0, str(root))
    try:
        package = types.ModuleType("methods")
        package.__path__ = [str(root / "methods")]
        sys.modules["methods"] = package
        sys.modules["datasets"] = _stand_in("datasets", {"__all__": []})
        importlib.import_module("utils")
        # cutmix_data: imported by methods/slca.py, never called with augmentation off
        sys.modules["utils.data_loader"] = _stand_in("utils.data_loader", {"get_statistics": _no_data, "cutmix_data": _no_data})
        with warnings.catch_warnings(), timm_registry_kept():
            # models.vit re-registers timm model names (timm warns about each overwrite).
            warnings.simplefilter("ignore")
            vit = importlib.import_module("models.vit")
            models = {m: _class_of(f"models.{CLASSES[m][0]}", CLASSES[m][1]) for m in methods}
            trainers = {m: _class_of(f"methods.{CLASSES[m][2]}", CLASSES[m][3]) for m in methods}
            base = importlib.import_module("methods._trainer")
        return Checkout(path=root, vit=vit, models=models, trainers=trainers, base_trainer=base._Trainer)
    finally:
        sys.path.remove(str(root))
        for name in [n for n in sys.modules if n.split(".")[0] in _TOP_LEVEL]:
            del sys.modules[name]
        sys.modules.update(saved)


@contextlib.contextmanager
def timm_registry_kept() -> Iterator[None]:
    """timm's model registry as it was before: the checkout's ``models.vit`` registers its own factories
    under timm's names (``vit_tiny_patch16_224``, ...), which ``timm.create_model`` would otherwise
    build from then on, in this process."""
    try:
        from timm.models import _registry as registry
    except ImportError:  # no timm: nothing to keep
        yield
        return
    tables = {name: value for name, value in vars(registry).items()
              if name.startswith(("_model", "_module")) and isinstance(value, (dict, set))}
    saved = {name: copy.copy(value) for name, value in tables.items()}
    try:
        yield
    finally:
        for name, table in tables.items():
            table.clear()
            table.update(saved[name])


#: the repository a checkout loaded here is of
FLYGCL = "AnAppleCore/FlyGCL"
#: pip's name of a package the official modules import, where it is not the module's (S-Prompt's trainer: sklearn)
_DISTRIBUTIONS = {"sklearn": "scikit-learn"}


def _class_of(module: str, name: str) -> type:
    """``module.name`` of the checkout; a package it imports that is not installed is a one-line ``ValueError``."""
    try:
        return getattr(importlib.import_module(module), name)
    except ModuleNotFoundError as error:
        missing = (error.name or "").split(".")[0]
        if not missing or missing in _TOP_LEVEL:
            raise
        raise ValueError(f"the official {module} imports {error.name}, which is not installed here: "
                         f"pip install {_DISTRIBUTIONS.get(missing, missing)}") from None


def _stand_in(name: str, attributes: Dict[str, Any]) -> types.ModuleType:
    module = types.ModuleType(name, "stand-in: the benchmark loads no data")
    module.__dict__.update(attributes)
    return module


def _no_data(*args: Any, **kwargs: Any) -> Any:
    raise RuntimeError("bench_vs_reference loads no data sets (utils.data_loader is a stand-in)")


# ---------------------------------------------------------------------------------- models
@contextlib.contextmanager
def _random_backbone(checkout: Checkout, preset: str) -> Iterator[str]:
    """Make ``models.vit.<name>`` build the checkout's VisionTransformer in ``preset``'s shape, unweighted."""
    vision_transformer, shape = checkout.vit.VisionTransformer, VIT_PRESETS[preset]

    def factory(pretrained: bool = False, **kwargs: Any) -> nn.Module:
        return vision_transformer(**shape, **kwargs)

    with backbone_factory(checkout, _BACKBONE_NAMES[preset], factory):
        yield _BACKBONE_NAMES[preset]


@contextlib.contextmanager
def backbone_factory(checkout: Checkout, name: str, factory: Callable[..., nn.Module]) -> Iterator[None]:
    """While open, ``models.vit.<name>`` (what a model's ``backbone_name`` asks for) is ``factory``."""
    missing = object()
    original = getattr(checkout.vit, name, missing)
    setattr(checkout.vit, name, factory)
    try:
        yield
    finally:
        if original is missing:
            delattr(checkout.vit, name)
        else:
            setattr(checkout.vit, name, original)


def build_models(
    checkout: Checkout, method: str, preset: str, *, num_classes: int, num_experts: int, expansion_dim: int,
    ridge: float, seed: int, device: torch.device,
) -> Tuple[nn.Module, nn.Module]:
    """``(baseline, official)``: the method's model with REAR/TE2 off and on, with the same weights.

    Arguments as the official ``select_model`` passes them (``task_num`` = the number of steps). The
    official variant is built first (its router and EMA heads draw random numbers before the prompts);
    the baseline then loads every weight the two share.
    """
    model_class = checkout.models[method]
    flags = dict(rp_dim=expansion_dim, rp_ridge=ridge, ema_ratio=[0.9, 0.99])
    with _random_backbone(checkout, preset) as backbone_name:
        common = dict(backbone_name=backbone_name, pretrained=True, num_classes=num_classes, task_num=num_experts)
        torch.manual_seed(seed)
        official = model_class(**common, use_rp_gate=True, use_ema_head=True, **flags)
        torch.manual_seed(seed)
        baseline = model_class(**common, use_rp_gate=False, use_ema_head=False, **flags)
    shared = {k: v for k, v in official.state_dict().items() if not k.startswith(("rp_head.", "experts_fc."))}
    baseline.load_state_dict(shared)
    return baseline.to(device), official.to(device)


# --------------------------------------------------------------------------------- trainers
def make_trainer(
    checkout: Checkout, method: str, model: nn.Module, *, device: torch.device, amp: bool, lr: float,
    num_classes: int, num_experts: int, samples_per_step: int,
) -> Any:
    """The method's official trainer around ``model``, set up as ``_Trainer``'s setup would for one GPU.

    Differences from a real run (the same for every variant): no augmentation (``train_transform`` and
    ``test_transform_tensor`` are the identity: the batches are already model-sized), every class is
    exposed from the start, and Adam + constant LR (``--opt_name adam --sched_name const``).
    """
    trainer_class = checkout.trainers[method]
    with _patched(checkout.base_trainer, "__init__", lambda self, *args, **kwargs: None):
        trainer = trainer_class()  # the method's own __init__ runs (MVP sets its loss constants there)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr, weight_decay=0)
    trainer.__dict__.update(
        model=model, model_without_ddp=model, device=device, use_amp=amp, n_classes=num_classes,
        exposed_classes=list(range(num_classes)), mask=torch.zeros(num_classes, device=device),
        topk=1, no_batchmask=False, ensemble_method="softmax_max_prob", world_size=1, distributed=False,
        train_transform=_identity, test_transform_tensor=_identity, optimizer=optimizer,
        scheduler=torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1), sched_name="const", lr=lr,
        scaler=_grad_scaler(amp), step_num=num_experts, samples_per_step=samples_per_step, current_step=0,
        current_step_seen_samples=0, criterion=getattr(model, "loss_fn", nn.CrossEntropyLoss()),
    )
    return trainer


def _identity(x: Tensor) -> Tensor:
    return x


def _grad_scaler(enabled: bool) -> Any:
    if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):
        return torch.amp.GradScaler("cuda", enabled=enabled)
    return torch.cuda.amp.GradScaler(enabled=enabled)  # torch < 2.3


@contextlib.contextmanager
def _patched(target: Any, name: str, value: Callable[..., Any]) -> Iterator[None]:
    original = target.__dict__[name]
    setattr(target, name, value)
    try:
        yield
    finally:
        setattr(target, name, original)


# ------------------------------------------------------------------- features and EMA banks
@torch.no_grad()
def clean_query(model: nn.Module, images: Tensor) -> Tensor:
    """Prompt-free final-norm class token: what the official trainers feed ``rp_head.collect``."""
    return model.backbone.forward_features(images)[:, 0]


@torch.no_grad()
def mvp_query(model: nn.Module, images: Tensor) -> Tensor:
    """MVP's own query (what the official MVP routes on): the class token after all blocks but the last
    (all of them with ``use_last_layer``), no final norm."""
    backbone = model.backbone
    tokens = backbone.patch_embed(images)
    tokens = torch.cat((backbone.cls_token.expand(tokens.shape[0], -1, -1), tokens), dim=1)
    tokens = backbone.pos_drop(tokens + backbone.pos_embed)
    blocks = list(backbone.blocks)
    for block in blocks if model.use_last_layer else blocks[:-1]:
        tokens = block(tokens)
    return tokens[:, 0]


def ema_bank_weights(model: nn.Module) -> Tuple[Tensor, Tensor]:
    """The official EMA heads as ``(weight (banks, decays, C, D), bias (banks, decays, C))``."""
    weights = torch.stack([torch.stack([head.weight for head in bank]) for bank in model.experts_fc])
    biases = torch.stack([torch.stack([head.bias for head in bank]) for bank in model.experts_fc])
    return weights.detach(), biases.detach()


class EvalBatches:
    """A fixed test set in the shape of a DataLoader (the trainers remap labels in place: fresh copies)."""

    def __init__(self, batches: List[Tuple[Tensor, Tensor]]) -> None:
        self.batches = batches

    def __iter__(self) -> Iterator[Tuple[Tensor, Tensor]]:
        return ((x, y.clone()) for x, y in self.batches)

    def __len__(self) -> int:
        return len(self.batches)

    @property
    def samples(self) -> int:
        return sum(y.shape[0] for _, y in self.batches)
