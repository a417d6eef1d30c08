"""What a run of the cross-ablation is: the :class:`Protocol` (every setting but the method, variant,
dataset and seed) and the :class:`RunSpec` naming one result, shared by the presets, the runner, the
result files and the command line."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Dict, Literal, Optional, Tuple, Union

__all__ = ["PAPER_METHODS", "ROUTER_QUERIES", "Protocol", "RunSpec"]

#: the methods of the paper's cross-ablation table
PAPER_METHODS = ("l2p", "dualprompt", "mvp", "misa", "hide", "norga")
ROUTER_QUERIES = ("clean", "first_iteration")
_REPOSITORY = Path(__file__).resolve().parents[2]
#: method arguments that name a file (recorded by their path in the checkout, as ``weights`` is)
_FILE_KWARGS = frozenset({"prompt_weights"})


@dataclass
class Protocol:
    """Every setting of a run except (method, variant, dataset, seed). See ``cross_ablation.py --help``."""

    model: str = "vit_base_patch16_224.orig_in21k"
    model_kwargs: Dict[str, Any] = field(default_factory=dict)
    pretrained: bool = True
    weights: Optional[str] = None
    image_size: int = 224
    batch_size: int = 64
    online_iter: int = 3
    eval_period: int = 1000
    test_batch_size: int = 128
    num_sessions: int = 5
    disjoint_ratio: float = 0.5
    blurry_ratio: float = 0.1
    num_experts: int = 5
    lr: Optional[float] = None  # None: the method's default (Adam 0.005; 0.003 for HiDe-Prompt/NoRGa)
    expansion_dim: int = 10_000
    ridge: Union[float, Literal["auto"]] = 1e4  # "auto": chosen by generalised cross-validation
    decays: Tuple[float, ...] = (0.9, 0.99)
    aggregate: str = "softmax_max"
    amp: bool = True  # used on CUDA only
    augment: bool = True
    method_kwargs: Dict[str, Dict[str, Any]] = field(default_factory=dict)
    misa_prompts: Optional[str] = None  # folder with g_prompt.pt and e_prompt.pt
    # Router statistics from "clean": a frozen fp32 pass over the un-augmented batch (the reference,
    # docs/protocol.md §3.4 step 3), or "first_iteration": the query pass of the batch's first online
    # iteration (augmented, under autocast; one backbone pass fewer).
    router_query: str = "clean"
    # When experts start: "method" (each method's own), "session" (task-correlated) or "budget" (self-triggered
    # every floor(N_train / num_experts) samples): benchmarks.ablation.expert_schedules.
    expert_schedule: str = "method"
    # The training logit mask: "method" (each method's own), "none", "random", "seen" or "batch":
    # benchmarks.ablation.logit_masks.
    train_mask: str = "method"

    def to_dict(self) -> Dict[str, Any]:
        """The protocol as recorded; weight files of the checkout by their path in it, so that a record
        does not depend on where the repository lies (and names no folder of the machine)."""
        record = asdict(self)
        if self.weights is not None:
            record["weights"] = _portable(self.weights)
        for kwargs in record["method_kwargs"].values():
            for name in _FILE_KWARGS.intersection(kwargs):
                kwargs[name] = _portable(kwargs[name])
        return record


def _portable(path: Any) -> str:
    """``path`` relative to the checkout when it lies in it, otherwise as given."""
    resolved = Path(path).resolve()
    return resolved.relative_to(_REPOSITORY).as_posix() if resolved.is_relative_to(_REPOSITORY) else str(path)


@dataclass(frozen=True)
class RunSpec:
    """One result of the sweep: a variant of a method on a dataset with a seed (one result file)."""

    method: str
    variant: str
    dataset: str
    seed: int

    @property
    def key(self) -> str:
        return f"{self.dataset}/{self.method}/{self.variant}/seed{self.seed}"
