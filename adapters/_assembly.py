"""The prefix assembly defect of the JH-LEE E-prompt lineage (``dualprompt-pytorch``; copied by
HiDe-Prompt, NoRGa, Mammoth and LAMDA-PILOT), found by a probe and corrected on request.

The E-prompt pools gather ``prompt[:, :, idx]`` into a ``(layers, key/value, B, top_k, length, heads,
head_dim)`` tensor and ``reshape`` it to ``(layers, B, key/value, ...)`` without moving the batch axis in
front of the key/value axis. The reshape only relabels memory: for ``B > 1`` sample ``b`` gets the rows
``2b`` and ``2b + 1`` of the ``(key/value, B)`` grid, i.e. other samples' prompts and the key half as
values. :func:`probe_assembly` finds it; :class:`AssemblyCorrection` relabels the memory back and moves
the axis (exact, differentiable).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import torch
from torch import Tensor, nn

from ._restore import Installation, Snapshot
from ._seams import GENERIC_CALL, SeamError

__all__ = ["AssemblyCorrection", "AssemblyProbe", "check_assembly", "correct_prefix_assembly", "probe_assembly"]

OPTION = "correct_assembly"
_PROBE_BATCH = 4  # even and > 2: the relabelling then also swaps key and value halves


def correct_prefix_assembly(batched: Tensor) -> Tensor:
    """``(L, B, 2, T, H, hd)`` made by ``raw.reshape`` of a ``(L, 2, B, ...)`` tensor -> the per-sample one."""
    layers, batch, dual = batched.shape[:3]
    rest = batched.shape[3:]
    return batched.reshape(layers, dual, batch, *rest).transpose(1, 2).reshape(batched.shape)


class AssemblyProbe:
    """What a probe call found: ``mixes`` (a sample's prompt depends on the batch) and ``correctable``
    (:func:`correct_prefix_assembly` makes every sample's prompt its own)."""

    def __init__(self, callee: str, mixes: bool, correctable: bool, detail: str) -> None:
        self.callee, self.mixes, self.correctable, self.detail = callee, mixes, correctable, detail


def _callee(module: nn.Module) -> str:
    cls = type(module)
    return f"{cls.__module__}.{cls.__qualname__}.forward"


def probe_assembly(module: nn.Module) -> Optional[AssemblyProbe]:
    """Call a JH-LEE-style E-prompt pool (``prompt``, ``prompt_key``, ``forward(x_embed, prompt_mask=...)``
    returning ``batched_prompt`` ``(L, B, ...)``) on a batch whose samples select different slots, and on
    each sample alone; ``None`` when the module does not look like one. The pool's prompts are filled with
    distinct values for the probe (zero-initialised pools would hide a mix) and everything is put back."""
    prompt, keys = getattr(module, "prompt", None), getattr(module, "prompt_key", None)
    if not isinstance(prompt, Tensor) or prompt.ndim < 3:
        return None
    # Without learnable keys (HiDe's prompt_key=False) the pool's prompt_key is a prompt mean of another shape.
    learned = isinstance(keys, Tensor) and keys.ndim == 2
    pool = int(getattr(module, "pool_size", 0) or (keys.shape[0] if learned else 0))
    width = prompt.shape[-2] * prompt.shape[-1] if prompt.ndim == 6 else prompt.shape[-1]  # heads x head_dim
    dim = int(getattr(module, "embed_dim", 0) or (keys.shape[1] if learned else width))
    top_k = int(getattr(module, "top_k", 1) or 1)
    if pool < 2 or dim < 1 or top_k > pool:
        return None
    generator = torch.Generator().manual_seed(0)  # the global random state stays untouched
    x_embed = torch.randn(_PROBE_BATCH, 3, dim, generator=generator).to(device=prompt.device, dtype=prompt.dtype)
    slots = (torch.arange(_PROBE_BATCH).unsqueeze(1) + torch.arange(top_k)) % pool
    mask = slots.to(prompt.device)
    snapshot = Snapshot([module], [])
    try:
        module.eval()
        with torch.no_grad():
            prompt.copy_(torch.arange(prompt.numel(), dtype=prompt.dtype, device=prompt.device).reshape(prompt.shape))
            together = _batched(module(x_embed, prompt_mask=mask))
            alone = [_batched(module(x_embed[b:b + 1], prompt_mask=mask[b:b + 1])) for b in range(_PROBE_BATCH)]
    except Exception:  # noqa: BLE001  (an unusual pool: left to verify's batch-independence check)
        return None
    finally:
        snapshot.restore(final=True)
    if together is None or any(a is None for a in alone) or together.ndim < 2 or together.shape[1] != _PROBE_BATCH:
        return None
    alone_batch = torch.cat(alone, dim=1)
    callee = _callee(module)
    if alone_batch.shape == together.shape and torch.equal(together, alone_batch):
        return AssemblyProbe(callee, False, False, "each sample's prompt is its own")
    correctable = together.ndim == 6 and together.shape[2] == 2 and torch.equal(
        correct_prefix_assembly(together), alone_batch)
    return AssemblyProbe(callee, True, correctable, (
        f"{callee} assembles the prefix prompts of a batch with a reshape of its (layers, key/value, batch, ...) "
        "gather into (layers, batch, key/value, ...) that does not move the batch axis, so each sample's key and "
        "value prefixes come from other samples of the batch (and from the key half as values)"
        if correctable else
        f"{callee} gives a sample of a {_PROBE_BATCH}-sample batch other prompts than the sample alone"
    ))


def _batched(output: Any) -> Optional[Tensor]:
    value = output.get("batched_prompt") if isinstance(output, dict) else None
    return value.detach().clone() if isinstance(value, Tensor) else None


class AssemblyCorrection:
    """``correction(installation)`` installs, on ``module``, a forward hook replacing its ``batched_prompt``
    by the per-sample assembly (undone with the rest of ``installation``)."""

    def __init__(self, module: nn.Module) -> None:
        self.module = module

    def __call__(self, installation: Installation) -> None:
        installation.forward_hook(self.module, self.correct)

    @staticmethod
    def correct(module: nn.Module, args: Any, output: Any) -> Any:
        batched = output.get("batched_prompt") if isinstance(output, dict) else None
        if not isinstance(batched, Tensor) or batched.ndim != 6:
            return None
        fixed: Dict[str, Any] = dict(output)
        fixed["batched_prompt"] = correct_prefix_assembly(batched)
        return fixed


def check_assembly(module: nn.Module, *, family: str, router: bool, correct: bool) -> List[AssemblyCorrection]:
    """Probe ``module`` when the option or the router needs it; the correction to install (one, or none).

    Called before anything is installed. ``router=True`` on a mixing pool without ``correct_assembly=True``
    raises :class:`SeamError` (the routed expert would reach its sample mixed with its neighbours');
    ``router=False`` without the option leaves the pool untouched (not even probed);
    ``correct_assembly=True`` corrects it for every variant, and is a no-op on a pool that does not mix.
    """
    if not (router or correct):
        return []
    probe = probe_assembly(module)
    if probe is None or not probe.mixes:
        return []
    if not probe.correctable:
        raise SeamError(
            f"fly_modules.adapters.{family}: {probe.detail}: a sample's prompt depends on the other samples of the "
            f"batch and {OPTION}=True does not know this assembly. Make the prompt of each sample its own in your "
            f"copy, or route through another seam: {GENERIC_CALL}"
        )
    if correct:
        return [AssemblyCorrection(module)]
    raise SeamError(
        f"fly_modules.adapters.{family}: {probe.detail}. The router's expert would reach each sample mixed with "
        f"its neighbours' prompts. Retrofit with {OPTION}=True: it corrects the assembly for every variant "
        f"(router=False too, for a like-with-like baseline) and remove() undoes it; router=False without it "
        "leaves the model as it is"
    )


