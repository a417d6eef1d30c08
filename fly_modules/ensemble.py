"""Temporal ensemble of classifier heads (TE2, FlyPrompt section 3.2).

One trainable *online* head plus, for every expert, frozen exponential-moving-average copies of it
with several decays. Training uses the online head alone; after each optimizer step the active
expert's copies move towards it; at inference each sample's routed expert contributes its copies,
which are ensembled with the online head after the logit mask. Inference has no per-sample loop and,
off the CPU, no host synchronisation. Details: ``docs/ensemble.md``.
"""

from __future__ import annotations

import weakref
from typing import Any, Dict, Optional, Sequence, Union

import torch
from torch import Tensor, nn
from torch.utils.hooks import RemovableHandle

from . import _compat
from ._checkpoint import check_entry, check_settings, checkpoint_entries, holds_any
from ._validation import (
    AGGREGATION_RULES,
    InvalidParameterError,
    NotFittedError,
    OneOf,
    check_choice,
    check_expert_ids,
    check_features,
    check_int,
    check_logit_mask,
    check_member_logits,
    shared_constraints,
    shared_default,
    validate_parameters,
)
from .classifier import find_classifier

__all__ = ["TemporalEnsembleHead", "aggregate_logits", "AGGREGATION_RULES"]


def aggregate_logits(member_logits: Tensor, rule: str = shared_default("aggregate")) -> Tensor:
    """Combine the ensemble members' (already masked) logits ``(N, H, C)`` into scores ``(N, C)``.

    Rules (FlyPrompt, appendix "aggregation methods"; the prediction is the argmax of the result):

    * ``mean``: average of the logits.  ``max_prob``: element-wise maximum of the logits.
    * ``min_entropy``: per sample, the logits of the member whose softmax has the lowest entropy (it
      predicts as ``softmax_min_entropy``: the same member, whose logits and softmax share their argmax).
    * ``softmax_mean`` / ``softmax_max``: average / element-wise maximum of the members' softmax
      (``softmax_max`` is the paper's default, ``max_j softmax(z_j + m)``).
    * ``softmax_min_entropy``: the softmax of the lowest-entropy member.
    * ``logit_min_entropy``: the official code's ``min_entropy``: per sample, the logits of the member
      with the least ``-sum_c z_c log(z_c + 1e-8)`` over its raw masked logits ``z``. That value is NaN
      as soon as one logit is below ``-1e-8`` or masked, and a NaN counts as the least (the first such
      member wins), so with a mask or any negative logit it selects the first member, the online head.

    Entropies of a softmax ``p`` are ``-sum_c p_c log(p_c + 1e-8)``, as the official code computes them,
    so masked (``-inf``) classes contribute 0 rather than NaN. A row whose classes are *all* masked has
    no prediction: the softmax rules give NaN there and the others ``-inf``.
    """
    check_member_logits(member_logits, caller="aggregate_logits")
    check_choice(rule, "rule", AGGREGATION_RULES, caller="aggregate_logits")
    if rule == "mean":
        return member_logits.mean(dim=1)
    if rule == "max_prob":
        return member_logits.amax(dim=1)
    rows = torch.arange(member_logits.shape[0], device=member_logits.device)
    if rule == "logit_min_entropy":
        return member_logits[rows, _least_entropy_member(member_logits)]
    probabilities = member_logits.softmax(dim=-1)
    if rule == "softmax_mean":
        return probabilities.mean(dim=1)
    if rule == "softmax_max":
        return probabilities.amax(dim=1)
    best = _least_entropy_member(probabilities)
    chosen = member_logits if rule == "min_entropy" else probabilities
    return chosen[rows, best]


#: added inside the entropy's logarithm, as the official code does (it keeps a zero probability's term 0)
ENTROPY_EPSILON = 1e-8


def _least_entropy_member(scores: Tensor) -> Tensor:
    """Per sample ``(N,)``, the member of least ``-sum_c s_c log(s_c + eps)`` over ``scores`` ``(N, H, C)``;
    a NaN value counts as the least, the first such member winning (``torch.argmin``'s documented order,
    written out here so that it does not depend on it). No host synchronisation."""
    entropy = -(scores * torch.log(scores + ENTROPY_EPSILON)).sum(dim=-1)  # (N, H)
    undefined = entropy.isnan()
    first_undefined = undefined.to(torch.uint8).argmax(dim=1)
    return torch.where(undefined.any(dim=1), first_undefined, entropy.argmin(dim=1))


class TemporalEnsembleHead(nn.Module):
    r"""An online linear head plus per-expert EMA copies of it, ensembled at inference.

    Args:
        head: the classifier to wrap: an ``nn.Linear``, or a module whose ``get_classifier()``
            (timm), ``head`` or ``fc`` is one. The very same module becomes ``self.online`` (it is not
            copied), so an optimizer that already holds its parameters keeps training it.
        num_experts: experts created now, each with copies cloned from the current online head.
            More can be added with ``add_expert()`` / ``start_expert()``.
        decays: EMA decay of each copy, distinct values in ``(0, 1)``; default ``(0.9, 0.99)``.
        aggregate: one of :data:`AGGREGATION_RULES`; default ``"softmax_max"`` (the paper's).
        check_values: whether ``forward`` checks the inputs' *values* (finite features, expert ids in
            range), which reads them on the host. ``None`` (default): for CPU tensors only, so the
            accelerator path never synchronises; ``True``: always; ``False``: never. Shapes, dtypes,
            widths and devices are always checked (metadata only).

    Shape:
        - features: ``(N, in_features)``
        - expert_ids: ``(N,)`` integer tensor or one int
        - logit_mask: ``(C,)`` or ``(N, C)``, added to every member's logits before aggregation
        - output: ``(N, C)``: online logits (no ``expert_ids``) or aggregated scores

    Attributes:
        online: the wrapped trainable ``nn.Linear`` (its parameters are part of this module's state).
        ema_weight: buffer ``(num_experts, num_decays, C, in_features)``, the copies' weights.
        ema_bias: buffer ``(num_experts, num_decays, C)`` or ``None`` when the head has no bias.
        decays: buffer ``(num_decays,)`` float64.
        num_updates: buffer ``(num_experts,)`` long, EMA steps taken by each expert since it started.
        active_expert: the expert whose copies ``update()`` moves (saved through ``get_extra_state``).

    .. note::
        ``aggregate`` is a constructor argument and is not saved. EMA copies live in buffers, so they
        never receive gradients and follow ``.to()``; they are updated under ``torch.no_grad()``.
        ``decays`` stays float64 under any cast (0.9999 is 1.0 in bfloat16).

    Examples::

        >>> ensemble = TemporalEnsembleHead(nn.Linear(8, 5), num_experts=2)
        >>> ensemble.start_expert(1)
        >>> ensemble.update()                      # after an optimizer step
        >>> x = torch.randn(4, 8)
        >>> ensemble(x).shape                      # training: online logits
        torch.Size([4, 5])
        >>> ensemble(x, torch.tensor([0, 1, 1, 0])).shape   # inference: ensembled scores
        torch.Size([4, 5])
    """

    _version = 1
    #: the rules of the arguments, in the order they are checked
    _parameter_constraints = {
        **shared_constraints("num_experts", "decays", "aggregate"),
        "check_values": OneOf((None, True, False)),
    }

    def __init__(
        self,
        head: nn.Module,
        num_experts: int = 1,
        *,
        decays: Sequence[float] = shared_default("decays"),
        aggregate: str = shared_default("aggregate"),
        check_values: Optional[bool] = None,
    ) -> None:
        super().__init__()
        given = validate_parameters(self._parameter_constraints, dict(
            num_experts=num_experts, decays=decays, aggregate=aggregate, check_values=check_values),
            caller="TemporalEnsembleHead")
        num_experts, decays = given["num_experts"], given["decays"]
        self.aggregate, self.check_values = given["aggregate"], given["check_values"]
        self.online = find_classifier(head)
        weight = self.online.weight.detach()
        self.register_buffer("decays", torch.tensor(decays, dtype=torch.float64, device=weight.device))
        bank = weight.unsqueeze(0).unsqueeze(0).expand(num_experts, len(decays), *weight.shape)
        self.register_buffer("ema_weight", bank.clone())
        if self.online.bias is not None:
            bias = self.online.bias.detach()
            self.register_buffer("ema_bias", bias.expand(num_experts, len(decays), bias.shape[0]).clone())
        else:
            self.register_buffer("ema_bias", None)
        self.register_buffer("num_updates", torch.zeros(num_experts, dtype=torch.long, device=weight.device))
        self.active_expert = 0

    # ------------------------------------------------------------------------------ properties
    @property
    def in_features(self) -> int:
        return self.online.in_features

    @property
    def num_classes(self) -> int:
        return self.online.out_features

    @property
    def num_experts(self) -> int:
        return self.ema_weight.shape[0]

    @property
    def num_decays(self) -> int:
        return self.ema_weight.shape[1]

    # -------------------------------------------------------------------------------- experts
    @torch.no_grad()
    def add_expert(self, count: int = 1) -> int:
        """Append ``count`` experts whose copies are clones of the current online head; returns the last id."""
        count = check_int(count, "count", caller="TemporalEnsembleHead.add_expert", minimum=1)
        weight = self.online.weight.detach().to(self.ema_weight.dtype)
        new = weight.expand(count, self.num_decays, *weight.shape)
        self.ema_weight = torch.cat([self.ema_weight, new])
        if self.ema_bias is not None:
            bias = self.online.bias.detach().to(self.ema_bias.dtype)
            self.ema_bias = torch.cat([self.ema_bias, bias.expand(count, self.num_decays, bias.shape[0])])
        self.num_updates = torch.cat([self.num_updates, self.num_updates.new_zeros(count)])
        return self.num_experts - 1

    @torch.no_grad()
    def start_expert(self, expert: int) -> None:
        """Clone the online head into ``expert``'s copies and make it the active expert.

        ``expert`` may be an existing id or ``num_experts`` (the next one, created here).
        """
        expert = check_int(expert, "expert", caller="TemporalEnsembleHead.start_expert", minimum=0, maximum=self.num_experts)
        if expert == self.num_experts:
            self.add_expert()
        else:
            self.ema_weight[expert].copy_(self.online.weight.detach().expand_as(self.ema_weight[expert]))
            if self.ema_bias is not None:
                self.ema_bias[expert].copy_(self.online.bias.detach().expand_as(self.ema_bias[expert]))
            self.num_updates[expert] = 0
        self.active_expert = expert

    # --------------------------------------------------------------------------------- update
    @torch.no_grad()
    def update(self, experts: Union[None, int, Tensor, Sequence[int]] = None) -> None:
        """One EMA step, ``copy <- decay * copy + (1 - decay) * online``, for each decay.

        Moves only the active expert's copies, or those of ``experts`` (ids, duplicates allowed, each
        moved once) when given. Call it after every optimizer step, or use :meth:`attach`.
        """
        if self.num_experts == 0:
            raise NotFittedError("TemporalEnsembleHead.update: no experts; call start_expert(0) first")
        # lerp(copy, online, 1 - decay) is the EMA step; one weight per decay, broadcast over (C, D).
        rate = (1.0 - self.decays).to(self.ema_weight.dtype)
        weight = self.online.weight.detach().to(self.ema_weight.dtype)
        bias = None if self.ema_bias is None else self.online.bias.detach().to(self.ema_bias.dtype)
        if experts is None:
            _compat.lerp_(self.ema_weight[self.active_expert], weight.unsqueeze(0), rate.view(-1, 1, 1))
            if bias is not None:
                _compat.lerp_(self.ema_bias[self.active_expert], bias.unsqueeze(0), rate.view(-1, 1))
            self.num_updates[self.active_expert] += 1
            return
        if not isinstance(experts, Tensor):
            experts = torch.as_tensor(experts)  # no dtype: 1.9 or True must fail the id check, not truncate
            experts = experts.long() if experts.numel() == 0 else experts
        ids = check_expert_ids(
            experts.reshape(-1), experts.numel(), self.num_experts, caller="TemporalEnsembleHead.update",
            device=self.ema_weight.device, check_range=self._checks_values(self.ema_weight),
        )
        # Two exact strategies, as in member_logits. On the CPU, step the listed banks only (unique() reads
        # the ids on the host, free there); elsewhere, step every bank and keep the unlisted ones by a mask,
        # which queues without a host synchronisation after each optimizer step.
        step = _ema_step_listed if self.ema_weight.device.type == "cpu" else _ema_step_masked
        moved = step(self.ema_weight, weight.expand(1, 1, *weight.shape), rate.view(1, -1, 1, 1), ids)
        if bias is not None:
            step(self.ema_bias, bias.expand(1, 1, -1), rate.view(1, -1, 1), ids)
        self.num_updates.add_(moved)

    def attach(self, optimizer: torch.optim.Optimizer) -> RemovableHandle:
        """Run :meth:`update` after every ``optimizer.step()``; returns the removable hook handle."""
        head_ref = weakref.ref(self)  # the optimizer must not keep the head alive

        def _after_step(opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
            ensemble = head_ref()
            if ensemble is not None:
                ensemble.update()

        return _compat.step_post_hook(optimizer, _after_step)

    # ------------------------------------------------------------------------------ inference
    def member_logits(self, features: Tensor, expert_ids: Union[int, Tensor]) -> Tensor:
        """Raw logits ``(N, 1 + num_decays, C)`` of ``[online, copies of each sample's expert]``."""
        features = self._check_features(features)
        ids = check_expert_ids(
            expert_ids, features.shape[0], self.num_experts, caller="TemporalEnsembleHead", device=features.device,
            check_range=self._checks_values(features),
        )
        online = self.online(features)
        bank = self.ema_weight.to(features.dtype)
        # Two exact strategies, no per-sample loop either way. On the CPU, one matmul per expert over its
        # own samples does only the work needed (a loop over the few experts, with sizes read on the host);
        # elsewhere, one matmul against every expert's bank and a gather keeps the device queue free of
        # host synchronisation, at num_experts times the (small) flops.
        if features.device.type == "cpu":
            copies = _copies_grouped_by_expert(features, bank, ids)
        else:
            copies = _copies_all_experts(features, bank, ids)
        if self.ema_bias is not None:
            copies = copies + self.ema_bias.to(features.dtype)[ids]
        return torch.cat([online.unsqueeze(1), copies.to(online.dtype)], dim=1)

    def _checks_values(self, features: Tensor) -> bool:
        return features.device.type == "cpu" if self.check_values is None else self.check_values

    def _check_features(self, features: Tensor) -> Tensor:
        return check_features(
            features, self.in_features, caller="TemporalEnsembleHead", device=self.online.weight.device,
            check_finite=isinstance(features, Tensor) and self._checks_values(features),
        )

    def aggregate_members(self, member_logits: Tensor) -> Tensor:
        """Aggregate (already masked) member logits ``(N, H, C)`` with this head's rule."""
        return aggregate_logits(member_logits, self.aggregate)

    def forward(
        self, features: Tensor, expert_ids: Union[None, int, Tensor] = None, logit_mask: Optional[Tensor] = None
    ) -> Tensor:
        """Online logits (``expert_ids`` is ``None``) or the ensemble's scores over each sample's expert."""
        if logit_mask is not None:  # checked before any work, against the batch and the head's classes
            batch = self._check_features(features).shape[0]
            logit_mask = check_logit_mask(logit_mask, batch, self.num_classes, caller="TemporalEnsembleHead",
                                          device=self.online.weight.device)
        if expert_ids is None:
            logits = self.online(self._check_features(features))
            return logits if logit_mask is None else logits + logit_mask
        members = self.member_logits(features, expert_ids)
        if logit_mask is not None:
            members = members + (logit_mask.unsqueeze(1) if logit_mask.ndim == 2 else logit_mask)
        return self.aggregate_members(members)

    # ---------------------------------------------------------------------------- persistence
    def _apply(self, fn, *args, **kwargs):  # type: ignore[no-untyped-def]
        # The decays stay float64 whatever the heads are cast to: in bfloat16, 0.9999 rounds to 1.0
        # and that copy would never move. They follow device moves as usual.
        decays = self.decays

        def keep_decays_float64(tensor: Tensor) -> Tensor:
            moved = fn(tensor)
            if tensor is decays and moved.dtype != torch.float64:
                return tensor.to(device=moved.device)
            return moved

        return super()._apply(keep_decays_float64, *args, **kwargs)

    def get_extra_state(self) -> Dict[str, int]:
        return {"active_expert": int(self.active_expert)}

    def set_extra_state(self, state: Dict[str, int]) -> None:
        # Called after the banks were loaded (and resized), so the checkpoint's expert count is known.
        self.active_expert = self._check_saved_state(state, self.num_experts)

    def _check_saved_state(self, state: Any, num_experts: int) -> int:
        saved = check_settings(state, {}, caller="TemporalEnsembleHead.load_state_dict", adopted=("active_expert",), fixes={})
        active = saved["active_expert"]
        if isinstance(active, bool) or not isinstance(active, int) or not 0 <= active < max(1, num_experts):
            raise InvalidParameterError(
                f"TemporalEnsembleHead: the checkpoint's active_expert {active!r} is not one of its {num_experts} experts"
            )
        return active

    def _load_from_state_dict(self, state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs):
        # All or nothing: every entry this head and its online classifier will read is checked first.
        names = ["online.weight", "ema_weight", "decays", "num_updates"]
        names += ["online.bias", "ema_bias"] if self.ema_bias is not None else []
        if not holds_any(state_dict, prefix, (*names, "_extra_state")):
            # Not in the checkpoint: the default loader only lists the missing keys (an error if strict).
            return super()._load_from_state_dict(
                state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs
            )
        entries = checkpoint_entries(state_dict, prefix, names, caller="TemporalEnsembleHead.load_state_dict")
        if self.ema_bias is None and holds_any(state_dict, prefix, ("online.bias", "ema_bias")):
            raise InvalidParameterError(
                "TemporalEnsembleHead.load_state_dict: the checkpoint's classifier has a bias but this head's has "
                "none; wrap an nn.Linear with bias=True"
            )
        experts = self._check_banks(entries, prefix)
        if prefix + "_extra_state" in state_dict:
            self._check_saved_state(state_dict[prefix + "_extra_state"], experts)
        # The banks grow with the experts: take the checkpoint's expert count.
        if experts != self.num_experts:
            self.ema_weight = self.ema_weight.new_zeros(experts, *self.ema_weight.shape[1:])
            if self.ema_bias is not None:
                self.ema_bias = self.ema_bias.new_zeros(experts, *self.ema_bias.shape[1:])
            self.num_updates = self.num_updates.new_zeros(experts)
        super()._load_from_state_dict(state_dict, prefix, local_metadata, strict, missing_keys, unexpected_keys, error_msgs)

    def _check_banks(self, entries: Dict[str, Tensor], prefix: str) -> int:
        """Checks the checkpoint's tensors against this head's layout; returns its expert count."""
        caller = "TemporalEnsembleHead.load_state_dict"
        classes, width = self.num_classes, self.in_features
        decays = self.num_decays
        fix = "build the head with the checkpoint's classifier shape and number of decays"
        check_entry(entries["online.weight"], prefix + "online.weight", (classes, width), caller=caller, fix=fix)
        check_entry(entries["decays"], prefix + "decays", (decays,), caller=caller, fix=fix)
        check_entry(entries["ema_weight"], prefix + "ema_weight", (None, decays, classes, width), caller=caller, fix=fix)
        experts = entries["ema_weight"].shape[0]
        check_entry(entries["num_updates"], prefix + "num_updates", (experts,), caller=caller, integer=True)
        if self.ema_bias is not None:
            check_entry(entries["online.bias"], prefix + "online.bias", (classes,), caller=caller, fix=fix)
            check_entry(entries["ema_bias"], prefix + "ema_bias", (experts, decays, classes), caller=caller, fix=fix)
        return experts

    def extra_repr(self) -> str:
        decays = tuple(round(float(d), 6) for d in self.decays)
        return f"num_experts={self.num_experts}, decays={decays}, aggregate={self.aggregate!r}"


def _ema_step_listed(bank: Tensor, target: Tensor, rate: Tensor, ids: Tensor) -> Tensor:
    """``bank[e] <- lerp(bank[e], target, rate)`` for each expert ``e`` in ``ids`` (duplicates once);
    returns the ``(E,)`` long count of steps taken (0 or 1 per expert)."""
    listed = ids.unique()
    bank.index_copy_(0, listed, _compat.lerp_(bank[listed], target, rate))
    return torch.zeros(bank.shape[0], dtype=torch.long, device=bank.device).index_fill_(0, listed, 1)


def _ema_step_masked(bank: Tensor, target: Tensor, rate: Tensor, ids: Tensor) -> Tensor:
    """The same step with no data-dependent shape: every bank is stepped, the unlisted ones kept."""
    moved = torch.zeros(bank.shape[0], dtype=torch.long, device=bank.device).index_fill_(0, ids, 1)
    keep = moved.view(-1, *([1] * (bank.ndim - 1))) == 0
    bank.copy_(torch.where(keep, bank, bank.lerp(target, rate)))
    return moved


def _copies_all_experts(features: Tensor, bank: Tensor, ids: Tensor) -> Tensor:
    """Logits ``(N, D, C)`` of each sample's expert's copies: every expert's bank, then a gather."""
    experts, decays, classes, width = bank.shape
    every = (features @ bank.view(experts * decays * classes, width).t()).view(-1, experts, decays, classes)
    return every[torch.arange(features.shape[0], device=features.device), ids]


def _copies_grouped_by_expert(features: Tensor, bank: Tensor, ids: Tensor) -> Tensor:
    """Logits ``(N, D, C)`` of each sample's expert's copies: one matmul per expert on its samples."""
    experts, decays, classes, width = bank.shape
    order = _compat.stable_argsort(ids)
    sizes = torch.bincount(ids, minlength=experts).tolist()
    groups = torch.split(features[order], sizes)
    flat_bank = bank.view(experts, decays * classes, width)
    grouped = torch.cat([group @ flat_bank[e].t() for e, group in enumerate(groups) if sizes[e]])
    copies = torch.empty_like(grouped)
    copies[order] = grouped  # back to the samples' order
    return copies.view(-1, decays, classes)
