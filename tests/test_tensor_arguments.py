"""Every tensor argument of the public API, given a wrong shape, width, dtype or type: one
``InvalidParameterError`` line naming the argument and what was expected, before any state moves (never
torch's "The size of tensor a ..." from deep inside a call).

The walk is a table, :data:`FAULTS`: the call, the argument, the fault and the words the message must hold.
"""

import inspect
from typing import Callable, Dict, Set, Tuple

import pytest
import torch
from torch import nn

import fly_modules
from fly_modules import (
    AnalyticRouter,
    InvalidParameterError,
    RandomExpansion,
    TemporalEnsembleHead,
    aggregate_logits,
    batch_seen_class_mask,
    class_mask,
    seen_class_mask,
)

N, D, C, E = 5, 4, 3, 2


def head() -> TemporalEnsembleHead:
    return TemporalEnsembleHead(nn.Linear(D, C), num_experts=E)


def router() -> AnalyticRouter:
    fitted = AnalyticRouter(D, num_experts=E, expansion_dim=16)
    fitted.update(torch.randn(2 * N, D), torch.arange(2 * N) % E)
    return fitted


def x(rows: int = N, width: int = D) -> torch.Tensor:
    return torch.randn(rows, width)


#: (call, argument, fault) -> (the call, words its message must hold)
FAULTS: Dict[Tuple[str, str, str], Tuple[Callable[[], object], Tuple[str, ...]]] = {
    ("TemporalEnsembleHead.forward", "logit_mask", "width, training"):
        (lambda: head()(x(), logit_mask=torch.zeros(C + 1)), ("logit_mask", f"({C},)", f"({N}, {C})")),
    ("TemporalEnsembleHead.forward", "logit_mask", "width, inference"):
        (lambda: head()(x(), 0, logit_mask=torch.zeros(C + 1)), ("logit_mask", f"({C},)", f"({N}, {C})")),
    ("TemporalEnsembleHead.forward", "logit_mask", "rows"):
        (lambda: head()(x(), 0, logit_mask=torch.zeros(N + 1, C)), ("logit_mask", f"({N}, {C})")),
    ("TemporalEnsembleHead.forward", "logit_mask", "3-d"):
        (lambda: head()(x(), 0, logit_mask=torch.zeros(1, N, C)), ("logit_mask", "(1, 5, 3)")),
    ("TemporalEnsembleHead.forward", "logit_mask", "bool"):
        (lambda: head()(x(), logit_mask=torch.ones(C, dtype=torch.bool)), ("logit_mask", "floating-point")),
    ("TemporalEnsembleHead.forward", "logit_mask", "a list"):
        (lambda: head()(x(), 0, logit_mask=[0.0] * C), ("logit_mask", "list")),
    ("TemporalEnsembleHead.forward", "features", "width"): (lambda: head()(x(width=D + 1), 0), ("features", f"{D}")),
    ("TemporalEnsembleHead.forward", "features", "1-d"): (lambda: head()(torch.randn(D), 0), ("features", "1-d")),
    ("TemporalEnsembleHead.forward", "expert_ids", "length"):
        (lambda: head()(x(), torch.zeros(N + 1, dtype=torch.long)), ("expert ids", f"{N}")),
    ("TemporalEnsembleHead.forward", "expert_ids", "float"): (lambda: head()(x(), torch.zeros(N)), ("expert ids", "float")),
    ("TemporalEnsembleHead.member_logits", "expert_ids", "2-d"):
        (lambda: head().member_logits(x(), torch.zeros(N, 1, dtype=torch.long)), ("expert ids", f"({N},)")),
    ("TemporalEnsembleHead.update", "experts", "float"):
        (lambda: head().update(torch.zeros(2)), ("expert ids", "float")),
    ("TemporalEnsembleHead.member_logits", "features", "width"):
        (lambda: head().member_logits(x(width=D + 1), 0), ("features", f"{D}")),
    ("TemporalEnsembleHead.aggregate_members", "member_logits", "2-d"):
        (lambda: head().aggregate_members(torch.randn(N, C)), ("member_logits",)),
    ("aggregate_logits", "member_logits", "2-d"): (lambda: aggregate_logits(torch.randn(N, C)), ("member_logits",)),
    ("aggregate_logits", "member_logits", "integer"):
        (lambda: aggregate_logits(torch.ones(N, 2, C, dtype=torch.long)), ("member_logits", "floating point")),
    ("aggregate_logits", "member_logits", "no member"):
        (lambda: aggregate_logits(torch.ones(N, 0, C)), ("member_logits", "H >= 1")),
    ("AnalyticRouter.update", "features", "width"): (lambda: router().update(x(width=D + 1), 0), ("features", f"{D}")),
    ("AnalyticRouter.update", "expert_ids", "length"):
        (lambda: router().update(x(), torch.zeros(N - 1, dtype=torch.long)), ("expert ids", f"{N}")),
    ("AnalyticRouter.update", "expert_ids", "float"):
        (lambda: router().update(x(), torch.zeros(N)), ("expert ids", "float")),
    ("AnalyticRouter.forward", "features", "width"): (lambda: router()(x(width=D - 1)), ("features", f"{D}")),
    ("AnalyticRouter.route", "features", "1-d"): (lambda: router().route(torch.randn(D)), ("features", "1-d")),
    ("AnalyticRouter.route", "features", "integer"):
        (lambda: router().route(torch.ones(N, D, dtype=torch.long)), ("features", "floating point")),
    ("RandomExpansion.forward", "features", "width"): (lambda: RandomExpansion(D, 8)(x(width=D + 1)), ("features", f"{D}")),
    ("class_mask", "classes", "float"): (lambda: class_mask(torch.zeros(2), C), ("classes", "integer")),
    ("class_mask", "dtype", "integer"):
        (lambda: class_mask(torch.tensor([0]), C, dtype=torch.long), ("dtype", "floating-point")),
    ("batch_seen_class_mask", "labels", "a list"): (lambda: batch_seen_class_mask([0, 1], C), ("batch_seen_class_mask", "labels", "list")),
    ("seen_class_mask", "dtype", "integer"):
        (lambda: seen_class_mask(1, C, dtype=torch.int32), ("dtype", "floating-point")),
}


@pytest.mark.parametrize("key", list(FAULTS), ids=[" ".join(key) for key in FAULTS])
def test_each_tensor_argument_fault_is_one_line_naming_the_argument(key):
    call, words = FAULTS[key]
    with pytest.raises(InvalidParameterError) as raised:
        call()
    message = str(raised.value)
    assert "\n" not in message and all(word in message for word in words), message


def tensor_arguments() -> Set[Tuple[str, str]]:
    """``(call, argument)`` of every parameter of the public API (``fly_modules.__all__``: its functions and its
    classes' public methods) that takes a tensor, read from the signatures."""
    found = set()
    for name in fly_modules.__all__:
        value = getattr(fly_modules, name)
        calls = [(name, value)] if inspect.isfunction(value) else [
            (f"{name}.{method}", call) for method, call in vars(value).items()
            if inspect.isfunction(call) and not method.startswith("_")] if inspect.isclass(value) else []
        for call_name, call in calls:
            found |= {(call_name, parameter.name) for parameter in inspect.signature(call).parameters.values()
                      if "Tensor" in str(parameter.annotation)}
    return found


def test_every_tensor_argument_of_the_public_api_is_walked():
    arguments = tensor_arguments()
    assert len(arguments) >= 15  # the signatures were read
    missing = arguments - {(call, argument) for call, argument, _ in FAULTS}
    assert not missing, f"tensor arguments without a fault in FAULTS: {sorted(missing)}"


def test_the_issue_case_names_logit_mask_and_the_width_in_training_and_at_inference():
    ensemble = head()
    for expert_ids in (None, 0):
        with pytest.raises(InvalidParameterError, match=r"logit_mask must have shape \(3,\) or \(5, 3\)"):
            ensemble(torch.randn(5, 4), expert_ids, logit_mask=torch.ones(4, dtype=torch.bool))


def test_a_right_mask_is_added_in_both_shapes():
    ensemble = head()
    features, mask = x(), torch.tensor([0.0, float("-inf"), 0.0])
    assert torch.equal(ensemble(features, logit_mask=mask), ensemble(features) + mask)
    rows = mask.expand(N, C)
    assert torch.equal(ensemble(features, 0, logit_mask=rows), ensemble(features, 0, logit_mask=mask))


@pytest.mark.parametrize("mask", [torch.zeros(1000), torch.ones(5, dtype=torch.bool)], ids=["width", "bool"])
def test_a_retrofits_mask_is_checked_when_the_ensemble_answers(mask):
    from upstream_cases import CASES, adapt, batch

    case = CASES["jhlee-l2p"]
    model, original = case.build()
    handle = adapt(case, model, original, router=True, ensemble=True)
    model.eval()
    handle.set_logit_mask(mask)
    with pytest.raises(InvalidParameterError, match="logit_mask must"):
        case.forward(model, original, batch()[0])
    handle.remove()
