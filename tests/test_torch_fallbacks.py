"""fly_modules._compat: each fallback (the path torch < 2 takes) behaves as the native API, on every torch.

The fallback is forced by clearing its flag; where the running torch has the native API, the same
scenario is replayed on it and the two records must be equal.
"""

import io
import os
import pickle
import subprocess
import sys

import pytest
import torch
from torch import nn

from fly_modules import TemporalEnsembleHead, _compat

# On torch < 2 only the fallback exists: there is no native path to run beside it.
_HAS_NATIVE = _compat.NATIVE_STEP_HOOKS and _compat.NATIVE_KWARGS_HOOKS and _compat.NATIVE_WEIGHTS_ONLY


@pytest.fixture(params=["native", "fallback"] if _HAS_NATIVE else ["fallback"])
def path(request, monkeypatch):
    native = request.param == "native"
    for flag in ("NATIVE_STEP_HOOKS", "NATIVE_KWARGS_HOOKS", "NATIVE_WEIGHTS_ONLY"):
        monkeypatch.setattr(_compat, flag, native)
    return request.param


def _step_record(order):
    torch.manual_seed(0)
    model = nn.Linear(3, 2)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    first = _compat.step_post_hook(optimizer, lambda opt, args, kwargs: order.append(("first", opt is optimizer)))
    _compat.step_post_hook(optimizer, lambda opt, args, kwargs: order.append(("second", args, kwargs)))
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step(None)
    model(torch.ones(1, 3)).sum().backward()
    optimizer.step()
    first.remove()
    optimizer.step(closure=None)
    return optimizer


def test_step_post_hooks_run_in_order_and_are_removable(path):
    order = []
    optimizer = _step_record(order)
    assert order == [("first", True), ("second", (optimizer, None), {}), ("first", True),
                     ("second", (optimizer,), {}), ("second", (optimizer,), {"closure": None})]
    if path == "fallback":
        assert "step" in vars(optimizer)  # one hook is left: the dispatcher stays


def test_the_fallback_leaves_once_the_last_step_hook_is_removed(path):
    optimizer = torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1)
    handles = [_compat.step_post_hook(optimizer, lambda *a: None) for _ in range(2)]
    for handle in handles:
        handle.remove()
    assert "step" not in vars(optimizer) and "_fly_modules_hooks" not in vars(optimizer)
    assert type(optimizer).step is not None


def test_a_step_wrapped_on_the_instance_before_the_hook_still_runs_it(path):
    """torch 1.x's LR schedulers put a plain-function wrapper of ``optimizer.step`` on the instance."""
    model = nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
    bound, calls = optimizer.step, []

    def wrapper(*args, **kwargs):
        calls.append("wrapper")
        return bound(*args, **kwargs)

    optimizer.step = wrapper
    _compat.step_post_hook(optimizer, lambda opt, args, kwargs: calls.append(opt is optimizer))
    model(torch.ones(1, 2)).sum().backward()
    optimizer.step()
    assert calls == ["wrapper", True]


def _train_ensemble(attached):
    """Three steps of a head; the EMA update by the attached hook or, for the reference, called by hand."""
    torch.manual_seed(1)
    features, labels = torch.randn(16, 6), torch.randint(0, 5, (16,))
    ensemble = TemporalEnsembleHead(nn.Linear(6, 5), 2, decays=(0.9, 0.5))
    ensemble.start_expert(1)
    optimizer = torch.optim.SGD(ensemble.online.parameters(), lr=0.5)
    handle = ensemble.attach(optimizer) if attached else None
    for _ in range(3):
        optimizer.zero_grad()
        nn.functional.cross_entropy(ensemble(features), labels).backward()
        optimizer.step()
        if not attached:
            ensemble.update()
    if handle is not None:
        handle.remove()
        optimizer.zero_grad(set_to_none=True)
        optimizer.step()  # removed: the copies stay
    return ensemble.state_dict()


def test_ensemble_attach_updates_as_a_hand_called_update(path):
    attached, reference = _train_ensemble(True), _train_ensemble(False)
    assert int(attached["num_updates"].sum()) == 3
    assert attached.keys() == reference.keys() and all(
        torch.equal(value, reference[k]) if torch.is_tensor(value) else value == reference[k]
        for k, value in attached.items())


def test_global_step_hook_sees_every_optimizer(path):
    seen = []
    handle = _compat.global_step_post_hook(lambda opt, args, kwargs: seen.append((type(opt).__name__, args[0] is opt)))

    class Stepper(torch.optim.Optimizer):  # defined after the registration: still followed
        def __init__(self, params):
            super().__init__(params, {})

        def step(self, closure=None):
            return None

    try:
        for kind in (torch.optim.SGD, torch.optim.Adam, Stepper):
            kind(nn.Linear(2, 2).parameters(), **({} if kind is Stepper else {"lr": 0.1})).step()
    finally:
        handle.remove()
    torch.optim.SGD(nn.Linear(2, 2).parameters(), lr=0.1).step()
    assert seen == [("SGD", True), ("Adam", True), ("Stepper", True)]


class Scaled(nn.Module):
    def forward(self, x, *, scale=1.0):
        return x * scale


def _kwargs_record():
    module, seen = Scaled(), []

    def pre(mod, args, kwargs):
        seen.append(("pre", mod is module, kwargs))
        return (args[0] + 1,), {"scale": kwargs.get("scale", 1.0) * 2}

    def pre_second(mod, args, kwargs):
        seen.append(("pre2", float(args[0].sum()), kwargs))

    def post(mod, args, kwargs, output):
        seen.append(("post", kwargs))
        return output - 1

    handles = [_compat.forward_pre_hook(module, pre), _compat.forward_pre_hook(module, pre_second),
               _compat.forward_hook(module, post)]
    outputs = [module(torch.ones(2), scale=3.0), module(torch.ones(2))]
    for handle in handles:
        handle.remove()
    outputs.append(module(torch.ones(2), scale=3.0))
    return seen, [o.tolist() for o in outputs], module


def test_keyword_forward_hooks_match_the_native_ones(path):
    seen, outputs, module = _kwargs_record()
    assert outputs == [[11.0, 11.0], [3.0, 3.0], [3.0, 3.0]]
    assert seen[:3] == [("pre", True, {"scale": 3.0}), ("pre2", 4.0, {"scale": 6.0}), ("post", {"scale": 6.0})]
    assert "forward" not in vars(module)


def test_a_malformed_pre_hook_result_is_refused(path):
    module = Scaled()
    _compat.forward_pre_hook(module, lambda mod, args, kwargs: args)
    with pytest.raises(RuntimeError, match="new_args, new_kwargs"):
        module(torch.ones(2))


def test_weights_loading_reads_a_state_dict_and_refuses_other_globals(path):
    state = {"w": nn.Parameter(torch.arange(4.0)), "x": torch.ones(2, dtype=torch.float64), "n": {"k": [1, "s"]}}
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    loaded = _compat.load_weights(buffer)
    assert torch.equal(loaded["w"], state["w"]) and loaded["x"].dtype == torch.float64 and loaded["n"] == state["n"]
    buffer = io.BytesIO()
    torch.save({"bad": io.BytesIO}, buffer)
    buffer.seek(0)
    with pytest.raises(pickle.UnpicklingError):
        _compat.load_weights(buffer)


def test_the_hook_tables_of_a_handle_whatever_torch_version_stores_them():
    """torch 2.1+ keeps a tuple of extra tables, 2.0 a single weak reference or None, older none at all."""
    import weakref
    from collections import OrderedDict

    from torch.utils.hooks import RemovableHandle

    from fly_modules import _compat

    main, extra = OrderedDict(), OrderedDict()  # torch's hook tables: a plain dict takes no weak reference
    handle = RemovableHandle(main)
    for stored in ((weakref.ref(extra),), weakref.ref(extra), None):
        handle.extra_dict_ref = stored
        expected = [main] if stored is None else [main, extra]
        assert [id(d) for d in _compat.handle_dicts(handle)] == [id(d) for d in expected]
    del handle.extra_dict_ref
    assert [id(d) for d in _compat.handle_dicts(handle)] == [id(main)]


def test_the_fallback_refuses_the_legacy_format_in_one_line(monkeypatch):
    monkeypatch.setattr(_compat, "NATIVE_WEIGHTS_ONLY", False)
    buffer = io.BytesIO()
    torch.save({"w": torch.ones(2)}, buffer, _use_new_zipfile_serialization=False)
    buffer.seek(0)
    with pytest.raises(pickle.UnpicklingError, match=r"legacy \(pre-1.6\) file format needs torch >= 2.0"):
        _compat.load_weights(buffer)


def test_the_environment_variable_forces_every_fallback():
    flags = ("NATIVE_STEP_HOOKS", "NATIVE_KWARGS_HOOKS", "NATIVE_WEIGHTS_ONLY", "NATIVE_STABLE_ARGSORT",
             "NATIVE_LOW_PRECISION_LERP")
    code = f"from fly_modules import _compat; print([getattr(_compat, f) for f in {flags!r}])"
    env = {**os.environ, "FLY_MODULES_FORCE_COMPAT": "1"}
    printed = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True).stdout
    assert printed.strip() == str([False] * len(flags))
