"""The routing study's routers against float64 references computed directly on small data."""

import numpy as np
import pytest
import torch

from benchmarks.studies.kmeans_router import KMeansRouter
from benchmarks.studies.mlp_router import MLPRouter
from benchmarks.studies.naive_bayes_router import GaussianNaiveBayesRouter
from benchmarks.studies.prototype_router import PrototypeRouter
from benchmarks.studies.router_set import RouterSet, check_router_names
from fly_modules import RandomExpansion


def _data(seed=0, n=120, features=6, experts=3, relu=True):
    generator = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, experts, (n,), generator=generator)
    centres = 3 * torch.randn(experts, features, generator=generator, dtype=torch.float64)
    x = centres[ids] + torch.randn(n, features, generator=generator, dtype=torch.float64) * (1 + ids.unsqueeze(1))
    return (x.relu() if relu else x), ids


def _feed(router, x, ids, chunks=5):
    for xs, es in zip(torch.tensor_split(x, chunks), torch.tensor_split(ids, chunks)):
        router.update(xs, es)
    return router


def test_prototypes_are_explicit_means_and_route_by_cosine():
    x, ids = _data()
    router = _feed(PrototypeRouter(x.shape[1], 3), x, ids)
    means = np.stack([x[ids == e].numpy().mean(0) for e in range(3)])
    np.testing.assert_allclose(router.prototypes().numpy(), means, rtol=1e-12)
    xn = x.numpy() / np.linalg.norm(x.numpy(), axis=1, keepdims=True)
    cosine = xn @ (means / np.linalg.norm(means, axis=1, keepdims=True)).T
    np.testing.assert_array_equal(router.route(x).numpy(), cosine.argmax(1))


def test_naive_bayes_equals_scikit_learn_on_the_whole_data():
    naive_bayes = pytest.importorskip("sklearn.naive_bayes")
    x, ids = _data(1)
    router = _feed(GaussianNaiveBayesRouter(x.shape[1], 3), x, ids, chunks=7)
    reference = naive_bayes.GaussianNB().fit(x.numpy(), ids.numpy())
    np.testing.assert_allclose(router.means.numpy(), reference.theta_, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(router.variances().numpy(), reference.var_, rtol=1e-10)
    np.testing.assert_allclose(router.scores(x).numpy(), reference.predict_joint_log_proba(x.numpy()), rtol=1e-9)
    np.testing.assert_array_equal(router.route(x).numpy(), reference.predict(x.numpy()))


def test_naive_bayes_log_likelihood_against_scipy():
    stats = pytest.importorskip("scipy.stats")
    x, ids = _data(2, n=40, relu=False)
    router = _feed(GaussianNaiveBayesRouter(x.shape[1], 3, var_smoothing=0.0), x, ids)
    expected = np.stack([
        np.log((ids == e).double().mean().item())
        + stats.norm.logpdf(x.numpy(), x[ids == e].numpy().mean(0), x[ids == e].numpy().std(0)).sum(1)
        for e in range(3)], axis=1)
    np.testing.assert_allclose(router.scores(x).numpy(), expected, rtol=1e-9)


@pytest.mark.parametrize("cls", [PrototypeRouter, GaussianNaiveBayesRouter])
def test_statistics_merge_to_those_of_all_samples(cls):
    x, ids = _data(3)
    whole = _feed(cls(x.shape[1], 3), x, ids)
    left = _feed(cls(x.shape[1], 3), x[:50], ids[:50])
    right = _feed(cls(x.shape[1], 3), x[50:], ids[50:])
    left.merge_(right)
    for name, tensor in whole.state_dict().items():
        torch.testing.assert_close(left.state_dict()[name], tensor, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("cls", [KMeansRouter, MLPRouter])
def test_order_dependent_routers_refuse_to_merge(cls):
    with pytest.raises(NotImplementedError, match="do not merge"):
        cls(4, 2).merge_(cls(4, 2))


def test_kmeans_centres_are_the_means_of_their_assigned_samples():
    x, ids = _data(4, n=90)
    router = _feed(KMeansRouter(x.shape[1], 3, centres_per_expert=2), x, ids, chunks=9)
    assert int(router.sizes.sum()) == len(x)
    # Replay: seeds, then each later sample to its nearest centre at the time of its batch.
    for expert in range(3):
        rows = [r for chunk_x, chunk_e in zip(torch.tensor_split(x, 9), torch.tensor_split(ids, 9))
                for r in [chunk_x[chunk_e == expert]] if len(r)]
        members = {0: [], 1: []}
        centres = []
        for batch in rows:
            batch = list(batch)
            while len(centres) < 2 and batch:
                centres.append(batch[0].clone())
                members[len(centres) - 1].append(batch.pop(0))
            frozen = torch.stack(centres)
            for row in batch:
                members[int(((frozen - row) ** 2).sum(1).argmin())].append(row)
            centres = [torch.stack(members[c]).mean(0) for c in range(len(centres))]
        torch.testing.assert_close(router.centres[expert], torch.stack(centres), rtol=1e-12, atol=1e-12)


def test_kmeans_routes_to_the_expert_of_the_nearest_centre():
    router = KMeansRouter(2, 2, centres_per_expert=1)
    router.update(torch.tensor([[0.0, 0.0]], dtype=torch.float64), 0)
    router.update(torch.tensor([[4.0, 0.0]], dtype=torch.float64), 1)
    assert router.route(torch.tensor([[1.0, 0.0], [3.0, 1.0]])).tolist() == [0, 1]


def test_mlp_learns_separable_experts_and_resumes_exactly():
    x, ids = _data(5, n=200)
    router = MLPRouter(x.shape[1], 3, hidden=32, lr=1e-2, seed=0)
    for _ in range(40):
        _feed(router, x[:150], ids[:150])
    assert (router.route(x[150:]) == ids[150:]).double().mean() > 0.8
    copy = MLPRouter(x.shape[1], 3, hidden=32, lr=1e-2, seed=1)
    copy.load_state_dict(router.state_dict())
    router.update(x[:10], ids[:10])
    copy.update(x[:10], ids[:10])
    torch.testing.assert_close(copy.scores(x), router.scores(x), rtol=0, atol=0)


def test_routers_answer_only_for_experts_with_samples():
    x, ids = _data(6)
    for cls in (PrototypeRouter, GaussianNaiveBayesRouter, KMeansRouter, MLPRouter):
        router = cls(x.shape[1], 3)
        router.update(x[ids == 1], 1)
        assert set(router.route(x).tolist()) == {1}, cls.__name__


def test_router_set_feeds_every_router_the_expanded_features():
    expansion = RandomExpansion(5, 16, seed=3, dtype=torch.float64)
    routers = RouterSet(expansion, ["kmeans", "ridge", "prototype"], 2)
    assert routers.names == ["prototype", "kmeans"]
    assert check_router_names(["mlp", "ridge"]) == ["ridge", "mlp"]
    x = torch.randn(8, 5)
    routers.update(x, 1)
    direct = PrototypeRouter(16, 2)
    direct.update(expansion(x), 1)
    torch.testing.assert_close(routers.routers["prototype"].sums, direct.sums)
    assert set(routers.route(x)) == {"prototype", "kmeans"}
    with pytest.raises(ValueError, match="unknown routers"):
        RouterSet(expansion, ["lda"], 2)
