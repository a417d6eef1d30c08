"""Which retrofit a model carries is held beside the model, never written into it: its ``__dict__``, deep
copies, pickles and ``state_dict`` see exactly the user's own attributes, and it is still retrofitted once."""

from __future__ import annotations

import copy
import gc
import io
import pickle
import weakref

import pytest
import torch
from fly_modules.adapters import generic
from upstream_standins import Tiny

from fly_modules import _compat


def _retrofit(model: Tiny):
    return generic.retrofit(model, num_experts=2, query_module=model.query, route_module=model.route,
                            route_kwarg="expert", expansion_dim=16, ridge=1.0)


def _attributes(modules):
    """Each module's instance attribute names (its classifier is wrapped in place, its own object unchanged);
    on torch < 2 without the names the keyword-hook fallback holds while a hook is registered (as torch 2's
    own hook tables are not counted)."""
    held = () if _compat.NATIVE_KWARGS_HOOKS else _compat.FALLBACK_MODULE_ATTRIBUTES
    return [sorted(set(vars(module)) - set(held)) for module in modules]


def test_the_retrofit_writes_nothing_into_the_model_and_answers_already_retrofitted():
    model = Tiny()
    modules = list(model.modules())
    own, keys = _attributes(modules), list(model.state_dict())
    handle = _retrofit(model)
    assert _attributes(modules) == own and list(model.state_dict()) == keys
    with pytest.raises(RuntimeError, match="already retrofitted"):
        _retrofit(model)
    twin = copy.deepcopy(model)  # a copy is another model: retrofitted apart, and holds the model's attributes
    assert _attributes([twin]) == own[:1]
    _retrofit(twin).remove()
    handle.remove()
    assert [sorted(vars(module)) for module in modules] == own  # the fallback's names gone with the hooks
    _retrofit(model).remove()  # removed: free to retrofit again


def test_a_removed_retrofit_leaves_a_model_that_pickles_as_before():
    model = Tiny()
    handle = _retrofit(model)
    handle.verify(torch.randn(5, 4))  # verify's trial removal and reinstall keep the model retrofitted
    with pytest.raises(RuntimeError, match="already retrofitted"):
        _retrofit(model)
    handle.remove()
    buffer = io.BytesIO()
    pickle.dump(model, buffer)
    buffer.seek(0)
    copy_ = pickle.load(buffer)  # noqa: S301  (our own object, just written)
    assert _attributes(copy_.modules()) == _attributes(model.modules())


def test_the_registry_keeps_neither_the_model_nor_the_handle_alive():
    model = Tiny()
    handle = _retrofit(model)
    model_ref, handle_ref = weakref.ref(model), weakref.ref(handle)
    del model, handle
    gc.collect()
    assert model_ref() is None and handle_ref() is None
