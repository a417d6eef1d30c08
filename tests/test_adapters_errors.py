"""The library's refusals are not ``AttributeError``s: raised inside a property, Python's attribute machinery
(``nn.Module.__getattr__``, ``hasattr``, ``getattr`` with a default) must not swallow them."""

from __future__ import annotations

import pytest
from fly_modules.adapters import SeamError
from fly_modules.adapters._seams import find_head
from torch import nn

from fly_modules import AnalyticRouter, InvalidParameterError, NotFittedError


class _Headless(nn.Module):
    """A module whose property reads a seam it does not have."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Identity()

    @property
    def head_name(self) -> str:
        return find_head(self)[1]


@pytest.mark.parametrize("error", [SeamError, NotFittedError, InvalidParameterError])
def test_no_refusal_is_an_attribute_error(error):
    assert not issubclass(error, AttributeError)


def test_a_seam_error_inside_a_module_property_reaches_the_caller():
    with pytest.raises(SeamError, match="classifier"):
        _ = _Headless().head_name
    with pytest.raises(SeamError):
        hasattr(_Headless(), "head_name")
    with pytest.raises(SeamError):
        getattr(_Headless(), "head_name", None)


def test_an_unfitted_router_property_names_the_fix_not_a_missing_attribute():
    router = AnalyticRouter(4, 2, expansion_dim=0)
    with pytest.raises(NotFittedError, match="call update"):
        _ = router.weight
    with pytest.raises(NotFittedError):
        hasattr(router, "weight")
