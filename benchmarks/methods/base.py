"""The base class of the reference methods, and the registry that builds methods by name.

``PromptMethod`` implements ``fly_modules.adapters.SeamContract``: it splits a prompt method into what
fly-modules replaces or drives (the frozen query pass, the selection restricted to given experts to
route or force it, the prompted pass, the head and its logit transform) and adds the training hooks a
loop calls. The contract is described in docs/methods.md.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, ClassVar, Dict, List, Optional, Type

import torch
import torch.nn.functional as F
from fly_modules.adapters import SeamContract
from torch import Tensor, nn

from ..parallel import WHOLE_BATCH, BatchShare

__all__ = [
    "MethodOutput",
    "QueryFeatures",
    "PromptMethod",
    "register_method",
    "create_method",
    "list_methods",
    "method_class",
    "frozen_cls",
]


@dataclass
class QueryFeatures:
    """Outputs of the single frozen, prompt-free backbone pass of a batch.

    Attributes:
        query: ``(B, Dq)`` features the method's own prompt selection matches against its keys.
        router: ``(B, Dr)`` features the analytic router accumulates and routes on (usually the
            final-norm CLS token; may be the same tensor as ``query``).
    """

    query: Tensor
    router: Tensor


@dataclass
class MethodOutput:
    """Everything one forward pass of a method produces.

    Attributes:
        logits: ``(B, C)`` classifier output after ``transform_logits`` and before any logit mask.
        features: ``(B, D)`` input of the classifier head.
        query: the batch's ``QueryFeatures`` (reuse them; never recompute).
        selection: ``(B,)`` or ``(B, k)`` long tensor of the prompt ids used.
        expert: ``(B,)`` long tensor, the expert / ensemble-bank id of each sample.
        aux_loss: scalar tensor, the method's extra training loss (0 when it has none).
    """

    logits: Tensor
    features: Tensor
    query: QueryFeatures
    selection: Tensor
    expert: Tensor
    aux_loss: Tensor


class PromptMethod(nn.Module, SeamContract):
    """Base class of the reference implementations in ``benchmarks.methods``: a
    :class:`~fly_modules.adapters.SeamContract` with the training hooks of a loop.

    Subclasses set the class attributes and implement ``compute_query``, ``select``, ``expert_of`` and
    ``forward_features``; everything else has a working default. Every instance has the frozen
    ``backbone`` (kept in eval mode), the trainable ``head``, ``num_experts`` and ``current_expert``.
    """

    #: registry name (``"dualprompt"``)
    name: ClassVar[str] = ""
    #: consumes ground-truth session boundaries (L2P, HiDe-Prompt, NoRGa); the task-free methods start
    #: experts on a sample budget instead
    session_aware: ClassVar[bool] = False
    #: the reference protocol's learning rate for the method
    default_lr: ClassVar[float] = 0.005
    #: ``"batch"``: the training logit mask covers the batch's classes; ``"seen"``: every exposed class
    train_logit_mask: ClassVar[str] = "batch"
    #: trains its own analytic router and temporal ensemble (its ``router`` and ``ensemble``, FlyPrompt):
    #: a benchmark adds neither and runs it as one variant, ``full``
    builtin_components: ClassVar[bool] = False
    #: why a router cannot choose this method's experts per sample (every sample uses every expert,
    #: SD-LoRA); empty when it can. A benchmark skips the routed variants with this reason.
    router_refusal: ClassVar[str] = ""
    #: why EMA copies of this method's head would not be its classifier (RanPAC: a ridge classifier replaces
    #: the head after the first session); empty when they are. A benchmark skips the ensemble variants.
    ensemble_refusal: ClassVar[str] = ""

    backbone: nn.Module
    head: nn.Linear
    num_experts: int
    current_expert: int

    # ----------------------------------------------------------------------------- set-up
    @classmethod
    def protocol_kwargs(cls, protocol: Any, *, seed: int, backbone: nn.Module, num_classes: int) -> Dict[str, Any]:
        """Constructor arguments for a benchmark run of ``protocol`` (``benchmarks.ablation.runner.Protocol``).

        ``num_experts`` and the protocol's ``method_kwargs`` for this method by default; subclasses add
        what the protocol decides for them (router settings, learning rates, initial prompts).
        """
        return {"num_experts": protocol.num_experts, **protocol.method_kwargs.get(cls.name, {})}

    @classmethod
    def from_protocol(cls, backbone: nn.Module, num_classes: int, protocol: Any, seed: int) -> "PromptMethod":
        """The method of a benchmark run, built around ``backbone`` with :meth:`protocol_kwargs`."""
        return cls(backbone, num_classes, **cls.protocol_kwargs(protocol, seed=seed, backbone=backbone, num_classes=num_classes))

    @classmethod
    def protocol_notes(cls, protocol: Any) -> str:
        """What a run record should say about how the protocol built this method ("" when nothing)."""
        return ""

    @classmethod
    def protocol_warning(cls, protocol: Any) -> str:
        """What a sweep should warn of before it starts: the protocol builds a lesser form of the method
        ("" when it does not)."""
        return ""

    # ----------------------------------------------------------------------------------- seams
    def compute_query(self, x: Tensor) -> QueryFeatures:
        """One frozen, prompt-free pass (no grad) giving the query and the router features.

        By default :meth:`query_from_frozen` of :meth:`frozen_features`; a method that implements that
        split lets an evaluator reuse the frozen pass of a test batch it has already seen.
        """
        return self.query_from_frozen(self.frozen_features(x))

    def frozen_features(self, x: Tensor) -> Any:
        """The frozen, prompt-free pass's outputs the query derives from: a tensor (or tuple of tensors)
        with the batch first that depends on the images alone, never on trained state."""
        raise NotImplementedError

    def query_from_frozen(self, frozen: Any) -> QueryFeatures:
        """The query and router features from :meth:`frozen_features` (may read trained state)."""
        raise NotImplementedError

    @classmethod
    def splits_query(cls) -> bool:
        """Whether the method implements :meth:`frozen_features` (its test queries can be cached)."""
        return cls.frozen_features is not PromptMethod.frozen_features

    def select(self, query: Tensor, *, train: bool, expert: Optional[Tensor] = None) -> Tensor:
        """The method's own prompt selection; restricted to ``expert``'s group when it is given."""
        raise NotImplementedError

    def expert_of(self, selection: Tensor) -> Tensor:
        """``(B,)`` expert / ensemble-bank id of each sample for a given selection."""
        raise NotImplementedError

    @property
    def num_banks(self) -> int:
        """Number of temporal-ensemble banks a retrofit creates (one per expert by default)."""
        return self.num_experts

    def bank_of(self, selection: Tensor) -> Tensor:
        """``(B,)`` ensemble-bank id of each sample (the expert by default; DualPrompt: the slot)."""
        return self.expert_of(selection)

    def banks_of_expert(self, expert: int) -> List[int]:
        """Banks re-cloned from the online head when ``expert`` starts (``[expert]`` by default)."""
        return [int(expert)]

    def forward_features(self, x: Tensor, selection: Tensor) -> Tensor:
        """Prompted backbone pass with per-sample ``selection``; returns the head input ``(B, D)``."""
        raise NotImplementedError

    def common_features(self, x: Tensor) -> Tensor:
        """The head input ``(B, D)`` of a pass with the parameters every expert shares and no expert's own
        (the CKA study's common representation, docs/benchmark.md); not defined by default."""
        raise NotImplementedError(f"{type(self).__name__} defines no common representation of its experts")

    def query_conditioned_features(self, x: Tensor, query: QueryFeatures, selection: Tensor) -> Tensor:
        """The prompted pass of :meth:`forward`, given the batch's query too: :meth:`forward_features` by
        default; a method whose prompts are weighted by the query (CODA-P) reuses it here instead of
        running the frozen pass again."""
        return self.forward_features(x, selection)

    def transform_logits(self, logits: Tensor, selection: Tensor) -> Tensor:
        """Method-specific transform of head outputs ``(B, C)`` or ``(B, H, C)``; identity by default."""
        return logits

    def get_classifier(self) -> nn.Linear:
        return self.head

    def auxiliary_loss(
        self, query: QueryFeatures, selection: Tensor, features: Tensor, parallel: BatchShare = WHOLE_BATCH
    ) -> Tensor:
        """Extra training loss (key pull, contrastive term, ...); zero by default."""
        return features.new_zeros(())

    def trainable_parameters(self) -> List[nn.Parameter]:
        """The parameters the optimizer trains (everything with ``requires_grad``)."""
        return [p for p in self.parameters() if p.requires_grad]

    def make_optimizer(self, lr: float) -> torch.optim.Optimizer:
        """The optimizer a loop trains :meth:`trainable_parameters` with at the run's learning rate ``lr``:
        Adam without weight decay (the launch scripts' ``--opt_name adam``) unless the method says otherwise."""
        return torch.optim.Adam(self.trainable_parameters(), lr=lr)

    # ------------------------------------------------------------------------------- forward
    def forward(
        self,
        x: Tensor,
        *,
        expert: Optional[Tensor] = None,
        query: Optional[QueryFeatures] = None,
        parallel: BatchShare = WHOLE_BATCH,
    ) -> MethodOutput:
        """Query pass (unless ``query`` is given) -> selection -> prompted pass -> head.

        ``self.training`` decides between the training-time and the inference-time selection.
        ``expert`` (``(B,)`` long) restricts the selection to those experts (routed or forced).
        ``parallel``: this process's share of a data-parallel batch (statistics use the global batch).
        """
        if query is None:
            query = self.compute_query(x)
        selection = self.select(query.query, train=self.training, expert=expert)
        features = self.query_conditioned_features(x, query, selection)
        logits = self.transform_logits(self.head(features), selection)
        aux = self.auxiliary_loss(query, selection, features, parallel) if self.training else features.new_zeros(())
        if self.training:
            self.record_selection(selection, parallel)
        return MethodOutput(logits, features, query, selection, self.expert_of(selection), aux)

    @torch.no_grad()
    def predict(self, x: Tensor, logit_mask: Optional[Tensor] = None) -> Tensor:
        """Inference scores ``(B, C)`` (argmax = prediction) with the seen-class ``logit_mask`` added.

        The default is the method's own inference: its own selection, the online head, the mask.
        Methods with a built-in router/ensemble (FlyPrompt) and the retrofit adapters override this.
        """
        output = self(x)  # through __call__ so that forward hooks (retrofits) apply
        return output.logits if logit_mask is None else output.logits + logit_mask

    def loss(
        self, output: MethodOutput, target: Tensor, logit_mask: Optional[Tensor] = None,
        parallel: BatchShare = WHOLE_BATCH,
    ) -> Tensor:
        """Cross-entropy on the masked logits plus the method's auxiliary loss."""
        logits = output.logits if logit_mask is None else output.logits + logit_mask
        return F.cross_entropy(logits, target) + output.aux_loss

    # ------------------------------------------------------------------------ training hooks
    def on_expert_start(self, expert: int) -> None:
        """A new expert starts being trained (sample budget or session start)."""
        self.current_expert = int(expert)

    def on_session_end(self, session: int) -> None:
        """A benchmark session ended (only session-aware methods should rely on it)."""

    def on_optimizer_step(self, output: MethodOutput) -> None:
        """Called after every optimizer step (each online iteration) with that step's output.

        Built-in per-step state lives here (FlyPrompt's EMA heads); no-op by default.
        """

    def on_batch_end(self, x: Tensor, y: Tensor, output: MethodOutput, parallel: BatchShare = WHOLE_BATCH) -> None:
        """Called once per stream batch after its online iterations (statistics, counters).

        ``output`` is the batch's first training forward; its ``query.router`` holds the router features
        of the batch (a benchmark may replace them with those of the un-augmented batch).
        """

    def on_evaluate(self) -> None:
        """Called before each evaluation."""

    def trains_online(self) -> bool:
        """Whether the next batch's online iterations train anything (``True`` by default). A method whose
        trained parts are all frozen (RanPAC after its first session) returns ``False``: the loop then runs
        one forward without gradients for the batch's hooks instead of the optimizer steps."""
        return True

    def record_selection(self, selection: Tensor, parallel: BatchShare = WHOLE_BATCH) -> None:
        """Called by every training :meth:`forward`, last, with the batch's selection (L2P and MVP count
        how often each prompt is chosen); no-op by default."""

    def train(self, mode: bool = True) -> "PromptMethod":
        # The frozen backbone stays in eval mode whatever the method's mode (no dropout/drop-path
        # noise in the query pass, as in the reference).
        super().train(mode)
        self.backbone.eval()
        return self


# --------------------------------------------------------------------------------- registry
_METHODS: Dict[str, Type[PromptMethod]] = {}


def register_method(cls: Type[PromptMethod]) -> Type[PromptMethod]:
    """Class decorator adding a method to the registry under ``cls.name``."""
    if not cls.name:
        raise ValueError(f"{cls.__name__} must set the class attribute `name` to be registered")
    if cls.name in _METHODS and _METHODS[cls.name] is not cls:
        raise ValueError(f"a method named {cls.name!r} is already registered ({_METHODS[cls.name].__name__})")
    _METHODS[cls.name] = cls
    return cls


def list_methods() -> List[str]:
    """Registered method names, sorted."""
    return sorted(_METHODS)


def method_class(name: str) -> Type[PromptMethod]:
    """The registered method class called ``name``."""
    try:
        return _METHODS[name]
    except KeyError:
        raise KeyError(f"unknown method {name!r}; registered methods: {', '.join(list_methods())}") from None


def create_method(name: str, backbone: nn.Module, num_classes: int, **kwargs) -> PromptMethod:
    """Build a registered method around a timm ViT ``backbone``."""
    return method_class(name)(backbone, num_classes, **kwargs)


# ---------------------------------------------------------------------------------- helpers
@torch.no_grad()
def frozen_cls(backbone: nn.Module, x: Tensor, *, depth: Optional[int] = None, norm: bool = True) -> Tensor:
    """CLS token of a prompt-free pass through a timm ``VisionTransformer``.

    Args:
        backbone: the frozen ViT.
        x: images ``(B, 3, H, W)``.
        depth: run only the first ``depth`` blocks (MVP's query uses 11 of 12); all by default.
        norm: apply the final LayerNorm (``backbone.norm``).
    """
    tokens = backbone.patch_embed(x)
    tokens = backbone._pos_embed(tokens)
    tokens = backbone.patch_drop(tokens)
    tokens = backbone.norm_pre(tokens)
    blocks: Callable = backbone.blocks if depth is None else backbone.blocks[:depth]
    tokens = blocks(tokens)
    if norm:
        tokens = backbone.norm(tokens)
    return tokens[:, 0]
