"""The official side of the MISA rows: kangzhiq/MISA's DualPrompt model and trainer, configured by MISA's own
argument parser from its launch script's options (``scripts/misa.sh``), on a copy of our backbone's weights,
trained by its own ``online_step`` per stream batch and ``online_after_task`` per session end."""

from __future__ import annotations

import contextlib
import functools
import io
import os
import sys
import tempfile
import types
from typing import Any, Dict, Iterator, List, Optional, Tuple

import torch
from torch import Tensor, nn

from .misa_checkout import MISACheckout
from .official import official_backbone_state
from .pairs import MethodPair
from .setting import Setting

__all__ = ["MISASide", "pool_rows", "script_arguments", "UNUSED_PARAMETERS"]

#: trainable parameters ``--load_pt`` adds that MISA's forward never reads (they get no gradient)
UNUSED_PARAMETERS = ("scale", "translation")
_BACKBONE_NAME = "fidelity_misa_vit"


def script_arguments(setting: Setting, *, lr: float, load_pt: bool, log_path: str) -> List[str]:
    """``scripts/misa.sh``'s options for the setting: Si-Blurry N=50, M=10 with random N/M, no replay memory,
    Adam at ``lr`` with the constant ``default`` schedule, the setting's online iterations. The stream batch
    is MISA's ``temp_batchsize``, half of ``--batchsize``. No ``--use_amp``, no augmentation (fp32, identical
    batches on both sides)."""
    argv = ["--mode", "DualPrompt", "--dataset", "cifar100", "--n_tasks", str(setting.num_sessions), "--m", "10",
            "--n", "50", "--rnd_seed", str(setting.seed), "--model_name", "DualPrompt", "--opt_name", "adam",
            "--sched_name", "default", "--lr", str(lr), "--batchsize", str(2 * setting.batch_size),
            "--memory_size", "0", "--online_iter", str(setting.online_iter), "--note", "MISA",
            "--eval_period", str(setting.eval_period), "--transforms", "autoaug", "--memory_epoch", "256",
            "--n_worker", "0", "--rnd_NM", "--log_path", log_path]
    return argv + (["--load_pt"] if load_pt else [])


class MISASide:
    """MISA's model and trainer as ``_Trainer.main_worker`` sets them up for one process, without the data."""

    def __init__(self, checkout: MISACheckout, pair: MethodPair, setting: Setting, backbone: nn.Module, *,
                 num_classes: int, lr: float, load_pt: bool) -> None:
        self.pair, self.checkout = pair, checkout
        with tempfile.TemporaryDirectory(prefix="fidelity_misa_") as logs:  # _Trainer makes its log folders
            args = _parse(checkout, script_arguments(setting, lr=lr, load_pt=load_pt, log_path=logs))
            trainer = checkout.trainer_class(**vars(args))
        self.model = self._build(checkout, setting, backbone, num_classes, {**vars(args), **pair.official_kwargs})
        # What setup_distributed_dataset / setup_distributed_model give the trainer (utils.train_utils).
        optimizer = checkout.select_optimizer(args.opt_name, args.lr, self.model)
        trainer.__dict__.update(
            device=torch.device("cpu"), n_classes=num_classes, mask=torch.full((num_classes,), float("-inf")),
            seen=0, memory=checkout.memory_class(), train_transform=_identity, test_transform=_identity,
            model=self.model, model_without_ddp=self.model, scaler=_disabled_grad_scaler(),
            criterion=self.model.loss_fn, optimizer=optimizer,
            scheduler=checkout.select_scheduler(args.sched_name, optimizer), distributed=False, world_size=1,
        )
        self.trainer = trainer

    @staticmethod
    def _build(checkout: MISACheckout, setting: Setting, backbone: nn.Module, num_classes: int,
               options: Dict[str, Any]) -> nn.Module:
        """``select_model``'s ``DualPrompt(backbone_name, class_num, **kwargs)`` on MISA's own ViT with our
        backbone's weights; ``--load_pt`` reads ``pretrained_prompt/`` from the checkout, as MISA's run does
        from its folder (onto the CPU, weights only: the shipped files hold CUDA tensors)."""
        state = official_backbone_state(backbone)
        vision_transformer = checkout.vit.VisionTransformer

        def create_model(name: str, pretrained: bool = False, **kwargs: Any) -> nn.Module:
            vit = vision_transformer(**setting.shape, **kwargs)
            missing, unexpected = vit.load_state_dict(state, strict=False)
            if unexpected or [key for key in missing if not key.startswith("fc.")]:
                raise ValueError(f"MISA's ViT does not take our backbone's weights: missing {missing}, "
                                 f"unexpected {unexpected}")
            return vit

        timm = types.SimpleNamespace(create_model=create_model)
        with _module_global(checkout.model_module, "timm", timm), _working_folder(checkout.path), \
                _cpu_weights_only(), contextlib.redirect_stdout(io.StringIO()):  # it prints the files it loads
            return checkout.model_class(backbone_name=_BACKBONE_NAME, class_num=num_classes, **options)

    def trainable(self) -> Dict[str, nn.Parameter]:
        return {name: p for name, p in self.model.named_parameters()
                if p.requires_grad and name not in UNUSED_PARAMETERS}

    def unused(self) -> Dict[str, Tensor]:
        return {name: p for name, p in self.model.named_parameters() if name in UNUSED_PARAMETERS}

    def stream_batch(self, images: Tensor, labels: Tensor) -> None:
        """MISA's per-batch entry: exposure, masks, online iterations, steps (no replay: memory_size 0)."""
        self.trainer.online_step(images.clone(), labels.clone(), None)

    def session_end(self, session: int) -> None:
        self.trainer.online_after_task(session)  # MISA's step: model.task_id += 1

    @torch.no_grad()
    def logits(self, images: Tensor) -> Tuple[Tensor, Tensor]:
        """``(logits, selected pool row)`` of MISA's eval forward, which ``online_evaluate`` reads unmasked."""
        self.model.eval()
        captured: List[Tensor] = []
        hook = self.model.e_prompt.register_forward_hook(lambda module, args, output: captured.append(output[1]))
        try:
            logits = self.model(images)
        finally:
            hook.remove()
        return logits, pool_rows(captured[-1], self.model.e_prompt.prompts)

    def predict(self, images: Tensor) -> "tuple[Tensor, Optional[Tensor]]":
        """``(scores, selection)`` with the seen-class mask added (the inference our runner compares)."""
        logits, rows = self.logits(images)
        return logits + self.trainer.mask, rows

    def state(self) -> Dict[str, Tensor]:
        return dict(self.model.state_dict(keep_vars=True))


def pool_rows(selected: Tensor, prompts: Tensor) -> Tensor:
    """``(B,)``: the pool row of ``prompts`` each sample's selected prompt ``(B, 1, L, D)`` equals."""
    equal = (selected[:, 0].flatten(1).unsqueeze(1) == prompts.detach().flatten(1).unsqueeze(0)).all(-1)
    if not bool(equal.any(1).all()):
        raise ValueError("a selected E-prompt equals no row of MISA's pool; expected the pool's own rows")
    return equal.int().argmax(1)


def _parse(checkout: MISACheckout, argv: List[str]) -> Any:
    saved = sys.argv
    sys.argv = ["main.py", *argv]
    try:
        return checkout.base_parser()
    finally:
        sys.argv = saved


@contextlib.contextmanager
def _module_global(module: types.ModuleType, name: str, value: Any) -> Iterator[None]:
    original = getattr(module, name)
    setattr(module, name, value)
    try:
        yield
    finally:
        setattr(module, name, original)


@contextlib.contextmanager
def _working_folder(path: Any) -> Iterator[None]:
    saved = os.getcwd()
    os.chdir(path)
    try:
        yield
    finally:
        os.chdir(saved)


@contextlib.contextmanager
def _cpu_weights_only() -> Iterator[None]:
    load = torch.load
    torch.load = functools.partial(load, map_location="cpu", weights_only=True)
    try:
        yield
    finally:
        torch.load = load


def _identity(x: Tensor) -> Tensor:
    return x


def _disabled_grad_scaler() -> Any:
    if hasattr(torch, "amp") and hasattr(torch.amp, "GradScaler"):
        return torch.amp.GradScaler("cuda", enabled=False)
    return torch.cuda.amp.GradScaler(enabled=False)  # torch < 2.3
