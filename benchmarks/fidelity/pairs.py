"""Which official class each reference method is compared with, and how their states correspond: one
row per method, read by the official side, our side and the comparison."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Optional, Tuple

from torch import Tensor, nn

from . import coda_state, expert_state, flyprompt_state, hide_state, ranpac_state, seqft_state, sprompt_state
from .setting import Setting

__all__ = ["MethodPair", "PAIRS"]

_HEAD = {"backbone.fc.weight": "head.weight", "backbone.fc.bias": "head.bias"}


@dataclass(frozen=True)
class MethodPair:
    """One reference method and the official model and trainer it is compared with.

    Attributes:
        method: our registry name (``benchmarks.methods``).
        official: the official model and trainer (a key of ``reference_checkout.CLASSES``).
        weights: official parameter name -> ours, for every trainable tensor of either side.
        ours_kwargs: our constructor options that select the official behaviour (``reference_quirks``).
        official_kwargs: official constructor options beyond the backbone, classes and steps.
        official_selection: reads the official model's prompt selection of its last forward.
        selection_attributes: attributes of the official model set during that forward only, where the
            model records its selection only when they are set.
        buffers: official buffer -> ours, the untrained state the selection reads (copied with the
            weights for the evaluation on identical state).
        official_lr: the launch scripts' learning rate for the method (Adam, constant).
        align: ``(official model, our model)``, before the stream: the untrained state both must share
            (random matrices, initial EMA heads), copied from one side to the other.
        other_state: ``(official model, our model, images) -> {name: (official, ours)}``, after the
            stream: the state beyond the trainable tensors to compare (router statistics, EMA heads).
        load_official: ``(official model, our model)``: that state copied to ours for the evaluation on
            identical state.
        official_predict: ``(trainer, images) -> (scores, selection)`` where the official inference is
            not the model's forward plus the seen-class mask.
        setup_trainer: sets what the official run's configuration gives the trainer beyond
            ``reference_checkout.make_trainer``.
        build_official: ``(checkout, backbone name, classes) -> model`` where the official model is not
            its class's constructor (Seq FT: ``select_model`` builds the checkout's ViT itself).
        variant: what sets this row apart from the method's main row ("" for the main row).
        session_end_seed: both sides reseed the global generator with ``session_end_seed + session``
            right before their session-end hook (for draws made there, HiDe-Prompt's alignment).
        note: what differs on purpose or is not compared.
    """

    method: str
    official: str
    weights: Dict[str, str]
    official_selection: Callable[[nn.Module], Tensor]
    selection_attributes: Dict[str, Any] = field(default_factory=dict)
    buffers: Dict[str, str] = field(default_factory=dict)
    ours_kwargs: Dict[str, Any] = field(default_factory=dict)
    official_kwargs: Dict[str, Any] = field(default_factory=dict)
    official_lr: float = 0.005
    align: Optional[Callable[[nn.Module, nn.Module], None]] = None
    other_state: Optional[Callable[[nn.Module, nn.Module, Tensor], Dict[str, Tuple[Tensor, Tensor]]]] = None
    load_official: Optional[Callable[[nn.Module, nn.Module], None]] = None
    official_predict: Optional[Callable[[Any, Tensor], Tuple[Tensor, Tensor]]] = None
    setup_trainer: Optional[Callable[[Any], None]] = None
    build_official: Optional[Callable[[Any, str, int], nn.Module]] = None
    session_end_seed: Optional[int] = None
    variant: str = ""
    note: str = ""

    def names(self) -> Tuple[Tuple[str, str], ...]:
        return tuple(sorted(self.weights.items()))


PAIRS: Dict[str, MethodPair] = {
    "l2p": MethodPair(
        "l2p", "l2p", {"prompt.key": "keys", "prompt.prompts": "prompts", **_HEAD},
        official_selection=lambda model: model.prompt.last_selected_indices,
        note="diversified selection: the official frequency is never updated, ours is off (same ranking)",
    ),
    "dualprompt": MethodPair(
        "dualprompt", "dualprompt",
        {"g_prompt.prompts": "g_prompts", "e_prompt.prompts": "e_prompts", "e_prompt.key": "e_keys", **_HEAD},
        official_selection=lambda model: model.e_prompt.last_selected_indices[:, 0],
        ours_kwargs={"reference_quirks": True},
        note="reference_quirks=True (pool-wide match at inference, as the official code); off by default",
    ),
    "mvp": MethodPair(
        "mvp", "mvp",
        {"learnable_key": "keys", "learnable_mask": "logit_mask", "g_prompts": "g_prompts", "e_prompts": "e_prompts",
         **_HEAD},
        # The official MVP records its selection only with its EMA heads on (a flag its forward reads
        # for that alone); the heads themselves are not built.
        official_selection=lambda model: model.last_expert_ids,
        selection_attributes={"use_ema_head": True, "num_ema": 1},
        buffers={"count": "count"},
        ours_kwargs={"reference_quirks": True},
        note="reference_quirks=True (batch-global focal weight and contrastive broadcast, as the official code)",
    ),
}

# MISA is the official DualPrompt with --load_pt: 10 G-prompt tokens per layer and initial prompts from
# files. Both sides start here from our MISA's prompts (copied), so what is compared is the training.
PAIRS["misa"] = MethodPair(
    "misa", "dualprompt", PAIRS["dualprompt"].weights,
    official_selection=PAIRS["dualprompt"].official_selection,
    ours_kwargs={"reference_quirks": True},
    official_kwargs={"len_g_prompt": 10},
    note="the official DualPrompt with MISA's 10 G-prompt tokens; initial prompts copied from ours, not MISA's "
         "shipped ones (ViT-B/16 width); reference_quirks=True",
)

PAIRS["flyprompt"] = MethodPair(
    "flyprompt", "flyprompt", {"experts.prompts": "prompts", **_HEAD},
    official_selection=lambda model: None,  # official_predict returns the routed experts
    align=flyprompt_state.align, other_state=flyprompt_state.other_state,
    load_official=flyprompt_state.load_official, official_predict=flyprompt_state.official_predict,
    note="the router's random expansion copied from the official side; our router solves in float64 (Cholesky), "
         "the official one in float32 (LU)",
)

_HIDE = {"backbone.prefix_k": "e_prompt.prompt#0", "backbone.prefix_v": "e_prompt.prompt#1",
         "prompt_head.weight": "head.weight", "prompt_head.bias": "head.bias", "g_mlp.0.weight": "g_mlp.0.weight",
         "g_mlp.0.bias": "g_mlp.0.bias", "g_head.weight": "g_head.weight", "g_head.bias": "g_head.bias"}
for _name, _weights in (("hide", _HIDE), ("norga", {**_HIDE, "backbone.act_scale": "e_prompt.act_scale"})):
    PAIRS[_name] = MethodPair(
        _name, _name, _weights, official_selection=lambda model: None, official_lr=0.003,
        official_predict=hide_state.official_predict, setup_trainer=hide_state.setup_trainer,
        session_end_seed=1000,
        note="the official orthogonality term picks its old classes by dataset class id in an exposure-ordered "
             "table (docs/protocol.md 6.2.4), ours by exposure index: the two differ from the second session on; "
             "classifier alignment: both sides reseeded before each session end",
    )
    # The same without the orthogonality terms (lam_orth 0 on both sides): what remains once 6.2.4 is out.
    PAIRS[f"{_name}-no-orth"] = dataclasses.replace(
        PAIRS[_name], ours_kwargs={"lam_orth": 0.0}, setup_trainer=hide_state.setup_trainer_without_orthogonality,
        variant="lam_orth 0",
        note="lam_orth 0 on both sides (the orthogonality terms, where 6.2.4 lies, left out); classifier "
             "alignment: both sides reseeded before each session end",
    )

# The task experts: the HiDe ones trained by HiDe-Prompt's official trainer, SD-LoRA by its own. The
# official constructor options are the launch scripts' defaults (``--sdlora_rank 10 --sdlora_alpha 0.8``,
# 5 expert blocks), which are our defaults too.
_EXPERT_OPTIONS = {"sdlora_rank": 10, "sdlora_alpha": 0.8}
_TASKS = Setting().num_experts
for _name, _weights, _blocks in (("hide-lora", expert_state.hide_lora_weights, "num_lora_layers"),
                                 ("hide-adapter", expert_state.hide_adapter_weights, "num_adapter_layers")):
    PAIRS[_name] = dataclasses.replace(
        PAIRS["hide"], method=_name, official=_name, weights=_weights(_TASKS),
        official_kwargs={**_EXPERT_OPTIONS, _blocks: expert_state.EXPERT_BLOCKS},
    )
    PAIRS[f"{_name}-no-orth"] = dataclasses.replace(
        PAIRS["hide-no-orth"], method=_name, official=_name, weights=_weights(_TASKS),
        official_kwargs={**_EXPERT_OPTIONS, _blocks: expert_state.EXPERT_BLOCKS},
    )
PAIRS["sd-lora"] = MethodPair(
    "sd-lora", "sd-lora", expert_state.sd_lora_weights(_TASKS), official_selection=lambda model: None,
    official_kwargs={**_EXPERT_OPTIONS, "sdlora_layers": "all"},
    setup_trainer=lambda trainer: setattr(trainer, "sdlora_ortho_weight", 0.0),
    note="the orthogonality term off on both sides (--sdlora_ortho_weight 0, the configuration's default); "
         "no selection (each class's logits come from every task's directions)",
)

# RanPAC with the first session's features in its statistics, as the official trainer collects them.
PAIRS["ranpac"] = MethodPair(
    "ranpac", "ranpac", ranpac_state.adapter_weights(expert_state.EXPERT_BLOCKS), official_selection=lambda model: None,
    ours_kwargs={"first_session_statistics": True}, official_kwargs={"ranpac_M": Setting().expansion_dim},
    align=ranpac_state.align, other_state=ranpac_state.other_state, load_official=ranpac_state.load_official,
    official_predict=ranpac_state.official_predict, setup_trainer=ranpac_state.setup_trainer,
    session_end_seed=ranpac_state.EXPANSION_SEED,
    note="first_session_statistics=True; the official adapters' dropout (0.1) off (ours has none); the random "
         "matrix drawn by the official side at the first session's end (seeded), ours the same draw; our "
         "classifier solves in float64 (Cholesky), the official one in float32",
)

# Seq FT and Seq FT w/ SL: FlyGCL's slca (the whole ViT and its fc trained), both by the optimiser sgd_sl.
for _name, _lr in (("seq-ft", 0.005), ("seq-ft-sl", 5e-5)):
    PAIRS[_name] = MethodPair(
        _name, "slca", seqft_state.vit_weights(Setting().shape["depth"]), official_selection=lambda model: None,
        official_lr=_lr, build_official=seqft_state.build_official, setup_trainer=seqft_state.setup_trainer,
        note=f"sgd_sl at {_lr:g} on both sides (backbone {_lr:g}, head 0.005); the official build's "
             "drop_block_rate=None left out (its ViT takes no such argument); no selection (one head)",
    )

# CODA-Prompt and S-Prompt++ (benchmarks/fidelity/coda_state.py, sprompt_state.py): session-aware, trained by
# their own trainers; both sides reseeded before each session end (CODA-P draws the next task's components there).
PAIRS["coda-prompt"] = MethodPair(
    "coda-prompt", "coda-prompt", coda_state.weights(range(5)), official_selection=lambda model: None,
    ours_kwargs={"reference_quirks": True}, official_kwargs={"key_dim": Setting().shape["embed_dim"]},
    session_end_seed=coda_state.SESSION_END_SEED,
    note="reference_quirks=True (the components freeze after the first session, as the official optimizer keeps "
         "the replaced tensors); key_dim = the backbone's width (the official default is ViT-B's 768); no "
         "per-sample selection (every started component weighs in)",
)
PAIRS["s-prompt"] = MethodPair(
    "s-prompt", "s-prompt", {"experts.prompts": "prompts", **_HEAD}, official_selection=lambda model: None,
    official_predict=sprompt_state.official_predict, setup_trainer=sprompt_state.setup_trainer,
    other_state=sprompt_state.other_state, load_official=sprompt_state.load_official,
    note="prototypes: scikit-learn's KMeans on the official side, ours on ours (same features, other random "
         "draws): the routing may differ; on identical state (official prototypes) it agrees",
)
# The same with the official trainer's KMeans replaced by ours: what remains once the clustering is the same.
PAIRS["s-prompt-our-kmeans"] = dataclasses.replace(
    PAIRS["s-prompt"], setup_trainer=sprompt_state.setup_trainer_our_kmeans, variant="our k-means on both sides",
    note="the official trainer's KMeans replaced by ours (benchmarks.methods.prototypes), the rest its own",
)
