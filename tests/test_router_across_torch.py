"""A router's state_dict written by one torch routes identically when loaded by another.

tests/fixtures/router_states/ holds one state per torch that wrote it (torch 2.x and 1.12.1), each with the
queries and the routes the writing torch gave. Every supported torch loads each file (weights-only) and
must give the same routes and the same solution, to float64 rounding. Written by running this file:
``python tests/test_router_across_torch.py`` (a new file per torch major.minor).
"""

import sys
from pathlib import Path

import pytest
import torch

from fly_modules import AnalyticRouter, _compat

STATES = Path(__file__).resolve().parent / "fixtures" / "router_states"
DIM, EXPERTS = 8, 3


def _trained_router():
    generator = torch.Generator().manual_seed(0)
    router = AnalyticRouter(DIM, num_experts=EXPERTS, expansion_dim=64, ridge=1.0, seed=0)
    centres = 3 * torch.randn(EXPERTS, DIM, generator=generator, dtype=torch.float64)
    for expert in range(EXPERTS):
        router.update(centres[expert] + torch.randn(20, DIM, generator=generator, dtype=torch.float64), expert)
    queries = centres.repeat(4, 1) + 1.5 * torch.randn(4 * EXPERTS, DIM, generator=generator, dtype=torch.float64)
    return router, queries


def write_state(folder: Path) -> Path:
    router, queries = _trained_router()
    path = folder / "torch{}.{}.pt".format(*_compat.TORCH_VERSION)
    torch.save({"router": router.state_dict(), "queries": queries, "routes": router.route(queries),
                "solution": router.solve(), "torch": str(torch.__version__)}, path)
    return path


@pytest.mark.parametrize("path", sorted(STATES.glob("*.pt")), ids=lambda path: path.stem)
def test_a_state_written_by_another_torch_routes_identically(path):
    written = _compat.load_weights(path)
    router, _ = _trained_router()
    router.load_state_dict(written["router"])
    assert torch.equal(router.route(written["queries"]), written["routes"]), written["torch"]
    torch.testing.assert_close(router.solve(), written["solution"], rtol=1e-10, atol=1e-12)


def test_a_changed_random_matrix_is_seen():
    """The comparison can fail: a planted change to the stored expansion changes the routes."""
    written = _compat.load_weights(sorted(STATES.glob("*.pt"))[0])
    state = dict(written["router"])
    name = next(key for key in state if key.endswith("weight") and state[key].dim() == 2)
    state[name] = state[name].flip(0)
    router, _ = _trained_router()
    router.load_state_dict(state)
    assert not torch.equal(router.route(written["queries"]), written["routes"])


def test_both_torch_generations_are_stored():
    majors = {path.stem.split(".")[0] for path in STATES.glob("*.pt")}
    assert {"torch1", "torch2"} <= majors


if __name__ == "__main__":
    print(write_state(Path(sys.argv[1]) if len(sys.argv) > 1 else STATES))
