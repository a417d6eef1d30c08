"""Snapshots of a model's structure and tensors, and their comparisons (checks (a), (b), (g)).

``structure`` records per module: class, identity, instance attribute names, parameter / child
identities in order (``parameters()`` order feeds optimizers and their state_dicts), buffer names and
hook table sizes; per optimizer the step hook counts; the global module hook tables.
"""

from __future__ import annotations

from typing import Any, Dict, List, Sequence

import torch
import torch.nn.modules.module as torch_module

HOOK_TABLES = (
    "_forward_hooks", "_forward_hooks_with_kwargs", "_forward_hooks_always_called", "_forward_pre_hooks",
    "_forward_pre_hooks_with_kwargs", "_backward_hooks", "_backward_pre_hooks", "_state_dict_hooks",
    "_state_dict_pre_hooks", "_load_state_dict_pre_hooks", "_load_state_dict_post_hooks",
)


def structure(roots: Dict[str, torch.nn.Module], optimizers: Sequence[Any] = ()) -> Dict[str, Any]:
    out: Dict[str, Any] = {}
    for root_name, root in roots.items():
        if root is None:
            continue
        for name, module in root.named_modules(remove_duplicate=False):
            out[f"{root_name}:{name}"] = dict(
                cls=f"{type(module).__module__}.{type(module).__qualname__}",
                id=id(module),
                attrs=sorted(vars(module)),
                params=[(k, id(v)) for k, v in module._parameters.items()],
                buffers=list(module._buffers),
                children=[(k, id(v)) for k, v in module._modules.items()],
                hooks={h: len(getattr(module, h, {}) or {}) for h in HOOK_TABLES},
            )
    for i, optimizer in enumerate(optimizers):
        out[f"optimizer{i}"] = dict(
            post=len(getattr(optimizer, "_optimizer_step_post_hooks", {})),
            pre=len(getattr(optimizer, "_optimizer_step_pre_hooks", {})))
    out["global"] = dict(hooks={name: len(getattr(torch_module, name)) for name in dir(torch_module)
                                if name.startswith("_global_") and isinstance(getattr(torch_module, name), dict)})
    return out


def structure_diff(before: Dict[str, Any], after: Dict[str, Any], fields: Sequence[str]) -> List[str]:
    """One line per difference of ``fields`` between two ``structure`` snapshots."""
    problems = []
    for key in sorted(set(before) | set(after)):
        if key not in before or key not in after:
            problems.append(f"{key}: {'added' if key in after else 'missing'}")
            continue
        old, new = before[key], after[key]
        for field in fields:
            if field not in old or old[field] == new.get(field):
                continue
            old_value, new_value = old[field], new.get(field)
            if isinstance(old_value, list) and old_value and isinstance(old_value[0], tuple):
                names = [n for n, _ in old_value], [n for n, _ in (new_value or [])]
                reordered = sorted(old_value) == sorted(new_value or []) and names[0] != names[1]
                problems.append(f"{key}.{field}: " + (f"order {names[0]} -> {names[1]}" if reordered
                                                      else f"{names[0]} -> {names[1]} (objects replaced)"))
            else:
                problems.append(f"{key}.{field}: {old_value} -> {new_value}")
    return problems


def clone_state(module: torch.nn.Module) -> Dict[str, torch.Tensor]:
    return {k: v.detach().clone() if isinstance(v, torch.Tensor) else v for k, v in module.state_dict().items()}


def state_equal(first: Dict[str, torch.Tensor], second: Dict[str, torch.Tensor]) -> List[str]:
    """Differences between two state_dicts: keys, key order, and any tensor not bitwise equal."""
    problems = []
    if set(first) != set(second):
        problems.append(f"keys differ: only first {sorted(set(first) - set(second))[:5]}, "
                        f"only second {sorted(set(second) - set(first))[:5]}")
    elif list(first) != list(second):
        moved = [a for a, b in zip(first, second) if a != b][:3]
        problems.append(f"state_dict key ORDER differs (first mismatch at {moved}): parameters() order changed")
    for key in sorted(set(first) & set(second)):
        a, b = first[key], second[key]
        if not isinstance(a, torch.Tensor):
            continue
        if a.shape != b.shape or a.dtype != b.dtype or not torch.equal(a, b):
            diff = (a.double() - b.double()).abs().max().item() if a.shape == b.shape else float("nan")
            problems.append(f"{key} differs (max |diff| {diff:.3g})")
    return problems


def max_diff(a: torch.Tensor, b: torch.Tensor) -> float:
    """Largest absolute difference of the finite entries (inf when shapes or the inf pattern differ)."""
    if a.shape != b.shape or not torch.equal(torch.isfinite(a), torch.isfinite(b)):
        return float("inf")
    finite = torch.isfinite(a)
    return (a[finite].double() - b[finite].double()).abs().max().item() if finite.any() else 0.0
