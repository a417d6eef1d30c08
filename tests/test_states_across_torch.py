"""State written by one torch, loaded by another: the router, the ensemble head and a retrofit's handle give
the same routes and outputs.

tests/fixtures/states_across_torch/ holds one file per torch that wrote it (torch 2.x and 1.12.1): each part's
state_dict, the inputs, and the routes and outputs the writing torch gave. Every supported torch loads each
file (weights-only) into freshly built objects and must give the same routes (their score margins are
far above any rounding), the router's solution to float64 rounding and the heads' outputs to float32
rounding. Written by running this file:
``python tests/test_states_across_torch.py`` (a new file per torch major.minor).
"""

import sys
from pathlib import Path

import pytest
import torch
from fly_modules.adapters import generic
from ridge_bounds import assert_same_solution
from torch import nn
from upstream_standins import Tiny

from fly_modules import AnalyticRouter, TemporalEnsembleHead, _compat

STATES = Path(__file__).resolve().parent / "fixtures" / "states_across_torch"
DIM, EXPERTS, CLASSES = 8, 3, 6
FLOAT32 = dict(rtol=1e-5, atol=1e-6)


def _clusters(generator, samples):
    centres = 3 * torch.randn(EXPERTS, DIM, generator=generator, dtype=torch.float64)
    labels = torch.arange(EXPERTS).repeat_interleave(samples)
    return centres[labels] + torch.randn(len(labels), DIM, generator=generator, dtype=torch.float64), labels


def _router():
    return AnalyticRouter(DIM, num_experts=EXPERTS, expansion_dim=64, ridge=1.0, seed=0)


def _ensemble():
    torch.manual_seed(0)
    return TemporalEnsembleHead(nn.Linear(DIM, CLASSES), num_experts=EXPERTS)


def _retrofit():
    torch.manual_seed(0)
    model = Tiny()
    handle = generic.retrofit(model, num_experts=2, query_module=model.query, route_module=model.route,
                              route_kwarg="expert", head_owner=model, head_name="head", expansion_dim=16, ridge=1.0)
    return model, handle


def _train_router_and_ensemble(generator):
    router, ensemble = _router(), _ensemble()
    optimizer = torch.optim.SGD(ensemble.parameters(), lr=0.1)
    hook = ensemble.attach(optimizer)
    features, experts = _clusters(generator, 20)
    for expert in range(EXPERTS):
        ensemble.start_expert(expert)
        rows = features[experts == expert]
        router.update(rows, expert)
        for _ in range(5):
            loss = nn.functional.cross_entropy(ensemble(rows.float()), torch.full((len(rows),), 2 * expert))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    hook.remove()
    return router, ensemble


def _train_retrofit(generator):
    model, handle = _retrofit()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    handle.attach_optimizer(optimizer)
    for expert in range(2):
        handle.start_expert(expert)
        for _ in range(4):
            x = torch.randn(8, 4, generator=generator) + 3 * expert
            loss = nn.functional.cross_entropy(model(x), torch.full((8,), expert))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            handle.end_batch()
    return model, handle


def write_state(folder: Path) -> Path:
    generator = torch.Generator().manual_seed(0)
    router, ensemble = _train_router_and_ensemble(generator)
    model, handle = _train_retrofit(generator)
    queries, _ = _clusters(generator, 4)
    inputs = torch.cat([torch.randn(6, 4, generator=generator), torch.randn(6, 4, generator=generator) + 3])
    model.eval()
    routes = router.route(queries)
    written = {
        "torch": str(torch.__version__), "queries": queries, "inputs": inputs,
        "router": router.state_dict(), "routes": routes, "solution": router.solve(),
        "ensemble": ensemble.state_dict(), "ensemble_outputs": ensemble(queries.float(), routes),
        "model": model.state_dict(), "handle": handle.state_dict(), "handle_routes": handle.route(model.query(inputs)),
        "model_outputs": model(inputs),
    }
    path = folder / "torch{}.{}.pt".format(*_compat.TORCH_VERSION)
    torch.save(written, path)
    return path


def _written():
    return sorted(STATES.glob("*.pt"))


@pytest.fixture(params=_written(), ids=lambda path: path.stem)
def written(request):
    return _compat.load_weights(request.param)


def test_the_router_routes_identically(written):
    router = _router()
    router.load_state_dict(written["router"])
    assert torch.equal(router.route(written["queries"]), written["routes"]), written["torch"]
    assert_same_solution(router.solve(), written["solution"], router.gram_matrix(), router.ridge)


def test_the_ensemble_gives_the_same_outputs(written):
    ensemble = _ensemble()
    ensemble.load_state_dict(written["ensemble"])
    outputs = ensemble(written["queries"].float(), written["routes"])
    torch.testing.assert_close(outputs, written["ensemble_outputs"], **FLOAT32)
    assert torch.equal(outputs.argmax(1), written["ensemble_outputs"].argmax(1))


def test_a_retrofit_resumed_routes_and_predicts_identically(written):
    model, handle = _retrofit()
    model.load_state_dict(written["model"])
    handle.load_state_dict(written["handle"])
    model.eval()
    with torch.no_grad():
        assert torch.equal(handle.route(model.query(written["inputs"])), written["handle_routes"]), written["torch"]
        torch.testing.assert_close(model(written["inputs"]), written["model_outputs"], **FLOAT32)
    handle.remove()


@pytest.mark.parametrize("part", ["router", "ensemble", "handle"])
def test_a_planted_change_is_seen(part):
    """The comparisons can fail: a changed stored expansion, EMA bank or handle router changes the result."""
    written = _compat.load_weights(_written()[0])
    if part == "router":
        state = dict(written["router"])
        state["expansion.weight"] = state["expansion.weight"].flip(0)
        router = _router()
        router.load_state_dict(state)
        assert not torch.equal(router.route(written["queries"]), written["routes"])
        return
    if part == "ensemble":
        state = dict(written["ensemble"])
        name = next(key for key in state if key.startswith("ema") and key.endswith("weight"))
        state[name] = state[name].flip(-1)
        ensemble = _ensemble()
        ensemble.load_state_dict(state)
        assert not torch.allclose(ensemble(written["queries"].float(), written["routes"]), written["ensemble_outputs"])
        return
    state = {**written["handle"], "router": dict(written["handle"]["router"])}
    state["router"]["expansion.weight"] = -state["router"]["expansion.weight"]
    model, handle = _retrofit()
    model.load_state_dict(written["model"])
    handle.load_state_dict(state)
    assert not torch.equal(handle.route(model.query(written["inputs"])), written["handle_routes"])


def test_both_torch_generations_are_stored():
    assert {"torch1", "torch2"} <= {path.stem.split(".")[0] for path in _written()}


if __name__ == "__main__":
    print(write_state(Path(sys.argv[1]) if len(sys.argv) > 1 else STATES))
