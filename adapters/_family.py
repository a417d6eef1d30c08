"""The base every family is a class on: :class:`AdapterFamily` recognises a model's layout (its
:meth:`~AdapterFamily.recognise` returns a :class:`Plan` carrying the :class:`~fly_modules.adapters.Layout`
found), and the base runs the one skeleton of every retrofit: the layout's checks, the handle with its
router and ensemble, the assembly corrections, then (unless both are off) the layout's hooks and head swap.

A family sets nothing on itself while recognising: what it found lives on its layout, and the sizes on the
plan. Its seam helpers (:meth:`~AdapterFamily.missing_seam`, :meth:`~AdapterFamily.find_head`, ...) name
the method the user asked for (``"misa"``, not ``"dualprompt"``).
"""

from __future__ import annotations

import dataclasses
import inspect
from typing import Any, Callable, ClassVar, Mapping, Optional, Sequence, Tuple, Union

from torch import nn

from fly_modules._validation import check_int
from fly_modules.distributed import resolve_process_group

from ._expert_heads import (
    ClassifierRefused,
    ClassifierSeat,
    ExpertHeadEnsemble,
    classifier_seat,
    install_pool,
    pool_holding,
)
from ._handle import Retrofit, StepCounter
from ._layout import Layout
from ._options import RetrofitOptions
from ._restore import Installation
from ._seams import (
    GENERIC_CALL,
    SeamError,
    backbone_of,
    count_experts,
    find_head,
    head_options,
    missing_seam,
    require_keyword,
)

__all__ = ["AdapterFamily", "Plan"]

Correction = Callable[[Installation], None]
Head = Union[Tuple[nn.Module, str], nn.Module, None]


@dataclasses.dataclass
class Plan:
    """What a family found on a model, before anything is installed.

    Attributes:
        num_experts: router outputs.
        head: the ensemble's online head: ``(parent, name)`` of the classifier (swapped for an
            :class:`~fly_modules.adapters.EnsembleLinear` by the default :meth:`Layout.swap_head`), or the
            classifier itself for a layout that swaps none. The classifier is an ``nn.Linear``, a small module
            holding exactly one (its ``nn.Linear`` is swapped), or a pool of per-expert classifiers (an
            ``nn.ModuleList``, or a module with one: expert ``e``'s EMA copies are of classifier ``e``, and
            classifiers the method appends later get theirs). ``None``: no classifier (router only).
        layout: the :class:`~fly_modules.adapters.Layout` found, which installs the hooks and swaps the head.
        num_banks: ensemble banks (default ``num_experts``).
        banks_of_expert: banks re-cloned from the online head when an expert starts (default ``[expert]``).
        counter: the method's own step counter (its value is the current expert; advancing it starts one;
            ``end_batch`` checks it and ``state_dict`` saves it).
        start_expert: the method's own expert start where it is not (only) advancing ``counter``.
        current_expert: the expert trained now, for a method without a counter (default 0).
        router_dim: width of the router features (default the classifier's ``in_features``).
        corrections: upstream fixes installed on the model for every variant (``correct_assembly``);
            ``verify()`` compares the retrofit with the model carrying these alone.
        inference: how ``verify()`` evaluates when the model's inference is not its forward.
        query_width: width of the query the layout routes on, when the family knows it: sizes the router
            when neither ``router_dim`` nor a classifier does (a router-only retrofit without an ``nn.Linear``).
    """

    num_experts: int
    head: Head
    layout: Layout
    num_banks: Optional[int] = None
    banks_of_expert: Optional[Callable[[int], Sequence[int]]] = None
    counter: Optional[StepCounter] = None
    start_expert: Optional[Callable[[int], None]] = None
    current_expert: Optional[int] = None
    router_dim: Optional[int] = None
    corrections: Sequence[Correction] = ()
    inference: Optional[Callable[[Any], Any]] = None
    query_width: Optional[int] = None

    def __post_init__(self) -> None:
        if self.counter is not None and self.current_expert is not None:
            raise TypeError("Plan: a counter's value is the current expert; give counter or current_expert")

    @property
    def classifier(self) -> Optional[nn.Module]:
        """The online head itself (``None``: none)."""
        if isinstance(self.head, tuple):
            parent, name = self.head
            return getattr(parent, name)
        return self.head

    @property
    def current(self) -> int:
        """The expert trained now: the counter's value, else ``current_expert``, else 0."""
        if self.counter is not None:
            return self.counter.read()
        return 0 if self.current_expert is None else int(self.current_expert)

    def method_start(self) -> Callable[[int], None]:
        """The method's own start of an expert: ``start_expert``, else advancing the counter, else nothing."""
        if self.start_expert is not None:
            return self.start_expert
        if self.counter is not None:
            return self.counter.advance
        return _no_start


def _no_start(expert: int) -> None:
    return None


def _one_bank(expert: int) -> Sequence[int]:
    return [int(expert)]


class AdapterFamily:
    """One retrofit of one model by a family. Subclasses set :attr:`names`, write :meth:`recognise` (whose
    keyword-only parameters are the family's options) returning a :class:`Plan` with its layout, and
    register with ``@register_family``.

    Attributes:
        names: the method names the family serves (the first names it in checkpoints).
        seam_contract: the family recognises upstream code, so a model implementing
            :class:`~fly_modules.adapters.SeamContract` is refused (``False``: it wires any model).
        model, options: what :meth:`retrofit` was given.
        family: the method name the user asked for (in every message).
        plan: what :meth:`recognise` found.
        installation: where the layout's hooks and swaps go (the handle's ``remove()`` undoes them).
        handle: the :class:`~fly_modules.adapters.Retrofit` returned to the user.
    """

    names: ClassVar[Tuple[str, ...]] = ()
    seam_contract: ClassVar[bool] = True

    def __init__(self, model: nn.Module, options: RetrofitOptions, method: Optional[str] = None) -> None:
        self.model, self.options = model, options
        self.family = method or (self.names[0] if self.names else type(self).__name__)
        self.plan: Optional[Plan] = None
        self.installation = Installation()  # the hooks and swaps, handed to the handle, undone by its remove()
        self.handle: Retrofit = None  # type: ignore[assignment]  (set by retrofit)
        self.seat: Optional[ClassifierSeat] = None  # what the plan names as the classifier (set by retrofit)

    def recognise(self, **family_options: Any) -> Plan:
        """Check the model's seams (nothing installed yet) and return what to build, with its layout."""
        raise NotImplementedError(f"{type(self).__name__} must define recognise(self, *, <family options>)")

    # ------------------------------------------------------------------------------------- skeleton
    @classmethod
    def retrofit(cls, model: nn.Module, options: RetrofitOptions, family_options: Mapping[str, Any],
                 method: Optional[str] = None) -> Retrofit:
        """Recognise ``model``, create the handle, then install the corrections, the hooks and the head."""
        family = cls(model, options, method)
        plan = family.recognise(**family_options)
        family.plan = plan = plan.layout.check(plan)
        family.seat = seat = family.classifier_seat(plan)
        if seat.seat is not None:  # a module holding one nn.Linear: the nn.Linear is what is swapped
            family.plan = plan = dataclasses.replace(plan, head=seat.seat)
        family.handle = handle = family.create_handle(plan)
        if not options.router and not options.ensemble:
            return handle  # the baseline variant: only the schedule is driven, the model is untouched
        plan.layout.install_hooks()
        plan.layout.guard_inference()
        if options.ensemble and seat.pool is not None:
            install_pool(plan.layout, handle.ensemble, seat)
        elif options.ensemble:
            plan.layout.swap_head()
        return handle

    def create_handle(self, plan: Plan) -> Retrofit:
        """The handle with its router and ensemble sized by ``plan``, the optimizer hook attached, the
        ``distributed`` option resolved to a process group once."""
        num_experts = check_int(plan.num_experts, "num_experts", caller=self.caller, minimum=1)
        seat = self.seat if self.seat is not None else self.classifier_seat(plan)
        first = seat.first_linear()
        current, banks_of_expert = plan.current, plan.banks_of_expert or _one_bank
        num_banks = num_experts if plan.num_banks is None else plan.num_banks
        device = first.weight.device if first is not None else next((p.device for p in self.model.parameters()), None)
        handle = Retrofit(
            self.model, family=self.names[0] if self.names else self.family,
            router=self.options.build_router(self.router_width(plan, first), num_experts, device),
            ensemble=self.build_ensemble(seat, num_experts, num_banks, banks_of_expert),
            schedule=self.options.schedule, start_method_expert=plan.method_start(),
            banks_of_expert=banks_of_expert, current_expert=current, num_experts=num_experts, step_counter=plan.counter,
            installation=self.installation, corrections=plan.corrections, inference=plan.inference,
            process_group=resolve_process_group(self.options.distributed, self.caller),
            distributed=self.options.distributed,
        )
        handle.record.caller = self.caller
        if handle.ensemble is not None:
            banks = list(banks_of_expert(current))
            if banks:
                handle.ensemble.active_expert = int(banks[-1])  # a retrofit mid-run
            handle.attach_optimizer(self.options.optimizer)
        return handle

    def classifier_seat(self, plan: Plan) -> ClassifierSeat:
        """What ``plan.head`` names (checked before anything is installed); a router-only retrofit needs none."""
        try:
            seat = classifier_seat(plan.head)
        except ClassifierRefused as reason:
            if not self.options.ensemble:
                return ClassifierSeat()  # the router does not use the classifier
            raise SeamError(f"{self.caller}: {reason}; {self.head_fix()}") from None
        if not self.options.ensemble:
            return seat
        if seat.linear is None and seat.pool is None:
            raise SeamError(f"{self.caller}: the ensemble needs the model's classifier and the plan names none; "
                            f"{self.head_fix()}")
        wrapped = seat.seat is not None and isinstance(plan.head, tuple) and seat.seat != plan.head
        if (seat.pool is not None or wrapped) and type(plan.layout).swap_head is not Layout.swap_head:
            what = "a pool of per-expert classifiers" if seat.pool is not None else \
                f"a {type(plan.classifier).__name__} holding its nn.Linear"
            raise SeamError(
                f"{self.caller}: the classifier is {what}, which the {self.family} layout's own head swap does not "
                f"take; retrofit with ensemble=False, or name the seams with {GENERIC_CALL}"
            )
        if seat.pool is not None:
            self.check_pool(plan, seat.pool)
        elif seat.seat is not None:
            self.refuse_one_of_a_pool(seat.linear)
        return seat

    def refuse_one_of_a_pool(self, linear: nn.Linear) -> None:
        """One classifier of a pool of per-expert classifiers would leave the others outside the ensemble (their
        samples answered by plain logits beside the ensembled ones): name the pool."""
        found = pool_holding(self.model, linear)
        if found is None:
            return
        path, pool = found
        owner, _, name = path.rpartition(".")
        seam = f"head_owner=model{'.' + owner if owner else ''}, head_name={name!r}"
        if not self._names_its_head():
            seam = f"{GENERIC_CALL} with {seam}"
        raise SeamError(
            f"{self.caller}: the classifier named is one of the {len(pool)} per-expert classifiers of `{path}` (an "
            f"nn.ModuleList), which would leave the others outside the ensemble; name the pool itself ({seam}) so "
            "that each expert gets EMA copies of its own classifier"
        )

    def check_pool(self, plan: Plan, pool: nn.ModuleList) -> None:
        """A pool of per-expert classifiers holds at least one classifier, and not more than the experts."""
        if not 1 <= len(pool) <= int(plan.num_experts):
            raise SeamError(
                f"{self.caller}: the pool of per-expert classifiers holds {len(pool)} classifiers for "
                f"{plan.num_experts} experts; it must hold between 1 and num_experts (the method appends the others)"
            )

    def head_fix(self) -> str:
        """The options that name another classifier, as this family accepts them."""
        return head_options("generic" if self._names_its_head() else self.family)

    def _names_its_head(self) -> bool:
        """Whether this family's ``recognise`` takes ``head_owner``/``head_name`` (else only ``generic`` does)."""
        return "head_owner" in inspect.signature(type(self).recognise).parameters

    def router_width(self, plan: Plan, first: Optional[nn.Linear]) -> Optional[int]:
        """``router_dim``, else the classifier's input width, else the layout's query width."""
        if plan.router_dim is not None:
            return check_int(plan.router_dim, "router_dim", caller=self.caller, minimum=1)
        if first is not None:
            return first.in_features
        if plan.query_width is not None or not self.options.router:
            return plan.query_width
        raise SeamError(f"{self.caller}: no nn.Linear classifier gives the width of the router's query features; "
                        "pass router_dim=<their width>")

    def build_ensemble(self, seat: ClassifierSeat, num_experts: int, num_banks: int,
                       banks_of_expert: Callable[[int], Sequence[int]]) -> Any:
        """The ensemble of one classifier (a bank per ``num_banks``), or of a pool (copies per expert)."""
        if not self.options.ensemble:
            return None
        if seat.pool is None:
            return self.options.build_ensemble(seat.linear, num_banks)
        expert_of_bank = [num_experts - 1] * num_banks
        for expert in reversed(range(num_experts)):
            for bank in banks_of_expert(expert):
                expert_of_bank[int(bank)] = expert
        return ExpertHeadEnsemble(seat.pool, num_experts, expert_of_bank, decays=self.options.decays,
                                  aggregate=self.options.aggregate)

    # ------------------------------------------------------------------------------------ seam checks
    @property
    def caller(self) -> str:
        """``fly_modules.adapters.<method>``, which starts every message of the family."""
        return f"fly_modules.adapters.{self.family}"

    def missing_seam(self, path: str, what: str, owner: Optional[nn.Module] = None) -> SeamError:
        """The :class:`SeamError` for a model (or ``owner``) without ``path`` (``what`` it should be)."""
        return missing_seam(self.model if owner is None else owner, path, what, family=self.family)

    def require_keyword(self, function: Callable[..., Any], keyword: str, *, callee: str, why: str = "") -> None:
        """:func:`~fly_modules.adapters._seams.require_keyword` in this family's name."""
        require_keyword(function, keyword, family=self.family, callee=callee, why=why)

    def find_head(self, owner: Optional[nn.Module] = None) -> Optional[Tuple[nn.Module, str]]:
        """``(parent, name)`` of the classifier of ``owner`` (default the model); ``None`` when it has none
        and the ensemble is off (the router needs no classifier)."""
        try:
            return find_head(self.model if owner is None else owner, family=self.family)
        except SeamError:
            if self.options.ensemble:
                raise
            return None

    def count_experts(self, num_experts: Optional[int], default: Any, what: str) -> int:
        """``num_experts`` if given, else ``default``, as an int >= 1 (an error naming ``what`` when neither)."""
        return count_experts(num_experts, default, what, family=self.family)

    def backbone_of(self, what: str, *, forward_features: bool = False) -> nn.Module:
        """``model.backbone`` (with ``forward_features`` when asked), else a :class:`SeamError`."""
        return backbone_of(self.model, what, family=self.family, forward_features=forward_features)
