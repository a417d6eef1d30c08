"""``python -m benchmarks.speed.router_timing``: every router of the routing study timed on the same batches."""

import json

import torch

from benchmarks.speed import router_timing
from benchmarks.studies.router_set import ROUTERS


def test_every_router_is_timed_and_has_a_cost_formula(tmp_path, capsys):
    output = tmp_path / "timing.json"
    assert router_timing.main(["--quick", "--threads", "1", "--repeats", "1", "--json", str(output)]) == 0
    costs = json.loads(output.read_text())
    assert [cost["name"] for cost in costs] == [*ROUTERS, "ridge solve"]
    assert all(cost["update"] > 0 for cost in costs)
    assert all(cost["route"] > 0 for cost in costs[:-1])
    table = capsys.readouterr().out
    assert all(f"| {name} |" in table for name in ROUTERS)


def test_routers_learn_the_same_samples():
    args = router_timing.parse_args(["--quick", "--threads", "1"])
    args.device = torch.device("cpu")
    features = torch.randn(3 * args.batch_size, args.features)
    experts = torch.arange(3).repeat_interleave(args.batch_size)
    ridge, others = router_timing.build_routers(features, experts, args)
    for router in others.routers.values():
        assert torch.equal(router.counts, ridge.counts)
    assert ridge.pending_rows == 0


def test_multiply_adds_follow_the_routers_sizes():
    args = router_timing.parse_args(["--quick"])
    args.device = torch.device("cpu")
    _, others = router_timing.build_routers(torch.randn(8, args.features), torch.zeros(8, dtype=torch.long), args)
    mlp, kmeans = others.routers["mlp"], others.routers["kmeans"]
    m, e = args.expansion_dim, args.experts
    assert router_timing.multiply_adds("mlp", m, e, mlp) == sum(layer.weight.numel() for layer in mlp.network[::2])
    assert router_timing.multiply_adds("kmeans", m, e, kmeans) == kmeans.centres.numel()
