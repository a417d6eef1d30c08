"""The seam contract: what a prompt method offers so that ``retrofit(model, "reference")`` wires it.

The upstream families recognise a codebase by its attributes; a method that implements
:class:`SeamContract` declares its seams instead (the query pass, the selection restricted to
experts, the head and its logit transform, the ensemble banks), and the ``reference`` family drives
them. ``docs/methods.md`` describes each seam.
"""

from __future__ import annotations

from typing import Any, Optional, Protocol, Sequence, Tuple, runtime_checkable

from torch import Tensor, nn

__all__ = ["SeamContract", "SeamOutput", "SeamQuery", "SEAM_MEMBERS", "missing_seams"]


class SeamQuery(Protocol):
    """What :meth:`SeamContract.compute_query` returns: ``router`` is the ``(B, D)`` router features."""

    router: Tensor


class SeamOutput(Protocol):
    """What a forward of a seam-contract method returns."""

    features: Tensor  # (B, D) input of the classifier
    query: SeamQuery
    selection: Tensor  # (B,) or (B, k) prompt ids


@runtime_checkable
class SeamContract(Protocol):
    """A prompt method the ``reference`` family wires (the project's reference methods implement it).

    Two attributes are optional and read when present: ``router_dim`` (the router's input width; the
    classifier's ``in_features`` otherwise) and ``current_expert`` (the expert trained now; ``0``
    otherwise).
    """

    num_experts: int

    @property
    def num_banks(self) -> int:
        """Temporal-ensemble banks a retrofit creates."""
        ...

    def compute_query(self, x: Tensor) -> SeamQuery:
        """One frozen, prompt-free pass giving the query and the router features."""
        ...

    def select(self, query: Tensor, *, train: bool, expert: Optional[Tensor] = None) -> Tensor:
        """The method's own prompt selection, restricted to ``expert``'s group when it is given."""
        ...

    def forward(self, x: Tensor, *, expert: Optional[Tensor] = None, query: Optional[Any] = None) -> SeamOutput:
        """Query pass (unless ``query`` is given), selection (restricted to ``expert``), prompted pass, head."""
        ...

    def bank_of(self, selection: Tensor) -> Tensor:
        """``(B,)`` ensemble bank of each sample."""
        ...

    def banks_of_expert(self, expert: int) -> Sequence[int]:
        """Banks re-cloned from the online head when ``expert`` starts."""
        ...

    def transform_logits(self, logits: Tensor, selection: Tensor) -> Tensor:
        """The method's transform of head outputs ``(B, C)`` or ``(B, H, C)``."""
        ...

    def get_classifier(self) -> nn.Linear:
        """The trainable head: the ensemble's online head."""
        ...

    def on_expert_start(self, expert: int) -> None:
        """The method's own start of ``expert``."""
        ...

    def predict(self, x: Tensor, logit_mask: Optional[Tensor] = None) -> Tensor:
        """Inference scores ``(B, C)`` with ``logit_mask`` added (the ensemble replaces it)."""
        ...


def _members(protocol: type) -> Tuple[str, ...]:
    # The annotated attributes, then the methods and properties, in the order of the class body.
    defined = (name for name in vars(protocol) if not name.startswith("_"))
    return (*protocol.__annotations__, *defined)


#: Every attribute a :class:`SeamContract` has, in declaration order.
SEAM_MEMBERS: Tuple[str, ...] = _members(SeamContract)


def missing_seams(model: Any) -> Tuple[str, ...]:
    """The members of :class:`SeamContract` that ``model`` lacks (empty: it implements the contract)."""
    return tuple(name for name in SEAM_MEMBERS if not hasattr(model, name))
