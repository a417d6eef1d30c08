"""The paper's two other online RanPACs (its ``ranpac_vs_flyprompt`` table), beside RanPAC† (``ranpac``):

- RanPAC‡ (``ranpac-frozen``): no first-session adaptation. The pre-trained model stays as it is (the
  adapters are never trained: their zero up-projection makes them the identity) and the features of every
  batch, the first session's included, feed the ridge classifier from the first batch on. The paper
  "stores all features"; the features of a frozen model never change, so adding each batch's statistics
  once is the same classifier as storing the features and solving at the end.
- RanPAC* (``ranpac-collect``): RanPAC† that also adds each first-session batch to the classifier, its
  class token computed after the batch's training steps while the adaptation still changes (the
  "ill-conditioned" Gram matrix of the paper's description): ``first_session_statistics`` on.

Each is selectable by name (``--methods ranpac,ranpac-frozen,ranpac-collect``); docs/methods.md ("RanPAC
variants").
"""

from __future__ import annotations

from typing import Any, ClassVar

from torch import nn

from .base import register_method
from .ranpac import RanPAC

__all__ = ["RanPACFrozen", "RanPACCollect"]


@register_method
class RanPACFrozen(RanPAC):
    """RanPAC‡: the frozen pre-trained model's class token, every batch into the ridge classifier.

    Same arguments as :class:`RanPAC` but ``first_session_statistics`` (refused: every batch is added).
    """

    name: ClassVar[str] = "ranpac-frozen"

    def __init__(self, backbone: nn.Module, num_classes: int, **kwargs: Any) -> None:
        if "first_session_statistics" in kwargs:
            raise TypeError("RanPACFrozen: first_session_statistics is not an option: every batch, the first "
                            "session's included, feeds the classifier")
        super().__init__(backbone, num_classes, **kwargs)
        self.first_session_done = True  # nothing to adapt: the classifier phase from the first batch
        self._sync_trainable()


@register_method
class RanPACCollect(RanPAC):
    """RanPAC*: RanPAC† with the first session's class tokens (each after its batch's steps) in the classifier.

    Same arguments as :class:`RanPAC`; ``first_session_statistics`` is on and may not be turned off (that
    is ``ranpac``).
    """

    name: ClassVar[str] = "ranpac-collect"

    def __init__(self, backbone: nn.Module, num_classes: int, **kwargs: Any) -> None:
        if kwargs.pop("first_session_statistics", True) is not True:
            raise TypeError("RanPACCollect: first_session_statistics must stay True (RanPAC† without it is 'ranpac')")
        super().__init__(backbone, num_classes, first_session_statistics=True, **kwargs)
