"""Per-expert classifiers: a codebase that keeps one classifier per task (an ``nn.ModuleList`` grown by its
own "add a task" call, earlier ones frozen) gets, for each expert, EMA copies of that expert's OWN classifier.

:func:`classifier_seat` reads what a plan names as the classifier: one ``nn.Linear`` (or a small module
holding exactly one), or a pool of them. :class:`ExpertHeadEnsemble` is the ensemble of a pool: one
:class:`~fly_modules.TemporalEnsembleHead` per expert, whose online head is that expert's ``nn.Linear``;
:func:`install_pool` puts an :class:`~fly_modules.adapters.EnsembleLinear` in the place of every
classifier of the pool, those the method appends later included.

Each classifier of the pool answers its ensemble at inference on the scale of its own logits: the
softmax rules give ``log(p) + logsumexp(z)`` (``p`` the aggregated probabilities, ``z`` the online
logits), which is ``z`` itself when every copy equals the online head, so a codebase that concatenates
the classifiers' outputs and takes one argmax compares one kind of number across them.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import torch
from torch import Tensor, nn

from fly_modules import TemporalEnsembleHead
from fly_modules._validation import InvalidParameterError

from ._head import EnsembleLinear, bank_copies

__all__ = [
    "ClassifierRefused", "ClassifierSeat", "ExpertHeadEnsemble", "classifier_seat", "install_pool", "pool_holding",
]

Seat = Tuple[nn.Module, str]


def _online(module: nn.Module) -> nn.Module:
    """An installed :class:`EnsembleLinear` stands for its online head."""
    return module.online if isinstance(module, EnsembleLinear) else module


def _linear_seats(module: nn.Module) -> List[Seat]:
    """``(parent, name)`` of every ``nn.Linear`` inside ``module`` (itself excluded)."""
    found: List[Seat] = []
    for parent in module.modules():
        found.extend((parent, name) for name, child in parent.named_children() if isinstance(child, nn.Linear))
    return found


def _pool_of(module: nn.Module) -> Optional[nn.ModuleList]:
    """``module`` itself when it is a ``ModuleList``, else its one ``ModuleList`` child (LAMDA-PILOT's
    ``SimpleContinualLinear.heads``), else ``None``."""
    if isinstance(module, nn.ModuleList):
        return module
    lists = [child for child in module.children() if isinstance(child, nn.ModuleList)]
    return lists[0] if len(lists) == 1 else None


class ClassifierRefused(Exception):
    """Why :func:`classifier_seat` refuses a classifier; the family completes it with the options it accepts."""


def _pool_seats(pool: nn.ModuleList) -> List[Seat]:
    """``(parent, name)`` of each per-expert classifier's one ``nn.Linear``, in the pool's order."""
    seats: List[Seat] = []
    for index, head in enumerate(pool):
        if isinstance(head, nn.Linear):
            seats.append((pool, str(index)))
            continue
        inner = _linear_seats(head)
        if len(inner) != 1:
            raise ClassifierRefused(
                f"classifier {index} of the pool is a {type(head).__name__} holding {len(inner)} nn.Linear; each "
                "per-expert classifier must hold exactly one"
            )
        seats.extend(inner)
    return seats


class ClassifierSeat:
    """What a plan names as the classifier: one ``nn.Linear`` at :attr:`seat` (``(parent, name)``; ``None``
    with :attr:`bare` for a layout that swaps none), or a pool of per-expert classifiers (:attr:`pool`),
    each holding exactly one ``nn.Linear``; nothing at all for a router-only retrofit without one."""

    def __init__(self, seat: Optional[Seat] = None, pool: Optional[nn.ModuleList] = None,
                 bare: Optional[nn.Linear] = None) -> None:
        self.seat, self.pool, self.bare = seat, pool, bare

    @property
    def linear(self) -> Optional[nn.Linear]:
        """The one classifier (``None`` for a pool or none)."""
        return self.bare if self.seat is None else _online(getattr(*self.seat))

    def first_linear(self) -> Optional[nn.Linear]:
        """The one classifier, or the pool's first (what sizes the router by default)."""
        if self.pool is not None:
            return _online(getattr(*_pool_seats(self.pool)[0])) if len(self.pool) else None
        return self.linear


def classifier_seat(head: Any) -> ClassifierSeat:
    """What a plan's ``head`` (``(parent, name)``, a module, or ``None``: no classifier) names; raises
    :class:`ClassifierRefused` for a module that is neither one ``nn.Linear`` (or holds exactly one) nor a pool."""
    if head is None:
        return ClassifierSeat()
    parent, name = head if isinstance(head, tuple) else (None, None)
    module = getattr(parent, name) if parent is not None else head
    if isinstance(module, nn.Linear):
        return ClassifierSeat(seat=(parent, name)) if parent is not None else ClassifierSeat(bare=_online(module))
    if not isinstance(module, nn.Module):
        raise ClassifierRefused(f"the classifier is a {type(module).__name__}, not a module")
    pool = _pool_of(module)
    if pool is not None:
        _pool_seats(pool)  # each classifier holds exactly one nn.Linear
        return ClassifierSeat(pool=pool)
    seats = _linear_seats(module)
    if len(seats) == 1:
        return ClassifierSeat(seat=seats[0])
    raise ClassifierRefused(
        f"the classifier is a {type(module).__name__} holding {len(seats)} nn.Linear, where the ensemble copies "
        "one nn.Linear (or one per expert: an nn.ModuleList of per-expert classifiers)"
    )


def pool_holding(model: nn.Module, linear: nn.Linear) -> Optional[Tuple[str, nn.ModuleList]]:
    """``(path, pool)`` of a pool of per-expert classifiers in ``model`` that holds ``linear``, if any: naming one
    of its classifiers would leave the others outside the ensemble."""
    for path, module in model.named_modules():
        if isinstance(module, nn.ModuleList) and any(m is linear for m in module.modules()):
            try:
                _pool_seats(module)
            except ClassifierRefused:
                continue  # a list of other modules (blocks), not of classifiers
            return path, module
    return None


class ExpertHeadEnsemble(nn.Module):
    """The ensemble of a pool of per-expert classifiers: expert ``e``'s EMA copies are of classifier ``e``.

    It speaks banks as the handle does (``update(banks)``, ``start_expert(bank)``, ``active_expert``);
    ``expert_of_bank`` maps them to experts (default one bank per expert). Classifiers the method appends
    to the pool get their copies when they appear (:meth:`grow`, run before each forward of the model).

    Attributes:
        members: one :class:`~fly_modules.TemporalEnsembleHead` (one bank) per classifier of the pool so far.
        active_expert: the bank the optimizer hook moves when the forward recorded none.
    """

    per_expert = True

    def __init__(self, pool: nn.ModuleList, num_experts: int, expert_of_bank: Sequence[int], *,
                 decays: Sequence[float], aggregate: str) -> None:
        super().__init__()
        self.__dict__["pool"] = pool  # the model's, not a submodule of the ensemble
        self.num_experts_declared = int(num_experts)
        self.expert_of_bank = [int(e) for e in expert_of_bank]
        self.decays, self.aggregate = tuple(decays), aggregate
        self.members = nn.ModuleList()
        self.active_expert = 0
        self.on_new: Optional[Callable[[int], None]] = None
        self.grow()

    # -------------------------------------------------------------------------------------- the pool
    def grow(self) -> None:
        """Give each classifier the method appended since the last call its copies (and its swap)."""
        if len(self.pool) == len(self.members):
            return  # what every forward finds: nothing appended
        if len(self.pool) > self.num_experts_declared:
            raise RuntimeError(
                f"Retrofit: the pool of per-expert classifiers holds {len(self.pool)} classifiers but the retrofit "
                f"declares {self.num_experts_declared} experts; retrofit with num_experts={len(self.pool)} or more"
            )
        seats = _pool_seats(self.pool)
        for expert in range(len(self.members), len(seats)):
            linear = _online(getattr(*seats[expert]))
            self.members.append(TemporalEnsembleHead(linear, 1, decays=self.decays, aggregate=self.aggregate))
            if self.on_new is not None:
                self.on_new(expert)

    def member(self, bank: int) -> Optional[TemporalEnsembleHead]:
        """The copies of the expert owning ``bank`` (``None``: its classifier does not exist yet)."""
        expert = self.expert_of_bank[int(bank)]
        return self.members[expert] if expert < len(self.members) else None

    @property
    def online(self) -> nn.Linear:
        """The active expert's classifier (the one the optimizer trains now)."""
        self.grow()
        member = self.member(self.active_expert) or self.members[len(self.members) - 1]
        return member.online

    @property
    def num_classes(self) -> int:
        """Classes of all the classifiers together (a codebase that concatenates them)."""
        return sum(member.num_classes for member in self.members)

    @property
    def num_experts(self) -> int:
        return len(self.expert_of_bank)

    # ----------------------------------------------------------------------------------------- steps
    def start_expert(self, bank: int) -> None:
        """Clone the expert's own classifier into its copies (created when the classifier appears)."""
        self.grow()
        member = self.member(bank)
        if member is not None:
            member.start_expert(0)
        self.active_expert = int(bank)

    @torch.no_grad()
    def update(self, banks: Optional[Tensor] = None) -> None:
        """One EMA step of the active expert's copies, or of each expert owning one of ``banks``."""
        self.grow()
        if banks is None:
            listed = [self.active_expert]
        else:  # the few experts a forward trained (read on the host: one read per optimizer step)
            listed = sorted(set(torch.as_tensor(banks).reshape(-1).tolist()))
        experts = sorted({self.expert_of_bank[int(b)] for b in listed})
        for expert in experts:
            if expert < len(self.members):
                self.members[expert].update()

    def scores(self, expert: int, features: Tensor) -> Tensor:
        """Classifier ``expert``'s inference output: its online head and copies aggregated, on its logits' scale."""
        member = self.members[expert]
        members = member.member_logits(features, 0)
        scores = member.aggregate_members(members)
        if not self.aggregate.startswith("softmax"):
            return scores
        return scores.log() + members[:, 0].logsumexp(dim=-1, keepdim=True)

    def bank_copies(self) -> List[Tensor]:
        """Each bank's copies, flattened (what ``verify`` compares before and after a step)."""
        flat = [bank_copies(member)[0] for member in self.members]  # each member holds one bank
        return [flat[e] if e < len(flat) else torch.zeros(0) for e in self.expert_of_bank]

    # ------------------------------------------------------------------------------------ checkpoints
    def state_dict(self, *args: Any, **kwargs: Any) -> Dict[str, Any]:  # type: ignore[override]
        """The copies only: each classifier is the model's own parameter."""
        state = super().state_dict(*args, **kwargs)
        for key in [k for k in state if ".online." in k]:
            del state[key]
        return state

    def load_state_dict(self, state: Dict[str, Any], strict: bool = True) -> Any:  # type: ignore[override]
        """Copies saved by :meth:`state_dict` (the handle adds ``online.*``: the model's own, ignored here)."""
        state = {k: v for k, v in state.items() if not k.startswith("online.")}
        saved = {int(k.split(".")[1]) for k in state if k.startswith("members.")}
        self.grow()
        count = max(saved) + 1 if saved else 0
        if count > len(self.members):
            raise InvalidParameterError(
                f"Retrofit.load_state_dict: the checkpoint holds the copies of {count} per-expert classifiers but the "
                f"pool holds {len(self.members)}; grow the pool as the run had (the method's add-a-task call) first"
            )
        online = {f"members.{e}.online.{k}": v for e, m in enumerate(self.members) for k, v in m.online.state_dict().items()}
        return super().load_state_dict({**online, **state}, strict=strict)

    def get_extra_state(self) -> Dict[str, int]:
        return {"active_expert": int(self.active_expert)}

    def set_extra_state(self, state: Dict[str, int]) -> None:
        active = state.get("active_expert") if isinstance(state, dict) else None
        if isinstance(active, bool) or not isinstance(active, int) or not 0 <= active < self.num_experts:
            raise InvalidParameterError(f"Retrofit.load_state_dict: the checkpoint's active_expert {active!r} is not a bank")
        self.active_expert = active


def install_pool(layout: Any, ensemble: ExpertHeadEnsemble, seat: ClassifierSeat) -> None:
    """Every classifier of the pool becomes an :class:`EnsembleLinear` answering its own expert's ensemble,
    now and as the method appends them (undone by ``remove()``)."""
    handle, install = layout.handle, layout.install

    def swap(expert: int) -> None:
        if install.removed:
            return
        parent, name = _pool_seats(seat.pool)[expert]
        linear = _online(getattr(parent, name))
        head = EnsembleLinear(linear, install.guarded(_Scorer(ensemble, expert, handle.record), None),
                              install.guarded(_Training(handle, expert, linear), None))
        install.set_attribute(parent, name, head)

    for expert in range(len(ensemble.members)):
        swap(expert)
    ensemble.on_new = swap
    install.forward_pre_hook(layout.model, _Grow(ensemble))


class _Scorer:
    """Classifier ``expert``'s inference output; inside ``verify()`` it also records its banks as answered (the
    banks a model's own selection used: without a router, those whose copies must reach the logits)."""

    def __init__(self, ensemble: ExpertHeadEnsemble, expert: int, record: Any) -> None:
        self.ensemble, self.expert, self.record = ensemble, expert, record

    def __call__(self, features: Tensor) -> Tensor:
        record = self.record
        if record.verifying:
            answered = record.ensembled if isinstance(record.ensembled, list) else []
            mine = [b for b, e in enumerate(self.ensemble.expert_of_bank) if e == self.expert]
            record.ensembled = sorted(set(answered) | set(mine))
        return self.ensemble.scores(self.expert, features)


class _Training:
    """Whether classifier ``expert`` answers online logits now; inside ``verify()`` it also records that a
    training forward ran it with trainable weights (the expert it trained)."""

    def __init__(self, handle: Any, expert: int, linear: nn.Linear) -> None:
        self.handle, self.expert, self.linear = handle, expert, linear

    def __call__(self) -> bool:
        record = self.handle.record
        training = bool(record.training)
        if training and record.verifying and self.linear.weight.requires_grad and torch.is_grad_enabled():
            mine = torch.tensor([self.expert])
            record.trained = mine if record.trained is None else torch.cat([record.trained.reshape(-1).cpu(), mine])
        return training


class _Grow:
    def __init__(self, ensemble: ExpertHeadEnsemble) -> None:
        self.ensemble = ensemble

    def __call__(self, module: nn.Module, args: Any) -> None:
        self.ensemble.grow()
