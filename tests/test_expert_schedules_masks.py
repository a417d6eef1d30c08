"""The task-correlated and self-triggered expert schedules (selectable for FlyPrompt, MVP and MISA) and the four
training logit masks of the paper's mask table."""

from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

pytest.importorskip("timm")

from benchmarks.ablation.expert_schedules import build_schedule, schedule_refusal  # noqa: E402
from benchmarks.ablation.logit_masks import TrainingMask  # noqa: E402
from benchmarks.ablation.runner import build_run  # noqa: E402
from benchmarks.core.protocol import Protocol  # noqa: E402
from benchmarks.data import make_synthetic_train_test  # noqa: E402
from benchmarks.methods import method_class  # noqa: E402
from fly_modules import SampleBudgetSchedule, SessionSchedule  # noqa: E402

CPU = torch.device("cpu")
INF = float("-inf")
PROTOCOL = Protocol(
    model="vit_tiny_patch16_224", model_kwargs=dict(img_size=32, patch_size=8, embed_dim=32, depth=5, num_heads=2),
    pretrained=False, image_size=32, batch_size=4, online_iter=1, eval_period=1000, test_batch_size=16,
    num_sessions=3, num_experts=3, expansion_dim=32, ridge=1e2, amp=False, augment=False,
)


@pytest.mark.parametrize("method", ["flyprompt", "mvp", "misa"])
def test_task_free_methods_take_either_schedule(method):
    cls = method_class(method)
    assert schedule_refusal(cls, "session") == schedule_refusal(cls, "budget") == ""
    model = type("Experts", (), {"session_aware": cls.session_aware, "name": method, "num_experts": 4})()
    assert isinstance(build_schedule(model, "session", 100), SessionSchedule)
    budget = build_schedule(model, "budget", 100)
    assert isinstance(budget, SampleBudgetSchedule) and budget.samples_per_expert == 25
    assert type(build_schedule(model, "method", 100)) is SampleBudgetSchedule  # their own: the budget


def test_session_aware_methods_refuse_a_sample_budget():
    assert "session starts" in schedule_refusal(method_class("l2p"), "budget")
    assert schedule_refusal(method_class("hide"), "session") == ""
    assert "expert_schedule must be one of" in schedule_refusal(method_class("mvp"), "weekly")


def _no_evaluation(*args, **kwargs):  # the schedule is what is tested, not the scores
    return None


class _Starts(list):
    """``(expert, samples seen, session)`` of every expert the trainer starts."""

    def __init__(self, trainer):
        super().__init__()
        self.trainer, self.start = trainer, trainer.components.start_expert
        trainer.components.start_expert = self

    def __call__(self, expert):
        self.append((expert, self.trainer.position.samples_seen, self.trainer.position.session))
        self.start(expert)


@pytest.mark.parametrize("method", ["flyprompt", "mvp", "misa"])
def test_task_correlated_experts_start_at_each_session(method):
    data = make_synthetic_train_test(6, train_per_class=8, test_per_class=1, seed=0, image_size=32)
    for schedule in ("session", "budget"):
        protocol = Protocol(**{**PROTOCOL.__dict__, "expert_schedule": schedule})
        variant = "full" if method == "flyprompt" else "baseline"
        run = build_run(method, "synthetic", 1, [variant], protocol, *data, device=CPU)
        trainer, starts = run.trainer, _Starts(run.trainer)
        trainer.evaluate = _no_evaluation
        trainer.train()
        sessions = list(range(run.stream.num_sessions))
        if schedule == "session":  # expert k starts as session k starts, before any of its samples
            firsts = {}
            for batch in run.stream.batches(protocol.batch_size, rank=None):
                firsts.setdefault(batch.session, batch.start)
            assert [(e, s) for e, _, s in starts] == [(k, k) for k in sessions[1:]]
            assert [seen for _, seen, _ in starts] == [firsts[k] for k in sessions[1:]]
        else:  # every w = N / experts samples, whatever the sessions
            budget = len(run.stream) // protocol.num_experts
            assert [e for e, _, _ in starts] == [1, 2]
            # the batch that reaches e * w samples (started at ``seen``, the loop's count before it) starts expert e
            assert all(seen < budget * e <= seen + protocol.batch_size for e, seen, _ in starts), (budget, starts)


class _Exposure:
    """Classes exposed in order 0, 1, 2, ...: two new ones per batch of four."""

    def num_exposed(self, samples_seen):
        return min(samples_seen // 2, 6)

    def to_exposure(self, labels):
        return labels


def _batch(index, targets):
    return SimpleNamespace(index=index, targets=torch.tensor(targets), samples_seen=4 * (index + 1))


def _mask(strategy, rank=0, world=1, own="batch"):
    model = SimpleNamespace(train_logit_mask=own)
    return TrainingMask(strategy, model, _Exposure(), 6, seed=3, parallel=SimpleNamespace(rank=rank, world=world),
                        device=CPU)


def test_the_four_training_masks():
    batch = _batch(1, [0, 2, 2, 3])  # 4 classes exposed
    assert _mask("none")(batch).tolist() == [0.0] * 6
    assert _mask("seen")(batch).tolist() == [0, 0, 0, 0, INF, INF]
    assert _mask("batch")(batch).tolist() == [0, INF, 0, 0, INF, INF]
    assert _mask("method", own="seen")(batch).tolist() == _mask("seen")(batch).tolist()
    random = _mask("random")(batch)
    assert random.shape == (4, 6)
    assert (random[torch.arange(4), batch.targets] == 0).all()  # each sample's own class
    assert (random[:, 4:] == INF).all()  # never a class not yet exposed
    assert torch.equal(random, _mask("random")(batch))  # drawn from the seed and the batch alone
    assert not torch.equal(random, _mask("random")(_batch(2, [0, 2, 2, 3])))
    many = _mask("random")(_batch(5, list(range(6)) * 20))
    assert 0.3 < float((many == 0).float()[:, :6].mean()) < 0.8  # about half of the other exposed classes
    assert torch.equal(_mask("random", rank=1, world=2)(batch), random[1::2])  # a process's rows of the global mask
    with pytest.raises(ValueError, match="train_mask must be one of"):
        _mask("sometimes")
