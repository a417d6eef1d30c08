"""The ensembled head: :class:`EnsembleLinear` takes the classifier's place, and :func:`ensemble_scores`
is what it answers at inference."""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Tuple, Union

import torch
from torch import Tensor, nn

from fly_modules import TemporalEnsembleHead
from fly_modules._validation import check_logit_mask

__all__ = ["ClassifierSteps", "EnsembleLinear", "bank_copies", "ensemble_scores", "frozen_classifier", "no_ema_cause",
           "perturb_banks"]

_NO_OPTIMIZER = (
    "Retrofit.end_batch: the ensemble is on but its EMA copies did not move during this batch while the "
    "classifier they copy did: pass "
    "optimizer=... to retrofit, call handle.attach_optimizer(new_optimizer) when your loop re-creates "
    "it, or call handle.update_ensemble() after each optimizer.step()"
)


def ensemble_scores(
    ensemble: TemporalEnsembleHead,
    features: Tensor,
    banks: Union[int, Tensor],
    logit_mask: Optional[Tensor] = None,
    transform: Optional[Callable[[Tensor], Tensor]] = None,
) -> Tensor:
    """Ensemble of ``[online, copies of each sample's bank]`` in the retrofit output convention.

    ``transform`` maps the member logits ``(B, H, C)`` (a method's per-sample class mask); the
    ``logit_mask`` is added next, then the members are aggregated. Softmax rules return the log of
    the aggregated probabilities, the other rules the aggregated logits.
    """
    members = ensemble.member_logits(features, banks)
    if transform is not None:
        members = transform(members)
    if logit_mask is not None:
        mask = check_logit_mask(logit_mask, members.shape[0], members.shape[2], caller="Retrofit (set_logit_mask)",
                                device=members.device)
        members = members + (mask.unsqueeze(1) if mask.ndim == 2 else mask)
    scores = ensemble.aggregate_members(members)
    return scores.log() if ensemble.aggregate.startswith("softmax") else scores


class EnsembleLinear(nn.Linear):
    """Stand-in for a retrofitted classifier: the online head in training, the ensemble at inference.

    It registers the online head's own ``weight`` and ``bias`` (the same ``Parameter`` objects), so an
    optimizer built before or after the retrofit trains them and the parent module's ``state_dict`` keys
    are unchanged. The online head itself is kept as ``online`` (not a child module).

    Args:
        online: the original ``nn.Linear``.
        scorer: ``scorer(x)`` computes the inference output; ``None`` (or a scorer answering ``None``: a
            removed retrofit) returns the online logits.
        is_training: tells training from inference (default: this module's ``training`` flag). The
            adapters pass the retrofitted model's flag: some codebases put the module that holds the
            classifier in eval mode inside every forward (MVP calls ``backbone.eval()``).
    """

    def __init__(
        self,
        online: nn.Linear,
        scorer: Optional[Callable[[Tensor], Tensor]],
        is_training: Optional[Callable[[], bool]] = None,
    ) -> None:
        nn.Module.__init__(self)
        self.in_features, self.out_features = online.in_features, online.out_features
        self.weight = online.weight
        if online.bias is None:
            self.register_parameter("bias", None)
        else:
            self.bias = online.bias
        self.training = online.training
        self.__dict__["online"] = online
        self.__dict__["scorer"] = scorer
        self.__dict__["is_training"] = is_training

    def forward(self, x: Tensor) -> Tensor:
        training = self.training if self.is_training is None else self.is_training()
        scores = None if training or self.scorer is None else self.scorer(x)
        return self.online(x) if scores is None else scores

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, online={type(self.online).__name__}"


class ClassifierSteps:
    """Whether something stepped the classifier the ensemble copies since :meth:`rebase`: the version counters
    of its parameters move with every in-place update (read on the host, no device synchronisation). A batch
    whose classifier moved while its copies did not has an optimizer the ensemble does not follow; one whose
    classifier did not move either (a step ``GradScaler`` skipped, gradient accumulation) lost nothing."""

    def __init__(self, ensemble: Any) -> None:
        self.ensemble = ensemble
        self.seen = self._versions()

    def _versions(self) -> Tuple[Tuple[int, int], ...]:
        online = self.ensemble.online
        return () if online is None else tuple((id(p), p._version) for p in online.parameters())

    def rebase(self) -> None:
        self.seen = self._versions()

    def stepped(self) -> bool:
        return self._versions() != self.seen


def no_ema_cause(ensemble: Any, stepped: bool) -> Optional[str]:
    """Why the EMA copies did not move during a batch, if that loses anything: a frozen classifier (nothing
    to follow; where each task has its own, one frozen after its task), or a classifier ``stepped`` by an
    optimizer without the step hook; ``None`` when the classifier did not move either."""
    online = ensemble.online
    if online is not None and not online.weight.requires_grad:
        return f"Retrofit.end_batch: {frozen_classifier(online)} (docs/adapters.md, \"Per-expert classifiers\")"
    return _NO_OPTIMIZER if stepped else None


def frozen_classifier(online: nn.Module) -> str:
    """What a frozen copied classifier means, and the fix (``end_batch``'s warning and ``verify``'s check)."""
    return (f"the classifier the ensemble copies ({type(online).__name__} {tuple(online.weight.shape)}) is frozen "
            "(requires_grad=False), so its EMA copies have nothing to follow; where each task has its own "
            "classifier, name the pool of them as the head")


def bank_copies(ensemble: Any) -> List[Tensor]:
    """Each bank's EMA copies, flattened (a pool of per-expert classifiers: its own expert's)."""
    if isinstance(ensemble, TemporalEnsembleHead):
        bias = ensemble.ema_bias
        return [torch.cat([ensemble.ema_weight[b].flatten(), *(() if bias is None else (bias[b].flatten(),))])
                for b in range(ensemble.num_experts)]
    return ensemble.bank_copies()


@torch.no_grad()
def perturb_banks(ensemble: Any, banks: List[int], generator: torch.Generator) -> None:
    """Overwrite the copies of ``banks`` with large random weights (``verify`` then looks for them in the logits)."""
    for bank in banks:
        member, index = (ensemble, bank) if isinstance(ensemble, TemporalEnsembleHead) else (ensemble.member(bank), 0)
        if member is None:
            continue
        weight = member.ema_weight[index]
        noise = torch.randn(weight.shape, generator=generator, dtype=torch.float64)
        weight.copy_((noise * 10.0 / weight.shape[-1] ** 0.5).to(weight))
        if member.ema_bias is not None:
            bias = member.ema_bias[index]
            bias.copy_((torch.randn(bias.shape, generator=generator, dtype=torch.float64) * 10.0).to(bias))
