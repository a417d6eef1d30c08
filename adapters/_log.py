"""Routing accuracy and expert use of a retrofit, written to the user's scalar writer (``handle.log_to``).

The counts stay on the model's device while the loop runs (scatter-adds, no host synchronisation); they
are read once per :meth:`DiagnosticsLog.write`. The writer is duck-typed: anything with
``add_scalar(tag, value, step)`` (``torch.utils.tensorboard.SummaryWriter``, tensorboardX) or a callable
``(tag, value, step)``; nothing here imports a logging package. Definitions: docs/diagnostics.md.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional

import torch
from torch import Tensor

from fly_modules._validation import InvalidParameterError, check_int

__all__ = ["DiagnosticsLog", "scalar_writer"]

ScalarWriter = Callable[[str, float, int], Any]


def scalar_writer(writer: Any, caller: str) -> ScalarWriter:
    """``writer`` as a ``(tag, value, step)`` callable: its ``add_scalar``, or itself when callable."""
    add_scalar = getattr(writer, "add_scalar", None)
    if callable(add_scalar):
        return add_scalar
    if callable(writer):
        return writer
    raise InvalidParameterError(
        f"{caller}: expected a writer with add_scalar(tag, value, step) (e.g. torch.utils.tensorboard.SummaryWriter) "
        f"or a callable (tag, value, step), got {type(writer).__name__}"
    )


class DiagnosticsLog:
    """Counts of one retrofit's training and routed inference, written as scalars at :meth:`write`.

    Training: :meth:`add_training` counts the stream batch's labels under the current expert (which expert
    trained each class). Inference: :meth:`add_inference`, after a forward, counts the experts the router
    gave it and, with the labels, whether each is the expert that trained most of the sample's class
    (or the ``true_experts`` given). :meth:`write` writes, under ``prefix``:

    - ``routing_accuracy``: routed samples with the true expert, over routed samples with a known one;
    - ``expert_share/<e>``: each expert's share of the routed samples;
    - ``trained_share/<e>``: each expert's share of the training samples counted so far;

    then starts the next evaluation's counts (the training counts accumulate). Args: ``handle``, the
    retrofit; ``writer``, as :func:`scalar_writer` takes it; ``num_classes`` (default: the ensemble's, else
    the classifier's outputs); ``prefix`` of every tag.
    """

    def __init__(self, handle: Any, writer: Any, *, num_classes: Optional[int] = None, prefix: str = "fly") -> None:
        caller = "Retrofit.log_to"
        self.handle, self.write_scalar, self.prefix = handle, scalar_writer(writer, caller), str(prefix)
        if handle.num_experts is None:
            raise InvalidParameterError(f"{caller}: the retrofit declares no number of experts (pass num_experts= "
                                        "to retrofit)")
        self.num_experts = int(handle.num_experts)
        self.num_classes = check_int(_classes(handle) if num_classes is None else num_classes, "num_classes",
                                     caller=caller, minimum=1)
        self.trained: Optional[Tensor] = None  # (classes, experts) training samples
        self.routed: Optional[Tensor] = None  # (experts,) routed inference samples
        self.hits: Optional[Tensor] = None  # (2,) routed samples with the true expert, with a known one
        self._last_routed: Optional[Tensor] = None

    def add_training(self, targets: Tensor) -> None:
        """Count the labels of a stream batch as trained by the current expert (once per stream batch).

        Labels must lie in ``[0, num_classes)``; they are not read back to check it (that would synchronise
        the device): an out-of-range label fails in the scatter (on CUDA, as a device-side assertion).
        """
        labels = _labels(targets, "DiagnosticsLog.add_training")
        if self.trained is None:
            self.trained = torch.zeros(self.num_classes, self.num_experts, dtype=torch.long, device=labels.device)
        cells = labels.to(self.trained.device) * self.num_experts + int(self.handle.current_expert)
        self.trained.view(-1).scatter_add_(0, cells, torch.ones_like(cells))

    def add_inference(self, targets: Optional[Tensor] = None, *, true_experts: Optional[Tensor] = None) -> None:
        """Count the routed experts of the latest inference forward; nothing when it was not routed."""
        experts = self.handle.record.routed
        if experts is None or experts is self._last_routed:  # the router off, not fitted, or this forward unrouted
            return
        truth = self._truth(experts, targets, true_experts)  # checks the labels before anything is counted
        self._last_routed = experts
        if self.routed is None:
            self.routed = torch.zeros(self.num_experts, dtype=torch.long, device=experts.device)
            self.hits = torch.zeros(2, dtype=torch.long, device=experts.device)
        self.routed.scatter_add_(0, experts, torch.ones_like(experts))
        if truth is not None:
            known = truth >= 0
            self.hits += torch.stack([((experts == truth) & known).sum(), known.sum()])

    def _truth(self, experts: Tensor, targets: Optional[Tensor], true_experts: Optional[Tensor]) -> Optional[Tensor]:
        """Each routed sample's true expert (-1: unknown), from ``true_experts`` or the training counts."""
        caller = "DiagnosticsLog.add_inference"
        given = true_experts if true_experts is not None else targets
        if given is not None and tuple(given.shape) != tuple(experts.shape):
            raise InvalidParameterError(f"{caller}: expected {tuple(experts.shape)} labels, one per sample of the "
                                        f"routed forward, got shape {tuple(given.shape)}")
        if true_experts is not None:
            return _labels(true_experts, caller).to(experts.device)
        if targets is None or self.trained is None:
            return None
        modal = self.trained.argmax(dim=1)
        modal = torch.where(self.trained.sum(dim=1) > 0, modal, torch.full_like(modal, -1))
        return modal[_labels(targets, caller).to(modal.device)].to(experts.device)

    def write(self, step: int) -> Dict[str, float]:
        """Write the scalars at ``step`` (one host read of the counts); returns them by tag."""
        step = check_int(step, "step", caller="DiagnosticsLog.write", minimum=0)
        values: Dict[str, float] = {}
        if self.routed is not None and self.hits is not None:
            routed, (hits, known) = self.routed.tolist(), self.hits.tolist()
            if known:
                values["routing_accuracy"] = hits / known
            values.update({f"expert_share/{e}": n / max(sum(routed), 1) for e, n in enumerate(routed)})
            self.routed, self.hits = None, None
        if self.trained is not None:
            per_expert = self.trained.sum(dim=0).tolist()
            values.update({f"trained_share/{e}": n / max(sum(per_expert), 1) for e, n in enumerate(per_expert)})
        tagged = {f"{self.prefix}/{name}": value for name, value in values.items()}
        for tag, value in tagged.items():
            self.write_scalar(tag, value, step)
        return tagged

    def state_dict(self) -> Dict[str, Any]:
        """The training counts (the true experts of a resumed loop); evaluation counts are not kept."""
        return {"trained": None if self.trained is None else self.trained.clone()}

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        trained = state.get("trained") if isinstance(state, dict) else None
        shape = (self.num_classes, self.num_experts)
        if trained is not None and tuple(trained.shape) != shape:
            raise InvalidParameterError(f"DiagnosticsLog.load_state_dict: expected training counts of shape {shape}, "
                                        f"got {tuple(trained.shape)}")
        self.trained = None if trained is None else trained.clone()


def _labels(values: Any, caller: str) -> Tensor:
    if not isinstance(values, Tensor) or values.ndim != 1 or values.dtype.is_floating_point:
        raise InvalidParameterError(f"{caller}: expected a 1-D integer tensor of labels, got "
                                    f"{getattr(values, 'shape', type(values).__name__)}")
    return values.long()


def _classes(handle: Any) -> int:
    """The classes of the retrofit's head: the ensemble's, else the model's classifier's outputs."""
    if handle.ensemble is not None:
        return int(handle.ensemble.num_classes)
    from fly_modules.classifier import find_classifier

    try:
        return int(find_classifier(handle.model).out_features)
    except (ValueError, TypeError, AttributeError):
        raise InvalidParameterError("Retrofit.log_to: the model has no nn.Linear classifier to count classes by; "
                                    "pass num_classes=") from None
