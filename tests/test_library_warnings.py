"""The library warns nothing of its own on any supported torch: no deprecated tensor operation on any path.

Torch 1.12 warns on ``tensor // n`` (``__floordiv__ is deprecated``, a ``UserWarning`` raised inside torch,
so a filter on the library's modules does not see it); newer torch does not. Each upstream case is
retrofitted and run in training and at inference with every deprecation an error (torch words its own as
``UserWarning``s saying "deprecated"), the deprecated operators made to warn as torch 1.12 does on every torch.
"""

import warnings

import pytest
import torch
from upstream_cases import CASES, adapt, batch

#: torch 1.12's tensor operators that warn (``torch/_tensor.py``), each with its warning's words
DEPRECATED_OPERATORS = {name: f"{name} is deprecated, and its behavior will change in a future version of pytorch"
                        for name in ("__floordiv__", "__rfloordiv__", "__ifloordiv__")}


@pytest.fixture
def warns_as_torch_1_12(monkeypatch):
    for name, words in DEPRECATED_OPERATORS.items():
        original = getattr(torch.Tensor, name)

        def warning(*args, _original=original, _words=words):
            warnings.warn(_words, UserWarning, stacklevel=1)  # as torch 1.12: raised on its own line
            return _original(*args)

        monkeypatch.setattr(torch.Tensor, name, warning)


def test_the_planted_operators_warn(warns_as_torch_1_12):
    with pytest.warns(UserWarning, match="__floordiv__ is deprecated"):
        torch.arange(4) // 2


@pytest.mark.parametrize("name", list(CASES))
def test_a_retrofit_trained_and_evaluated_warns_nothing(name, warns_as_torch_1_12):
    case = CASES[name]
    model, original = case.build()
    x, y = batch()
    with warnings.catch_warnings():
        for category in (DeprecationWarning, PendingDeprecationWarning, FutureWarning):
            warnings.simplefilter("error", category)
        warnings.filterwarnings("error", message=".*deprecated", category=UserWarning)  # torch's own deprecations
        handle = adapt(case, model, original, router=True, ensemble=True)
        for training in (True, False):
            model.train(training)
            case.forward(model, original, x)
        handle.remove()
